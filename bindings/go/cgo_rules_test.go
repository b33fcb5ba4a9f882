package pagedkv

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// Every pkvgo_* wrapper returns a pkvgo_result whose message, on failure,
// is malloc'ed by the C side and freed by check. A call statement that
// drops the result leaks that copy on every failure (Export's size query,
// answered PKV_E_BUFFER_TOO_SMALL each time, leaked one per export).
func TestNoPkvgoResultIsDropped(t *testing.T) {
	files, err := filepath.Glob("*.go")
	ok(t, err)
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		ok(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			call, isCall := n.(*ast.CallExpr)
			if isCall {
				if sel, isSel := call.Fun.(*ast.SelectorExpr); isSel {
					if x, isIdent := sel.X.(*ast.Ident); isIdent && x.Name == "C" &&
						strings.HasPrefix(sel.Sel.Name, "pkvgo_") {
						checked++
					}
				}
			}
			stmt, isStmt := n.(*ast.ExprStmt)
			if !isStmt {
				return true
			}
			call, isCall = stmt.X.(*ast.CallExpr)
			if !isCall {
				return true
			}
			sel, isSel := call.Fun.(*ast.SelectorExpr)
			if !isSel {
				return true
			}
			if x, isIdent := sel.X.(*ast.Ident); isIdent && x.Name == "C" &&
				strings.HasPrefix(sel.Sel.Name, "pkvgo_") {
				t.Errorf("%s: the result of C.%s is dropped: its error message leaks",
					fset.Position(call.Pos()), sel.Sel.Name)
			}
			return true
		})
	}
	if checked < 50 {
		t.Fatalf("found only %d C.pkvgo_* calls: the scan is broken", checked)
	}
}
