package rule

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"

	yamlv2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"

	closest "github.com/llmgw/llmgw/internal/suggest"
)

// MaxRuleBytes bounds one rule body accepted by Decode.
const MaxRuleBytes = 1 << 20

// MaxListBytes bounds a rules file accepted by DecodeList.
const MaxListBytes = 16 << 20

// ErrTooLarge is wrapped by Decode and DecodeList when the input exceeds
// MaxRuleBytes or MaxListBytes.
var ErrTooLarge = errors.New("rule: body too large")

// ErrSyntax is wrapped when the input is not well-formed JSON or YAML, is
// empty, or carries trailing data after the rule.
var ErrSyntax = errors.New("rule: malformed body")

// FieldError reports a problem with one field of a decoded body: an unknown
// or duplicated key, or a value of the wrong type. Path is the JSON path of
// the field ("endpoints[1].epRole"); Message says what is wrong and, for
// near-miss names, which field was probably meant.
type FieldError struct {
	Path    string
	Message string
}

func (e *FieldError) Error() string {
	if e.Path == "" {
		return "rule: " + e.Message
	}
	return "rule: " + e.Path + ": " + e.Message
}

// Decode parses one rule from JSON or YAML. The input is JSON when its first
// non-space byte is '{', YAML otherwise; YAML is converted to JSON first so
// both go through the same strict decoder.
//
// Decoding is strict: unknown fields (at any depth, compared case-sensitively)
// and duplicated keys are *FieldError values naming the path and suggesting
// the nearest valid name; a value of the wrong type is a *FieldError naming
// the expected type; trailing data and malformed input wrap ErrSyntax; input
// over MaxRuleBytes wraps ErrTooLarge. Decode checks shape only: run Admit
// for the semantic checks. It is safe for concurrent use.
func Decode(data []byte) (*Rule, error) {
	if len(data) > MaxRuleBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(data), MaxRuleBytes)
	}
	js, err := toJSON(data)
	if err != nil {
		return nil, err
	}
	r, err := decodeJSONRule(js, "")
	if err != nil && errors.Is(err, ErrSyntax) && firstByte(data) == '{' {
		// A YAML flow mapping ("{name: a}") lands here too; say why it was
		// read as JSON.
		return nil, fmt.Errorf("%w (a body starting with '{' is read as JSON)", err)
	}
	return r, err
}

// DecodeList parses a rules file: a JSON array or YAML sequence of rules, or
// an object (mapping) whose only key is "rules" holding that list. Each rule
// is decoded as strictly as by Decode; error paths are prefixed with the
// rule's position ("rules[2].endpoints[0].weight"). Two rules with the same
// name are an error. An empty list yields an empty, non-nil slice. Input over
// MaxListBytes wraps ErrTooLarge.
func DecodeList(data []byte) ([]*Rule, error) {
	if len(data) > MaxListBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(data), MaxListBytes)
	}
	js, err := toJSON(data)
	if err != nil {
		return nil, err
	}
	prefix := ""
	var raw json.RawMessage = js
	if first := firstByte(js); first == '{' {
		r, err := rulesMember(js)
		if err != nil {
			return nil, err
		}
		raw, prefix = r, "rules"
	}
	if first := firstByte(raw); first != '[' {
		if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			return []*Rule{}, nil
		}
		return nil, &FieldError{Path: prefix, Message: "want a list of rules, got " + describeRaw(raw)}
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	rules := make([]*Rule, 0, len(items))
	seen := make(map[string]int, len(items))
	for i, item := range items {
		path := prefix + "[" + strconv.Itoa(i) + "]"
		r, err := decodeJSONRule(item, path)
		if err != nil {
			return nil, err
		}
		if j, dup := seen[r.Name]; dup {
			return nil, &FieldError{Path: path + ".name", Message: fmt.Sprintf("duplicate rule name %q (also %s[%d])", r.Name, prefix, j)}
		}
		seen[r.Name] = i
		rules = append(rules, r)
	}
	return rules, nil
}

// rulesMember returns the value of the single key "rules" of the JSON
// object js, refusing any other key and a repeated "rules".
func rulesMember(js []byte) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(js))
	if _, err := dec.Token(); err != nil { // the opening '{'
		return nil, fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	var rules json.RawMessage
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSyntax, err)
		}
		key, _ := tok.(string)
		if key != "rules" {
			msg := "unknown field; a rules file is a list of rules or an object with the single key \"rules\""
			if _, isRuleField := fieldsOf(reflect.TypeFor[Rule]())[key]; isRuleField {
				msg += " (this looks like a single rule: wrap it in a list)"
			}
			return nil, &FieldError{Path: key, Message: msg}
		}
		if rules != nil {
			return nil, &FieldError{Path: key, Message: "duplicate key"}
		}
		if err := dec.Decode(&rules); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSyntax, err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: trailing data after the rules object", ErrSyntax)
	}
	if rules == nil {
		return nil, &FieldError{Path: "rules", Message: "missing; a rules file needs a \"rules\" list"}
	}
	return rules, nil
}

