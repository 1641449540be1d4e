// Package adaptertest checks an engine adapter's stated facts against the
// fixture set built from the engine itself (its package's
// testdata/adapter.json and testdata/cases/metrics.json), so that a fact in
// engines/<engine> cannot drift from the cited source without a test
// failing. Engine packages call Check from their tests.
package adaptertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/llmgw/llmgw/engines"
)

// Source cites where a fact was read.
type Source struct {
	Repo   string `json:"repo"`
	Path   string `json:"path"`
	Commit string `json:"commit"`
	Shows  string `json:"shows"`
}

// Facts is testdata/adapter.json.
type Facts struct {
	Conn struct {
		IdleTimeoutSeconds float64  `json:"idle_timeout_seconds"`
		CloseAfterStream   bool     `json:"close_after_stream"`
		Source             []Source `json:"source"`
	} `json:"conn"`
	Surfaces struct {
		Health       string   `json:"health"`
		Version      string   `json:"version"`
		Tokenize     string   `json:"tokenize"`
		Metrics      string   `json:"metrics"`
		MetricsOptIn string   `json:"metrics_opt_in"`
		Models       string   `json:"models"`
		Source       []Source `json:"source"`
	} `json:"surfaces"`
	// VersionBody is what the version endpoint answers; Version what
	// ParseVersion must read from it.
	VersionBody json.RawMessage `json:"version_body"`
	Version     string          `json:"version"`
	Classify    []struct {
		Status int    `json:"status"`
		Fault  string `json:"fault"`
		Why    string `json:"why"`
	} `json:"classify"`
	ClassifySource []Source `json:"classify_source"`
	KV             *struct {
		Transport   string   `json:"transport"`
		HashAlgo    string   `json:"hash_algo"`
		BlockSize   int      `json:"block_size"`
		ZMQPort     int      `json:"zmq_port"`
		Replay      int      `json:"replay_offset"`
		PollPath    string   `json:"poll_path"`
		Destructive bool     `json:"destructive"`
		Source      []Source `json:"source"`
		Notes       []string `json:"notes"`
	} `json:"kv"`
	NotEstablished []string `json:"not_established"`
}

// Load reads testdata/adapter.json of the package under test.
func Load(t testing.TB) Facts {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "adapter.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f Facts
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("testdata/adapter.json: %v", err)
	}
	for _, group := range [][]Source{f.Conn.Source, f.Surfaces.Source, f.ClassifySource} {
		if len(group) == 0 {
			t.Fatal("testdata/adapter.json: every fact group must cite a source")
		}
	}
	return f
}

// Check compares a's facts with testdata/adapter.json and its metric names
// with the families of testdata/cases/metrics.json.
func Check(t *testing.T, a engines.Adapter) {
	t.Helper()
	f := Load(t)
	t.Run("conn", func(t *testing.T) {
		c := a.Conn()
		if want := time.Duration(f.Conn.IdleTimeoutSeconds * float64(time.Second)); c.IdleTimeout != want {
			t.Errorf("IdleTimeout: adapter %v, engine %v", c.IdleTimeout, want)
		}
		if c.CloseAfterStream != f.Conn.CloseAfterStream {
			t.Errorf("CloseAfterStream: adapter %v, engine %v", c.CloseAfterStream, f.Conn.CloseAfterStream)
		}
	})
	t.Run("surfaces", func(t *testing.T) {
		s := a.Surfaces()
		for _, c := range []struct{ name, got, want string }{
			{"Health", s.Health, f.Surfaces.Health},
			{"Version", s.Version, f.Surfaces.Version},
			{"Tokenize", s.Tokenize, f.Surfaces.Tokenize},
			{"Metrics", s.Metrics, f.Surfaces.Metrics},
			{"MetricsOptIn", s.MetricsOptIn, f.Surfaces.MetricsOptIn},
			{"Models", s.Models, f.Surfaces.Models},
		} {
			if c.got != c.want {
				t.Errorf("%s: adapter %q, engine %q", c.name, c.got, c.want)
			}
		}
	})
	t.Run("version", func(t *testing.T) {
		got, err := a.ParseVersion(f.VersionBody)
		if err != nil || got != f.Version {
			t.Errorf("ParseVersion(%s): %q, %v; want %q", f.VersionBody, got, err, f.Version)
		}
	})
	t.Run("classify", func(t *testing.T) {
		for _, c := range f.Classify {
			if got := a.Classify(c.Status, nil).String(); got != c.Fault {
				t.Errorf("Classify(%d): adapter %s, engine %s (%s)", c.Status, got, c.Fault, c.Why)
			}
		}
	})
	t.Run("kv", func(t *testing.T) {
		kv := a.KV()
		if f.KV == nil {
			if kv != nil {
				t.Errorf("KV: adapter states a contract, the engine publishes no KV events")
			}
			return
		}
		if kv == nil {
			t.Fatal("KV: adapter states none")
		}
		transport := map[engines.EventTransport]string{engines.EventsNone: "none", engines.EventsZMQ: "zmq", engines.EventsHTTPPoll: "http_poll"}[kv.Transport]
		for _, c := range []struct {
			name      string
			got, want any
		}{
			{"Transport", transport, f.KV.Transport},
			{"HashAlgo", kv.HashAlgo, f.KV.HashAlgo},
			{"BlockSize", kv.BlockSize, f.KV.BlockSize},
			{"ZMQPort", kv.ZMQPort, f.KV.ZMQPort},
			{"ReplayOffset", kv.ReplayOffset, f.KV.Replay},
			{"PollPath", kv.PollPath, f.KV.PollPath},
			{"Destructive", kv.Destructive, f.KV.Destructive},
		} {
			if fmt.Sprint(c.got) != fmt.Sprint(c.want) {
				t.Errorf("KV.%s: adapter %v, engine %v", c.name, c.got, c.want)
			}
		}
	})
	t.Run("metrics", func(t *testing.T) {
		families := metricFamilies(t)
		m := a.Metrics()
		for _, c := range []struct{ name, series, typ string }{
			{"Requests", m.Requests, "counter"},
			{"PromptTokens", m.PromptTokens, "counter"},
			{"PrefixQueries", m.PrefixQueries, "counter"},
			{"PrefixHits", m.PrefixHits, "counter"},
			{"RunningRequests", m.RunningRequests, "gauge"},
			{"WaitingRequests", m.WaitingRequests, "gauge"},
		} {
			if c.series == "" {
				continue
			}
			typ, ok := families[c.series]
			if !ok {
				t.Errorf("Metrics.%s: %q is not a family of the engine's metrics fixture", c.name, c.series)
				continue
			}
			if typ != c.typ {
				t.Errorf("Metrics.%s: %q is a %s, want a %s", c.name, c.series, typ, c.typ)
			}
		}
	})
}

// metricFamilies reads the families of testdata/cases/metrics.json.
func metricFamilies(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "cases", "metrics.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Response struct {
			Prometheus struct {
				Families []struct{ Name, Type string } `json:"families"`
			} `json:"prometheus"`
		} `json:"response"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("testdata/cases/metrics.json: %v", err)
	}
	out := map[string]string{}
	for _, f := range c.Response.Prometheus.Families {
		out[f.Name] = f.Type
	}
	return out
}
