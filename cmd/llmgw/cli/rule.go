package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/gateway"
	"github.com/llmgw/llmgw/gateway/adminclient"
	"github.com/llmgw/llmgw/gateway/rule"
	"github.com/llmgw/llmgw/results"
)

// RuleOptions are what every `llmgw rule` subcommand shares: the gateway's
// admin API and its token. Client builds the admin client once flags are
// parsed.
type RuleOptions struct {
	IO        *IOStreams
	Admin     string
	TokenFile string
	// Client returns the admin API client for Admin and TokenFile; bad
	// values are usage errors.
	Client func() (*adminclient.Client, error)
}

// RuleApplyOptions are the inputs of `llmgw rule apply`.
type RuleApplyOptions struct {
	*RuleOptions
	File   string
	Output string
}

// RuleGetOptions are the inputs of `llmgw rule get`.
type RuleGetOptions struct {
	*RuleOptions
	Name   string
	Output string
}

// RuleListOptions are the inputs of `llmgw rule list`.
type RuleListOptions struct {
	*RuleOptions
	Output string
}

// RuleDeleteOptions are the inputs of `llmgw rule delete`.
type RuleDeleteOptions struct {
	*RuleOptions
	Name  string
	Drain time.Duration
}

// RuleDrainOptions are the inputs of `llmgw rule drain`.
type RuleDrainOptions struct {
	*RuleOptions
	Name     string
	Endpoint string
	Undo     bool
	Output   string
}

// The -o json|yaml documents of `llmgw rule`. A rule's status has the admin
// API's shape (docs/admin-api.md) with a kind beside it.
type (
	// RuleDoc is one rule: `rule get`, `rule drain`.
	RuleDoc struct {
		Kind string `json:"kind"` // "Rule"
		gateway.RuleStatus
	}
	// RuleListDoc is `rule list`.
	RuleListDoc struct {
		Kind  string               `json:"kind"` // "RuleList"
		Rules []gateway.RuleStatus `json:"rules"`
	}
	// RuleApplyDoc is `rule apply`: each rule's effective configuration as
	// the gateway read it back, in file order.
	RuleApplyDoc struct {
		Kind  string       `json:"kind"` // "RuleApply"
		Rules []*rule.Rule `json:"rules"`
	}
)

// ruleRequestTimeout bounds one admin call of `llmgw rule` (a delete with
// --drain waits up to its drain time on the gateway, at most an hour).
const ruleRequestTimeout = 65 * time.Minute

func newRuleCmd(ios *IOStreams) *cobra.Command {
	o := &RuleOptions{IO: ios}
	o.Client = func() (*adminclient.Client, error) {
		var token string
		if o.TokenFile != "" {
			b, err := os.ReadFile(o.TokenFile)
			if err != nil {
				return nil, usageErrorf("--token-file: %v", err)
			}
			token = strings.TrimSpace(string(b))
		}
		c, err := adminclient.New(o.Admin, token, &http.Client{Timeout: ruleRequestTimeout})
		if err != nil {
			return nil, usageErrorf("--admin %q: want a URL such as http://127.0.0.1:8081", o.Admin)
		}
		return c, nil
	}
	cmd := &cobra.Command{
		Use:   "rule",
		Short: "Manage a running gateway's rules over its admin API",
		Long: `Manage the rules of a running 'llmgw serve' through its management API
(docs/admin-api.md; the rule fields are in docs/rules.md).

Mutating calls send the bearer token from --token-file when the gateway was
started with --admin-token-file.

get, list, apply and drain take -o table (default: a table on a terminal,
tab-separated lines otherwise), -o json or -o yaml (kind Rule, RuleList or
RuleApply; a rule's status as the admin API returns it).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.PersistentFlags().StringVar(&o.Admin, "admin", "http://127.0.0.1:8081", "the gateway's management API URL")
	cmd.PersistentFlags().StringVar(&o.TokenFile, "token-file", "", "file holding the admin bearer token")
	cmd.AddCommand(
		newRuleApplyCmd(o, nil),
		newRuleGetCmd(o, nil),
		newRuleListCmd(o, nil),
		newRuleDeleteCmd(o, nil),
		newRuleDrainCmd(o, nil),
	)
	return cmd
}

func newRuleApplyCmd(base *RuleOptions, runF func(*RuleApplyOptions) error) *cobra.Command {
	o := &RuleApplyOptions{RuleOptions: base}
	cmd := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create or update the rules in FILE (YAML or JSON; one rule or a list)",
		Long: `Create or update every rule in FILE, in order, and print each rule's
effective configuration (defaults resolved) as the gateway read it back.
A rule the gateway refuses stops the command with the admission error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.File == "" {
				return usageErrorf("apply needs -f FILE")
			}
			if err := checkOutput(o.Output); err != nil {
				return err
			}
			if runF != nil {
				return runF(o)
			}
			return ruleApplyRun(cmd.Context(), o)
		},
	}
	cmd.Flags().StringVarP(&o.File, "file", "f", "", "rule file, or - for standard input")
	addOutputFlag(cmd, &o.Output, outputTable)
	return cmd
}

