//go:build linux

package gateway

import (
	"testing"

	"github.com/llmgw/llmgw/internal/testnet"
)

// blackholePort is a loopback port whose connects time out (see
// testnet.Blackhole).
func blackholePort(t *testing.T) int { return testnet.Blackhole(t).Port }
