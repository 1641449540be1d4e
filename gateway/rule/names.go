package rule

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// Sel, KVExactMode and EPRole are the rule's numbered choices. On the wire
// each is the reference gateway's number (8) or, beside it, a name
// ("chwbl"); a quoted number ("8") means the number. They always encode as
// the number, so every existing client and stored rule reads what it wrote;
// Effective adds the name in a sibling field (sel_name, kvExactModeName,
// ep_role_name) for people. A name that is not known is refused at decode
// time with the nearest known name; a number is kept as written so that
// Admit can explain why it is refused (sel 9, kvExactMode 2).

// Sel is the endpoint selection policy.
type Sel int

// The selection policies.
const (
	SelRoundRobin         Sel = 0
	SelWeightedRoundRobin Sel = 2
	SelSession            Sel = 3
	SelLeastInFlight      Sel = 4
	SelCHWBL              Sel = 8
	SelWeightedCHWBL      Sel = 10
)

// KVExactMode is the KV-exact routing mode.
type KVExactMode int

// The KV-exact modes (2, "nats", is reserved and refused by Admit).
const (
	KVExactOff        KVExactMode = 0
	KVExactPDPrefill  KVExactMode = 1
	KVExactSinglePool KVExactMode = 3
)

// EPRole is an endpoint's role in a P/D rule.
type EPRole int

// The endpoint roles.
const (
	RoleNormal  EPRole = 0
	RolePrefill EPRole = 1 // TensorRT-LLM: context server
	RoleDecode  EPRole = 2 // TensorRT-LLM: generation server
)

type named struct {
	name string
	val  int
}

var (
	selNames = []named{
		{"rr", int(SelRoundRobin)}, {"wrr", int(SelWeightedRoundRobin)}, {"session", int(SelSession)},
		{"least_inflight", int(SelLeastInFlight)}, {"chwbl", int(SelCHWBL)}, {"weighted_chwbl", int(SelWeightedCHWBL)},
	}
	kvExactModeNames = []named{
		{"off", int(KVExactOff)}, {"pd_prefill", int(KVExactPDPrefill)}, {"single_pool", int(KVExactSinglePool)},
	}
	epRoleNames = []named{
		{"normal", int(RoleNormal)}, {"prefill", int(RolePrefill)}, {"decode", int(RoleDecode)},
	}
)

// Name returns the policy's name ("chwbl"), or "" for a number with none.
func (s Sel) Name() string { return nameOf(selNames, int(s)) }

// Name returns the mode's name ("single_pool"), or "" for a number with none.
func (m KVExactMode) Name() string { return nameOf(kvExactModeNames, int(m)) }

// Name returns the role's name ("prefill"), or "" for a number with none.
func (r EPRole) Name() string { return nameOf(epRoleNames, int(r)) }

// SelNames, KVExactModeNames and EPRoleNames list the accepted names in
// number order (for help and completion).
func SelNames() []string         { return namesOf(selNames) }
func KVExactModeNames() []string { return namesOf(kvExactModeNames) }
func EPRoleNames() []string      { return namesOf(epRoleNames) }

func (s *Sel) UnmarshalJSON(b []byte) error {
	v, err := decodeNamed(b, selNames)
	*s = Sel(v)
	return err
}

func (m *KVExactMode) UnmarshalJSON(b []byte) error {
	v, err := decodeNamed(b, kvExactModeNames)
	*m = KVExactMode(v)
	return err
}

func (r *EPRole) UnmarshalJSON(b []byte) error {
	v, err := decodeNamed(b, epRoleNames)
	*r = EPRole(v)
	return err
}

func nameOf(ns []named, v int) string {
	for _, n := range ns {
		if n.val == v {
			return n.name
		}
	}
	return ""
}

func namesOf(ns []named) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.name
	}
	return out
}

// decodeNamed reads an integer, a quoted integer or a name of ns. Its
// errors omit the field: the decoder prefixes the path.
func decodeNamed(b []byte, ns []named) (int, error) {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		return 0, nil
	}
	s, quoted := string(b), len(b) > 0 && b[0] == '"'
	if quoted {
		if err := json.Unmarshal(b, &s); err != nil {
			return 0, fmt.Errorf("rule: %w", err)
		}
		for _, n := range ns {
			if s == n.name {
				return n.val, nil
			}
		}
	}
	v, err := strconv.ParseInt(s, 10, 32)
	switch {
	case err == nil:
		return int(v), nil
	case errors.Is(err, strconv.ErrRange):
		return 0, fmt.Errorf("rule: integer %s is out of range", truncate(s, 32))
	case !quoted:
		return 0, fmt.Errorf("rule: want integer or one of the names %s, got %s", strings.Join(namesOf(ns), ", "), truncate(s, 32))
	}
	msg := fmt.Sprintf("rule: unknown name %q", truncate(s, 32))
	cands := make(map[string]reflect.Type, len(ns))
	for _, n := range ns {
		cands[n.name] = nil
	}
	if hint := suggest(s, cands); hint != "" {
		msg += fmt.Sprintf("; did you mean %q?", hint)
	}
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = fmt.Sprintf("%s (%d)", n.name, n.val)
	}
	return 0, fmt.Errorf("%s (names: %s; or the number)", msg, strings.Join(parts, ", "))
}

// checkReadBackNames: a body may carry the read-back names Effective adds
// (GET, edit, PUT) only when they name the value beside them; a name that
// disagrees would leave it unclear which one the operator meant.
func checkReadBackNames(r *Rule) *AdmissionError {
	if r.SelName != "" && r.SelName != r.Sel.Name() {
		return bad(CodeReadBackName, "sel_name", "sel_name %q does not name sel %d (%q); sel_name is read-back only: set sel (a number or a name) and omit sel_name", r.SelName, r.Sel, r.Sel.Name())
	}
	if r.KVExactModeName != "" && r.KVExactModeName != r.KVExactMode.Name() {
		return bad(CodeReadBackName, "kvExactModeName", "kvExactModeName %q does not name kvExactMode %d (%q); it is read-back only: set kvExactMode (a number or a name) and omit kvExactModeName", r.KVExactModeName, r.KVExactMode, r.KVExactMode.Name())
	}
	for i, ep := range r.Endpoints {
		if ep.EPRoleName != "" && ep.EPRoleName != ep.EPRole.Name() {
			return bad(CodeReadBackName, fmt.Sprintf("endpoints[%d].ep_role_name", i), "ep_role_name %q does not name ep_role %d (%q); it is read-back only: set ep_role (a number or a name) and omit ep_role_name", ep.EPRoleName, ep.EPRole, ep.EPRole.Name())
		}
	}
	return nil
}
