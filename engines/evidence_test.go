package engines

import "testing"

func TestParseSlotsTask(t *testing.T) {
	cases := []struct {
		name, body string
		want       int64
		err        bool
	}{
		{"fresh server", `[{"id":0,"id_task":-1},{"id":1,"id_task":-1}]`, -1, false},
		{"largest task", `[{"id":0,"id_task":3},{"id":1,"id_task":9}]`, 9, false},
		{"empty", `[]`, 0, true},
		{"missing id_task", `[{"id":0}]`, 0, true},
		{"not a list", `{"id":0,"id_task":1}`, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSlotsTask([]byte(tc.body))
			if (err != nil) != tc.err || (!tc.err && got != tc.want) {
				t.Errorf("ParseSlotsTask = %d, %v; want %d (err %v)", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestOpenAICachedTokens(t *testing.T) {
	cases := []struct {
		name, body string
		want       int
		ok         bool
	}{
		{"reported", `{"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":32}}}`, 32, true},
		{"zero is reported", `{"usage":{"prompt_tokens_details":{"cached_tokens":0}}}`, 0, true},
		{"no details", `{"usage":{"prompt_tokens":40}}`, 0, false},
		{"null details", `{"usage":{"prompt_tokens_details":null}}`, 0, false},
		{"not json", `x`, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := OpenAICachedTokens([]byte(tc.body))
			if got != tc.want || ok != tc.ok {
				t.Errorf("OpenAICachedTokens = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func FuzzParseSlotsTask(f *testing.F) {
	f.Add([]byte(`[{"id":0,"id_task":3}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := ParseSlotsTask(b); err == nil && v < -1 && len(b) < 3 {
			t.Fatalf("value %d from %q", v, b)
		}
	})
}

func FuzzOpenAICachedTokens(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens_details":{"cached_tokens":32}}}`))
	f.Add([]byte(`{"usage":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, ok := OpenAICachedTokens(b); !ok && n != 0 {
			t.Fatalf("no report but n=%d", n)
		}
	})
}
