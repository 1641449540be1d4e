package plan

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/llmgw/llmgw/engines"
	"github.com/llmgw/llmgw/gateway/rule"
)

// Stage is one step of the recommendation: a rule to apply (every stage
// updates the same rule name, so each adds one capability to the previous
// one) and the runbook command that qualifies it.
type Stage struct {
	N          int        `json:"n"`
	Capability string     `json:"capability"`
	Reason     string     `json:"reason"`
	Rule       *rule.Rule `json:"rule"`
	// Runbook is the qualifying command line; RunbookMode is the
	// converged runbook's --mode (rr, chwbl, exact) or, for P/D, "pd" /
	// "pd-kv-exact".
	Runbook     string `json:"runbook"`
	RunbookMode string `json:"runbook_mode"`
}

// Block is a capability the plan does not offer, and the fact that blocks it.
type Block struct {
	Capability string `json:"capability"`
	Fact       string `json:"fact"`
	Endpoint   string `json:"endpoint,omitempty"`
	Reason     string `json:"reason"`
}

// Capability names.
const (
	CapFullproxy = "fullproxy"
	CapCHWBL     = "chwbl"
	CapKVExact   = "kv-exact"
	CapPD        = "pd"
	CapPDKVExact = "pd-kv-exact"
)

func recommend(o *Options, p *Plan) {
	if p.Engine == "" {
		e := p.Answer(KeyEngine)
		blk := Block{Capability: "any", Fact: KeyEngine, Reason: "the engine is not known: " + firstNonEmpty(e.Note, "the endpoints disagree")}
		if len(e.Disagree) > 0 {
			blk.Endpoint, blk.Reason = e.Disagree[0].Endpoint, fmt.Sprintf("%s answers as %s, the pool as %s", e.Disagree[0].Endpoint, e.Disagree[0].Value, e.Value)
		}
		p.Blocked = append(p.Blocked, blk)
		return
	}
	a := engines.MustFor(p.Engine)
	var g engines.Guide
	if gd, ok := a.(engines.Guided); ok {
		g = gd.Guide()
	}
	model := ""
	m := p.Answer(KeyModels)
	if m.Status != Unknown && !strings.Contains(m.Value, ",") {
		model = m.Value
	}
	// A rule serves one model name: endpoints serving another model are
	// left out of the stages (and named), never routed the pool's model.
	exclude := map[string]bool{}
	excludeNote := ""
	if m.Status == Inconsistent {
		var names []string
		for _, d := range m.Disagree {
			exclude[d.Endpoint] = true
			names = append(names, d.Endpoint+" (serves "+d.Value+")")
		}
		excludeNote = " Left out, serving another model: " + strings.Join(names, ", ") + "."
	}
	p.Converged = without(p.Converged, exclude)
	// Facts that block KV-exact and P/D: any inconsistency.
	var blocks []Block
	for _, ans := range p.Answers {
		if ans.Status != Inconsistent || !contains(consistencyKeys, ans.Key) {
			continue
		}
		b := Block{Fact: ans.Key, Reason: fmt.Sprintf("%s is inconsistent across the pool", ans.Key)}
		if len(ans.Disagree) > 0 {
			d := ans.Disagree[0]
			b.Endpoint = d.Endpoint
			b.Reason = fmt.Sprintf("%s: %s says %s, the pool %s", ans.Key, d.Endpoint, d.Value, firstNonEmpty(ans.Value, "disagrees"))
		} else if ans.Note != "" {
			b.Reason += ": " + ans.Note
		}
		blocks = append(blocks, b)
	}
	// A stage's runbook attributes each request to a worker by the engine's
	// own counters: where a worker serves none, the stage says so.
	var noEvidence []string
	for _, ob := range p.Endpoints {
		if ob.NoEvidence != "" {
			noEvidence = append(noEvidence, ob.Addr+" "+ob.NoEvidence)
		}
	}
	n := 0
	add := func(capability, reason, mode string, r *rule.Rule, runbook string) {
		n++
		if len(noEvidence) > 0 {
			reason += ". Its runbook will be BLOCKED until every worker serves the engine's request evidence: " + strings.Join(noEvidence, "; ")
		}
		r.Name = o.Name
		p.Stages = append(p.Stages, Stage{N: n, Capability: capability, Reason: reason, Rule: r, Runbook: runbook, RunbookMode: mode})
	}
	block := func(capability string, bs []Block) {
		for _, b := range bs {
			b.Capability = capability
			p.Blocked = append(p.Blocked, b)
		}
	}
	if p.Topology == "pd" {
		if a.PD() == nil || g.PDWhy == "" {
			block(CapPD, []Block{{Fact: "engine", Reason: firstNonEmpty(g.NoPDWhy, a.Display()+" has no prefill/decode protocol")}})
			return
		}
		if len(blocks) > 0 {
			block(CapPD, blocks)
			return
		}
		r := baseRule(a, model, o, p, 0, nil)
		r.PDDisaggMode = true
		if a.PD().Shape() == engines.PDConcurrent && p.BootstrapPort > 0 {
			r.PDBootstrapPort = p.BootstrapPort
		}
		add(CapPD, "the workers are split by role and cannot serve alone, so stage 1 is P/D dispatch on health-checked fullproxy, with no KV feature yet: "+g.PDWhy+bootstrapNote(a, p),
			CapPD, r, pdRunbook(o, p, false))
		if why := kvExactBlocks(a, o, p); len(why) > 0 {
			block(CapPDKVExact, why)
			return
		}
		r2 := kvExact(baseRule(a, model, o, p, 0, nil), o, p, 1)
		r2.PDDisaggMode = true
		r2.PDBootstrapPort = r.PDBootstrapPort
		add(CapPDKVExact, "kvExactMode 1 scores the prefills by the blocks each holds; the runbook's hash-parity gate must pass first. "+g.KVExactWhy,
			CapPDKVExact, r2, pdRunbook(o, p, true))
		return
	}
	if p.Topology != "converged" {
		block(CapFullproxy, blocks)
		return
	}
	// Stage 1 is always offered: health-checked fullproxy needs nothing of
	// the pool but health, and an inconsistent pool still serves (the
	// blocked stages say what to fix).
	if len(p.Converged) == 0 {
		block(CapFullproxy, blocks)
		return
	}
	first := baseRule(a, model, o, p, g.FirstSel, exclude)
	mode := "rr"
	if g.FirstSel == 8 {
		mode = "chwbl"
	}
	add(CapFullproxy, g.FirstWhy+excludeNote, mode, first, convRunbook(o, p, mode))
	if g.FirstSel != 8 && g.AffinityWhy != "" {
		add(CapCHWBL, g.AffinityWhy+excludeNote, "chwbl", baseRule(a, model, o, p, 8, exclude), convRunbook(o, p, "chwbl"))
	}
	if g.KVExactWhy == "" || a.KV() == nil {
		block(CapKVExact, []Block{{Fact: KeyEvents, Reason: firstNonEmpty(g.NoKVExactWhy, a.Display()+" publishes no KV events")}})
	} else if len(blocks) > 0 {
		block(CapKVExact, blocks)
	} else if why := kvExactBlocks(a, o, p); len(why) > 0 {
		block(CapKVExact, why)
	} else {
		reason := g.KVExactWhy
		if c := p.Answer(KeyConsumer); c.Status != Known {
			reason += ". Sole consumer: " + c.Note
		}
		add(CapKVExact, reason+"; the runbook's hash-parity gate qualifies it", "exact", kvExact(baseRule(a, model, o, p, 8, nil), o, p, 3), convRunbook(o, p, "exact"))
	}
	if a.PD() == nil || g.PDWhy == "" {
		block(CapPD, []Block{{Fact: "engine", Reason: firstNonEmpty(g.NoPDWhy, a.Display()+" has no prefill/decode protocol")}})
	} else {
		block(CapPD, []Block{{Fact: KeyRoles, Reason: "every endpoint is converged: P/D needs workers launched as prefill and decode (" + g.PDWhy + ")"}})
	}
}

