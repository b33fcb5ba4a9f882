package pagedkv

import (
	"math/rand"
	"testing"
)

func TestSeqLifecycle(t *testing.T) {
	p := managerPool(t, 9) // blocks 1..8 of 4 tokens
	r := rand.New(rand.NewSource(6))
	toks := randTokens(r, 10)
	s, err := p.CreateSeq(&SeqOptions{Priority: 5, LoraID: 9})
	ok(t, err)
	if s.Pool() != p || s.ID() == 0 || p.Seq(s.ID()) != s {
		t.Fatal("Seq accessors")
	}
	need, err := s.BlocksNeeded(10, 0)
	ok(t, err)
	if need != 3 {
		t.Fatalf("BlocksNeeded(10) = %d", need)
	}
	ok(t, s.Append(toks))
	compute(t, s, len(toks))
	// Allocation pops the free queue's head: blocks 1, 2, 3 in order.
	if bt := table(t, s); !equalInt32(bt, []int32{1, 2, 3}) {
		t.Fatalf("block table %v", bt)
	}
	info, err := s.Info()
	ok(t, err)
	if info != (SeqInfo{Priority: 5, NumTokens: 10, NumBlocks: 3, NumSlots: 12, LoraID: 9, NumComputedTokens: 10}) {
		t.Fatalf("info %+v", info)
	}
	need, err = s.BlocksNeeded(2, 0)
	ok(t, err)
	if need != 0 {
		t.Fatalf("room for 2 more tokens, but BlocksNeeded = %d", need)
	}
	need, err = s.BlocksNeeded(3, 4)
	ok(t, err)
	if need != 2 {
		t.Fatalf("BlocksNeeded(3, lookahead 4) = %d", need)
	}
	ok(t, s.AppendLookahead([]int32{7}, 5))
	compute(t, s, 1)
	info, err = s.Info()
	ok(t, err)
	if info.NumTokens != 11 || info.NumSlots < 16 {
		t.Fatalf("after lookahead %+v", info)
	}

	// Truncate releases blocks that become empty.
	ok(t, s.Truncate(5))
	if bt := table(t, s); !equalInt32(bt, []int32{1, 2}) {
		t.Fatalf("after truncate %v", bt)
	}
	wantErr(t, s.Truncate(6), ErrInvalidArgument)
	wantErr(t, s.Truncate(-1), ErrInvalidArgument)
	ok(t, p.Validate())

	ok(t, s.Free())
	wantErr(t, s.Free(), ErrNotFound)
	wantErr(t, s.Append(toks), ErrNotFound)
	_, err = s.Info()
	wantErr(t, err, ErrNotFound)
	_, err = s.BlockTable()
	wantErr(t, err, ErrNotFound)
	_, err = s.BlockHashes()
	wantErr(t, err, ErrNotFound)
	_, err = s.Fork()
	wantErr(t, err, ErrNotFound)
	_, err = s.MatchPrefix(toks)
	wantErr(t, err, ErrNotFound)
	_, err = s.BlocksNeeded(1, 0)
	wantErr(t, err, ErrNotFound)
	wantErr(t, p.Seq(0).Free(), ErrNotFound)
	_, err = s.BlocksNeeded(-1, 0)
	wantErr(t, err, ErrInvalidArgument)
	wantErr(t, s.AppendLookahead(nil, -2), ErrInvalidArgument)
	if st := stats(t, p); st.NumSeqs != 0 || st.NumUsedBlocks != 0 || st.NumFreeBlocks != 8 {
		t.Fatalf("stats after free %+v", st)
	}
}

func TestOutOfBlocksChangesNothing(t *testing.T) {
	p := managerPool(t, 5) // 4 usable blocks
	r := rand.New(rand.NewSource(7))
	a := seqOf(t, p, randTokens(r, 9)) // 3 blocks
	b, err := p.CreateSeq(nil)
	ok(t, err)
	before := stats(t, p)
	wantErr(t, b.Append(randTokens(r, 5)), ErrOutOfBlocks)
	wantErr(t, a.AppendLookahead(randTokens(r, 3), 8), ErrOutOfBlocks) // 20 slots: 5 blocks
	after := stats(t, p)
	if before != after {
		t.Fatalf("a failed append changed the pool:\n%+v\n%+v", before, after)
	}
	if info, _ := b.Info(); info.NumTokens != 0 || info.NumBlocks != 0 {
		t.Fatalf("b changed: %+v", info)
	}
	if info, _ := a.Info(); info.NumTokens != 9 {
		t.Fatalf("a changed: %+v", info)
	}
	// Preempt and retry: the engine's everyday loop.
	ok(t, a.Free())
	ok(t, b.Append(randTokens(r, 5)))
	ok(t, p.Validate())
}

