// Package suggest finds the name a user most likely meant: the one "did
// you mean …?" messages name for a misspelled rule field or config key.
package suggest

import "strings"

// Closest returns the name in names that key was most likely meant to be:
// one that differs only in case, '_' or '-', or else the closest within a
// small edit distance (a third of the shorter normalised name, at least 1),
// ties broken by name. It returns "" when nothing is close.
func Closest(key string, names []string) string {
	nk := norm(key)
	best, bestDist := "", -1
	for _, name := range names {
		nn := norm(name)
		if nn == nk {
			return name
		}
		limit := max(1, min(len(nk), len(nn))/3)
		if d := Distance(nk, nn); d <= limit && (bestDist < 0 || d < bestDist || (d == bestDist && name < best)) {
			best, bestDist = name, d
		}
	}
	return best
}

func norm(s string) string {
	return strings.ToLower(strings.NewReplacer("_", "", "-", "").Replace(s))
}

// Distance is the Levenshtein distance between a and b, in bytes. Names
// are short: inputs over 64 bytes are "far" without being compared, so a
// hostile key costs nothing.
func Distance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 30
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
