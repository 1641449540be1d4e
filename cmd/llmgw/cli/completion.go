package cli

import (
	"context"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/gateway/adminclient"
	"github.com/llmgw/llmgw/profiles"
	"github.com/llmgw/llmgw/runbook/labkit"
)

// Value completion for the shell completion scripts cobra generates
// (`llmgw completion bash|zsh|fish|powershell`). Each source is best
// effort: when it cannot answer (no results directory, no gateway) the
// shell simply gets no candidates, never an error or a hang.

// ruleCompletionDeadline bounds the admin API call that completes rule
// names: a shell waiting on a dead gateway must come back at once.
const ruleCompletionDeadline = 500 * time.Millisecond

// completeEngines completes engine names (the catalog's), plus extra
// values (qualify's "all").
func completeEngines(extra ...string) cobra.CompletionFunc {
	return fixedCompletion(append(profiles.Engines(), extra...)...)
}

// completeProfiles completes catalog profile IDs.
func completeProfiles(_ *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
	cat, err := labkit.LoadCatalog(nil)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return cat.IDs(), cobra.ShellCompDirectiveNoFileComp
}

// completeList completes a comma-separated list flag (--profiles a,b):
// the candidates are the prefix already typed plus each value not in it.
func completeList(values func() []string) cobra.CompletionFunc {
	return func(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		done, prefix := "", ""
		if i := strings.LastIndex(toComplete, ","); i >= 0 {
			done, prefix = toComplete[:i+1], toComplete[:i+1]
		}
		have := map[string]bool{}
		for _, v := range strings.Split(done, ",") {
			have[v] = true
		}
		var out []string
		for _, v := range values() {
			if !have[v] {
				out = append(out, prefix+v)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
	}
}

// profileIDs lists the catalog's profile IDs, none when it cannot load.
func profileIDs() []string {
	cat, err := labkit.LoadCatalog(nil)
	if err != nil {
		return nil
	}
	return cat.IDs()
}

// completeRunIDs completes run IDs recorded in the results directory *out
// (read when the shell asks, so a --out typed before it is honoured).
// Only the first positional argument is a run.
func completeRunIDs(out *string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 && cmd.Flags().Lookup("run") == nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		s, ok, err := openResults(*out)
		if err != nil || !ok {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		rows, err := s.List()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ids := make([]string, 0, len(rows))
		for i := len(rows) - 1; i >= 0; i-- { // newest first
			ids = append(ids, rows[i].ID+"\t"+rows[i].Tuple.Engine+" "+rows[i].Tuple.Mode+" "+string(rows[i].Verdict.Norm()))
		}
		return ids, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveKeepOrder
	}
}

// completeRuleNames completes the first argument with the rule names of
// the gateway at *admin (read with the token in *tokenFile, if any), within
// ruleCompletionDeadline.
func completeRuleNames(admin, tokenFile *string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var token string
		if *tokenFile != "" {
			if b, err := os.ReadFile(*tokenFile); err == nil {
				token = strings.TrimSpace(string(b))
			}
		}
		c, err := adminclient.New(*admin, token, &http.Client{Timeout: ruleCompletionDeadline})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(context.Background(), ruleCompletionDeadline)
		defer cancel()
		rules, err := c.Rules(ctx)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		names := make([]string, 0, len(rules))
		for _, r := range rules {
			if r.Rule != nil {
				names = append(names, r.Rule.Name+"\t"+r.Rule.ModelName)
			}
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeFlag registers fn as flag name's completion on cmd. It panics on
// a flag cmd does not have: a typo in the command tree, caught by any test
// that builds it.
func completeFlag(cmd *cobra.Command, name string, fn cobra.CompletionFunc) {
	if err := cmd.RegisterFlagCompletionFunc(name, fn); err != nil {
		panic("llmgw: completion for --" + name + " of " + cmd.Name() + ": " + err.Error())
	}
}
