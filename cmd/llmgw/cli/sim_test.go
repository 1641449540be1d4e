package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/wait"
)

// pipeIO returns streams whose Out is a pipe the test reads line by line.
func pipeIO() (*IOStreams, *io.PipeReader) {
	r, w := io.Pipe()
	ios, _, _ := TestIO()
	ios.Out = w
	return ios, r
}

func TestSimCommandPrintsAddressesAndServes(t *testing.T) {
	for _, engine := range []string{"vllm", "sglang", "trtllm", "llamacpp"} {
		t.Run(engine, func(t *testing.T) {
			ios, out := pipeIO()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel() // also when the test fails before the interrupt
			done := make(chan ExitCode, 1)
			go func() {
				done <- Main(ctx, []string{"sim", "--engine", engine, "--listen", "127.0.0.1:0", "--model", "m"}, ios)
			}()
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil {
				cancel()
				t.Fatalf("no address line: %v", err)
			}
			go io.Copy(io.Discard, out) // the command may print more
			var addrs struct {
				HTTP string `json:"http"`
			}
			if err := json.Unmarshal([]byte(line), &addrs); err != nil || addrs.HTTP == "" {
				cancel()
				t.Fatalf("address line %q: %v", line, err)
			}
			c := &http.Client{Timeout: 10 * time.Second}
			// llama.cpp answers 503 while "loading".
			wait.ForErr(t, 10*time.Second, "the sim to serve", func() error {
				resp, err := c.Post("http://"+addrs.HTTP+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hello","max_tokens":2}`))
				if err != nil {
					return err
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("status %d", resp.StatusCode)
				}
				return nil
			})
			c.CloseIdleConnections()
			cancel()
			select {
			case code := <-done:
				if code != ExitOK {
					t.Errorf("exit code after interrupt = %d; want 0", code)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("sim did not stop on interrupt")
			}
		})
	}
}

func TestSimCommandBadInput(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown engine", []string{"--engine", "ollama"}, "vllm"},
		{"unknown role", []string{"--engine", "vllm", "--role", "both-ish"}, "prefill"},
		{"unknown encoding", []string{"--engine", "vllm", "--event-encoding", "json"}, "map"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ios, _, errOut := TestIO()
			code := Main(context.Background(), append([]string{"sim", "--listen", "127.0.0.1:0"}, tc.args...), ios)
			if code != ExitUsage || !strings.Contains(errOut.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want %d naming %q", code, errOut, ExitUsage, tc.want)
			}
		})
	}
}

// TestSimReceiptsFalse: `llmgw sim --receipts=false` serves its persona but
// no /_sim/* endpoint; the default serves them.
func TestSimReceiptsFalse(t *testing.T) {
	cases := []struct {
		name       string
		args       []string
		wantStatus int
	}{
		{"default keeps the receipt log", nil, http.StatusOK},
		{"--receipts=false is silent", []string{"--receipts=false"}, http.StatusNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ios, out := pipeIO()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan ExitCode, 1)
			go func() {
				done <- Main(ctx, append([]string{"sim", "--engine", "vllm", "--listen", "127.0.0.1:0", "--kv-events", "off"}, tc.args...), ios)
			}()
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil {
				cancel()
				t.Fatalf("no address line: %v", err)
			}
			go io.Copy(io.Discard, out)
			var addrs struct {
				HTTP string `json:"http"`
			}
			if err := json.Unmarshal([]byte(line), &addrs); err != nil || addrs.HTTP == "" {
				cancel()
				t.Fatalf("address line %q: %v", line, err)
			}
			c := &http.Client{Timeout: 10 * time.Second}
			resp, err := c.Get("http://" + addrs.HTTP + "/_sim/receipts")
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.wantStatus {
				t.Errorf("GET /_sim/receipts = %d; want %d", resp.StatusCode, tc.wantStatus)
			}
			c.CloseIdleConnections()
			cancel()
			select {
			case code := <-done:
				if code != ExitOK {
					t.Errorf("exit code after interrupt = %d; want 0", code)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("sim did not stop on interrupt")
			}
		})
	}
}
