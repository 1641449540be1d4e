//go:build !unix

package gateway

import "net"

// peerOpen cannot peek on this platform: the idle and request limits alone
// decide whether a pooled connection is reused.
func peerOpen(net.Conn) bool { return true }
