package profiles

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/llmgw/llmgw/internal/golden"
)

func mustLoad(t *testing.T) *Catalog {
	t.Helper()
	c, err := Load()
	if err != nil {
		t.Fatalf("Load() error = %v", err)
	}
	return c
}

func TestEmbeddedCatalogLoads(t *testing.T) {
	c := mustLoad(t)
	wantIDs := []string{"exaone-3.5-7.8b-instruct", "gemma-2-9b-it", "llama-3.1-8b-instruct", "qwen2.5-7b-instruct", "qwen3-0.6b"}
	if got := c.IDs(); !slices.Equal(got, wantIDs) {
		t.Fatalf("IDs() = %v; want %v", got, wantIDs)
	}
	for _, p := range c.Profiles() {
		t.Run(p.ID, func(t *testing.T) {
			if err := p.Validate(); err != nil {
				t.Errorf("Validate() = %v; want nil", err)
			}
			for _, e := range Engines() {
				l, err := p.Launch(e)
				if _, _, blocked := c.Blocked(e, p.ID); blocked {
					if !errors.Is(err, ErrBlocked) {
						t.Errorf("Launch(%s) error = %v; want ErrBlocked", e, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("Launch(%s) error = %v", e, err)
				}
				v, _ := c.Versions().For(e)
				if l.Engine != e || l.Image != v.Image {
					t.Errorf("Launch(%s) engine, image = %q, %q; want %q, %q", e, l.Engine, l.Image, e, v.Image)
				}
			}
			// The golden is the normalized profile as Launch and Get expose it.
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			enc.SetIndent("", "  ")
			if err := enc.Encode(p); err != nil {
				t.Fatal(err)
			}
			golden.File(t, p.ID+".json", buf.Bytes())
		})
	}
}

func TestVersionTuple(t *testing.T) {
	c := mustLoad(t)
	tests := []struct {
		engine, version, backend string
	}{
		{"vllm", "0.31.0", ""},
		{"sglang", "0.5.19", ""},
		{"trtllm", "1.3.0rc29", "pytorch"},
		{"llamacpp", "b0-unknown", ""},
	}
	for _, tc := range tests {
		t.Run(tc.engine, func(t *testing.T) {
			v, err := c.Versions().For(tc.engine)
			if err != nil {
				t.Fatal(err)
			}
			if v.Version != tc.version || v.Backend != tc.backend {
				t.Errorf("Versions().For(%s) = %q/%q; want %q/%q", tc.engine, v.Version, v.Backend, tc.version, tc.backend)
			}
		})
	}
	if _, err := c.Versions().For("tgi"); !errors.Is(err, ErrUnknownEngine) {
		t.Errorf("For(tgi) error = %v; want ErrUnknownEngine", err)
	}
	if got := c.KVHashSeed(); got != "0" {
		t.Errorf("KVHashSeed() = %q; want \"0\"", got)
	}
}

func TestBlockedCatalogue(t *testing.T) {
	c := mustLoad(t)
	want := []BlockedTuple{
		{Engine: "trtllm", Profile: "exaone-3.5-7.8b-instruct", Code: "architecture_unsupported"},
		{Engine: "trtllm", Profile: "gemma-2-9b-it", Code: "architecture_unsupported"},
	}
	got := c.BlockedTuples()
	if len(got) != len(want) {
		t.Fatalf("BlockedTuples() = %+v; want %d tuples", got, len(want))
	}
	for i := range want {
		if got[i].Engine != want[i].Engine || got[i].Profile != want[i].Profile || got[i].Code != want[i].Code || got[i].Detail == "" {
			t.Errorf("BlockedTuples()[%d] = %+v; want %+v with a detail", i, got[i], want[i])
		}
	}
	// The reference baseline: 5 profiles x 3 KV engines x {RR, Exact} = 30
	// cases, 4 BLOCKED.
	blockedCases := 0
	for _, p := range c.IDs() {
		for _, e := range []string{"vllm", "sglang", "trtllm"} {
			if _, _, b := c.Blocked(e, p); b {
				blockedCases += 2
			}
		}
	}
	if blockedCases != 4 {
		t.Errorf("blocked RR/Exact cases = %d; want 4", blockedCases)
	}
	tests := []struct {
		name, engine, profile string
		wantCode              string
		wantBlocked           bool
	}{
		{"trtllm gemma", "trtllm", "gemma-2-9b-it", "architecture_unsupported", true},
		{"trtllm exaone", "trtllm", "exaone-3.5-7.8b-instruct", "architecture_unsupported", true},
		{"trtllm qwen3", "trtllm", "qwen3-0.6b", "", false},
		{"vllm gemma", "vllm", "gemma-2-9b-it", "", false},
		{"unknown profile", "trtllm", "nope", "", false},
		{"unknown engine", "tgi", "gemma-2-9b-it", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, blocked := c.Blocked(tc.engine, tc.profile)
			if code != tc.wantCode || blocked != tc.wantBlocked {
				t.Errorf("Blocked(%s, %s) = %q, %v; want %q, %v", tc.engine, tc.profile, code, blocked, tc.wantCode, tc.wantBlocked)
			}
		})
	}
}

func TestGetUnknownListsValidIDs(t *testing.T) {
	c := mustLoad(t)
	_, err := c.Get("qwen4")
	if !errors.Is(err, ErrUnknownProfile) {
		t.Fatalf("Get(qwen4) error = %v; want ErrUnknownProfile", err)
	}
	for _, id := range c.IDs() {
		if !strings.Contains(err.Error(), id) {
			t.Errorf("Get(qwen4) error %q does not list %q", err, id)
		}
	}
	p, err := c.Get("qwen3-0.6b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Launch("tgi"); !errors.Is(err, ErrUnknownEngine) || !strings.Contains(err.Error(), "llamacpp") {
		t.Errorf("Launch(tgi) error = %v; want ErrUnknownEngine listing the engines", err)
	}
}

func TestProfileEngine(t *testing.T) {
	c := mustLoad(t)
	p, _ := c.Get("gemma-2-9b-it")
	tests := []struct {
		engine        string
		wantBlockSize int
		wantAlgo      string
		wantBlocked   bool
		wantErr       error
	}{
		{"vllm", 16, "sha256_cbor", false, nil},
		{"sglang", 16, "sha256_sglang", false, nil},
		{"trtllm", 32, "blockhash_trtllm", true, nil},
		{"llamacpp", 0, "none", false, nil},
		{"tgi", 0, "", false, ErrUnknownEngine},
	}
	for _, tc := range tests {
		t.Run(tc.engine, func(t *testing.T) {
			es, err := p.Engine(tc.engine)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Engine(%s) error = %v; want %v", tc.engine, err, tc.wantErr)
			}
			if es.BlockSize != tc.wantBlockSize || es.HashAlgo != tc.wantAlgo || (es.Blocked != nil) != tc.wantBlocked {
				t.Errorf("Engine(%s) = %d/%s blocked %v; want %d/%s blocked %v", tc.engine, es.BlockSize, es.HashAlgo, es.Blocked != nil, tc.wantBlockSize, tc.wantAlgo, tc.wantBlocked)
			}
		})
	}
}

