//go:build linux && !race

package rawio

func raceBeforeWrite([]byte) {}

func raceAfterRead(uintptr, []byte, int) {}

// raceEnabled: built with the race detector.
const raceEnabled = false

// RaceReleaseIO does nothing without the race detector.
func RaceReleaseIO() {}
