package gateway

import (
	"fmt"
	"sort"
	"strings"
	"sync"
)

// KV-exact effectiveness over a recent window, and the degraded mark.
//
// A KV-exact rule keeps the outcomes of its last kvWindowSize decisions
// (hit, or the miss reason) and of its last kvWindowSize self-checked
// responses (agree, mismatch; neutral ones, where neither side saw a cached
// token or the engine reported none, are not kept). It is degraded, a
// warning and not an outage (it stays ready and keeps serving by its
// fallback policy), while either
//
//   - kv_tokenize: the window holds at least kvDegradeMinSamples decisions
//     and at least kvDegradeShare of them failed to tokenize (any
//     "tokenize*" miss reason), or
//   - kv_parity: the window holds at least kvDegradeMinSamples checked
//     responses and at least kvDegradeShare of them mismatched (the engine
//     reused a different number of cached tokens than predicted), or the
//     self-check's streak raised parity_broken (parityThreshold clear
//     mismatches in a row with no agreement).
//
// docs/admin-api.md states the same thresholds.
const (
	kvWindowSize        = 100
	kvDegradeMinSamples = 10
	kvDegradeShare      = 0.5
)

// Degradation causes: the keys of RuleLiveStatus.DegradedCauses and the
// cause label of llmgw_rule_degraded.
const (
	degradedKVTokenize = "kv_tokenize"
	degradedKVParity   = "kv_parity"
)

var kvDegradeCauses = []string{degradedKVTokenize, degradedKVParity}

// kvOutcomes are the decision outcomes the window counts: "hit" and every
// miss reason route and decide give (see llmgw_kv_misses_total).
var kvOutcomes = []string{"hit", "tokenize", "tokenize_timeout", "tokenize_engine", "tokenize_no_worker", "short", "no_match", "not_ready", "overloaded", "spill", "partial"}

var kvOutcomeIndex = func() map[string]uint8 {
	m := make(map[string]uint8, len(kvOutcomes))
	for i, o := range kvOutcomes {
		m[o] = uint8(i)
	}
	return m
}()

// ring counts the last kvWindowSize values of a small alphabet.
type ring struct {
	vals   [kvWindowSize]uint8
	n      int // values held, up to kvWindowSize
	next   int
	counts []int // by value
}

func (r *ring) add(v uint8) {
	if r.n == kvWindowSize {
		r.counts[r.vals[r.next]]--
	} else {
		r.n++
	}
	r.vals[r.next] = v
	r.counts[v]++
	r.next = (r.next + 1) % kvWindowSize
}

// kvHealth is a rule's window. Safe for concurrent use.
type kvHealth struct {
	mu        sync.Mutex
	decisions ring // by kvOutcomes index
	parity    ring // 0 agree, 1 mismatch
}

func newKVHealth() *kvHealth {
	return &kvHealth{decisions: ring{counts: make([]int, len(kvOutcomes))}, parity: ring{counts: make([]int, 2)}}
}

// decision records one KV-exact decision.
func (h *kvHealth) decision(c *kvChoice) {
	o := "hit"
	if c.ep == nil || !c.hit {
		o = c.reason
	}
	i, ok := kvOutcomeIndex[o]
	if !ok {
		return // a reason this window does not know is a bug caught by TestKVWindowKnowsEveryReason
	}
	h.mu.Lock()
	h.decisions.add(i)
	h.mu.Unlock()
}

// check records one self-checked response ("agree" or "mismatch"; others
// are not kept).
func (h *kvHealth) check(outcome string) {
	var v uint8
	switch outcome {
	case "agree":
	case "mismatch":
		v = 1
	default:
		return
	}
	h.mu.Lock()
	h.parity.add(v)
	h.mu.Unlock()
}

// KVWindowStatus is a KV-exact rule's effectiveness over its recent
// decisions, as the admin API shows it.
type KVWindowStatus struct {
	// Size is the window: the last Size decisions (and, apart, checked
	// responses) are counted.
	Size      int `json:"window_size"`
	Decisions int `json:"decisions"`
	Hits      int `json:"hits"`
	// HitShare is Hits over Decisions (0 with no decision).
	HitShare float64 `json:"hit_share"`
	// Misses counts the window's other decisions by reason.
	Misses map[string]int `json:"misses"`
	// ParityChecked is the checked responses held (agree or mismatch),
	// ParityMismatches those that mismatched.
	ParityChecked    int `json:"parity_checked"`
	ParityMismatches int `json:"parity_mismatches"`
}

func (h *kvHealth) status() KVWindowStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := KVWindowStatus{Size: kvWindowSize, Decisions: h.decisions.n, Hits: h.decisions.counts[0], Misses: map[string]int{},
		ParityChecked: h.parity.n, ParityMismatches: h.parity.counts[1]}
	for i, n := range h.decisions.counts[1:] {
		if n > 0 {
			st.Misses[kvOutcomes[i+1]] = n
		}
	}
	if st.Decisions > 0 {
		st.HitShare = float64(st.Hits) / float64(st.Decisions)
	}
	return st
}

// degraded returns the rule's degradation causes with a sentence each
// (empty when it is not degraded), from its window and its parity state.
func degraded(w KVWindowStatus, p ParityStatus) map[string]string {
	out := map[string]string{}
	tok := 0
	var reasons []string
	for r, n := range w.Misses {
		if strings.HasPrefix(r, "tokenize") {
			tok += n
			reasons = append(reasons, fmt.Sprintf("%s %d", r, n))
		}
	}
	sort.Strings(reasons)
	if w.Decisions >= kvDegradeMinSamples && float64(tok) >= kvDegradeShare*float64(w.Decisions) {
		out[degradedKVTokenize] = fmt.Sprintf("%d of the last %d KV-exact decisions could not tokenize the prompt (%s) and fell back to the rule's policy", tok, w.Decisions, strings.Join(reasons, ", "))
	}
	last := ""
	if p.LastDetail != "" {
		last = " (last: " + p.LastDetail + ")"
	}
	switch {
	case w.ParityChecked >= kvDegradeMinSamples && float64(w.ParityMismatches) >= kvDegradeShare*float64(w.ParityChecked):
		out[degradedKVParity] = fmt.Sprintf("%d of the last %d self-checked responses disagreed with the predicted cached tokens%s", w.ParityMismatches, w.ParityChecked, last)
	case p.Broken:
		out[degradedKVParity] = fmt.Sprintf("%d self-checked responses in a row disagreed with the predicted cached tokens%s", p.Streak, last)
	}
	return out
}

// degradedText joins causes into the one sentence of
// RuleLiveStatus.Degraded, in a fixed order.
func degradedText(causes map[string]string) string {
	var parts []string
	for _, c := range kvDegradeCauses {
		if s, ok := causes[c]; ok {
			parts = append(parts, c+": "+s)
		}
	}
	return strings.Join(parts, "; ")
}

// degradedRules maps each degraded rule to its Degraded sentence (/readyz).
func degradedRules(rules []*RuleStatus) map[string]string {
	d := map[string]string{}
	for _, st := range rules {
		if st.Status.Degraded != "" {
			d[st.Rule.Name] = st.Status.Degraded
		}
	}
	return d
}
