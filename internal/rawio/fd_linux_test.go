//go:build linux

package rawio

import (
	"syscall"
	"testing"
)

// TestFDCallsCountNothingOnError: Read and Writev return 0 with a non-zero
// errno (the raw call's -1 would be taken as a count by callers that
// slice by it: the loop plane's client send did, and panicked when a
// client's socket was full).
func TestFDCallsCountNothingOnError(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := fds[0], fds[1]
	defer Close(b)
	var iov [MaxIovec]syscall.Iovec
	buf := make([]byte, 64<<10)
	cases := []struct {
		name  string
		call  func() (int, syscall.Errno)
		errno syscall.Errno
	}{
		{"read, nothing to read", func() (int, syscall.Errno) { return Read(a, buf) }, syscall.EAGAIN},
		{"write, no room", func() (int, syscall.Errno) {
			for {
				n, e := Writev(a, [][]byte{buf}, &iov)
				if e != 0 || n == 0 {
					return n, e
				}
			}
		}, syscall.EAGAIN},
		{"writev, no room", func() (int, syscall.Errno) { return Writev(a, [][]byte{buf[:10], buf[:20]}, &iov) }, syscall.EAGAIN},
		{"read, closed descriptor", func() (int, syscall.Errno) {
			if e := Close(a); e != 0 {
				t.Fatal(e)
			}
			return Read(a, buf)
		}, syscall.EBADF},
		{"write, closed descriptor", func() (int, syscall.Errno) { return Writev(a, [][]byte{buf[:1]}, &iov) }, syscall.EBADF},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, e := tc.call()
			if n != 0 || e != tc.errno {
				t.Fatalf("got (%d, %v), want (0, %v)", n, e, tc.errno)
			}
		})
	}
}
