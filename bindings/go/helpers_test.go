package pagedkv

import (
	"errors"
	"math/rand"
	"testing"
)

// newPool creates a pool closed when the test ends.
func newPool(t testing.TB, o PoolOptions) *Pool {
	t.Helper()
	p, err := NewPool(&o)
	if err != nil {
		t.Fatalf("NewPool(%+v): %v", o, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// managerPool is a pool without storage: block tables, hashing and plans.
func managerPool(t testing.TB, numBlocks uint64) *Pool {
	return newPool(t, PoolOptions{BlockSize: 4, NumBlocks: numBlocks, EnableEvents: true})
}

func ok(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wantErr fails unless err is an *Error matching sentinel with a message.
func wantErr(t testing.TB, err error, sentinel *Error) *Error {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", sentinel.Code.name())
	}
	if !errors.Is(err, sentinel) {
		t.Fatalf("got %v, want %v", err, sentinel.Code.name())
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("%v is not an *Error", err)
	}
	if e.Msg == "" {
		t.Fatalf("%v carries no message", err)
	}
	return e
}

func randTokens(r *rand.Rand, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(r.Intn(50000))
	}
	return out
}

// seqOf is a sequence whose tokens an engine step has computed: appended,
// then covered by a prepared plan (see compute).
func seqOf(t testing.TB, p *Pool, tokens []int32) Seq {
	t.Helper()
	s, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append(tokens))
	compute(t, s, len(tokens))
	return s
}

// compute runs an engine step over s whose K/V the engine wrote itself: a
// plan whose queries are s's last n tokens (those just appended), then
// Commit. From then on those tokens count as computed (pool.h): their full
// blocks can be hit and stay cached when s lets them go, and the sliding
// window may release blocks behind them.
func compute(t testing.TB, s Seq, n int) {
	t.Helper()
	b, err := s.Pool().Prepare([]Seq{s}, []int{n})
	ok(t, err)
	ok(t, b.Commit())
	ok(t, b.Close())
}

func table(t testing.TB, s Seq) []int32 {
	t.Helper()
	bt, err := s.BlockTable()
	ok(t, err)
	return bt
}

func stats(t testing.TB, p *Pool) Stats {
	t.Helper()
	st, err := p.Stats()
	ok(t, err)
	return st
}

func equalInt32(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
