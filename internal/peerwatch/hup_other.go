//go:build unix && !linux

package peerwatch

// peerHungUp cannot see a FIN behind unread bytes without POLLRDHUP; a TLS
// 1.3 client's close is then not reported (the first failed write is).
func peerHungUp(uintptr) bool { return false }
