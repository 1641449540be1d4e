//go:build linux && !race

package rawio

func raceBeforeWrite([]byte) {}

func raceAfterRead(uintptr, []byte, int) {}

// raceEnabled: built with the race detector.
const raceEnabled = false
