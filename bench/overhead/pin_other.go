//go:build !linux

package overhead

import "fmt"

// pinSelf is Linux only (sched_setaffinity).
func pinSelf(list string) error {
	return fmt.Errorf("%w: pinning the load generator is supported on Linux only", ErrParams)
}
