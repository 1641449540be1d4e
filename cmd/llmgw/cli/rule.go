package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/gateway/rule"
)

// ruleClient talks to a gateway's management API.
type ruleClient struct {
	base  string
	token string
	http  *http.Client
}

// adminError is the management API's error body.
type adminError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// do sends one request and decodes a 2xx JSON answer into out (when non-nil).
// Non-2xx answers become errors carrying the API's code and message.
func (c *ruleClient) do(method, path string, body []byte, out any) error {
	req, err := http.NewRequest(method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return usageErrorf("--admin %q: %v", c.base, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("gateway admin API at %s is unreachable: %w", c.base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("reading the admin API's answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var ae adminError
		if json.Unmarshal(data, &ae) == nil && ae.Error.Code != "" {
			return fmt.Errorf("%s %s: %d %s: %s", method, path, resp.StatusCode, ae.Error.Code, ae.Error.Message)
		}
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(data)))
	}
	if out != nil && len(data) > 0 {
		if raw, ok := out.(*json.RawMessage); ok {
			*raw = append((*raw)[:0], data...)
			return nil
		}
		return json.Unmarshal(data, out)
	}
	return nil
}

func newRuleCmd(ios *IOStreams) *cobra.Command {
	c := &ruleClient{http: &http.Client{Timeout: 5 * time.Minute}}
	var tokenFile string
	cmd := &cobra.Command{
		Use:   "rule",
		Short: "Manage a running gateway's rules over its admin API",
		Long: `Manage the rules of a running 'llmgw serve' through its management API.

Mutating calls send the bearer token from --token-file when the gateway was
started with --admin-token-file.`,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := cmd.Root().PersistentPreRunE(cmd, nil); err != nil {
				return err
			}
			u, err := url.Parse(c.base)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return usageErrorf("--admin %q: want a URL such as http://127.0.0.1:8081", c.base)
			}
			c.base = strings.TrimRight(c.base, "/")
			if tokenFile != "" {
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return usageErrorf("--token-file: %v", err)
				}
				c.token = strings.TrimSpace(string(b))
			}
			return nil
		},
	}
	cmd.PersistentFlags().StringVar(&c.base, "admin", "http://127.0.0.1:8081", "the gateway's management API URL")
	cmd.PersistentFlags().StringVar(&tokenFile, "token-file", "", "file holding the admin bearer token")

	var file string
	apply := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create or update the rules in FILE (YAML or JSON; one rule or a list)",
		Long: `Create or update every rule in FILE, in order, and print each rule's
effective configuration (defaults resolved) as the gateway read it back.
A rule the gateway refuses stops the command with the admission error.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if file == "" {
				return usageErrorf("apply needs -f FILE")
			}
			var data []byte
			var err error
			if file == "-" {
				data, err = io.ReadAll(ios.In)
			} else {
				data, err = os.ReadFile(file)
			}
			if err != nil {
				return usageErrorf("-f %s: %v", file, err)
			}
			rules, err := decodeRules(data)
			if err != nil {
				return usageErrorf("-f %s: %v", file, err)
			}
			for _, r := range rules {
				body, err := json.Marshal(r)
				if err != nil {
					return err
				}
				var eff json.RawMessage
				if err := c.do(http.MethodPut, "/v1/rules/"+url.PathEscape(r.Name), body, &eff); err != nil {
					return err
				}
				fmt.Fprintf(ios.ErrOut, "rule %q applied\n", r.Name)
				if _, err := ios.Out.Write(eff); err != nil {
					return err
				}
			}
			return nil
		},
	}
	apply.Flags().StringVarP(&file, "file", "f", "", "rule file, or - for standard input")

	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Print a rule's effective configuration and live status as JSON",
		Args:  exactArgs(1, "get needs the rule NAME"),
		RunE: func(_ *cobra.Command, args []string) error {
			var raw json.RawMessage
			if err := c.do(http.MethodGet, "/v1/rules/"+url.PathEscape(args[0]), nil, &raw); err != nil {
				return err
			}
			_, err := ios.Out.Write(raw)
			return err
		},
	}

	list := &cobra.Command{
		Use:   "list",
		Short: "List rules with their readiness and endpoint states",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			var resp struct {
				Rules []struct {
					Rule struct {
						Name      string `json:"name"`
						ModelName string `json:"model_name"`
						Sel       int    `json:"sel"`
					} `json:"rule"`
					Status struct {
						Address   string `json:"address"`
						Ready     bool   `json:"ready"`
						InFlight  int64  `json:"in_flight"`
						Endpoints []struct {
							ID        string `json:"id"`
							Available bool   `json:"available"`
						} `json:"endpoints"`
					} `json:"status"`
				} `json:"rules"`
			}
			if err := c.do(http.MethodGet, "/v1/rules", nil, &resp); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(ios.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tMODEL\tSEL\tADDRESS\tREADY\tAVAILABLE\tIN-FLIGHT")
			for _, r := range resp.Rules {
				avail := 0
				for _, e := range r.Status.Endpoints {
					if e.Available {
						avail++
					}
				}
				fmt.Fprintf(tw, "%s\t%q\t%d\t%s\t%v\t%d/%d\t%d\n", r.Rule.Name, r.Rule.ModelName, r.Rule.Sel, r.Status.Address, r.Status.Ready, avail, len(r.Status.Endpoints), r.Status.InFlight)
			}
			return tw.Flush()
		},
	}

	var drainFor time.Duration
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a rule (with --drain, wait for its in-flight requests first)",
		Args:  exactArgs(1, "delete needs the rule NAME"),
		RunE: func(_ *cobra.Command, args []string) error {
			path := "/v1/rules/" + url.PathEscape(args[0])
			if drainFor > 0 {
				path += "?drain=" + drainFor.String()
			}
			if err := c.do(http.MethodDelete, path, nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(ios.ErrOut, "rule %q deleted\n", args[0])
			return nil
		},
	}
	del.Flags().DurationVar(&drainFor, "drain", 0, "drain the rule first and wait up to this long for in-flight requests")

	var endpoint string
	var undo bool
	drain := &cobra.Command{
		Use:   "drain NAME [--endpoint ID] [--undo]",
		Short: "Stop new requests to a rule's endpoints (in-flight ones finish); --undo resumes",
		Args:  exactArgs(1, "drain needs the rule NAME"),
		RunE: func(_ *cobra.Command, args []string) error {
			verb := "drain"
			if undo {
				verb = "undrain"
			}
			path := "/v1/rules/" + url.PathEscape(args[0])
			if endpoint != "" {
				path += "/endpoints/" + url.PathEscape(endpoint)
			}
			var raw json.RawMessage
			if err := c.do(http.MethodPost, path+"/"+verb, nil, &raw); err != nil {
				return err
			}
			_, err := ios.Out.Write(raw)
			return err
		},
	}
	drain.Flags().StringVar(&endpoint, "endpoint", "", "drain only this endpoint id (default: every endpoint of the rule)")
	drain.Flags().BoolVar(&undo, "undo", false, "undrain instead")

	cmd.AddCommand(apply, get, list, del, drain)
	return cmd
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
