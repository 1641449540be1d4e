//go:build unix

package idcache

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// mapArena maps size bytes of anonymous private memory: zero pages that
// cost nothing until written.
func mapArena(size int) ([]byte, error) {
	return unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
}

// releaseWith unmaps arena once c is unreachable. Nothing else refers to
// the arena: every id leaves the cache as a copy made under c's lock.
// Munmap of a mapping made by mapArena fails only for bad arguments; a
// cleanup has no caller to report to, so a failure leaves the mapping.
func releaseWith(c *Cache, arena []byte) {
	runtime.AddCleanup(c, func(b []byte) { _ = unix.Munmap(b) }, arena)
}