func ruleApplyRun(ctx context.Context, o *RuleApplyOptions) error {
	var data []byte
	var err error
	if o.File == "-" {
		data, err = io.ReadAll(o.IO.In)
	} else {
		data, err = os.ReadFile(o.File)
	}
	if err != nil {
		return usageErrorf("-f %s: %v", o.File, err)
	}
	rules, err := decodeRules(data)
	if err != nil {
		return usageErrorf("-f %s: %v", o.File, err)
	}
	c, err := o.Client()
	if err != nil {
		return err
	}
	doc := RuleApplyDoc{Kind: kindRuleApply, Rules: make([]*rule.Rule, 0, len(rules))}
	for _, r := range rules {
		body, err := json.Marshal(r)
		if err != nil {
			return err
		}
		raw, err := c.Put(ctx, r.Name, body)
		if err != nil {
			return err
		}
		var eff rule.Rule
		if err := json.Unmarshal(raw, &eff); err != nil {
			return fmt.Errorf("rule %q: the gateway's read-back: %w", r.Name, err)
		}
		fmt.Fprintf(o.IO.ErrOut, "rule %q applied\n", r.Name)
		doc.Rules = append(doc.Rules, &eff)
	}
	if o.Output != outputTable {
		return writeDoc(o.IO.Out, o.Output, doc)
	}
	headers := []string{"NAME", "MODEL", "SEL", "LISTEN", "ENDPOINTS"}
	rows := make([][]string, len(doc.Rules))
	for i, r := range doc.Rules {
		rows[i] = []string{r.Name, r.ModelName, selCell(r.Sel), dashCell(r.Listen), strconv.Itoa(len(r.Endpoints))}
	}
	return writeTable(o.IO, headers, rows, "NAME")
}

func newRuleGetCmd(base *RuleOptions, runF func(*RuleGetOptions) error) *cobra.Command {
	o := &RuleGetOptions{RuleOptions: base}
	cmd := &cobra.Command{
		Use:               "get NAME",
		Short:             "Print a rule's effective configuration and live status",
		Long:              "Print a rule's live status and endpoints (-o table), or its effective configuration\nwith defaults resolved and its live status (-o json, -o yaml).",
		Args:              exactArgs(1, "get needs the rule NAME"),
		ValidArgsFunction: completeRuleNames(&base.Admin, &base.TokenFile),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			if err := checkOutput(o.Output); err != nil {
				return err
			}
			if runF != nil {
				return runF(o)
			}
			return ruleGetRun(cmd.Context(), o)
		},
	}
	addOutputFlag(cmd, &o.Output, outputTable)
	return cmd
}

func ruleGetRun(ctx context.Context, o *RuleGetOptions) error {
	c, err := o.Client()
	if err != nil {
		return err
	}
	st, _, err := c.Rule(ctx, o.Name)
	if err != nil {
		return err
	}
	return writeRuleStatus(o.IO, o.Output, st)
}

