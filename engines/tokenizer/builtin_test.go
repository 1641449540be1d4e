package tokenizer

import (
	"slices"
	"testing"
)

func TestBuiltinRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		text string
	}{
		{"empty", ""},
		{"word", "hello"},
		{"sentence", "The quick brown fox jumps over the lazy dog."},
		{"leading and double spaces", "  two  spaces\n\nnewlines\t"},
		{"utf8", "naïve café — 日本語 🙂"},
		{"specials", "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>"},
		{"broken special", "<|im_sta <| <|im_end"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ids := Builtin{}.Encode(nil, tc.text)
			if got := (Builtin{}).Decode(ids); got != tc.text {
				t.Errorf("Decode(Encode(%q)) = %q", tc.text, got)
			}
		})
	}
}

func TestBuiltinSpecialsAndPrefixStability(t *testing.T) {
	ids := Builtin{}.Encode(nil, "<|im_start|>user\nhi<|im_end|>")
	if ids[0] != BuiltinIMStart || ids[len(ids)-1] != BuiltinIMEnd {
		t.Fatalf("specials not recognised: %v", ids)
	}
	// A shared text prefix that ends at a word boundary gives a shared id
	// prefix: the property prefix caching depends on.
	a := Builtin{}.Encode(nil, "You are a helpful assistant. Question one")
	b := Builtin{}.Encode(nil, "You are a helpful assistant. Another question")
	common := Builtin{}.Encode(nil, "You are a helpful assistant.")
	if !slices.Equal(a[:len(common)], common) || !slices.Equal(b[:len(common)], common) {
		t.Errorf("shared prefix not preserved:\n%v\n%v\n%v", a, b, common)
	}
}

func FuzzBuiltinRoundTrip(f *testing.F) {
	f.Add("hello <|im_end|> world")
	f.Add("\xff\xfe  x")
	f.Fuzz(func(t *testing.T, s string) {
		ids := Builtin{}.Encode(nil, s)
		if got := (Builtin{}).Decode(ids); got != s {
			t.Fatalf("round trip %q -> %q", s, got)
		}
	})
}
