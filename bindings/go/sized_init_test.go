package pagedkv

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStructsAreInitialisedAtTheBindingsOwnSize: every versioned struct the
// binding hands the library starts at pkv_X_init_sized with the binding's
// own C.sizeof_pkv_X (docs/conventions.md, "Versioned structs"), never at
// the plain pkv_X_init, which stops at the size the library froze; so a
// build against a newer header reaches every field it knows. (cgo is not
// available in tests: the calls are checked in the package's sources.)
func TestStructsAreInitialisedAtTheBindingsOwnSize(t *testing.T) {
	files, err := filepath.Glob("*.go")
	ok(t, err)
	fset := token.NewFileSet()
	sized := map[string]int{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		ok(t, err)
		f, err := parser.ParseFile(fset, name, src, 0)
		ok(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			call, isCall := n.(*ast.CallExpr)
			if !isCall {
				return true
			}
			fn := cName(call.Fun)
			switch {
			case strings.HasPrefix(fn, "pkv_") && strings.HasSuffix(fn, "_init") && fn != "pkv_tensor_init":
				t.Errorf("%s: C.%s: use C.pkvgo_%s_sized with the binding's sizeof", fset.Position(call.Pos()), fn,
					strings.TrimPrefix(fn, "pkv_"))
			case strings.HasPrefix(fn, "pkvgo_") && strings.HasSuffix(fn, "_init_sized"):
				x := strings.TrimSuffix(strings.TrimPrefix(fn, "pkvgo_"), "_init_sized")
				want := "C.size_t(C.sizeof_pkv_" + x + ")"
				if len(call.Args) != 2 || string(src[fset.Position(call.Args[1].Pos()).Offset:fset.Position(call.Args[1].End()).Offset]) != want {
					t.Errorf("%s: C.%s: the size must be %s", fset.Position(call.Pos()), fn, want)
				}
				sized[x]++
			}
			return true
		})
	}
	// Every struct the binding fills or reads back goes through its sized init.
	for _, x := range []string{"pool_options", "seq_options", "hash_options", "attention_params",
		"batch_info", "pool_stats", "seq_info", "prefix_match", "event_publisher_options",
		"event_publisher_stats", "kv_group_spec", "group_stats", "tier_options", "tier_match",
		"tier_stats", "transfer_options"} {
		if sized[x] == 0 {
			t.Errorf("pkv_%s is never initialised with pkvgo_%s_init_sized", x, x)
		}
	}
}

// cName is the name of C.name, or "".
func cName(e ast.Expr) string {
	sel, isSel := e.(*ast.SelectorExpr)
	if !isSel {
		return ""
	}
	if id, isID := sel.X.(*ast.Ident); isID && id.Name == "C" {
		return sel.Sel.Name
	}
	return ""
}

// The sized initialisers' defaults are the library's: a pool of default
// options (pkv_pool_options_init_sized, then the Go fields) reads back the
// defaults, and every counter struct comes back filled.
func TestSizedInitDefaultsReachTheLibrary(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 8})
	o := p.Options()
	if o.BlockSize != 4 || o.NumBlocks != 8 || o.HashAlgo != SHA256CBOR || o.DisablePrefixCaching {
		t.Fatalf("options read back: %+v", o)
	}
	s, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append([]int32{1, 2, 3, 4, 5}))
	info, err := s.Info()
	ok(t, err)
	if info.NumTokens != 5 {
		t.Fatalf("seq info %+v", info)
	}
	st, err := p.Stats()
	ok(t, err)
	if st.NumBlocks != 8 || st.NumSeqs != 1 || st.BlockSize != 4 {
		t.Fatalf("stats %+v", st)
	}
}
