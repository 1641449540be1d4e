package launcher

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"

	"github.com/llmgw/llmgw/gateway/adminclient"
	"github.com/llmgw/llmgw/runbook"
)

// CleanupOptions select what Cleanup removes.
type CleanupOptions struct {
	// Out is the results directory holding the ownership ledgers.
	Out string
	// RunID limits cleanup to one run; "" with All cleans every run.
	RunID string
	// All cleans every ledger and also every container and network
	// labelled llmgw.owner=llmgw (left by a run whose ledger was lost).
	All bool
	// AdminTokenFile is a file holding the admin bearer token for rules
	// whose ledger entry names no token file of its own ("" = none).
	AdminTokenFile string
	// DockerEndpoint is the daemon address ("" = default). Docker is only
	// contacted when there is something docker-owned to remove.
	DockerEndpoint string
	// Logf receives one line per action; nil discards.
	Logf func(format string, a ...any)
}

// CleanupReport says what Cleanup did.
type CleanupReport struct {
	Runs       []string // ledgers examined
	Containers []string // removed
	Networks   []string // removed
	Rules      []string // deleted ("admin name")
	Processes  []int    // signalled
	Dirs       []string // removed
	// Kept lists ledgers that still own something (an error prevented its
	// removal); their files stay for the next attempt.
	Kept []string
	// Unreadable lists ledger files that could not be read (the others
	// were cleaned all the same).
	Unreadable []string
	// LeftAlone lists processes recorded without a start time, or whose
	// PID now runs another process: never signalled.
	LeftAlone []int
}

// Nothing reports whether Cleanup found nothing to remove.
func (r CleanupReport) Nothing() bool {
	return len(r.Containers)+len(r.Networks)+len(r.Rules)+len(r.Processes)+len(r.Dirs) == 0
}

// Cleanup removes what runs of this tool own, as their ledgers record it
// (and, with All, what carries the llmgw.owner label): containers and
// networks, applied rules (deleted with a drain), child processes and
// temporary directories. Rules are drained before deletion, workers after.
// It never touches anything unrecorded or unlabelled, and is safe to repeat:
// a second call finds nothing. Errors are collected; ledgers that still own
// something are kept.
func Cleanup(ctx context.Context, o CleanupOptions) (CleanupReport, error) {
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	var rep CleanupReport
	var ledgers []*runbook.Ledger
	var ledgerErr error
	switch {
	case o.RunID != "":
		l, err := runbook.LoadLedger(o.Out, o.RunID)
		if errors.Is(err, fs.ErrNotExist) {
			logf("run %s owns nothing (no ledger in %s)", o.RunID, o.Out)
			return rep, nil
		}
		if err != nil {
			return rep, err
		}
		ledgers = []*runbook.Ledger{l}
	case o.All:
		ls, err := runbook.Ledgers(o.Out)
		if err != nil {
			// Reported, and the readable ledgers are still cleaned.
			rep.Unreadable = append(rep.Unreadable, err.Error())
			logf("unreadable ledger: %v", err)
			ledgerErr = err
		}
		ledgers = ls
	default:
		return rep, errors.New("launcher: cleanup: name a run or ask for all")
	}

	var pool *dockertest.Pool
	var poolErr error
	dockerPool := func() (*dockertest.Pool, error) {
		if pool == nil && poolErr == nil {
			p, err := dockertest.NewPool(o.DockerEndpoint)
			if err == nil {
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err = p.Client.PingWithContext(pctx)
				cancel()
			}
			if err != nil {
				poolErr = fmt.Errorf("launcher: cleanup: docker: %w", err)
			} else {
				pool = p
			}
		}
		return pool, poolErr
	}

	errs := []error{ledgerErr}
	for _, l := range ledgers {
		st := l.State()
		rep.Runs = append(rep.Runs, st.RunID)
		// 1. Rules first, drained: traffic leaves the workers before they go.
		for _, r := range st.Rules {
			if err := deleteRule(ctx, r, o.AdminTokenFile); err != nil {
				errs = append(errs, err)
				continue
			}
			rep.Rules = append(rep.Rules, r.Admin+" "+r.Name)
			logf("deleted rule %s on %s", r.Name, r.Admin)
			errs = append(errs, l.Update(func(s *runbook.LedgerState) {
				s.Rules = slices.DeleteFunc(s.Rules, func(x runbook.OwnedRule) bool { return x == r })
			}))
		}
		// 2. Containers: the recorded ids and anything labelled with the run.
		if len(st.Containers) > 0 || len(st.Networks) > 0 || o.All {
			p, err := dockerPool()
			if err != nil && (len(st.Containers) > 0 || len(st.Networks) > 0) {
				errs = append(errs, err)
			}
			if p != nil {
				ids, err := labelled(p, LabelRun+"="+st.RunID)
				errs = append(errs, err)
				for _, id := range union(st.Containers, ids) {
					if err := removeContainer(p, id); err != nil {
						errs = append(errs, err)
						continue
					}
					rep.Containers = append(rep.Containers, id)
					logf("removed container %.12s (run %s)", id, st.RunID)
					errs = append(errs, l.Update(func(s *runbook.LedgerState) {
						s.Containers = slices.DeleteFunc(s.Containers, func(x string) bool { return x == id })
					}))
				}
				for _, id := range st.Networks {
					if err := p.Client.RemoveNetwork(id); err != nil && !isNoSuchNetwork(err) {
						errs = append(errs, fmt.Errorf("launcher: cleanup: network %.12s: %w", id, err))
						continue
					}
					rep.Networks = append(rep.Networks, id)
					logf("removed network %.12s (run %s)", id, st.RunID)
					errs = append(errs, l.Update(func(s *runbook.LedgerState) {
						s.Networks = slices.DeleteFunc(s.Networks, func(x string) bool { return x == id })
					}))
				}
			}
		}
		// 3. Child processes this run started: signalled only when the PID
		// still runs the very process recorded (same start time). A PID
		// recorded without a start time cannot be proved ours: left alone.
		for _, p := range st.Processes {
			if runbook.SameProcess(p) {
				if err := syscall.Kill(p.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
					errs = append(errs, fmt.Errorf("launcher: cleanup: process %d: %w", p.PID, err))
					continue
				}
				rep.Processes = append(rep.Processes, p.PID)
				logf("stopped process %d (run %s)", p.PID, st.RunID)
			} else {
				rep.LeftAlone = append(rep.LeftAlone, p.PID)
				logf("process %d (run %s) is gone or the PID now runs another process: left alone", p.PID, st.RunID)
			}
			errs = append(errs, l.Update(func(s *runbook.LedgerState) {
				s.Processes = slices.DeleteFunc(s.Processes, func(x runbook.OwnedProcess) bool { return x == p })
			}))
		}
		for _, pid := range st.PIDs {
			rep.LeftAlone = append(rep.LeftAlone, pid)
			logf("process %d (run %s) was recorded without its start time: not provably ours, left alone", pid, st.RunID)
			errs = append(errs, l.Update(func(s *runbook.LedgerState) {
				s.PIDs = slices.DeleteFunc(s.PIDs, func(x int) bool { return x == pid })
			}))
		}
		// 4. Temporary directories.
		for _, d := range st.Dirs {
			if err := os.RemoveAll(d); err != nil {
				errs = append(errs, fmt.Errorf("launcher: cleanup: %w", err))
				continue
			}
			rep.Dirs = append(rep.Dirs, d)
			logf("removed directory %s (run %s)", d, st.RunID)
			errs = append(errs, l.Update(func(s *runbook.LedgerState) {
				s.Dirs = slices.DeleteFunc(s.Dirs, func(x string) bool { return x == d })
			}))
		}
		errs = append(errs, l.Finish())
		if !l.State().Empty() {
			rep.Kept = append(rep.Kept, st.RunID)
		}
	}
	// 5. With --all: labelled leftovers of runs whose ledger is gone.
	if o.All {
		if p, err := dockerPool(); p != nil {
			ids, err := labelled(p, LabelOwner+"="+OwnerValue)
			errs = append(errs, err)
			for _, id := range ids {
				if err := removeContainer(p, id); err != nil {
					errs = append(errs, err)
					continue
				}
				rep.Containers = append(rep.Containers, id)
				logf("removed labelled container %.12s", id)
			}
			nets, err := p.Client.FilteredListNetworks(dc.NetworkFilterOpts{"label": {LabelOwner + "=" + OwnerValue: true}})
			if err != nil {
				errs = append(errs, fmt.Errorf("launcher: cleanup: list networks: %w", err))
			}
			for _, n := range nets {
				if err := p.Client.RemoveNetwork(n.ID); err != nil && !isNoSuchNetwork(err) {
					errs = append(errs, fmt.Errorf("launcher: cleanup: network %s: %w", n.Name, err))
					continue
				}
				rep.Networks = append(rep.Networks, n.ID)
				logf("removed labelled network %s", n.Name)
			}
		} else if err != nil && !errors.Is(err, context.Canceled) {
			logf("docker not reachable: no labelled containers to look for (%v)", err)
		}
	}
	return rep, errors.Join(errs...)
}