// writeRuleStatus prints one rule: its document, or a summary line and a
// table of its endpoints.
func writeRuleStatus(ios *IOStreams, output string, st *gateway.RuleStatus) error {
	if output != outputTable {
		return writeDoc(ios.Out, output, RuleDoc{Kind: kindRule, RuleStatus: *st})
	}
	if st.Rule != nil {
		fmt.Fprintf(ios.Out, "%s\n", results.FitLine(ios.Width, fmt.Sprintf("rule %s: model %q, sel %s, address %s, ready %v, in-flight %d",
			st.Rule.Name, st.Rule.ModelName, selCell(st.Rule.Sel), dashCell(st.Status.Address), st.Status.Ready, st.Status.InFlight)))
	}
	if w := st.Status.KVWindow; w != nil {
		fmt.Fprintf(ios.Out, "%s\n", results.FitLine(ios.Width, kvWindowLine(w)))
	}
	if st.Status.Degraded != "" {
		// Whole, never cut to the terminal: it is the warning.
		fmt.Fprintf(ios.Out, "degraded: %s\n", st.Status.Degraded)
	}
	if st.Status.NotReady != "" {
		fmt.Fprintf(ios.Out, "%s\n", results.FitLine(ios.Width, "not ready: "+st.Status.NotReady))
	}
	headers := []string{"ENDPOINT", "ADDRESS", "ROLE", "AVAILABLE", "HEALTHY", "BREAKER", "DRAINING", "IN-FLIGHT"}
	rows := make([][]string, len(st.Status.Endpoints))
	for i, e := range st.Status.Endpoints {
		rows[i] = []string{e.ID, e.Address, rule.EPRole(e.Role).Name(), strconv.FormatBool(e.Available), strconv.FormatBool(e.Healthy),
			dashCell(e.Breaker), strconv.FormatBool(e.Draining), strconv.FormatInt(e.InFlight, 10)}
	}
	return writeTable(ios, headers, rows, "ENDPOINT")
}

// kvWindowLine summarises a KV-exact rule's recent window.
func kvWindowLine(w *gateway.KVWindowStatus) string {
	line := fmt.Sprintf("kv-exact: %d hits of the last %d decisions (%.0f%%)", w.Hits, w.Decisions, 100*w.HitShare)
	reasons := make([]string, 0, len(w.Misses))
	for r := range w.Misses {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for i, r := range reasons {
		sep := ", "
		if i == 0 {
			sep = "; misses "
		}
		line += fmt.Sprintf("%s%s %d", sep, r, w.Misses[r])
	}
	return line + fmt.Sprintf("; parity %d mismatched of %d checked", w.ParityMismatches, w.ParityChecked)
}

func newRuleListCmd(base *RuleOptions, runF func(*RuleListOptions) error) *cobra.Command {
	o := &RuleListOptions{RuleOptions: base}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List rules with their readiness and endpoint states",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(o.Output); err != nil {
				return err
			}
			if runF != nil {
				return runF(o)
			}
			return ruleListRun(cmd.Context(), o)
		},
	}
	addOutputFlag(cmd, &o.Output, outputTable)
	return cmd
}

func ruleListRun(ctx context.Context, o *RuleListOptions) error {
	c, err := o.Client()
	if err != nil {
		return err
	}
	rules, err := c.Rules(ctx)
	if err != nil {
		return err
	}
	if o.Output != outputTable {
		if rules == nil {
			rules = []gateway.RuleStatus{}
		}
		return writeDoc(o.IO.Out, o.Output, RuleListDoc{Kind: kindRuleList, Rules: rules})
	}
	headers := []string{"NAME", "MODEL", "SEL", "ADDRESS", "READY", "AVAILABLE", "IN-FLIGHT"}
	rows := make([][]string, 0, len(rules))
	for _, r := range rules {
		if r.Rule == nil {
			continue
		}
		avail := 0
		for _, e := range r.Status.Endpoints {
			if e.Available {
				avail++
			}
		}
		rows = append(rows, []string{r.Rule.Name, r.Rule.ModelName, selCell(r.Rule.Sel), dashCell(r.Status.Address),
			strconv.FormatBool(r.Status.Ready), fmt.Sprintf("%d/%d", avail, len(r.Status.Endpoints)), strconv.FormatInt(r.Status.InFlight, 10)})
	}
	return writeTable(o.IO, headers, rows, "NAME")
}

func newRuleDeleteCmd(base *RuleOptions, runF func(*RuleDeleteOptions) error) *cobra.Command {
	o := &RuleDeleteOptions{RuleOptions: base}
	cmd := &cobra.Command{
		Use:               "delete NAME",
		Short:             "Delete a rule (with --drain, wait for its in-flight requests first)",
		Args:              exactArgs(1, "delete needs the rule NAME"),
		ValidArgsFunction: completeRuleNames(&base.Admin, &base.TokenFile),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			if runF != nil {
				return runF(o)
			}
			return ruleDeleteRun(cmd.Context(), o)
		},
	}
	cmd.Flags().DurationVar(&o.Drain, "drain", 0, "drain the rule first and wait up to this long for in-flight requests")
	return cmd
}

