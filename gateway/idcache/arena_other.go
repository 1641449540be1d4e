//go:build !unix

package idcache

// mapArena falls back to the Go heap where there is no mmap: the arena is
// one pointer-free slice, so the collector counts it but never scans it.
func mapArena(size int) ([]byte, error) { return make([]byte, size), nil }

func releaseWith(*Cache, []byte) {}