func TestProfilesAreCopies(t *testing.T) {
	c := mustLoad(t)
	p, _ := c.Get("qwen3-0.6b")
	p.Engines["vllm"].Launch.Env["PYTHONHASHSEED"] = "42"
	p.Engines["vllm"].Launch.Args[0] = "changed"
	again, _ := c.Get("qwen3-0.6b")
	l, _ := again.Launch("vllm")
	if l.Env["PYTHONHASHSEED"] != "0" || l.Args[0] == "changed" {
		t.Errorf("mutating a returned profile changed the catalog: env %q, args[0] %q", l.Env["PYTHONHASHSEED"], l.Args[0])
	}
}

func TestLaunchSpecsCarryTheContractFlags(t *testing.T) {
	c := mustLoad(t)
	p, _ := c.Get("llama-3.1-8b-instruct")
	tests := []struct {
		engine string
		flag   string
		want   string
	}{
		{"vllm", "--block-size", "16"},
		{"vllm", "--prefix-caching-hash-algo", "sha256_cbor"},
		{"sglang", "--page-size", "16"},
		{"trtllm", "--backend", "pytorch"},
		{"llamacpp", "--port", "8085"},
	}
	for _, tc := range tests {
		t.Run(tc.engine+" "+tc.flag, func(t *testing.T) {
			l, err := p.Launch(tc.engine)
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := argValue(l.Args, tc.flag); got != tc.want {
				t.Errorf("%s %s = %q; want %q", tc.engine, tc.flag, got, tc.want)
			}
		})
	}
	l, _ := p.Launch("vllm")
	var ec eventsConfig
	raw, _ := argValue(l.Args, "--kv-events-config")
	if err := json.Unmarshal([]byte(raw), &ec); err != nil {
		t.Fatal(err)
	}
	if ec.Publisher != "zmq" || ec.Endpoint != "tcp://*:5557" || ec.ReplayEndpoint == nil || *ec.ReplayEndpoint != "tcp://*:5558" {
		t.Errorf("vLLM events config = %+v; want zmq on tcp://*:5557 with replay on tcp://*:5558", ec)
	}
}

