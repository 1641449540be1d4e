package kvindex

// ReferenceSeqWindow is the forward gap the reference gateway tolerates
// without clearing (gateway-reference §8.1). llmgw's default window is 0; see
// DecideSeq.
const ReferenceSeqWindow = 64

// Reasons a sequence verdict gives. The Clear reasons are also the values of
// IngestState.LastResyncReason, together with ReasonCleared, ReasonCreated,
// ReasonMalformed, ReasonOversize and ReasonAdmission.
const (
	ReasonFirst     = "first"             // keep: the stream's first batch
	ReasonNext      = "next"              // keep: seq = last+1
	ReasonDuplicate = "duplicate"         // keep: seq = last (re-delivery)
	ReasonTolerated = "gap_window"        // keep: forward gap within the window
	ReasonGap       = "gap"               // clear: batches missing that replay did not restore
	ReasonRegress   = "regression"        // clear: seq went back (the publisher restarted)
	ReasonRestart   = "publisher_restart" // clear: after a reconnect the publisher's replay buffer did not hold the last applied batch

	ReasonCleared   = "all_blocks_cleared" // the engine cleared its cache
	ReasonCreated   = "created"            // TensorRT-LLM announced a fresh cache
	ReasonMalformed = "malformed"          // a batch that consumed a seq could not be decoded
	ReasonOversize  = "oversize"           // a TRT drain response passed the size cap
	ReasonAdmission = "admission"          // a TRT worker lost its admission
)

// SeqVerdict is the outcome of DecideSeq: keep the endpoint's inventory and
// apply the batch, or clear the inventory first.
type SeqVerdict struct {
	Keep   bool
	Reason string
}

// DecideSeq decides, for a batch with sequence number seq arriving on a
// stream whose last applied batch was last (-1 = none yet), whether the
// endpoint's inventory is still trustworthy.
//
//	last < 0                      keep   first
//	seq == last+1                 keep   next
//	seq == last                   keep   duplicate
//	seq < last                    clear  regression
//	last+1 < seq <= last+window   keep   gap_window
//	seq > last+window (and last+1) clear gap
//
// The rule is the same for the first batch after a reconnect and for live
// batches. With window = ReferenceSeqWindow it reproduces the reference's
// decision table; llmgw runs with window 0, because the subscriber has
// already asked the replay socket for every missing batch before it delivers
// one past a gap, so a gap that reaches this function is unrecoverable: the
// lost batches may hold BlockRemoved events, and keeping the inventory would
// route to blocks the engine no longer has (phantom hits), while clearing only
// costs a cold window.
//
// A regression is how a publisher restart shows up: sequence numbers restart
// at 0 per process. A restart that has already published past last by the
// time the stream reconnects cannot be told from a normal stream by sequence
// numbers alone (the wire carries no engine identity); that residual risk is
// shared by every consumer of this protocol.
func DecideSeq(last int64, seq uint64, window uint64) SeqVerdict {
	if last < 0 {
		return SeqVerdict{true, ReasonFirst}
	}
	l := uint64(last)
	switch {
	case seq == l+1:
		return SeqVerdict{true, ReasonNext}
	case seq == l:
		return SeqVerdict{true, ReasonDuplicate}
	case seq < l:
		return SeqVerdict{false, ReasonRegress}
	case seq-l <= window:
		return SeqVerdict{true, ReasonTolerated}
	}
	return SeqVerdict{false, ReasonGap}
}
