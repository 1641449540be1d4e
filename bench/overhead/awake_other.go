//go:build !linux

package overhead

import (
	"context"
	"fmt"
)

// keepAwake is Linux only (SCHED_IDLE, sched_setaffinity).
func keepAwake(context.Context) ([]int, func(), error) {
	return nil, nil, fmt.Errorf("%w: keeping CPUs awake is supported on Linux only", ErrParams)
}
