//go:build !linux

package rawio

import "net"

// QuickAck does nothing off Linux: TCP_QUICKACK is a Linux option.
func QuickAck(net.Conn) error { return nil }
