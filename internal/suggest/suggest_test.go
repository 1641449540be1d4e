package suggest

import "testing"

func TestClosest(t *testing.T) {
	names := []string{"listen", "admin", "state-dir", "kvExactMode", "model_name"}
	for _, tc := range []struct{ key, want string }{
		{"listne", "listen"},
		{"STATE_DIR", "state-dir"},
		{"kvexactmode", "kvExactMode"},
		{"modelname", "model_name"},
		{"colour", ""},
		{"", ""},
	} {
		if got := Closest(tc.key, names); got != tc.want {
			t.Errorf("Closest(%q) = %q; want %q", tc.key, got, tc.want)
		}
	}
}

func TestDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"abc", "abc", 0}, {"abc", "abd", 1}, {"kitten", "sitting", 3}, {"", "xyz", 3}} {
		if got := Distance(tc.a, tc.b); got != tc.want {
			t.Errorf("Distance(%q, %q) = %d; want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