// toJSON returns data as JSON: unchanged when it already is JSON (first
// non-space byte '{' or '['), converted from YAML otherwise. YAML input must
// hold exactly one document; duplicate mapping keys are refused.
func toJSON(data []byte) ([]byte, error) {
	switch firstByte(data) {
	case 0:
		return nil, fmt.Errorf("%w: empty body", ErrSyntax)
	case '{', '[':
		return data, nil
	}
	// sigs.k8s.io/yaml reads only the first document; count them so a
	// second document is reported instead of silently dropped.
	yd := yamlv2.NewDecoder(bytes.NewReader(data))
	var doc any
	if err := yd.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: yaml: %w", ErrSyntax, err)
	}
	if err := yd.Decode(&doc); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, fmt.Errorf("%w: yaml: %w", ErrSyntax, err)
		}
		return nil, fmt.Errorf("%w: trailing data: more than one YAML document", ErrSyntax)
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("%w: yaml: %w", ErrSyntax, err)
	}
	return js, nil
}

func firstByte(b []byte) byte {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return c
	}
	return 0
}

// decodeJSONRule checks js against the Rule schema (exact keys, no
// duplicates, value kinds) and then decodes it with encoding/json. prefix is
// prepended to error paths.
func decodeJSONRule(js []byte, prefix string) (*Rule, error) {
	if first := firstByte(js); first != '{' {
		if first == 0 {
			return nil, fmt.Errorf("%w: empty body", ErrSyntax)
		}
		return nil, &FieldError{Path: prefix, Message: "want a rule object, got " + describeRaw(js)}
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	c := checker{dec: dec}
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	if err := c.value(reflect.TypeFor[Rule](), prefix, tok); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: trailing data after the rule object", ErrSyntax)
	}

	var r Rule
	strict := json.NewDecoder(bytes.NewReader(js))
	strict.DisallowUnknownFields()
	if err := strict.Decode(&r); err != nil {
		// The checker accepted the shape, so this is a value the field's own
		// decoder refused; report it without a path rather than not at all.
		return nil, &FieldError{Path: prefix, Message: err.Error()}
	}
	return &r, nil
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// checker walks a JSON token stream alongside a Go type and reports the
// first mismatch with its path. It exists because encoding/json reports
// unknown fields without their path, matches keys case-insensitively and
// keeps the last of duplicated keys; a rule body must be exact.
type checker struct {
	dec   *json.Decoder
	depth int
}

// maxDepth bounds nesting; the schema is four levels deep.
const maxDepth = 16

func (c *checker) value(t reflect.Type, path string, tok json.Token) error {
	if tok == nil { // JSON null: the field keeps its zero value.
		return nil
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return c.custom(t, path, tok)
	}
	switch t.Kind() {
	case reflect.Pointer:
		return c.value(t.Elem(), path, tok)
	case reflect.Struct:
		return c.object(t, path, tok)
	case reflect.Slice:
		return c.list(t, path, tok)
	case reflect.Map:
		return c.dict(t, path, tok)
	case reflect.String:
		if _, ok := tok.(string); !ok {
			return wantGot(path, "string", tok)
		}
	case reflect.Bool:
		if _, ok := tok.(bool); !ok {
			return wantGot(path, "boolean", tok)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := tok.(json.Number)
		if !ok {
			return wantGot(path, "integer", tok)
		}
		if _, err := strconv.ParseInt(string(n), 10, t.Bits()); err != nil {
			if errors.Is(err, strconv.ErrRange) {
				return &FieldError{Path: path, Message: "integer " + truncate(string(n), 32) + " is out of range"}
			}
			return wantGot(path, "integer", tok)
		}
	case reflect.Float32, reflect.Float64:
		n, ok := tok.(json.Number)
		if !ok {
			return wantGot(path, "number", tok)
		}
		if _, err := strconv.ParseFloat(string(n), t.Bits()); err != nil {
			return &FieldError{Path: path, Message: "number " + truncate(string(n), 32) + " is out of range"}
		}
	default:
		return &FieldError{Path: path, Message: "field of unsupported kind " + t.Kind().String()}
	}
	return nil
}

// custom validates a scalar for a type with its own UnmarshalJSON (Mode,
// Duration) by running that decoder on the token, so its error carries the
// path.
func (c *checker) custom(t reflect.Type, path string, tok json.Token) error {
	var raw []byte
	switch v := tok.(type) {
	case json.Number:
		raw = []byte(v)
	case string:
		raw, _ = json.Marshal(v)
	default:
		return wantGot(path, expected(t), tok)
	}
	target := reflect.New(t).Interface().(json.Unmarshaler)
	if err := target.UnmarshalJSON(raw); err != nil {
		return &FieldError{Path: path, Message: strings.TrimPrefix(err.Error(), "rule: ")}
	}
	return nil
}

func (c *checker) object(t reflect.Type, path string, tok json.Token) error {
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return wantGot(path, "object", tok)
	}
	if c.depth++; c.depth > maxDepth {
		return &FieldError{Path: path, Message: "nested too deeply"}
	}
	defer func() { c.depth-- }()
	fields := fieldsOf(t)
	seen := make(map[string]bool, len(fields))
	for c.dec.More() {
		ktok, err := c.dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrSyntax, err)
		}
		key, _ := ktok.(string)
		fpath := joinPath(path, key)
		f, ok := fields[key]
		if !ok {
			return &FieldError{Path: fpath, Message: unknownFieldMessage(t, key, fields)}
		}
		if seen[key] {
			return &FieldError{Path: fpath, Message: "duplicate key"}
		}
		seen[key] = true
		vtok, err := c.dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrSyntax, err)
		}
		if err := c.value(f, fpath, vtok); err != nil {
			return err
		}
	}
	if _, err := c.dec.Token(); err != nil { // the closing '}'
		return fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	return nil
}

