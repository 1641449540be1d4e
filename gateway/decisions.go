package gateway

import (
	"sync"
	"time"
)

// Decision is one recorded routing decision (GET /v1/decisions).
type Decision struct {
	Time      time.Time `json:"time"`
	RequestID string    `json:"request_id"`
	Rule      string    `json:"rule"`
	Endpoint  string    `json:"endpoint"`
	Reason    string    `json:"reason"`
	// Leg is the P/D leg ("prefill", "decode") the decision chose an
	// endpoint for; empty on single-pool rules.
	Leg   string `json:"leg,omitempty"`
	Spill int    `json:"spill,omitempty"`
	// MatchedBlocks and TotalBlocks are the prompt's blocks the endpoint
	// the request went to already held, and the prompt's full blocks; Hit
	// says whether that reaches the rule's kvHitMinShare (KV-exact rules
	// only, for every decision: a fallback's endpoint too).
	MatchedBlocks *int  `json:"matched_blocks,omitempty"`
	TotalBlocks   *int  `json:"total_blocks,omitempty"`
	Hit           *bool `json:"hit,omitempty"`
	// TotalBlocksAtLeast: TotalBlocks is a lower bound. The prompt was
	// tokenized only up to the first block no endpoint held and the rest
	// counted; the decision is the one its full count gives.
	TotalBlocksAtLeast bool `json:"total_blocks_at_least,omitempty"`
}

// decisionLog keeps the most recent decisions in a fixed ring, so recording
// costs no allocation beyond the request id copy into a fixed array.
type decisionLog struct {
	mu   sync.Mutex
	ring []decisionSlot
	next uint64
}

type decisionSlot struct {
	at       int64
	rule     string
	endpoint string
	reason   string
	leg      string
	spill    int
	kv       bool
	hit      bool
	matched  int
	total    int
	atLeast  bool
	idLen    uint8
	id       [255]byte
}

func newDecisionLog(n int) *decisionLog { return &decisionLog{ring: make([]decisionSlot, n)} }

// add records one decision; kv is nil for non-KV rules.
func (l *decisionLog) add(rule, endpoint, reason string, id []byte, spill int, kv *kvChoice, epChosen string) {
	l.addLeg(rule, "", endpoint, reason, id, spill, kv, epChosen)
}

// addLeg records one decision of a P/D leg (leg "prefill" or "decode").
func (l *decisionLog) addLeg(rule, leg, endpoint, reason string, id []byte, spill int, kv *kvChoice, epChosen string) {
	l.addAt(time.Now().UnixNano(), rule, leg, endpoint, reason, id, spill, kv, epChosen)
}

// addAt records one decision made at unix nanoseconds now.
func (l *decisionLog) addAt(now int64, rule, leg, endpoint, reason string, id []byte, spill int, kv *kvChoice, epChosen string) {
	l.mu.Lock()
	sl := &l.ring[l.next%uint64(len(l.ring))]
	l.next++
	sl.at, sl.rule, sl.endpoint, sl.reason, sl.leg, sl.spill = now, rule, endpoint, reason, leg, spill
	sl.kv = kv != nil
	if kv != nil {
		sl.matched, sl.total, sl.atLeast = kv.matchedOn(epChosen), kv.total, kv.totalAtLeast
		sl.hit = kv.isHit(sl.matched)
	}
	sl.idLen = uint8(copy(sl.id[:], id))
	l.mu.Unlock()
}

// list returns the recorded decisions, oldest first, filtered by rule ("" =
// all) and time (zero = all).
func (l *decisionLog) list(rule string, since time.Time) []Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := uint64(len(l.ring))
	start := uint64(0)
	if l.next > n {
		start = l.next - n
	}
	out := []Decision{}
	for i := start; i < l.next; i++ {
		sl := &l.ring[i%n]
		if rule != "" && sl.rule != rule {
			continue
		}
		t := time.Unix(0, sl.at)
		if !since.IsZero() && t.Before(since) {
			continue
		}
		d := Decision{Time: t, RequestID: string(sl.id[:sl.idLen]), Rule: sl.rule, Endpoint: sl.endpoint, Reason: sl.reason, Leg: sl.leg, Spill: sl.spill}
		if sl.kv {
			m, tot, hit := sl.matched, sl.total, sl.hit
			d.MatchedBlocks, d.TotalBlocks, d.Hit = &m, &tot, &hit
			d.TotalBlocksAtLeast = sl.atLeast
		}
		out = append(out, d)
	}
	return out
}
