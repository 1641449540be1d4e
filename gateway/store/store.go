// Package store persists gateway rules on local disk, one JSON file per
// rule, so that every acknowledged change survives a crash (kill -9 or power
// loss on a file system that honours fsync).
//
// Each Put writes the rule to a temporary file in the same directory, fsyncs
// it, renames it over "<name>.json" and fsyncs the directory. A reader
// therefore sees either the previous complete file or the new complete file,
// never a partial one. Temporary files left by a crash are removed by Load.
package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/llmgw/llmgw/gateway/rule"
)

const (
	ruleSuffix = ".json"
	// tempSuffix marks files being written. Temporary files are recognised
	// by this suffix, which no rule file ("<name>.json") can end with.
	tempSuffix = ".tmp"
)

// ErrCorrupt is wrapped by Load when a stored file cannot be decoded or does
// not hold the rule its name says.
var ErrCorrupt = errors.New("store: corrupt rule file")

// Store is a directory of rule files. Its methods are safe for concurrent
// use by many goroutines; they are not safe against a second process using
// the same directory at the same time.
type Store struct {
	dir string
	// mu serialises writers with each other and with Load, so that Load's
	// clean-up of temporary files never removes one a Put is still writing.
	mu sync.Mutex
}

// Open returns a Store on dir, creating it (mode 0700) if needed. It reads
// nothing: call Load for the stored rules.
func Open(dir string) (*Store, error) {
	if dir == "" {
		return nil, errors.New("store: empty directory name")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: create %s: %w", dir, err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("store: %s is not a directory", dir)
	}
	return &Store{dir: dir}, nil
}

// Dir returns the directory the store writes to.
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(name string) string {
	return filepath.Join(s.dir, name+ruleSuffix)
}

// Load returns every stored rule, sorted by name. A file that does not decode
// strictly as a rule, or whose rule name differs from its file name, is an
// error wrapping ErrCorrupt and naming the file: nothing is silently skipped.
// Temporary files left by an interrupted Put are removed. Files that are
// neither rules nor temporary files are ignored.
func (s *Store) Load() ([]*rule.Rule, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("store: read %s: %w", s.dir, err)
	}
	removed := false
	rules := make([]*rule.Rule, 0, len(entries))
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, tempSuffix) && e.Type().IsRegular():
			if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("store: remove leftover %s: %w", name, err)
			}
			removed = true
		case strings.HasSuffix(name, ruleSuffix) && e.Type().IsRegular():
			r, err := s.readFile(name)
			if err != nil {
				return nil, err
			}
			rules = append(rules, r)
		}
	}
	if removed {
		if err := syncDir(s.dir); err != nil {
			return nil, err
		}
	}
	sort.Slice(rules, func(i, j int) bool { return rules[i].Name < rules[j].Name })
	return rules, nil
}

func (s *Store) readFile(file string) (*rule.Rule, error) {
	p := filepath.Join(s.dir, file)
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("store: read %s: %w", p, err)
	}
	r, err := rule.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrCorrupt, p, err)
	}
	if want := strings.TrimSuffix(file, ruleSuffix); r.Name != want {
		return nil, fmt.Errorf("%w %s: holds rule %q, want %q", ErrCorrupt, p, r.Name, want)
	}
	return r, nil
}

// Put stores r under r.Name, replacing any previous version, and returns
// only after the new version is durable. r.Name must be a valid rule name
// (rule.ValidName). Put stores r as given; it does not run admission.
func (s *Store) Put(r *rule.Rule) error {
	if r == nil {
		return errors.New("store: put: nil rule")
	}
	if err := rule.ValidName(r.Name); err != nil {
		return fmt.Errorf("store: put: %w", err)
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("store: put %s: encode: %w", r.Name, err)
	}
	data = append(data, '\n')
	// Refuse what Load could not read back (a negative Duration, a body over
	// the decoder's limit): storing it would turn a bad call into a start-up
	// failure.
	if _, err := rule.Decode(data); err != nil {
		return fmt.Errorf("store: put %s: rule does not round-trip: %w", r.Name, err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writeAtomic(r.Name, data)
}

func (s *Store) writeAtomic(name string, data []byte) (err error) {
	f, err := os.CreateTemp(s.dir, "."+name+".*"+tempSuffix)
	if err != nil {
		return fmt.Errorf("store: put %s: %w", name, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err = bytes.NewReader(data).WriteTo(f); err != nil {
		return fmt.Errorf("store: put %s: write: %w", name, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("store: put %s: fsync: %w", name, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("store: put %s: close: %w", name, err)
	}
	if err = os.Rename(tmp, s.path(name)); err != nil {
		return fmt.Errorf("store: put %s: rename: %w", name, err)
	}
	// From here the new version is visible; a failed directory fsync leaves
	// it visible but maybe not durable, so report it without removing tmp
	// (which no longer exists under that name).
	if err := syncDir(s.dir); err != nil {
		return fmt.Errorf("store: put %s: %w", name, err)
	}
	return nil
}

// Delete removes the rule called name and returns after the removal is
// durable. Deleting a name that is not stored is not an error.
func (s *Store) Delete(name string) error {
	if err := rule.ValidName(name); err != nil {
		return fmt.Errorf("store: delete: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Remove(s.path(name)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("store: delete %s: %w", name, err)
	}
	return syncDir(s.dir)
}

// syncDir fsyncs a directory so that a rename or removal in it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("store: open dir for fsync: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("store: fsync dir %s: %w", dir, err)
	}
	return nil
}
