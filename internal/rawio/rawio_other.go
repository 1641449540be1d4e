//go:build !linux

package rawio

import "net"

// Wrap returns c unchanged: raw socket calls are implemented for Linux
// only.
func Wrap(c net.Conn) net.Conn { return c }
