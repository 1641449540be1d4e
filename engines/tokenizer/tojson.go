package tokenizer

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Templates render with transformers' tojson filter, which is Python's
// json.dumps(value, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys): objects keep the request's
// key order unless sort_keys is true. github.com/ardanlabs/jinja v1.8.0's
// tojson sorts keys when given indent= (Llama-3.1 lists its tools with
// tojson(indent=4)), and its filters cannot be replaced, so a call with
// arguments is rewritten at compile time into a call of orderedTojson,
// passed to every render as a template variable.

// tojsonFunc is the template variable the rewritten calls name.
const tojsonFunc = "__llmgw_tojson"

// tojsonCall matches `name | tojson(args)` and `a.b.c | tojson(args)`: a
// filter call with arguments on a (dotted) name, the form chat templates
// use. Calls without arguments keep the library's filter, which keeps key
// order.
var tojsonCall = regexp.MustCompile(`\b([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\s*\|\s*tojson\s*\(([^()]*)\)`)

// rewriteTojson rewrites every tojsonCall in a template's source.
func rewriteTojson(src string) string {
	return tojsonCall.ReplaceAllString(src, tojsonFunc+"($1, $2)")
}

var tojsonValue = jinja.NewCallable(tojsonFunc, orderedTojson)

// orderedTojson is json.dumps as transformers calls it, over template
// values: kwargs indent (int or None), separators ([item, key]) and
// sort_keys.
func orderedTojson(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewString(""), nil
	}
	e := jsonDumps{item: ", ", key: ": ", indent: -1}
	if v, ok := kwargs["indent"]; ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsInt() {
			return jinja.Undefined(), fmt.Errorf("tojson: indent must be an integer")
		}
		e.indent = int(v.AsInt())
		e.item = ","
	}
	if v, ok := kwargs["separators"]; ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Get(0).IsString() || !v.AsList().Get(1).IsString() {
			return jinja.Undefined(), fmt.Errorf("tojson: separators must be two strings")
		}
		e.item, e.key = v.AsList().Get(0).AsString(), v.AsList().Get(1).AsString()
	}
	if v, ok := kwargs["sort_keys"]; ok {
		e.sort = v.IsTruthy()
	}
	var sb strings.Builder
	if err := e.value(&sb, args[0], 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(sb.String()), nil
}

type jsonDumps struct {
	item, key string
	indent    int // -1: no newlines
	sort      bool
}

func (e *jsonDumps) newline(sb *strings.Builder, level int) {
	if e.indent < 0 {
		return
	}
	sb.WriteByte('\n')
	sb.WriteString(strings.Repeat(" ", e.indent*level))
}

func (e *jsonDumps) value(sb *strings.Builder, v jinja.Value, level int) error {
	if level > 64 {
		return fmt.Errorf("tojson: nested deeper than 64")
	}
	switch {
	case v.IsUndefined(), v.IsNone():
		sb.WriteString("null")
	case v.IsBool():
		sb.WriteString(strconv.FormatBool(v.AsBool()))
	case v.IsInt():
		sb.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		f := v.AsFloat()
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return fmt.Errorf("tojson: cannot encode %v", f)
		}
		sb.WriteString(pyFloat(f))
	case v.IsString():
		pyString(sb, v.AsString())
	case v.IsList():
		l := v.AsList()
		if l.Len() == 0 {
			sb.WriteString("[]")
			return nil
		}
		sb.WriteByte('[')
		for i := 0; i < l.Len(); i++ {
			if i > 0 {
				sb.WriteString(e.item)
			}
			e.newline(sb, level+1)
			if err := e.value(sb, l.Get(i), level+1); err != nil {
				return err
			}
		}
		e.newline(sb, level)
		sb.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		keys := d.OrderedKeys()
		if len(keys) == 0 {
			sb.WriteString("{}")
			return nil
		}
		if e.sort {
			sort.Strings(keys)
		}
		sb.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				sb.WriteString(e.item)
			}
			e.newline(sb, level+1)
			pyString(sb, k)
			sb.WriteString(e.key)
			val, _ := d.Get(k)
			if err := e.value(sb, val, level+1); err != nil {
				return err
			}
		}
		e.newline(sb, level)
		sb.WriteByte('}')
	default:
		return fmt.Errorf("tojson: cannot encode a %s", v.String())
	}
	return nil
}

// pyFloat is Python's repr of a float as json.dumps writes it: whole
// numbers keep ".0" (1.0), others the shortest round-trip form.
func pyFloat(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e16 {
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
	s := strconv.FormatFloat(f, 'g', -1, 64)
	// Go writes 1e+16 / 1e-05 exactly as Python's repr does.
	return s
}

// pyString writes s as json.dumps(ensure_ascii=False) does: quote,
// backslash and control characters escaped (\n \r \t \b \f, else \u00XX),
// everything else, non-ASCII included, as is.
func pyString(sb *strings.Builder, s string) {
	sb.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		default:
			if c < 0x20 {
				fmt.Fprintf(sb, `\u%04x`, c)
			} else {
				sb.WriteByte(c)
			}
		}
	}
	sb.WriteByte('"')
}
