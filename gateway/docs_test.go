package gateway

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestStatusCodesDocumented fails when a code statusFor can answer (the
// third result of each of its return statements) is not in
// docs/data-plane.md's table with its status.
func TestStatusCodesDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/data-plane.md")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	type entry struct{ status, code string }
	var found []entry
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "statusFor" {
			continue
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			ret, ok := n.(*ast.ReturnStmt)
			if !ok || len(ret.Results) != 3 {
				return true
			}
			lit, ok := ret.Results[2].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: statusFor returns a code that is not a string literal", fset.Position(ret.Pos()))
				return true
			}
			code, _ := strconv.Unquote(lit.Value)
			found = append(found, entry{statusOf(t, ret.Results[0]), code})
			return true
		})
	}
	if len(found) < 15 {
		t.Fatalf("found %d codes in statusFor: the parse is broken", len(found))
	}
	for _, e := range found {
		if !strings.Contains(string(doc), "| "+e.status+" | `"+e.code+"` |") {
			t.Errorf("statusFor code %q (status %s) has no row \"| %s | `%s` |\" in docs/data-plane.md", e.code, e.status, e.status, e.code)
		}
	}
}

// statusOf renders a statusFor status expression: a fasthttp.StatusX
// constant or an integer literal.
func statusOf(t *testing.T, e ast.Expr) string {
	switch v := e.(type) {
	case *ast.BasicLit:
		return v.Value
	case *ast.SelectorExpr:
		codes := map[string]string{
			"StatusBadRequest": "400", "StatusNotFound": "404", "StatusMethodNotAllowed": "405",
			"StatusRequestTimeout": "408", "StatusRequestEntityTooLarge": "413",
			"StatusRequestHeaderFieldsTooLarge": "431", "StatusBadGateway": "502",
			"StatusServiceUnavailable": "503", "StatusGatewayTimeout": "504",
			"StatusInternalServerError": "500", "StatusTooManyRequests": "429",
			"StatusConflict": "409", "StatusUnauthorized": "401", "StatusForbidden": "403",
		}
		if s, ok := codes[v.Sel.Name]; ok {
			return s
		}
	}
	t.Errorf("statusFor returns a status this test cannot read: %T", e)
	return "?"
}
