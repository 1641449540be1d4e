package kvindex

import "testing"

func TestDecideSeq(t *testing.T) {
	cases := []struct {
		name   string
		last   int64
		seq    uint64
		window uint64
		want   SeqVerdict
	}{
		{"first_batch_at_zero", -1, 0, 0, SeqVerdict{true, ReasonFirst}},
		{"first_batch_mid_stream", -1, 5000, 0, SeqVerdict{true, ReasonFirst}},
		{"in_order", 7, 8, 0, SeqVerdict{true, ReasonNext}},
		{"in_order_from_zero", 0, 1, 0, SeqVerdict{true, ReasonNext}},
		{"duplicate", 7, 7, 0, SeqVerdict{true, ReasonDuplicate}},
		{"gap_of_one", 7, 9, 0, SeqVerdict{false, ReasonGap}},
		{"large_gap", 7, 1000, 0, SeqVerdict{false, ReasonGap}},
		{"regression_to_zero", 7, 0, 0, SeqVerdict{false, ReasonRegress}},
		{"regression_by_one", 7, 6, 0, SeqVerdict{false, ReasonRegress}},
		// The reference's table: keep iff last <= seq <= last+64.
		{"reference_gap_inside_window", 7, 9, ReferenceSeqWindow, SeqVerdict{true, ReasonTolerated}},
		{"reference_gap_at_window_edge", 7, 7 + 64, ReferenceSeqWindow, SeqVerdict{true, ReasonTolerated}},
		{"reference_gap_past_window", 7, 7 + 65, ReferenceSeqWindow, SeqVerdict{false, ReasonGap}},
		{"reference_regression", 7, 3, ReferenceSeqWindow, SeqVerdict{false, ReasonRegress}},
		{"reference_duplicate", 7, 7, ReferenceSeqWindow, SeqVerdict{true, ReasonDuplicate}},
		{"huge_seq_is_a_gap", 7, 1<<64 - 1, ReferenceSeqWindow, SeqVerdict{false, ReasonGap}},
		{"window_does_not_overflow", 1<<63 - 1, 1<<64 - 1, 1<<64 - 1, SeqVerdict{true, ReasonTolerated}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := DecideSeq(tc.last, tc.seq, tc.window); got != tc.want {
				t.Errorf("DecideSeq(%d, %d, %d): got %+v, want %+v", tc.last, tc.seq, tc.window, got, tc.want)
			}
		})
	}
}
