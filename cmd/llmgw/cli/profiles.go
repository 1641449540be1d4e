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
	IO      *IOStreams
	JSON    bool
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

On a terminal 'list' prints a table; otherwise tab-separated lines.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the evaluation profiles",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return profilesList(opts) },
	}
	list.Flags().BoolVar(&opts.JSON, "json", false, "print the full profiles and the version tuple as JSON")
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Print one profile as YAML (or --json)",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("profiles show needs one profile ID (see 'llmgw profiles list')")
			}
			return nil
		},
		RunE: func(_ *cobra.Command, args []string) error { return profilesShow(opts, args[0]) },
	}
	show.Flags().BoolVar(&opts.JSON, "json", false, "print JSON instead of YAML")
	show.Flags().StringVar(&opts.Engine, "engine", "", "print only this engine's launch spec ("+strings.Join(profiles.Engines(), ", ")+")")
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

func profilesList(opts *ProfilesOptions) error {
	cat, err := opts.Catalog()
	if err != nil {
		return err
	}
	if opts.JSON {
		doc := struct {
			Versions profiles.Versions       `json:"versions"`
			Seed     string                  `json:"kv_hash_seed"`
			Profiles []profiles.Profile      `json:"profiles"`
			Blocked  []profiles.BlockedTuple `json:"blocked"`
		}{cat.Versions(), cat.KVHashSeed(), cat.Profiles(), cat.BlockedTuples()}
		return writeIndentedJSON(opts.IO.Out, doc)
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
	footer := fmt.Sprintf("versions: vllm %s, sglang %s, trtllm %s (%s backend), llamacpp %s; kv hash seed %q\n",
		v.VLLM.Version, v.SGLang.Version, v.TRTLLM.Version, v.TRTLLM.Backend, v.LlamaCpp.Version, cat.KVHashSeed())
	_, err = io.WriteString(opts.IO.Out, results.Table(opts.IO.Out, headers, rows)+"\n"+footer)
	return err
}

func profilesShow(opts *ProfilesOptions, id string) error {
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
	if opts.JSON {
		return writeIndentedJSON(opts.IO.Out, doc)
	}
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
