//go:build !linux

package rawio

import (
	"errors"
	"net"
)

// ErrNotIdle: the connection was not idle before the request (Linux only;
// see sendfirst_linux.go).
var ErrNotIdle = errors.New("rawio: the connection was not idle before the request (closed, reset or unsolicited bytes)")

// SendError is a failure to write the bytes SendFirst left for the next
// Read (Linux only; see sendfirst_linux.go).
type SendError struct{ Err error }

func (e *SendError) Error() string { return "sending before the read: " + e.Err.Error() }
func (e *SendError) Unwrap() error { return e.Err }

// CanSendFirst is false off Linux.
func CanSendFirst(net.Conn) bool { return false }

// SendFirst is not supported off Linux: the caller writes the bytes itself.
func SendFirst(net.Conn, []byte, []byte, bool, bool) bool { return false }
