package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/llmgw/llmgw/profiles"
	"github.com/llmgw/llmgw/results"
	"github.com/llmgw/llmgw/runbook/labkit"
)

// ProfilesOptions are the inputs of `llmgw profiles`.
type ProfilesOptions struct {
	IO *IOStreams
	// Output is -o: list table, json or yaml; show yaml (default) or json.
	Output  string
	Engine  string // show: print only this engine's launch spec
	Catalog func() (*profiles.Catalog, error)
}

func newProfilesCmd(io *IOStreams) *cobra.Command {
	opts := &ProfilesOptions{IO: io, Catalog: func() (*profiles.Catalog, error) { return labkit.LoadCatalog(nil) }}
	cmd := &cobra.Command{
		Use:   "profiles",
		Short: "Show the model catalog: evaluation profiles and the engine version tuple",
		Long: `The model catalog embedded in llmgw: the pinned engine version tuple (vLLM,
SGLang, TensorRT-LLM on the PyTorch backend, a llama.cpp server build) and one
evaluation profile per model, with its tokenizer and chat-template facts, block
size and hash algorithm per engine, launch specs, and known-BLOCKED tuples.

'list' prints a table sized to the terminal on a terminal, tab-separated lines
otherwise (-o table), or the whole catalog (-o json, -o yaml: kind
ProfileCatalog). 'show' prints one profile as YAML (-o yaml, the default) or
JSON (-o json). --json is a deprecated alias of -o json.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	// list and show have their own -o (their defaults differ).
	var listOut, showOut string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the evaluation profiles",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return profilesList(opts.with(listOut)) },
	}
	addOutputFlag(list, &listOut, outputTable)
	deprecatedJSONFlag(list, io, &listOut)
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Print one profile as YAML (or -o json)",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("profiles show needs one profile ID (see 'llmgw profiles list')")
			}
			return nil
		},
		ValidArgsFunction: func(cmd *cobra.Command, args []string, s string) ([]string, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return completeProfiles(cmd, args, s)
		},
		RunE: func(_ *cobra.Command, args []string) error { return profilesShow(opts.with(showOut), args[0]) },
	}
	show.Flags().StringVarP(&showOut, "output", "o", outputYAML, "output format: yaml or json")
	completeFlag(show, "output", fixedCompletion(outputYAML, outputJSON))
	deprecatedJSONFlag(show, io, &showOut)
	show.Flags().StringVar(&opts.Engine, "engine", "", "print only this engine's launch spec ("+strings.Join(profiles.Engines(), ", ")+")")
	completeFlag(show, "engine", completeEngines())
	cmd.AddCommand(list, show)
	return cmd
}

// engineCell summarises one engine of a profile for the list table.
func engineCell(p profiles.Profile, engine string) string {
	es := p.Engines[engine]
	if es.Blocked != nil {
		return "BLOCKED " + es.Blocked.Code
	}
	if es.BlockSize == 0 {
		return es.HashAlgo
	}
	return fmt.Sprintf("%d/%s", es.BlockSize, es.HashAlgo)
}

// ProfileCatalogDoc is `profiles list -o json|yaml`: the whole catalog.
type ProfileCatalogDoc struct {
	Kind     string                  `json:"kind"` // "ProfileCatalog"
	Versions profiles.Versions       `json:"versions"`
	Seed     string                  `json:"kv_hash_seed"`
	Profiles []profiles.Profile      `json:"profiles"`
	Blocked  []profiles.BlockedTuple `json:"blocked"`
}

// with is a copy of o printing in output.
func (o *ProfilesOptions) with(output string) *ProfilesOptions {
	c := *o
	c.Output = output
	return &c
}

func profilesList(opts *ProfilesOptions) error {
	if err := checkOutput(opts.Output); err != nil {
		return err
	}
	cat, err := opts.Catalog()
	if err != nil {
		return err
	}
	if opts.Output != outputTable {
		doc := ProfileCatalogDoc{kindProfileCatalog, cat.Versions(), cat.KVHashSeed(), cat.Profiles(), cat.BlockedTuples()}
		return writeDoc(opts.IO.Out, opts.Output, doc)
	}
	headers := []string{"ID", "MODEL", "REVISION", "API", "TEMPLATE", "BOS"}
	for _, e := range profiles.Engines() {
		headers = append(headers, strings.ToUpper(e))
	}
	var rows [][]string
	for _, p := range cat.Profiles() {
		bos := "none"
		switch {
		case p.Tokenizer.AddBOS && p.Tokenizer.TemplateBOS:
			bos = "tokenizer+template"
		case p.Tokenizer.AddBOS:
			bos = "tokenizer"
		case p.Tokenizer.TemplateBOS:
			bos = "template"
		}
		row := []string{p.ID, p.Model.Repo, p.Model.Revision, p.APIMode, p.Tokenizer.TemplateFamily, bos}
		for _, e := range profiles.Engines() {
			row = append(row, engineCell(p, e))
		}
		rows = append(rows, row)
	}
	if !opts.IO.OutTTY {
		return results.TSV(opts.IO.Out, headers, rows)
	}
	v := cat.Versions()
	footer := fmt.Sprintf("versions: vllm %s, sglang %s, trtllm %s (%s backend), llamacpp %s; kv hash seed %q",
		v.VLLM.Version, v.SGLang.Version, v.TRTLLM.Version, v.TRTLLM.Backend, v.LlamaCpp.Version, cat.KVHashSeed())
	if err := writeTable(opts.IO, headers, rows, "ID"); err != nil {
		return err
	}
	_, err = io.WriteString(opts.IO.Out, results.FitLine(opts.IO.Width, footer)+"\n")
	return err
}

func profilesShow(opts *ProfilesOptions, id string) error {
	if err := checkOutput(opts.Output, outputYAML, outputJSON); err != nil {
		return err
	}
	cat, err := opts.Catalog()
	if err != nil {
		return err
	}
	p, err := cat.Get(id)
	if errors.Is(err, profiles.ErrUnknownProfile) {
		return usageErrorf("unknown profile %q (valid: %s)", id, strings.Join(cat.IDs(), ", "))
	}
	if err != nil {
		return err
	}
	var doc any = p
	if opts.Engine != "" {
		l, err := p.Launch(opts.Engine)
		switch {
		case errors.Is(err, profiles.ErrUnknownEngine):
			return usageErrorf("unknown engine %q (valid: %s)", opts.Engine, strings.Join(profiles.Engines(), ", "))
		case errors.Is(err, profiles.ErrBlocked):
			code, detail, _ := cat.Blocked(opts.Engine, id)
			fmt.Fprintf(opts.IO.ErrOut, "%s on %s is BLOCKED (%s): %s\n", id, opts.Engine, code, detail)
			return &ExitCodeError{Code: ExitBlocked}
		case err != nil:
			return err
		}
		doc = l
	}
	if opts.Output == outputJSON {
		return writeIndentedJSON(opts.IO.Out, doc)
	}
	// The catalog's own YAML (its files' keys, which the JSON tags repeat).
	enc := yaml.NewEncoder(opts.IO.Out)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("profiles show: %w", err)
	}
	return enc.Close()
}

// writeIndentedJSON prints v indented, without HTML escaping.
func writeIndentedJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
