package launcher

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/llmgw/llmgw/engines/sim"
)

// httpClient is used for the launchers' few control calls (faults, sim
// addresses, health); requests are bounded by their contexts.
var httpClient = &http.Client{Timeout: 10 * time.Second}

// postFault applies a /_sim/faults body to the simulator at addr.
func postFault(ctx context.Context, addr, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/_sim/faults", strings.NewReader(body))
	if err != nil {
		return fmt.Errorf("launcher: fault: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return fmt.Errorf("launcher: fault: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("launcher: fault %s: %d %s", body, resp.StatusCode, b)
	}
	return nil
}

// simAddrs asks a worker for its simulator addresses (GET /_sim/addrs).
// ok is false when the worker is not an llmgw simulator.
func simAddrs(ctx context.Context, addr string) (a sim.Addrs, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/_sim/addrs", nil)
	if err != nil {
		return a, false
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return a, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return a, false
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&a); err != nil || a.HTTP == "" {
		return a, false
	}
	return a, true
}
