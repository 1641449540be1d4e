package llamacpp

import "github.com/llmgw/llmgw/engines"

// CheckLaunch: the worker is llama-server.
func (Adapter) CheckLaunch(f engines.LaunchFacts) error {
	if len(f.Launch.Command) == 0 || f.Launch.Command[0] != "llama-server" {
		cmd := ""
		if len(f.Launch.Command) > 0 {
			cmd = f.Launch.Command[0]
		}
		return engines.LaunchErrorf("launch.command", "must run llama-server (got %q)", cmd)
	}
	return nil
}
