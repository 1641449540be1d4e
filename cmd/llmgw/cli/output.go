package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// The one output convention: every command that prints data takes
// -o/--output table|json|yaml.
//
//	table  for people: a table sized to the terminal on a terminal (long
//	       cells truncated with an ellipsis), tab-separated lines otherwise
//	json   the command's document, encoding/json of a typed struct whose
//	       "kind" (or, for results, "schema") field names its shape
//	yaml   the same document as YAML (converted from the JSON, so the keys
//	       are the same)
//
// Data goes to standard output, messages to standard error, so
// `llmgw results list -o json | jq` always parses.
const (
	outputTable = "table"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

// The kinds of the -o json|yaml documents, one per shape; docs/output.md
// has a row for each (TestOutputKindsDocumented).
const (
	kindRule           = "Rule"           // rule get, rule drain: RuleDoc
	kindRuleList       = "RuleList"       // rule list: RuleListDoc
	kindRuleApply      = "RuleApply"      // rule apply: RuleApplyDoc
	kindRunbookRun     = "RunbookRun"     // runbook converged|pd: RunbookDoc
	kindQualifyReport  = "QualifyReport"  // qualify: QualifyDoc
	kindProfileCatalog = "ProfileCatalog" // profiles list: ProfileCatalogDoc
	kindResultsVerify  = "ResultsVerify"  // results verify: VerifyDoc
)

// outputKinds lists every kind above.
var outputKinds = []string{kindRule, kindRuleList, kindRuleApply, kindRunbookRun, kindQualifyReport, kindProfileCatalog, kindResultsVerify}

// outputFormats are the values of -o in the order help and completion list
// them.
var outputFormats = []string{outputTable, outputJSON, outputYAML}

// addOutputFlag registers -o/--output on cmd, bound to p, with def as the
// default and completion of the formats. extra formats (results export's
// md, junit, tsv) follow the common three.
func addOutputFlag(cmd *cobra.Command, p *string, def string, extra ...string) {
	formats := append(append([]string(nil), outputFormats...), extra...)
	cmd.Flags().StringVarP(p, "output", "o", def, "output format: "+strings.Join(formats, ", "))
	_ = cmd.RegisterFlagCompletionFunc("output", fixedCompletion(formats...))
}

// checkOutput refuses an -o value not in formats (the common three when
// none are given).
func checkOutput(o string, formats ...string) error {
	if len(formats) == 0 {
		formats = outputFormats
	}
	for _, f := range formats {
		if o == f {
			return nil
		}
	}
	return usageErrorf("-o %q: want %s", o, strings.Join(formats, ", "))
}

// writeDoc prints v as JSON (indented, no HTML escaping) or YAML; format
// must be json or yaml.
func writeDoc(w io.Writer, format string, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("-o %s: %w", format, err)
	}
	if format == outputYAML {
		y, err := yaml.JSONToYAML(b.Bytes())
		if err != nil {
			return fmt.Errorf("-o yaml: %w", err)
		}
		_, err = w.Write(y)
		return err
	}
	_, err := w.Write(b.Bytes())
	return err
}

// deprecatedJSONFlag registers the old boolean --json on cmd as a
// deprecated alias of -o json: scripts written against it keep working,
// and each use prints a note on standard error naming the replacement.
func deprecatedJSONFlag(cmd *cobra.Command, ios *IOStreams, output *string) {
	var on bool
	cmd.Flags().BoolVar(&on, "json", false, "deprecated: use -o json")
	_ = cmd.Flags().MarkHidden("json")
	wrapPreRun(cmd, func(c *cobra.Command) error {
		if !on {
			return nil
		}
		if c.Flags().Changed("output") && *output != outputJSON {
			return usageErrorf("--json conflicts with -o %s", *output)
		}
		fmt.Fprintln(ios.ErrOut, "llmgw: --json is deprecated; use -o json")
		*output = outputJSON
		return nil
	})
}

// deprecatedFormatFlag registers the old --format on cmd as a deprecated
// alias of -o, mapping its values through names ("markdown" -> "md").
func deprecatedFormatFlag(cmd *cobra.Command, ios *IOStreams, output *string, names map[string]string) {
	var format string
	cmd.Flags().StringVar(&format, "format", "", "deprecated: use -o")
	_ = cmd.Flags().MarkHidden("format")
	wrapPreRun(cmd, func(c *cobra.Command) error {
		if !c.Flags().Changed("format") {
			return nil
		}
		v := format
		if n, ok := names[v]; ok {
			v = n
		}
		if c.Flags().Changed("output") && *output != v {
			return usageErrorf("--format %s conflicts with -o %s", format, *output)
		}
		fmt.Fprintf(ios.ErrOut, "llmgw: --format is deprecated; use -o %s\n", v)
		*output = v
		return nil
	})
}

// wrapPreRun runs fn before cmd's own PreRunE (flags are parsed by then).
func wrapPreRun(cmd *cobra.Command, fn func(*cobra.Command) error) {
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if err := fn(c); err != nil {
			return err
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
}

// fixedCompletion completes a flag or argument from a fixed list.
func fixedCompletion(values ...string) cobra.CompletionFunc {
	return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return values, cobra.ShellCompDirectiveNoFileComp
	}
}
