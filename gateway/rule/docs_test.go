package rule

import (
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// TestEveryFieldDocumented fails when a field of the rule schema (a json
// tag of Rule or of a type it holds) has no row in docs/rules.md, so the
// schema documentation cannot fall behind the code.
func TestEveryFieldDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/rules.md")
	if err != nil {
		t.Fatal(err)
	}
	var fields []string
	seen := map[reflect.Type]bool{}
	var walk func(t reflect.Type, path string)
	walk = func(rt reflect.Type, path string) {
		for rt.Kind() == reflect.Pointer || rt.Kind() == reflect.Slice {
			rt = rt.Elem()
		}
		if rt.Kind() != reflect.Struct || seen[rt] || reflect.PointerTo(rt).Implements(unmarshalerType) {
			return
		}
		seen[rt] = true
		for i := 0; i < rt.NumField(); i++ {
			f := rt.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			fields = append(fields, path+name)
			walk(f.Type, path+name+".")
		}
	}
	walk(reflect.TypeFor[Rule](), "")
	if len(fields) < 40 {
		t.Fatalf("found only %d fields: the walk is broken", len(fields))
	}
	for _, f := range fields {
		name := f[strings.LastIndexByte(f, '.')+1:]
		if !strings.Contains(string(doc), "| `"+name+"` |") {
			t.Errorf("rule field %s has no row (| `%s` |) in docs/rules.md", f, name)
		}
	}
}

// TestExamplesAdmit: every rule file in examples/ decodes and is admitted,
// so the examples the README and docs point to keep working.
func TestExamplesAdmit(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples found: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			rules, err := DecodeList(data)
			if err != nil {
				r, err1 := Decode(data)
				if err1 != nil {
					t.Fatalf("neither a rule nor a rules file: %v; %v", err1, err)
				}
				rules = []*Rule{r}
			}
			for _, r := range rules {
				if err := Admit(r, nil, nil); err != nil {
					t.Fatalf("%s: %v", r.Name, err)
				}
			}
		})
	}
}

// TestDocsSpeakOfNoBranches fails when the user documentation (docs/ and
// README.md) speaks of development branches ("branch `tok`, not yet
// merged", "from branch `adapters`, on main"): a reader of the docs has the
// program as built, and such rows said what some other build would do.
func TestDocsSpeakOfNoBranches(t *testing.T) {
	leftover := regexp.MustCompile(`(?i)\bbranch(es)?\b|not yet merged|\bon main\b|\bmerged into main\b`)
	files := []string{"../../README.md"}
	err := filepath.WalkDir("../../docs", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 4 {
		t.Fatalf("found only %v: the walk is broken", files)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			if m := leftover.FindString(line); m != "" {
				t.Errorf("%s:%d speaks of development branches (%q): say what the program does", f, i+1, m)
			}
		}
	}
}
