package kvhash

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind (the
// concurrency test starts some).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