func bootstrapNote(a engines.Adapter, p *Plan) string {
	if a.PD().Shape() != engines.PDConcurrent {
		return ""
	}
	if p.BootstrapPort > 0 {
		return fmt.Sprintf(" (bootstrap port %d, reported by the prefills)", p.BootstrapPort)
	}
	return " (the prefills reported different bootstrap ports: each endpoint carries its own)"
}

// kvExactBlocks are the facts a KV-exact stage needs beyond consistency:
// reachable events on every endpoint that should publish them.
func kvExactBlocks(a engines.Adapter, o *Options, p *Plan) []Block {
	var out []Block
	for _, ob := range p.Endpoints {
		if p.Topology == "pd" && !ob.Desc.Role.PrefillSide() {
			continue // decode workers need not publish
		}
		e := ob.Events
		switch {
		case e.Transport == "off":
			out = append(out, Block{Fact: KeyEvents, Endpoint: ob.Addr, Reason: ob.Addr + " publishes no KV events: " + e.How})
		case e.Reachable != Known:
			out = append(out, Block{Fact: KeyEvents, Endpoint: ob.Addr, Reason: fmt.Sprintf("KV events of %s are %s: %s", ob.Addr, e.Reachable, e.How)})
		}
	}
	if _, why := kvTokenizerFor(a, o, p); why != "" {
		out = append(out, Block{Fact: KeyTokenizer, Reason: why})
	}
	if h := p.Answer(KeyHashes); h.Status == Known && strings.HasPrefix(h.Value, "not reproduced") {
		out = append(out, Block{Fact: KeyHashes, Reason: "published block hashes do not reproduce with " + a.KV().HashAlgo + " and the expected seed: " + strings.Join(h.Evidence, "; ")})
	}
	return out
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

func without(addrs []string, exclude map[string]bool) []string {
	var out []string
	for _, a := range addrs {
		if !exclude[a] {
			out = append(out, a)
		}
	}
	return out
}

// baseRule is health-checked fullproxy over the pool (less exclude) with
// sel; P/D pools get their roles.
func baseRule(a engines.Adapter, model string, o *Options, p *Plan, sel int, exclude map[string]bool) *rule.Rule {
	r := &rule.Rule{
		ModelName:    model,
		Mode:         rule.ModeFullProxy,
		Sel:          rule.Sel(sel),
		KVEngineType: string(a.Kind()),
		Probe:        rule.ProbeConfig{Path: a.Surfaces().Health},
	}
	for _, ob := range p.Endpoints {
		if exclude[ob.Addr] {
			continue
		}
		host, port, _ := net.SplitHostPort(ob.Addr)
		n, _ := strconv.Atoi(port)
		ep := rule.Endpoint{EndpointIP: host, TargetPort: n}
		if p.Topology == "pd" {
			switch {
			case ob.Desc.Role.PrefillSide():
				ep.EPRole = 1
				if p.BootstrapPort == 0 && ob.Desc.BootstrapPort > 0 && a.PD() != nil && a.PD().Shape() == engines.PDConcurrent {
					ep.BootstrapPort = ob.Desc.BootstrapPort
				}
			case ob.Desc.Role.DecodeSide():
				ep.EPRole = 2
			}
		}
		r.Endpoints = append(r.Endpoints, ep)
	}
	return r
}

// kvExact turns r into a KV-exact rule (mode 3 single pool, 1 P/D) with the
// block size the pool runs and each endpoint's event sockets where they are
// not the rule-level default.
// kvTokenizerFor is the kvTokenizer a KV-exact stage uses: the operator's
// --kv-tokenizer, else "engine" when the engine has a tokenize endpoint and
// every endpoint tokenized the canary to the same ids; else why there is
// none (the gateway refuses a KV-exact rule without the model's tokenizer).
func kvTokenizerFor(a engines.Adapter, o *Options, p *Plan) (string, string) {
	if o.KVTokenizer != "" {
		return o.KVTokenizer, ""
	}
	if a.Tokenize() == nil {
		return "", a.Display() + " has no tokenize endpoint, and KV-exact needs the model's own tokenizer: give --kv-tokenizer with the model's tokenizer.json or .gguf path (or a models directory) on the gateway host"
	}
	if t := p.Answer(KeyTokenizer); t.Status != Known {
		var who []string
		for _, d := range t.Disagree {
			who = append(who, d.Endpoint+" "+d.Value)
		}
		return "", "the endpoints' tokenizers are " + string(t.Status) + " (" + firstNonEmpty(t.Note, strings.Join(who, ", ")) + "): give --kv-tokenizer with the model's tokenizer.json or .gguf path, or fix the pool"
	}
	return "engine", ""
}

func kvExact(r *rule.Rule, o *Options, p *Plan, mode int) *rule.Rule {
	r.KVExactMode = rule.KVExactMode(mode)
	r.KVTokenizer, _ = kvTokenizerFor(engines.MustFor(p.Engine), o, p)
	if o.HashSeed != "0" {
		// The operator named the engines' PYTHONHASHSEED and the published
		// hashes were checked against it.
		seed := o.HashSeed
		r.KVHashSeed = &seed
	}
	if b := p.Answer(KeyBlockSize); b.Status == Known {
		if n, err := strconv.Atoi(b.Value); err == nil {
			r.KVBlockSize = n
		}
	}
	at := map[string]int{}
	for i, ep := range r.Endpoints {
		at[net.JoinHostPort(ep.EndpointIP, strconv.Itoa(ep.TargetPort))] = i
	}
	for _, ob := range p.Endpoints {
		e := ob.Events
		i, in := at[ob.Addr]
		if !in || e.Transport != "zmq" || e.Endpoint == "" {
			continue
		}
		host := hostForURL(r.Endpoints[i].EndpointIP)
		if e.Endpoint != fmt.Sprintf("tcp://%s:%d", host, rule.DefaultKVZmqPort) {
			r.Endpoints[i].KVEventsEndpoint = e.Endpoint
		}
		if e.Replay != "" && e.Replay != fmt.Sprintf("tcp://%s:%d", host, rule.DefaultKVZmqPort+rule.ReplayPortOffset) {
			r.Endpoints[i].KVReplayEndpoint = e.Replay
		}
	}
	return r
}

// PrefillBootstrapPorts are the bootstrap ports the prefills reported, one
// per Prefill entry in order; nil when any prefill reported none.
func (p *Plan) PrefillBootstrapPorts() []int {
	by := map[string]int{}
	for _, ob := range p.Endpoints {
		by[ob.Addr] = ob.Desc.BootstrapPort
	}
	var out []int
	for _, a := range p.Prefill {
		if by[a] <= 0 {
			return nil
		}
		out = append(out, by[a])
	}
	return out
}

// KVTokenizer is the kvTokenizer of the plan's KV-exact stage ("" when it
// has none).
func (p *Plan) KVTokenizer() string {
	for _, st := range p.Stages {
		if st.Rule != nil && st.Rule.KVExactMode != 0 {
			return st.Rule.KVTokenizer
		}
	}
	return ""
}

// EventsOf are the ZeroMQ KV event endpoints the plan found for addrs, in
// order; nil when any of them has none (it publishes no ZeroMQ events).
func (p *Plan) EventsOf(addrs []string) []string {
	by := map[string]string{}
	for _, ob := range p.Endpoints {
		if ob.Events.Transport == "zmq" {
			by[ob.Addr] = ob.Events.Endpoint
		}
	}
	var out []string
	for _, a := range addrs {
		if by[a] == "" {
			return nil
		}
		out = append(out, by[a])
	}
	return out
}

// BootstrapPortFlag is the runbook's --bootstrap-port value: the one port
// every prefill reported, or one per prefill; "" when they reported none.
func (p *Plan) BootstrapPortFlag() string {
	if p.BootstrapPort > 0 {
		return strconv.Itoa(p.BootstrapPort)
	}
	var parts []string
	for _, n := range p.PrefillBootstrapPorts() {
		parts = append(parts, strconv.Itoa(n))
	}
	return strings.Join(parts, ",")
}

func convRunbook(o *Options, p *Plan, mode string) string {
	args := []string{"llmgw", "runbook", "converged", "--launcher", "attach", "--engine", string(p.Engine), "--mode", mode, "--endpoints", strings.Join(p.Converged, ",")}
	if mode == "exact" {
		if ev := p.EventsOf(p.Converged); ev != nil {
			args = append(args, "--kv-events", strings.Join(ev, ","))
		}
		if tok, _ := kvTokenizerFor(engines.MustFor(p.Engine), o, p); tok != "" {
			args = append(args, "--kv-tokenizer", tok)
		}
	}
	if o.Profile != "" {
		args = append(args, "--profile", o.Profile)
	}
	return strings.Join(args, " ")
}

func pdRunbook(o *Options, p *Plan, kvExact bool) string {
	args := []string{"llmgw", "runbook", "pd", "--launcher", "attach", "--engine", string(p.Engine),
		"--prefill-endpoints", strings.Join(p.Prefill, ","), "--decode-endpoints", strings.Join(p.Decode, ",")}
	if a := engines.MustFor(p.Engine); a.PD() != nil && a.PD().Shape() == engines.PDConcurrent {
		if bp := p.BootstrapPortFlag(); bp != "" {
			args = append(args, "--bootstrap-port", bp)
		}
	}
	if kvExact {
		args = append(args, "--kv-exact")
		if ev := p.EventsOf(p.Prefill); ev != nil {
			args = append(args, "--kv-events", strings.Join(ev, ","))
		}
		if tok, _ := kvTokenizerFor(engines.MustFor(p.Engine), o, p); tok != "" {
			args = append(args, "--kv-tokenizer", tok)
		}
	}
	if o.Profile != "" {
		args = append(args, "--profile", o.Profile)
	}
	return strings.Join(args, " ")
}