// dict checks a string-keyed map (endpoints_from.selector): an object
// whose keys are free but unique, each value of the map's element kind.
func (c *checker) dict(t reflect.Type, path string, tok json.Token) error {
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return wantGot(path, "object", tok)
	}
	if c.depth++; c.depth > maxDepth {
		return &FieldError{Path: path, Message: "nested too deeply"}
	}
	defer func() { c.depth-- }()
	seen := map[string]bool{}
	for c.dec.More() {
		ktok, err := c.dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrSyntax, err)
		}
		key, _ := ktok.(string)
		kpath := joinPath(path, key)
		if seen[key] {
			return &FieldError{Path: kpath, Message: "duplicate key"}
		}
		seen[key] = true
		vtok, err := c.dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrSyntax, err)
		}
		if err := c.value(t.Elem(), kpath, vtok); err != nil {
			return err
		}
	}
	if _, err := c.dec.Token(); err != nil { // the closing '}'
		return fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	return nil
}

func (c *checker) list(t reflect.Type, path string, tok json.Token) error {
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return wantGot(path, "list", tok)
	}
	if c.depth++; c.depth > maxDepth {
		return &FieldError{Path: path, Message: "nested too deeply"}
	}
	defer func() { c.depth-- }()
	for i := 0; c.dec.More(); i++ {
		etok, err := c.dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrSyntax, err)
		}
		if err := c.value(t.Elem(), path+"["+strconv.Itoa(i)+"]", etok); err != nil {
			return err
		}
	}
	if _, err := c.dec.Token(); err != nil { // the closing ']'
		return fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	return nil
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

var fieldCache sync.Map // reflect.Type -> map[string]reflect.Type

// fieldsOf maps the JSON names of t's fields to their types.
func fieldsOf(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := make(map[string]reflect.Type, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = f.Type
	}
	fieldCache.Store(t, m)
	return m
}

// referenceNames maps rule-level field names of the reference gateway, which
// operators paste from its documentation, to where llmgw expects them.
var referenceNames = map[string]string{
	"serviceArguments":       "the rule fields themselves, at the top level (there is no serviceArguments envelope)",
	"externalIP":             `"listen" ("host:port")`,
	"port":                   `"listen" ("host:port")`,
	"protocol":               "nothing: rules are always HTTP",
	"probetype":              `"probe" (HTTP only)`,
	"probereq":               `"probe.path"`,
	"probeTimeout":           `"probe.interval"`,
	"probeRetries":           `"probe.failures"`,
	"monitor":                `"probe.disabled" (probes are on by default)`,
	"chwbl_mean_load_factor": `"chwbl.load_factor" (a factor such as 1.25, not 125)`,
	"chwbl_replication":      `"chwbl.replicas"`,
	"pd_session_ttl_sec":     `"session_ttl"`,
	"adminStateUp":           "the drain API",
	"timeoutMemberConnect":   `"timeouts.connect"`,
	"timeoutMemberData":      `"timeouts.idle"`,
}

func unknownFieldMessage(t reflect.Type, key string, fields map[string]reflect.Type) string {
	msg := "unknown field"
	if t == reflect.TypeFor[Rule]() {
		if hint, ok := referenceNames[key]; ok {
			return msg + "; use " + hint
		}
	}
	if s := suggest(key, fields); s != "" {
		return msg + "; did you mean " + strconv.Quote(s) + "?"
	}
	return msg
}

// suggest returns the field name key was most likely meant to be
// (internal/suggest), or "" when nothing is close.
func suggest(key string, fields map[string]reflect.Type) string {
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	return closest.Closest(key, names)
}

func expected(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[Mode]():
		return `"fullproxy" or 4`
	case reflect.TypeFor[Duration]():
		return `a duration string like "5s" or integer seconds`
	}
	return t.Kind().String()
}

func wantGot(path, want string, tok json.Token) error {
	return &FieldError{Path: path, Message: "want " + want + ", got " + describeToken(tok)}
}

func describeToken(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		if v == '{' {
			return "object"
		}
		return "list"
	case string:
		return "string " + strconv.Quote(truncate(v, 32))
	case json.Number:
		return "number " + truncate(string(v), 32)
	case bool:
		return "boolean " + strconv.FormatBool(v)
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", tok)
}

func describeRaw(b []byte) string {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return "malformed JSON"
	}
	return describeToken(tok)
}
