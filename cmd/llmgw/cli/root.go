// Package cli holds llmgw's cobra commands. Commands are thin: they parse
// flags into an options struct and call a run function in a library package.
package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/llmgw/llmgw/internal/suggest"
)

// Main runs llmgw with args and returns the process exit code.
func Main(ctx context.Context, args []string, io *IOStreams) ExitCode {
	root := NewRootCmd(io)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	code := exitCodeFor(err)
	if err != nil && err.Error() != "" {
		fmt.Fprintf(io.ErrOut, "llmgw: %v\n", err)
	}
	if code == ExitUsage {
		fmt.Fprintln(io.ErrOut, "run 'llmgw --help' (or 'llmgw <command> --help') for usage")
	}
	return code
}

// NewRootCmd builds the command tree. Each subcommand registers itself in
// subcommands below; the list is explicit so duplicates are caught at compile
// time rather than by init order.
func NewRootCmd(io *IOStreams) *cobra.Command {
	v := viper.New()
	root := &cobra.Command{
		Use:   "llmgw",
		Short: "Cache-aware LLM inference gateway and qualification lab",
		Long: `llmgw is one binary with two halves:

  the gateway   llmgw serve      OpenAI-compatible full proxy with round robin, session
                                 affinity, CHWBL content affinity, KV-exact routing and
                                 prefill/decode disaggregation, health checks and metrics
                llmgw rule       manage the gateway's rules over its admin API

  the lab       llmgw runbook    ordered, evidence-backed deployment runbooks
                                 (converged, pd) that end PASS, FAIL or BLOCKED
                llmgw qualify    the qualification matrix: profiles x modes x topologies
                llmgw results    list, show, verify and export recorded runs
                llmgw cleanup    remove what runbooks launched (containers, processes, rules)
                llmgw profiles   the model catalog and engine version tuple
                llmgw sim        engine simulators (vLLM, SGLang, TensorRT-LLM, llama.cpp)
                llmgw bench      gateway overhead and routing quality, side by side

Start with: llmgw runbook converged   (simulated vLLM workers, KV-exact routing)

Every flag can also be set with an environment variable LLMGW_<FLAG> (dashes
become underscores, e.g. LLMGW_STATE_DIR) or in a YAML config file given with
--config. Flags win over the environment, which wins over the file.`,
		Version:       versionString(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return loadConfig(cmd, v)
		},
	}
	root.SetVersionTemplate("llmgw {{.Version}}\n")
	root.SetOut(io.Out)
	root.SetErr(io.ErrOut)
	root.PersistentFlags().String("config", "", "YAML config file whose keys are flag names (e.g. listen: 127.0.0.1:8080)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &UsageError{Err: err} })
	for _, sub := range subcommands(io) {
		root.AddCommand(sub)
	}
	return root
}

// loadConfig fills every flag the user did not set from the environment
// (LLMGW_*) or the config file, so all three sources share one set of names.
func loadConfig(cmd *cobra.Command, v *viper.Viper) error {
	v.SetEnvPrefix("LLMGW")
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_"))
	v.AutomaticEnv()
	if path, _ := cmd.Flags().GetString("config"); path != "" {
		v.SetConfigFile(path)
		if err := v.ReadInConfig(); err != nil {
			return &UsageError{Err: fmt.Errorf("config file %s: %w", path, err)}
		}
		if err := checkConfigKeys(cmd, path); err != nil {
			return err
		}
	}
	var firstErr error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Changed || f.Name == "config" || f.Name == "help" || !v.IsSet(f.Name) {
			return
		}
		val := v.Get(f.Name)
		var s string
		switch x := val.(type) {
		case []any:
			parts := make([]string, len(x))
			for i := range x {
				parts[i] = fmt.Sprint(x[i])
			}
			s = strings.Join(parts, ",")
		default:
			s = fmt.Sprint(x)
		}
		if err := cmd.Flags().Set(f.Name, s); err != nil && firstErr == nil {
			firstErr = &UsageError{Err: fmt.Errorf("--%s from environment or config: %w", f.Name, err)}
		}
	})
	return firstErr
}

// checkConfigKeys refuses a config file key that is not a flag of cmd: a
// misspelled key would otherwise be silently ignored. The file is read on
// its own (not through the merged viper) so environment variables cannot
// mask or add keys.
func checkConfigKeys(cmd *cobra.Command, path string) error {
	fv := viper.New()
	fv.SetConfigFile(path)
	if err := fv.ReadInConfig(); err != nil {
		return &UsageError{Err: fmt.Errorf("config file %s: %w", path, err)}
	}
	var unknown []string
	for _, k := range fv.AllKeys() {
		if k == "config" || cmd.Flags().Lookup(k) == nil {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	var flagNames []string
	cmd.Flags().VisitAll(func(f *pflag.Flag) { flagNames = append(flagNames, f.Name) })
	var hint []string
	for _, k := range unknown {
		if near := suggest.Closest(k, flagNames); near != "" {
			hint = append(hint, fmt.Sprintf("%s (did you mean %s?)", k, near))
		} else {
			hint = append(hint, k)
		}
	}
	return &UsageError{Err: fmt.Errorf("config file %s: unknown key(s) for '%s': %s; keys are the command's flag names (%s --help)",
		path, cmd.CommandPath(), strings.Join(hint, "; "), cmd.CommandPath())}
}

// usageErrorf returns a UsageError: the command was called wrongly and nothing
// was started.
func usageErrorf(format string, a ...any) error {
	return &UsageError{Err: fmt.Errorf(format, a...)}
}