func TestMatchPrefixForkAndCOW(t *testing.T) {
	p := managerPool(t, 17)
	r := rand.New(rand.NewSource(8))
	toks := randTokens(r, 14)
	a := seqOf(t, p, toks) // blocks 1..4, three full
	b, err := p.CreateSeq(nil)
	ok(t, err)
	n, err := b.MatchPrefix(toks)
	ok(t, err)
	if n != 12 {
		t.Fatalf("matched %d of 14 tokens", n)
	}
	// At least one token is always left to compute.
	c, err := p.CreateSeq(nil)
	ok(t, err)
	n, err = c.MatchPrefix(toks[:12])
	ok(t, err)
	if n != 8 {
		t.Fatalf("a 12-token prompt matched %d", n)
	}
	info, err := b.Info()
	ok(t, err)
	if info.NumCachedTokens != 12 || info.NumTokens != 12 {
		t.Fatalf("info %+v", info)
	}
	if bt := table(t, b); !equalInt32(bt, table(t, a)[:3]) {
		t.Fatalf("shared prefix %v vs %v", bt, table(t, a))
	}
	// Matching twice is a misuse: the sequence is no longer empty.
	_, err = b.MatchPrefix(toks)
	if err == nil {
		t.Fatal("MatchPrefix on a non-empty sequence")
	}
	ok(t, b.Append(toks[12:]))

	// Fork shares every block; writing into the shared partial block copies it.
	f, err := a.Fork()
	ok(t, err)
	if !equalInt32(table(t, f), table(t, a)) {
		t.Fatal("fork must share the block table")
	}
	ok(t, f.Append([]int32{1}))
	ft, at := table(t, f), table(t, a)
	if !equalInt32(ft[:3], at[:3]) || ft[3] == at[3] {
		t.Fatalf("copy-on-write: fork %v parent %v", ft, at)
	}
	if st := stats(t, p); st.NumCOWCopies != 1 {
		t.Fatalf("%d COW copies", st.NumCOWCopies)
	}
	ok(t, p.Validate())
}

func TestSlidingWindowReleasesBlocks(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 32, SlidingWindow: 8})
	s := seqOf(t, p, make([]int32, 30))
	// The window is applied from the first new token's point of view: the
	// next token (position 30) sees keys 23..30, so blocks 0..4 go.
	ok(t, s.Append([]int32{1}))
	bt := table(t, s)
	if len(bt) != 8 || bt[len(bt)-1] == NullBlock {
		t.Fatalf("block table %v", bt)
	}
	for i, b := range bt {
		if (b == NullBlock) != (i < 5) {
			t.Fatalf("block table %v", bt)
		}
	}
	if st := stats(t, p); st.NumUsedBlocks >= 8 {
		t.Fatalf("window kept %d blocks", st.NumUsedBlocks)
	}
	// The window goes by the first token not yet computed (pool.h): until a
	// plan covers token 30, appending more releases nothing further, so
	// every query of the next step still finds its keys.
	ok(t, s.Append([]int32{2, 3, 4, 5}))
	if got := table(t, s); !equalInt32(got[:len(bt)], bt) || got[5] == NullBlock {
		t.Fatalf("block table %v before the step, %v after more appends", bt, got)
	}
	compute(t, s, 5)
	// Now token 35 comes next and sees keys 28..35: blocks 0..6 go.
	ok(t, s.Append([]int32{6}))
	bt = table(t, s)
	if len(bt) != 9 {
		t.Fatalf("block table %v", bt)
	}
	for i, b := range bt {
		if (b == NullBlock) != (i < 7) {
			t.Fatalf("block table %v", bt)
		}
	}
	ok(t, p.Validate())
}

func TestLongBlockTableGrowsBuffer(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 1, NumBlocks: 200})
	r := rand.New(rand.NewSource(9))
	toks := randTokens(r, 150)
	s := seqOf(t, p, toks)
	bt := table(t, s)
	hs, err := s.BlockHashes()
	ok(t, err)
	if len(bt) != 150 || len(hs) != 150 {
		t.Fatalf("%d blocks, %d hashes", len(bt), len(hs))
	}
	want, err := HashPrefix(&HashOptions{BlockSize: 1}, toks)
	ok(t, err)
	for i, b := range bt {
		if b != int32(i+1) || hs[i] != want[i] {
			t.Fatalf("block %d: id %d, hash %v want %v", i, b, hs[i], want[i])
		}
	}
}
