package pagedkv

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// seqView is everything a caller can see of a sequence and its pool.
type seqView struct {
	Info   SeqInfo
	Tables [][]int32
	Hashes []BlockHash
	Stats  Stats
}

func viewOf(t *testing.T, s Seq) seqView {
	t.Helper()
	info, err := s.Info()
	ok(t, err)
	groups, err := s.Pool().NumGroups()
	ok(t, err)
	v := seqView{Info: info, Stats: stats(t, s.Pool())}
	for g := 0; g < groups; g++ {
		bt, err := s.GroupBlockTable(g)
		ok(t, err)
		v.Tables = append(v.Tables, bt)
	}
	if groups == 1 { // a multi-group pool does not give out block hashes
		v.Hashes, err = s.BlockHashes()
		ok(t, err)
	}
	return v
}

// Reserve is a host-memory hint: two pools driven alike, one sequence of
// them reserved at admission, show the same infos, tables, hashes and stats
// through a prefill and 40 decode steps.
func TestReserveChangesNothingACallerSees(t *testing.T) {
	pools := []*Pool{managerPool(t, 32), managerPool(t, 32)}
	var seqs []Seq
	for i, p := range pools {
		s, err := p.CreateSeq(nil)
		ok(t, err)
		if i == 1 {
			before := viewOf(t, s)
			ok(t, s.Reserve(7+40))
			ok(t, s.Reserve(3)) // below the room already made: a no-op
			ok(t, s.Reserve(0))
			if after := viewOf(t, s); !reflect.DeepEqual(after, before) {
				t.Fatalf("reserve changed %+v into %+v", before, after)
			}
		}
		ok(t, s.Append([]int32{1, 2, 3, 4, 5, 6, 7}))
		compute(t, s, 7)
		seqs = append(seqs, s)
	}
	for step := 0; step <= 40; step++ {
		a, b := viewOf(t, seqs[0]), viewOf(t, seqs[1])
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("step %d: without reserve %+v, with %+v", step, a, b)
		}
		if step == 40 {
			break
		}
		for _, s := range seqs {
			batch, err := s.Pool().PrepareDecode([]SeqID{s.ID()}, []int32{int32(1000 + step)})
			ok(t, err)
			ok(t, batch.Commit())
			ok(t, batch.Close())
		}
	}
	if info, _ := seqs[1].Info(); info.NumTokens != 47 || info.NumComputedTokens != 47 {
		t.Fatalf("after 40 steps %+v", info)
	}
	for _, p := range pools {
		ok(t, p.Validate())
	}
}

func TestReserveBadInput(t *testing.T) {
	p := managerPool(t, 16)
	s, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append([]int32{1, 2, 3, 4, 5, 6}))
	before := viewOf(t, s)
	for _, n := range []int{1 << 31, 1 << 62, math.MaxInt} {
		e := wantErr(t, s.Reserve(n), ErrInvalidArgument)
		if e.Op != "pkv_seq_reserve" {
			t.Fatalf("Op %q", e.Op)
		}
	}
	wantErr(t, s.Reserve(-1), ErrInvalidArgument)
	wantErr(t, s.Reserve(math.MinInt), ErrInvalidArgument)
	if after := viewOf(t, s); !reflect.DeepEqual(after, before) {
		t.Fatalf("refused reserves changed %+v into %+v", before, after)
	}
	ok(t, s.Reserve(64)) // still usable afterwards
	ok(t, p.Validate())

	// A freed or unknown sequence is ErrNotFound.
	u, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, u.Free())
	wantErr(t, u.Reserve(8), ErrNotFound)
	wantErr(t, p.Seq(12345).Reserve(8), ErrNotFound)

	// After Close: ErrClosed (an ErrInvalidState), no panic.
	ok(t, p.Close())
	err = s.Reserve(8)
	if !errors.Is(err, ErrClosed) || !errors.Is(err, ErrInvalidState) {
		t.Fatalf("Reserve after Close: %v", err)
	}
	err = Seq{}.Reserve(8) // the zero Seq has no pool
	if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "no pool") {
		t.Fatalf("Reserve on the zero Seq: %v", err)
	}
}

// On a multi-group pool Reserve acts on every group's table; the twin
// without it sees the same through steps that slide the window.
func TestReserveGroupPool(t *testing.T) {
	pools := []*Pool{gptOssLike(t, 32), gptOssLike(t, 32)}
	var seqs []Seq
	for _, p := range pools {
		s, err := p.CreateSeq(nil)
		ok(t, err)
		seqs = append(seqs, s)
	}
	before := viewOf(t, seqs[1])
	ok(t, seqs[1].Reserve(10+30))
	if after := viewOf(t, seqs[1]); !reflect.DeepEqual(after, before) {
		t.Fatalf("reserve changed %+v into %+v", before, after)
	}
	for step := 0; step <= 30; step++ {
		n := 1
		if step == 0 {
			n = 10
		}
		for _, s := range seqs {
			toks := make([]int32, n)
			for i := range toks {
				toks[i] = int32(step + i)
			}
			ok(t, s.Append(toks))
			compute(t, s, n)
		}
		if a, b := viewOf(t, seqs[0]), viewOf(t, seqs[1]); !reflect.DeepEqual(a, b) {
			t.Fatalf("step %d: without reserve %+v, with %+v", step, a, b)
		}
	}
	if win := viewOf(t, seqs[1]).Tables[0]; win[0] != NullBlock {
		t.Fatalf("the window never slid: %v", win)
	}
	wantErr(t, seqs[1].Reserve(1<<31), ErrInvalidArgument)
	ok(t, seqs[1].Free())
	wantErr(t, seqs[1].Reserve(8), ErrNotFound)
	for _, p := range pools {
		ok(t, p.Validate())
	}
}