func ruleDeleteRun(ctx context.Context, o *RuleDeleteOptions) error {
	c, err := o.Client()
	if err != nil {
		return err
	}
	// Not Client.Delete: an unknown rule is an error here (the user named
	// it), where the runbooks' idempotent cleanup tolerates it.
	path := "/v1/rules/" + url.PathEscape(o.Name)
	if o.Drain > 0 {
		path += "?drain=" + o.Drain.String()
	}
	if _, _, err := c.Do(ctx, http.MethodDelete, path, nil); err != nil {
		return err
	}
	fmt.Fprintf(o.IO.ErrOut, "rule %q deleted\n", o.Name)
	return nil
}

func newRuleDrainCmd(base *RuleOptions, runF func(*RuleDrainOptions) error) *cobra.Command {
	o := &RuleDrainOptions{RuleOptions: base}
	cmd := &cobra.Command{
		Use:               "drain NAME [--endpoint ID] [--undo]",
		Short:             "Stop new requests to a rule's endpoints (in-flight ones finish); --undo resumes",
		Long:              "Drain (or with --undo resume) a rule's endpoints and print the rule's status after the change.",
		Args:              exactArgs(1, "drain needs the rule NAME"),
		ValidArgsFunction: completeRuleNames(&base.Admin, &base.TokenFile),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			if err := checkOutput(o.Output); err != nil {
				return err
			}
			if runF != nil {
				return runF(o)
			}
			return ruleDrainRun(cmd.Context(), o)
		},
	}
	cmd.Flags().StringVar(&o.Endpoint, "endpoint", "", "drain only this endpoint id (default: every endpoint of the rule)")
	cmd.Flags().BoolVar(&o.Undo, "undo", false, "undrain instead")
	addOutputFlag(cmd, &o.Output, outputTable)
	return cmd
}

func ruleDrainRun(ctx context.Context, o *RuleDrainOptions) error {
	c, err := o.Client()
	if err != nil {
		return err
	}
	raw, err := c.SetDraining(ctx, o.Name, o.Endpoint, !o.Undo)
	if err != nil {
		return err
	}
	var st gateway.RuleStatus
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("rule %q: the gateway's status after drain: %w", o.Name, err)
	}
	return writeRuleStatus(o.IO, o.Output, &st)
}

// selCell is a rule's selection policy for a table: its name and number.
func selCell(s rule.Sel) string {
	if n := s.Name(); n != "" {
		return fmt.Sprintf("%s (%d)", n, int(s))
	}
	return strconv.Itoa(int(s))
}

func dashCell(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeTable prints headers and rows for people: a bordered table sized to
// the terminal on a terminal, tab-separated lines otherwise. The columns
// named whole are never truncated (see results.FitSpec); columns the
// terminal has no room for are named under the table.
func writeTable(ios *IOStreams, headers []string, rows [][]string, whole ...string) error {
	if !ios.OutTTY {
		return results.TSV(ios.Out, headers, rows)
	}
	headers, rows, dropped := results.FitSpec{Whole: whole}.Fit(ios.Width, headers, rows)
	out := results.Table(ios.Out, ios.Width, headers, rows) + "\n"
	if n := results.DroppedNote(dropped); n != "" {
		out += results.FitLine(ios.Width, n) + "\n"
	}
	_, err := io.WriteString(ios.Out, out)
	return err
}

func exactArgs(n int, msg string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return &UsageError{Err: errors.New(msg)}
		}
		return nil
	}
}

// decodeRules reads a rules file: one rule, a list of rules, or an object
// {rules: [...]}, in YAML or JSON. The error reported is the one of the shape
// the file looks like, so the user sees the precise field at fault.
func decodeRules(data []byte) ([]*rule.Rule, error) {
	if r, err := rule.Decode(data); err == nil {
		return []*rule.Rule{r}, nil
	} else if !looksLikeList(data) {
		return nil, err
	}
	return rule.DecodeList(data)
}

func looksLikeList(data []byte) bool {
	t := bytes.TrimSpace(data)
	if len(t) > 0 && (t[0] == '[' || t[0] == '-') {
		return true
	}
	for _, line := range bytes.Split(t, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("rules:")) || bytes.HasPrefix(line, []byte(`{"rules"`)) {
			return true
		}
	}
	return false
}
