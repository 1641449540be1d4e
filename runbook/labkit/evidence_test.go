package labkit

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/engines"
	_ "github.com/llmgw/llmgw/engines/all"
	"github.com/llmgw/llmgw/runbook"
)

func TestParseCounter(t *testing.T) {
	cases := []struct {
		name, body, series string
		want               float64
		found, err         bool
	}{
		{"labelled samples summed", "# HELP x\nvllm:request_success_total{finished_reason=\"stop\"} 2\nvllm:request_success_total{finished_reason=\"length\"} 3\n", "vllm:request_success_total", 5, true, false},
		{"bare sample", "llamacpp:prompt_tokens_total 29\n", "llamacpp:prompt_tokens_total", 29, true, false},
		{"longer name sharing the prefix is not it", "llamacpp:prompt_tokens_total_x 7\n", "llamacpp:prompt_tokens_total", 0, false, false},
		{"absent", "other 1\n", "x_total", 0, false, false},
		{"bad value", "x_total{a=\"b\"} abc\n", "x_total", 0, false, true},
		{"NaN refused", "x_total NaN\n", "x_total", 0, false, true},
		{"unterminated labels", "x_total{a=\"b\" 1\n", "x_total", 0, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, found, err := ParseCounter([]byte(tc.body), tc.series)
			if (err != nil) != tc.err || found != tc.found || v != tc.want {
				t.Errorf("ParseCounter = %v, %v, %v; want %v, %v, err %v", v, found, err, tc.want, tc.found, tc.err)
			}
		})
	}
}

func TestParseDecisions(t *testing.T) {
	cases := []struct {
		name, body string
		want       map[string]string
		err        bool
	}{
		{"list", `{"decisions":[{"request_id":"a","endpoint":"w1"},{"request_id":"b","endpoint":"w2"}]}`, map[string]string{"a": "w1", "b": "w2"}, false},
		{"empty list", `{"decisions":[]}`, map[string]string{}, false},
		{"no list", `{}`, nil, true},
		{"null", `null`, nil, true},
		{"not json", `<html>`, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDecisions([]byte(tc.body))
			if (err != nil) != tc.err || len(got) != len(tc.want) {
				t.Fatalf("ParseDecisions = %v, %v; want %v (err %v)", got, err, tc.want, tc.err)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("decision %s = %q; want %q", k, got[k], v)
				}
			}
		})
	}
}

// TestChooseWitness: the source is picked from what the worker serves, and a
// worker serving none is refused with the flag that would give one.
func TestChooseWitness(t *testing.T) {
	cases := []struct {
		name, engine string
		// serve maps path → body (200); other paths answer 501 as
		// llama-server's disabled /metrics does.
		serve      map[string]string
		wantSource string
		wantCode   string
	}{
		{"receipts first", "vllm", map[string]string{"/_sim/receipts": "[]", "/metrics": "vllm:request_success_total 0\n"}, SourceReceipts, ""},
		{"vllm metrics", "vllm", map[string]string{"/metrics": "vllm:request_success_total{finished_reason=\"stop\"} 4\n"}, SourceMetrics + " vllm:request_success_total", ""},
		{"llama.cpp slots without --metrics", "llamacpp", map[string]string{"/slots": `[{"id":0,"id_task":-1},{"id":1,"id_task":7}]`}, SourceSlots + " /slots", ""},
		{"llama.cpp with neither", "llamacpp", nil, "", "engine_metrics_disabled"},
		{"metrics without the counter", "sglang", map[string]string{"/metrics": "sglang:num_running_reqs 0\n"}, "", "engine_metrics_disabled"},
		{"receipt log that is not a list", "trtllm", map[string]string{"/_sim/receipts": "null"}, "", "no_evidence_source"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, ok := tc.serve[r.URL.Path]
				if !ok {
					w.WriteHeader(http.StatusNotImplemented)
					return
				}
				_, _ = w.Write([]byte(b))
			}))
			defer srv.Close()
			a, err := engines.For(engines.Kind(tc.engine))
			if err != nil {
				t.Fatal(err)
			}
			w := runbook.Worker{ID: "w1", HTTP: strings.TrimPrefix(srv.URL, "http://")}
			wt, err := ChooseWitness(t.Context(), srv.Client(), w, a)
			if tc.wantCode != "" {
				var ne *NoEvidenceError
				if !errors.As(err, &ne) || ne.Code != tc.wantCode || !errors.Is(err, ErrNoEvidence) {
					t.Fatalf("ChooseWitness error = %v; want code %s", err, tc.wantCode)
				}
				if tc.wantCode == "engine_metrics_disabled" && !strings.Contains(err.Error(), "start ") {
					t.Errorf("error %q does not say how to start the engine", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if wt.Source() != tc.wantSource {
				t.Errorf("source = %q; want %q", wt.Source(), tc.wantSource)
			}
		})
	}
}

func FuzzParseCounter(f *testing.F) {
	f.Add([]byte("x_total{a=\"b\"} 1\nx_total 2\n"), "x_total")
	f.Add([]byte("# TYPE x counter\nx 1e3\n"), "x")
	f.Fuzz(func(t *testing.T, body []byte, name string) {
		if name == "" {
			return
		}
		v, found, err := ParseCounter(body, name)
		if err != nil && (found || v != 0) {
			t.Fatalf("error with a value: %v %v %v", v, found, err)
		}
	})
}

func FuzzParseDecisions(f *testing.F) {
	f.Add([]byte(`{"decisions":[{"request_id":"a","endpoint":"w1"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := ParseDecisions(b); err != nil && m != nil {
			t.Fatal("map with an error")
		}
	})
}

// TestRecordVersions: the workers' own version stands beside the catalog's;
// a mismatch on real workers fails unless accepted, on simulators it is
// recorded and never refused.
func TestRecordVersions(t *testing.T) {
	cases := []struct {
		name              string
		version           string // what /version answers ("" → 404)
		simulated, accept bool
		wantOK, mismatch  bool
		wantCode          string
	}{
		{"same", "0.31.0", false, false, true, false, ""},
		{"mismatch refused", "0.30.1", false, false, false, true, "ENGINE_VERSION_MISMATCH"},
		{"mismatch accepted", "0.30.1", false, true, true, true, ""},
		{"simulated persona", "0.26.0", true, false, true, true, ""},
		{"no version endpoint answer", "", false, false, true, false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/version" || tc.version == "" {
					http.NotFound(w, r)
					return
				}
				_, _ = w.Write([]byte(`{"version":"` + tc.version + `"}`))
			}))
			defer srv.Close()
			a, err := engines.For(engines.VLLM)
			if err != nil {
				t.Fatal(err)
			}
			ws := []runbook.Worker{{ID: "w1", HTTP: strings.TrimPrefix(srv.URL, "http://")}, {ID: "w2", HTTP: strings.TrimPrefix(srv.URL, "http://")}}
			vc, out, ok := RecordVersions(t.Context(), &runbook.Run{}, srv.Client(), ws, a, "0.31.0", tc.simulated, tc.accept)
			if ok != tc.wantOK || vc.Mismatch != tc.mismatch || out.Code != tc.wantCode {
				t.Fatalf("ok %v mismatch %v code %q; want %v %v %q (%+v)", ok, vc.Mismatch, out.Code, tc.wantOK, tc.mismatch, tc.wantCode, vc)
			}
			if tc.version != "" && vc.Joined() != tc.version {
				t.Errorf("reported %q; want %q", vc.Joined(), tc.version)
			}
		})
	}
}