// catalogFS returns the embedded catalog as a writable map FS so a test can
// break one file.
func catalogFS(t *testing.T) fstest.MapFS {
	t.Helper()
	sub, err := fs.Sub(embedded, "catalog")
	if err != nil {
		t.Fatal(err)
	}
	m := fstest.MapFS{}
	err = fs.WalkDir(sub, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(sub, p)
		m[p] = &fstest.MapFile{Data: data}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestBrokenProfiles(t *testing.T) {
	const gemma = "profiles/gemma-2-9b-it.yaml"
	const qwen = "profiles/qwen3-0.6b.yaml"
	tests := []struct {
		name    string
		file    string
		old     string // text replaced once in file
		new     string
		wantErr string
	}{
		{"unknown field", gemma, "gated: true", "gated: true\n  gatted: true", "field gatted not found"},
		{"repeated key", qwen, "api_mode: completions", "api_mode: completions\napi_mode: chat", "already defined"},
		{"bad api mode", qwen, "api_mode: completions", "api_mode: embeddings", "profiles/qwen3-0.6b.yaml: api_mode: must be"},
		{"id differs from file name", qwen, "id: qwen3-0.6b", "id: qwen3-small", "qwen3-0.6b.yaml: id: must equal the file name"},
		{"bad revision", qwen, "  revision: main\n  served_name", "  revision: v1\n  served_name", "model.revision: must be a 40-hex commit"},
		{"unknown blocked code", gemma, "code: architecture_unsupported", "code: too_big", "engines.trtllm.blocked.code: must be one of"},
		{"missing engine", qwen, "  llamacpp:\n", "  llamacppx:\n", "engines.llamacppx: unknown engine"},
		{"bad port", qwen, "- {name: http, port: 8355}", "- {name: http, port: 70000}", "engines.trtllm.launch.ports[0].port: must be in 1..65535"},
		{"two documents", qwen, "api_mode: completions", "api_mode: completions\n---\nid: x", "more than one YAML document"},
		{"catalog schema", "catalog.yaml", "schema: llmgw.profiles/v1", "schema: v0", "catalog.yaml: schema: must be"},
		{"catalog trtllm backend", "catalog.yaml", "backend: pytorch", "backend: tensorrt", "catalog.yaml: versions.trtllm.backend"},
		{"catalog unknown field", "catalog.yaml", "kv_hash_seed:", "kv_hash_sed: x\nkv_hash_seed:", "field kv_hash_sed not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := catalogFS(t)
			f, ok := m[tc.file]
			if !ok {
				t.Fatalf("no file %s in the catalog", tc.file)
			}
			src := string(f.Data)
			if !strings.Contains(src, tc.old) {
				t.Fatalf("%s does not contain %q", tc.file, tc.old)
			}
			m[tc.file] = &fstest.MapFile{Data: []byte(strings.Replace(src, tc.old, tc.new, 1))}
			_, err := LoadFS(m)
			if err == nil {
				t.Fatalf("LoadFS() = nil error; want one containing %q", tc.wantErr)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("LoadFS() error = %v; want it to wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("LoadFS() error = %q; want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestLoadFSNoProfiles(t *testing.T) {
	m := catalogFS(t)
	for k := range m {
		if strings.HasPrefix(k, "profiles/") {
			delete(m, k)
		}
	}
	if _, err := LoadFS(m); err == nil || !strings.Contains(err.Error(), "no profiles found") {
		t.Errorf("LoadFS() error = %v; want \"no profiles found\"", err)
	}
}

// FuzzLoadProfile feeds arbitrary bytes as one profile file: loading must
// return an error or a catalog that validates, never panic.
func FuzzLoadProfile(f *testing.F) {
	base := fstest.MapFS{}
	sub, _ := fs.Sub(embedded, "catalog")
	cat, _ := fs.ReadFile(sub, "catalog.yaml")
	base["catalog.yaml"] = &fstest.MapFile{Data: cat}
	for _, name := range []string{"qwen3-0.6b", "gemma-2-9b-it"} {
		data, _ := fs.ReadFile(sub, "profiles/"+name+".yaml")
		f.Add(data)
	}
	f.Add([]byte("id: [\n"))
	f.Add([]byte("engines: {vllm: {block_size: -1}}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m := fstest.MapFS{"catalog.yaml": base["catalog.yaml"], "profiles/qwen3-0.6b.yaml": &fstest.MapFile{Data: data}}
		c, err := LoadFS(m)
		if err != nil {
			return
		}
		for _, p := range c.Profiles() {
			if err := p.Validate(); err != nil {
				t.Fatalf("loaded profile fails Validate: %v", err)
			}
		}
	})
}

// BenchmarkLoad measures decoding and validating the embedded catalog (done
// once per command that needs it).
func BenchmarkLoad(b *testing.B) {
	for b.Loop() {
		if _, err := Load(); err != nil {
			b.Fatal(err)
		}
	}
}

// argValue reads "--flag value" or "--flag=value" from args.
func argValue(args []string, flag string) (string, bool) {
	for i, a := range args {
		if a == flag {
			if i+1 < len(args) {
				return args[i+1], true
			}
			return "", true
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

// eventsConfig is the part of --kv-events-config the catalog test reads.
type eventsConfig struct {
	Publisher      string  `json:"publisher"`
	Endpoint       string  `json:"endpoint"`
	ReplayEndpoint *string `json:"replay_endpoint"`
}
