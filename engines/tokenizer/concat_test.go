package tokenizer

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"

	"github.com/llmgw/llmgw/internal/testfix"
)

func TestSplitOutput(t *testing.T) {
	for _, c := range []struct{ name, tag, want string }{
		{"a message line", `{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}`,
			`{{- '<|im_start|>' }}{{ message.role }}{{ '\n' }}{{ message.content }}{{ '<|im_end|>' }}{{ '\n' }}`},
		{"a literal second", `{{ messages[0].content + '\n\n' -}}`, `{{ messages[0].content }}{{ '\n\n' -}}`},
		{"filters bind tighter", `{{ 'a' + b | trim + c.strip('\n') }}`, `{{ 'a' }}{{ b | trim }}{{ c.strip('\n') }}`},
		{"a plus inside a literal or brackets", `{{ '+' + f(x + 1) + d['a+b'] }}`, `{{ '+' }}{{ f(x + 1) }}{{ d['a+b'] }}`},
		{"no literal among the first two: numbers may add", `{{ a + b + 'x' }}`, `{{ a + b + 'x' }}`},
		{"a conditional", `{{ 'a' + b if c else 'd' }}`, `{{ 'a' + b if c else 'd' }}`},
		{"another operator", `{{ 'a' + b ~ c }}`, `{{ 'a' + b ~ c }}`},
		{"a minus", `{{ 'a' + (b - 1) + c - 1 }}`, `{{ 'a' + (b - 1) + c - 1 }}`},
		{"a comparison", `{{ 'a' + b == c }}`, `{{ 'a' + b == c }}`},
		{"an exponent", `{{ 'a' + 1e+5 }}`, `{{ 'a' + 1e+5 }}`},
		{"one operand", `{{ 'a' }}`, `{{ 'a' }}`},
		{"an empty operand", `{{ 'a' + + b }}`, `{{ 'a' + + b }}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := rewriteConcat(c.tag); got != c.want {
				t.Fatalf("rewriteConcat(%s)\n got %s\nwant %s", c.tag, got, c.want)
			}
		})
	}
	raw := `{% raw %}{{ 'a' + b }}{% endraw %}{{ 'a' + b }}`
	if got := rewriteConcat(raw); got != raw {
		t.Fatalf("a template with a raw block was rewritten: %s", got)
	}
	tags := `{# {{ 'a' + b }} #}{% if x == '}}' %}{{ 'c' + d }}{% endif %}`
	if got, want := rewriteConcat(tags), `{# {{ 'a' + b }} #}{% if x == '}}' %}{{ 'c' }}{{ d }}{% endif %}`; got != want {
		t.Fatalf("comments and statements:\n got %s\nwant %s", got, want)
	}
}

// renderBoth renders src as written and rewritten with the same messages.
func renderBoth(src string, msgs []Message, gen bool) (orig, rewritten string, origErr, rewrittenErr error) {
	render := func(s string) (out string, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		tpl, err := jinja.Compile(s)
		if err != nil {
			return "", fmt.Errorf("compile: %w", err)
		}
		r := &JinjaRenderer{tpl: tpl, vars: map[string]string{"bos_token": "<s>", "eos_token": "</s>"}}
		return r.Render(msgs, gen)
	}
	src = rewriteTojson(src)
	orig, origErr = render(src)
	rewritten, rewrittenErr = render(rewriteConcat(src))
	return
}

// TestRewriteConcatRendersAlike: every chat template in the repository's
// testdata, and the embedded Qwen3 one, renders the same text (or fails
// alike) once rewritten, for conversations of every role; and the
// rewrite does reach the message lines of Qwen3's.
func TestRewriteConcatRendersAlike(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testfix.Path(t, "chat-templates"), "*.jinja"))
	if err != nil || len(files) == 0 {
		t.Fatalf("templates: %v (%d)", err, len(files))
	}
	q, err := Qwen3()
	if err != nil {
		t.Fatal(err)
	}
	templates := map[string]string{"Qwen3 (embedded)": q.chatTemplate}
	for _, f := range append(files, "testdata/chatml_qwen25_rules.jinja") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		templates[filepath.Base(f)] = string(b)
	}
	long := strings.Repeat("a b\n", 300)
	convs := map[string][]Message{
		"user":                 {{Role: "user", Content: "hi + there {{ x }}"}},
		"system, user":         {{Role: "system", Content: "be brief"}, {Role: "user", Content: long}},
		"turns":                {{Role: "user", Content: "q1"}, {Role: "assistant", Content: "<think>\nr\n</think>\n\na1"}, {Role: "user", Content: "q2"}},
		"tool":                 {{Role: "user", Content: "q"}, {Role: "assistant", Content: "a"}, {Role: "tool", Content: "<tool_response>x</tool_response>"}},
		"out of order":         {{Role: "assistant", Content: "a"}, {Role: "system", Content: "s"}},
		"empty":                {},
		"an empty user string": {{Role: "user", Content: ""}},
	}
	for name, src := range templates {
		t.Run(name, func(t *testing.T) {
			if strings.Count(rewriteConcat(rewriteTojson(src)), "{{") < strings.Count(src, "{{") {
				t.Fatal("the rewrite lost output tags")
			}
			for cname, msgs := range convs {
				for _, gen := range []bool{false, true} {
					o, r, oe, re := renderBoth(src, msgs, gen)
					if (oe == nil) != (re == nil) || o != r {
						t.Fatalf("%s (generation prompt %v):\nas written %q, %v\nrewritten  %q, %v", cname, gen, o, oe, r, re)
					}
				}
			}
		})
	}
	if rw := rewriteConcat(q.chatTemplate); !strings.Contains(rw, `{{- '<|im_start|>' }}{{ message.role }}{{ '\n' }}{{ message.content }}`) {
		t.Fatal("Qwen3's user message line was not rewritten")
	}
}

// FuzzRewriteConcat: any template that compiles renders the same once
// rewritten (or fails alike), and the rewrite never panics.
func FuzzRewriteConcat(f *testing.F) {
	for _, s := range []string{
		`{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}`,
		`{% for m in messages %}{{ m.role + ': ' + m.content | trim + '\n' }}{% endfor %}`,
		`{{ 1 + 2 + 'x' }}{{ 'x' + 1 + 2 }}{{ none + 'a' }}{{ [1] + [2] }}`,
		`{% raw %}{{ 'a' + b }}{% endraw %}`,
		`{# c #}{{ 'a' + b if c else 'd' }}{{ 'x' + messages[0]['content'] }}`,
	} {
		f.Add(s)
	}
	msgs := []Message{{Role: "system", Content: "s"}, {Role: "user", Content: "u + v"}}
	f.Fuzz(func(t *testing.T, src string) {
		rw := rewriteConcat(src)
		if _, err := jinja.Compile(src); err != nil {
			return
		}
		if _, err := jinja.Compile(rw); err != nil {
			t.Fatalf("%q compiles, its rewrite %q does not: %v", src, rw, err)
		}
		o, r, oe, re := renderBoth(src, msgs, true)
		if (oe == nil) != (re == nil) || o != r {
			t.Fatalf("%q rewritten %q:\nas written %q, %v\nrewritten  %q, %v", src, rw, o, oe, r, re)
		}
	})
}
