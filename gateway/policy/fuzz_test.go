package policy

import (
	"errors"
	"testing"
)

// FuzzPick feeds arbitrary request fields, exclusions and availability to
// every policy and checks the contract: an endpoint is returned iff one is
// eligible, it is eligible, the reason belongs to the policy, and a repeated
// pick of a session or key on unchanged state answers the same.
func FuzzPick(f *testing.F) {
	f.Add(uint8(0), uint64(0), false, uint64(0), false, []byte(nil), uint8(255), uint8(0))
	f.Add(uint8(3), uint64(1), true, uint64(2), true, []byte("user-1"), uint8(0), uint8(0b0101))
	f.Add(uint8(4), uint64(1<<63), true, uint64(0), false, []byte{0, 0xff}, uint8(2), uint8(0b1111))
	f.Add(uint8(5), ^uint64(0), true, uint64(7), false, []byte(""), uint8(1), uint8(0b0010))
	f.Fuzz(func(t *testing.T, selIdx uint8, key uint64, hasKey bool, conv uint64, hasConv bool, sess []byte, exclude, drain uint8) {
		sel := allSels[int(selIdx)%len(allSels)]
		eps := testEndpoints(0, 3, 1, 2, 1)
		for i, e := range eps {
			e.SetDraining(drain&(1<<i) != 0)
		}
		p := mustNew(t, Config{Sel: sel, SessionCap: 8}, eps)
		req := &Request{KeyHash: key, HasKey: hasKey, ConvHash: conv, HasConv: hasConv, Session: sess}
		if int(exclude) < len(eps) {
			req.Exclude = eps[exclude]
		}
		anyEligible := false
		for _, e := range eps {
			anyEligible = anyEligible || eligible(e, req.Exclude)
		}
		d, err := p.Pick(req)
		if !anyEligible {
			if !errors.Is(err, ErrNoEndpoint) || d.Endpoint != nil {
				t.Fatalf("nothing eligible: Pick = %+v, %v; want ErrNoEndpoint", d, err)
			}
			return
		}
		if err != nil || d.Endpoint == nil {
			t.Fatalf("Pick = %+v, %v; want an endpoint", d, err)
		}
		if !eligible(d.Endpoint, req.Exclude) {
			t.Fatalf("Pick chose ineligible %s", d.Endpoint.ID)
		}
		valid := map[int][]Reason{
			0:  {ReasonRoundRobin},
			2:  {ReasonWeighted},
			3:  {ReasonSessionNew, ReasonSessionNoKey},
			4:  {ReasonLeastInFlight},
			8:  {ReasonCHWBLHome, ReasonCHWBLSpill, ReasonCHWBLNoKey},
			10: {ReasonCHWBLHome, ReasonCHWBLSpill, ReasonCHWBLNoKey},
		}[sel]
		ok := false
		for _, r := range valid {
			ok = ok || r == d.Reason
		}
		if !ok {
			t.Fatalf("sel %d reason %v; want one of %v", sel, d.Reason, valid)
		}
		switch {
		case sel == 3 && len(sess) > 0:
			again, err := p.Pick(req)
			if err != nil || again.Endpoint != d.Endpoint || again.Reason != ReasonSessionBound {
				t.Fatalf("session repeat = %+v, %v; want %s (session-bound)", again, err, d.Endpoint.ID)
			}
		case (sel == 8 || sel == 10) && (hasKey || hasConv):
			again, err := p.Pick(req)
			if err != nil || again != d {
				t.Fatalf("key repeat = %+v, %v; want %+v", again, err, d)
			}
		}
	})
}
