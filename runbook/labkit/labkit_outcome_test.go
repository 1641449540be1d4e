package labkit

import (
	"context"
	"fmt"
	"testing"

	"github.com/llmgw/llmgw/results"
)

func TestFailErrWithoutReceiptSourceIsBlocked(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want results.Status
		code string
	}{
		{"no receipt log", fmt.Errorf("worker w1: %w", ErrNoReceipts), results.StatusBlocked, CodeNoReceiptSource},
		{"transport error", fmt.Errorf("connection refused"), results.StatusFail, "X"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := FailErr(context.Background(), "X", tc.err)
			if o.Status != tc.want || o.Code != tc.code {
				t.Errorf("FailErr = %s %s; want %s %s", o.Status, o.Code, tc.want, tc.code)
			}
		})
	}
}
