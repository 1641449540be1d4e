package tokenizer

import "strings"

// Chat templates print each message as one concatenation,
// `{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}`.
// github.com/ardanlabs/jinja v1.8.0 evaluates `+` left to right, each step
// building a new string (addValues: printValue(a) + printValue(b) when
// either is a string), so a 256 KiB message is copied once per `+` after
// it, and then once more into the output. rewriteConcat prints the operands
// one by one instead: `{{- '<|im_start|>' }}{{ message.role }}...`.
//
// The two print the same text, error for error: with a string among the
// first two operands every step of the left-to-right chain has a string
// operand, so the chain's value is the printValue of each operand in order,
// which is what an output tag writes for each (printValue again); the
// operands are evaluated in the same order. Filters bind tighter than `+`
// (parsePostfix), so `a + b | trim` splits into `a` and `b | trim`. An
// output tag is rewritten only when its expression is such a chain at the
// top level: any other operator, keyword or separator outside brackets and
// string literals (`-`, `~`, comparisons, `if`/`else`, `and`/`or`, ...)
// leaves it as written. A template with a raw block is left whole.
// TestRewriteConcatRendersAlike and FuzzRewriteConcat compare renders.

// rewriteConcat rewrites every output tag of src whose expression is a
// string concatenation into one output tag per operand.
func rewriteConcat(src string) string {
	if hasRawBlock(src) {
		return src
	}
	var b strings.Builder
	i := 0
	for {
		j := strings.Index(src[i:], "{")
		if j < 0 || i+j+1 >= len(src) {
			b.WriteString(src[i:])
			return b.String()
		}
		j += i
		var end int // just past the tag; -1: it does not close
		switch src[j+1] {
		case '#':
			if end = strings.Index(src[j+2:], "#}"); end >= 0 {
				end += j + 4
			}
		case '%':
			end = tagEnd(src, j+2, '%')
		case '{':
			end = tagEnd(src, j+2, '}')
		default:
			end = j + 1
		}
		switch {
		case end < 0:
			b.WriteString(src[i:])
			return b.String()
		case src[j+1] == '{':
			b.WriteString(src[i:j])
			b.WriteString(splitOutput(src[j:end]))
		default:
			b.WriteString(src[i:end])
		}
		i = end
	}
}

// tagEnd returns the index just past the `%}` or `}}` (closer '%' or '}')
// that ends the tag whose body starts at i, skipping string literals and,
// for an output tag, brackets; -1 if there is none.
func tagEnd(src string, i int, closer byte) int {
	depth := 0
	for i < len(src) {
		switch c := src[i]; c {
		case '\'', '"':
			k := literalEnd(src, i)
			if k < 0 {
				return -1
			}
			i = k
			continue
		case '(', '[':
			depth++
		case ')', ']':
			depth--
		case '{':
			if closer == '}' {
				depth++
			}
		case '}':
			if closer == '}' && depth > 0 {
				depth--
				break
			}
			fallthrough
		case '%':
			if c == closer && i+1 < len(src) && src[i+1] == '}' && (closer == '%' || depth == 0) {
				return i + 2
			}
		}
		i++
	}
	return -1
}

// literalEnd returns the index just past the string literal that opens at
// i (quote at src[i], backslash escapes), or -1.
func literalEnd(src string, i int) int {
	q := src[i]
	for k := i + 1; k < len(src); k++ {
		switch src[k] {
		case '\\':
			k++
		case q:
			return k + 1
		}
	}
	return -1
}

// splitOutput rewrites one output tag (`{{` ... `}}`, with its
// whitespace-control marks) when its expression is a string concatenation.
func splitOutput(tag string) string {
	open, close := "{{", "}}"
	body := tag[2 : len(tag)-2]
	if body != "" && (body[0] == '-' || body[0] == '+') {
		open, body = tag[:3], body[1:]
	}
	if body != "" && (body[len(body)-1] == '-' || body[len(body)-1] == '+') {
		close, body = tag[len(tag)-3:], body[:len(body)-1]
	}
	ops, ok := concatOperands(body)
	if !ok || len(ops) < 2 || !(isStringLiteral(ops[0]) || isStringLiteral(ops[1])) {
		return tag
	}
	var b strings.Builder
	for k, op := range ops {
		o, c := "{{ ", " }}"
		if k == 0 {
			o = open + " "
		}
		if k == len(ops)-1 {
			c = " " + close
		}
		b.WriteString(o)
		b.WriteString(op)
		b.WriteString(c)
	}
	return b.String()
}

// concatOperands splits expr at its top-level `+`; ok is false when expr
// has anything at the top level (outside brackets and string literals)
// but `+`, names, numbers, `.`, `|` and whitespace, when a name there is a
// keyword, when an operand is empty, or when a number is written with an
// exponent (1e+5).
func concatOperands(expr string) (ops []string, ok bool) {
	depth, start := 0, 0
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch {
		case c == '\'' || c == '"':
			k := literalEnd(expr, i)
			if k < 0 {
				return nil, false
			}
			i = k - 1
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			depth--
			if depth < 0 {
				return nil, false
			}
		case depth > 0:
		case c == '+':
			op := strings.TrimSpace(expr[start:i])
			if op == "" || exponentTail(op) {
				return nil, false
			}
			ops = append(ops, op)
			start = i + 1
		case c == '.' || c == '|' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || (c >= '0' && c <= '9'):
		case isIdentStart(c):
			k := i
			for k < len(expr) && isIdentByte(expr[k]) {
				k++
			}
			switch expr[i:k] {
			case "if", "else", "and", "or", "not", "in", "is":
				return nil, false
			}
			i = k - 1
		default:
			return nil, false // another operator, a separator, or a byte the library may read otherwise
		}
	}
	if depth != 0 {
		return nil, false
	}
	op := strings.TrimSpace(expr[start:])
	if op == "" {
		return nil, false
	}
	return append(ops, op), true
}

// exponentTail reports an operand that would make `+` part of a number
// (`1e` before `+5`).
func exponentTail(op string) bool {
	last := op[len(op)-1]
	return (last == 'e' || last == 'E') && len(op) > 1 && op[0] >= '0' && op[0] <= '9'
}

func isIdentStart(c byte) bool { return c == '_' || isASCIILetter(c) }
func isIdentByte(c byte) bool  { return isIdentStart(c) || (c >= '0' && c <= '9') }

// isStringLiteral reports whether op is exactly one string literal.
func isStringLiteral(op string) bool {
	if op == "" || (op[0] != '\'' && op[0] != '"') {
		return false
	}
	return literalEnd(op, 0) == len(op)
}

// hasRawBlock reports a `{% raw %}` tag, whose body is text, not tags.
func hasRawBlock(src string) bool {
	for i := 0; ; {
		j := strings.Index(src[i:], "{%")
		if j < 0 {
			return false
		}
		i += j + 2
		body := strings.TrimLeft(src[i:], "-+ \t\r\n")
		if strings.HasPrefix(body, "raw") && (len(body) == 3 || !isIdentByte(body[3])) {
			return true
		}
	}
}
