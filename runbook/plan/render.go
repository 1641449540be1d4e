package plan

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// ErrNoStage classifies a request for a stage the plan does not have.
var ErrNoStage = errors.New("plan: no such stage")

// WriteJSON writes the whole plan as indented JSON (what `llmgw runbook
// --plan` reads back).
func (p *Plan) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(p)
}

// ReadJSON reads a plan written by WriteJSON.
func ReadJSON(data []byte) (*Plan, error) {
	var p Plan
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	if p.Topology == "" || len(p.Answers) == 0 {
		return nil, fmt.Errorf("plan: not a plan (no topology or answers)")
	}
	return &p, nil
}

// WriteYAML writes stage n's rule (1-based) as a YAML document that `llmgw
// rule apply -f -` accepts, with the answers, the other stages and the
// blocked capabilities as comments above it. With no stage it writes only
// the comments and returns an error saying why there is no rule.
func (p *Plan) WriteYAML(w io.Writer, n int) error {
	var b strings.Builder
	comment := func(format string, args ...any) {
		for _, line := range strings.Split(fmt.Sprintf(format, args...), "\n") {
			b.WriteString("# " + line + "\n")
		}
	}
	comment("llmgw plan: engine %s, topology %s, consistent %v", firstNonEmpty(string(p.Engine), "unknown"), p.Topology, p.Consistent)
	for _, a := range p.Answers {
		comment("%-15s %-12s %s%s", a.Key, a.Status, a.Value, disagreeText(a))
	}
	for _, s := range p.Stages {
		mark := " "
		if s.N == n {
			mark = ">"
		}
		comment("%s stage %d %s: %s", mark, s.N, s.Capability, s.Reason)
		comment("    qualify: %s", s.Runbook)
	}
	for _, bl := range p.Blocked {
		comment("  blocked %s (%s): %s", bl.Capability, bl.Fact, bl.Reason)
	}
	if n < 1 || n > len(p.Stages) {
		if _, err := io.WriteString(w, b.String()); err != nil {
			return err
		}
		return fmt.Errorf("%w: no stage %d (the plan has %d)", ErrNoStage, n, len(p.Stages))
	}
	js, err := ruleJSON(p.Stages[n-1].Rule)
	if err != nil {
		return err
	}
	y, err := yaml.JSONToYAML(js)
	if err != nil {
		return err
	}
	b.Write(y)
	_, err = io.WriteString(w, b.String())
	return err
}

// ruleJSON is the rule's JSON without the empty sub-objects encoding/json
// keeps for struct fields (cb: {}, chwbl: {}): what an operator would write.
func ruleJSON(r any) ([]byte, error) {
	js, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil {
		return nil, err
	}
	for k, v := range m {
		if o, ok := v.(map[string]any); ok && len(o) == 0 {
			delete(m, k)
		}
	}
	return json.Marshal(m)
}

func disagreeText(a Answer) string {
	var parts []string
	for _, d := range a.Disagree {
		parts = append(parts, d.Endpoint+" says "+d.Value)
	}
	s := ""
	if len(parts) > 0 {
		s = " (" + strings.Join(parts, "; ") + ")"
	}
	if a.Note != "" {
		s += " [" + a.Note + "]"
	}
	return s
}

// WriteTable writes the answers, the per-endpoint facts and the stages for
// a terminal.
func (p *Plan) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUESTION\tSTATUS\tANSWER\tDISAGREES")
	for _, a := range p.Answers {
		var ds []string
		for _, d := range a.Disagree {
			ds = append(ds, d.Endpoint+"="+d.Value)
		}
		val := a.Value
		if a.Note != "" {
			val = strings.TrimSpace(val + " [note]")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", a.Key, a.Status, dash(val), strings.Join(ds, " "))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "ENDPOINT\tENGINE\tVERSION\tROLE\tMODELS\tBLOCK\tEVENTS\tTOKENIZER")
	for _, o := range p.Endpoints {
		bs, _ := blockSize(o)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", o.Addr, dash(string(o.Engine)), dash(o.Version), dash(string(o.Desc.Role)),
			dash(strings.Join(o.Models, ",")), dash(bs), o.Events.Transport+":"+string(o.Events.Reachable), dash(o.Tokenizer))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, a := range p.Answers {
		if a.Note != "" {
			fmt.Fprintf(w, "note  %s: %s\n", a.Key, a.Note)
		}
	}
	fmt.Fprintln(w)
	for _, s := range p.Stages {
		fmt.Fprintf(w, "stage %d  %s (sel %d", s.N, s.Capability, s.Rule.Sel)
		if s.Rule.KVExactMode != 0 {
			fmt.Fprintf(w, ", kvExactMode %d", s.Rule.KVExactMode)
		}
		if s.Rule.PDDisaggMode {
			fmt.Fprint(w, ", pd_disagg_mode")
		}
		if s.Rule.PDBootstrapPort != 0 {
			fmt.Fprintf(w, ", pdBootstrapPort %d", s.Rule.PDBootstrapPort)
		}
		fmt.Fprintf(w, ")\n  why:     %s\n  qualify: %s\n", s.Reason, s.Runbook)
	}
	for _, b := range p.Blocked {
		fmt.Fprintf(w, "blocked  %s: %s\n", b.Capability, b.Reason)
	}
	if len(p.Stages) > 0 {
		fmt.Fprintf(w, "\nrule of stage N: llmgw plan ... -o yaml --stage N | llmgw rule apply -f -\n")
	}
	for _, o := range p.Endpoints {
		for _, pr := range o.Problems {
			fmt.Fprintf(w, "probe %s: %s\n", o.Addr, pr)
		}
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
