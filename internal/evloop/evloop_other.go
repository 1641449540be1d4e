//go:build !linux

// Package evloop is an epoll event loop, on Linux only; elsewhere New
// fails and the gateway serves with goroutines (see evloop_linux.go).
package evloop

import "errors"

// ErrUnsupported: there is no event loop off Linux.
var ErrUnsupported = errors.New("evloop: event loops need Linux (epoll)")