// deleteRule deletes an owned rule with a short drain, authenticated with
// the token file the ledger names (else tokenFile). An embedded gateway's
// rule died with its process when its admin API no longer answers (its
// state directory is removed with the ledger's Dirs).
func deleteRule(ctx context.Context, r runbook.OwnedRule, tokenFile string) error {
	if r.TokenFile != "" {
		tokenFile = r.TokenFile
	}
	token := ""
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return fmt.Errorf("launcher: cleanup: rule %s on %s: admin token file: %w", r.Name, r.Admin, err)
		}
		if token = strings.TrimSpace(string(b)); token == "" {
			return fmt.Errorf("launcher: cleanup: rule %s on %s: admin token file %s is empty", r.Name, r.Admin, tokenFile)
		}
	}
	a, err := adminclient.New(r.Admin, token, &http.Client{Timeout: 30 * time.Second})
	if err != nil {
		return err
	}
	if _, err := a.Delete(ctx, r.Name, 5*time.Second); err != nil {
		var ae *adminclient.Error
		if r.Embedded && !errors.As(err, &ae) {
			return nil // the process that served it is gone
		}
		return fmt.Errorf("launcher: cleanup: rule %s on %s: %w", r.Name, r.Admin, err)
	}
	return nil
}

func labelled(p *dockertest.Pool, label string) ([]string, error) {
	cs, err := p.Client.ListContainers(dc.ListContainersOptions{All: true, Filters: map[string][]string{"label": {label}}})
	if err != nil {
		return nil, fmt.Errorf("launcher: cleanup: list containers %s: %w", label, err)
	}
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids, nil
}

func removeContainer(p *dockertest.Pool, id string) error {
	err := p.Client.RemoveContainer(dc.RemoveContainerOptions{ID: id, Force: true, RemoveVolumes: true})
	if err != nil && !isNoSuchContainer(err) {
		return fmt.Errorf("launcher: cleanup: container %.12s: %w", id, err)
	}
	return nil
}

func isNoSuchNetwork(err error) bool {
	var nsn *dc.NoSuchNetwork
	return errors.As(err, &nsn)
}

func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}
