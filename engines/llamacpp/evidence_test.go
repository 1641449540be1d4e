package llamacpp

import "testing"

func TestCachedTokens(t *testing.T) {
	cases := []struct {
		name, body string
		want       int
		ok         bool
	}{
		{"timings cache_n", `{"timings":{"cache_n":24,"prompt_n":5}}`, 24, true},
		{"openai usage wins", `{"usage":{"prompt_tokens_details":{"cached_tokens":16}},"timings":{"cache_n":24}}`, 16, true},
		// The shape this lab's llama-server (b0-unknown) answers: prompt_n only.
		{"prompt_n only", `{"timings":{"prompt_n":29,"prompt_ms":0.8}}`, 0, false},
		{"no timings", `{"usage":{"prompt_tokens":29}}`, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Adapter{}.CachedTokens([]byte(tc.body))
			if got != tc.want || ok != tc.ok {
				t.Errorf("CachedTokens = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func FuzzCachedTokens(f *testing.F) {
	f.Add([]byte(`{"timings":{"cache_n":24,"prompt_n":5}}`))
	f.Add([]byte(`{"timings":{"prompt_n":29}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, ok := (Adapter{}).CachedTokens(b); !ok && n != 0 {
			t.Fatalf("no report but n=%d", n)
		}
	})
}
