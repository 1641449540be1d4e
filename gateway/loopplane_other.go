//go:build !linux

package gateway

import (
	"context"
	"errors"
	"net"
)

// loopPlaneSupported: event loops need Linux (epoll).
const loopPlaneSupported = false

// loopPlane is Linux-only; elsewhere every listener is the goroutine
// plane's (Config.DataPlane refuses "loop").
type loopPlane struct {
	acc  acceptStatus
	hand net.Listener
}

func (s *Server) startLoopPlane(key, addr string) (*loopPlane, error) {
	return nil, errors.New("gateway: the loop plane needs Linux")
}

func (p *loopPlane) close(context.Context) {}
