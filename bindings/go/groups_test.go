package pagedkv

import (
	"errors"
	"math/rand"
	"strings"
	"testing"
)

func gptOssLike(t *testing.T, numBlocks uint64) *Pool {
	t.Helper()
	p, err := NewGroupPool(&PoolOptions{BlockSize: 4, NumBlocks: numBlocks}, []GroupSpec{
		{Kind: GroupSlidingWindow, NumLayers: 2, NumKVHeads: 2, HeadDim: 8, SlidingWindow: 8},
		{Kind: GroupFull, NumLayers: 2, NumKVHeads: 2, HeadDim: 8},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestGroupPoolWindowAndFull(t *testing.T) {
	p := gptOssLike(t, 64)
	if n, err := p.NumGroups(); err != nil || n != 2 {
		t.Fatalf("NumGroups = %d, %v", n, err)
	}
	s, err := p.CreateSeq(nil)
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]int32, 21)
	for i := range tokens {
		tokens[i] = int32(100 + i)
	}
	if err := s.Append(tokens[:20]); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(tokens[20:]); err != nil {
		t.Fatal(err)
	}
	win, err := s.GroupBlockTable(0)
	if err != nil {
		t.Fatal(err)
	}
	full, err := s.GroupBlockTable(1)
	if err != nil {
		t.Fatal(err)
	}
	if len(win) != 6 || len(full) != 6 {
		t.Fatalf("tables %v %v", win, full)
	}
	for j := 0; j < 6; j++ {
		if (win[j] == NullBlock) != (j < 3) || full[j] == NullBlock {
			t.Fatalf("entry %d: window %v full %v", j, win, full)
		}
	}
	st, err := p.GroupStats(0)
	if err != nil || st.NumNullEntries != 3 || st.Kind != GroupSlidingWindow {
		t.Fatalf("GroupStats(0) = %+v, %v", st, err)
	}
	// Same prompt: every group hits 20 tokens.
	s2, _ := p.CreateSeq(nil)
	if n, err := s2.MatchPrefix(tokens); err != nil || n != 20 {
		t.Fatalf("MatchPrefix = %d, %v", n, err)
	}
	// Fork and write: one copy per group.
	c, err := s.Fork()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Append([]int32{1}); err != nil {
		t.Fatal(err)
	}
	for g := 0; g < 2; g++ {
		src, dst, err := p.TakeCopies(g)
		if err != nil || len(src) != 1 || len(dst) != 1 {
			t.Fatalf("TakeCopies(%d) = %v %v %v", g, src, dst, err)
		}
		pt, _ := s.GroupBlockTable(g)
		ct, _ := c.GroupBlockTable(g)
		if src[0] != pt[5] || dst[0] != ct[5] {
			t.Fatalf("group %d: copy %d->%d, tables %v %v", g, src[0], dst[0], pt, ct)
		}
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestGroupPoolErrors(t *testing.T) {
	_, err := NewGroupPool(&PoolOptions{BlockSize: 4, NumBlocks: 8},
		[]GroupSpec{{Kind: GroupSlidingWindow, NumKVHeads: 1, HeadDim: 8}})
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeInvalidArgument || !strings.Contains(e.Msg, "groups[0].SlidingWindow") {
		t.Fatalf("window 0: %v", err)
	}
	_, err = NewGroupPool(&PoolOptions{NumBlocks: 8}, []GroupSpec{{Kind: GroupRecurrent}})
	if !errors.As(err, &e) || e.Code != CodeInvalidArgument || !strings.Contains(e.Msg, "groups[0].StateBytes") {
		t.Fatalf("recurrent: %v", err)
	}
	p := gptOssLike(t, 16)
	if _, err := p.GroupStats(2); !errors.As(err, &e) || e.Code != CodeInvalidArgument {
		t.Fatalf("group 2: %v", err)
	}
	single, err := NewPool(&PoolOptions{BlockSize: 4, NumBlocks: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer single.Close()
	if n, err := single.NumGroups(); err != nil || n != 1 {
		t.Fatalf("single NumGroups = %d, %v", n, err)
	}
	if _, _, err := single.TakeCopies(0); !errors.As(err, &e) || e.Code != CodeUnsupported {
		t.Fatalf("single TakeCopies: %v", err)
	}
}

func TestGroupPoolRecurrentSnapshot(t *testing.T) {
	p, err := NewGroupPool(&PoolOptions{BlockSize: 4, NumBlocks: 32}, []GroupSpec{
		{Kind: GroupFull, NumKVHeads: 2, HeadDim: 8},
		{Kind: GroupRecurrent, NumLayers: 7, StateBytes: 4096},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tokens := []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	a, _ := p.CreateSeq(nil)
	if err := a.Append(tokens[:8]); err != nil {
		t.Fatal(err)
	}
	slot, _ := a.GroupBlockTable(1)
	if err := a.Append(tokens[8:9]); err != nil {
		t.Fatal(err)
	}
	moved, _ := a.GroupBlockTable(1)
	src, dst, err := p.TakeCopies(1)
	if err != nil || len(src) != 1 || src[0] != slot[0] || dst[0] != moved[0] {
		t.Fatalf("snapshot copy %v %v %v (slot %v moved %v)", src, dst, err, slot, moved)
	}
	b, _ := p.CreateSeq(nil)
	if n, err := b.MatchPrefix(tokens); err != nil || n != 8 {
		t.Fatalf("MatchPrefix = %d, %v", n, err)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestGroupPoolStepPlanPerGroupArrays(t *testing.T) {
	p := gptOssLike(t, 64)
	s, err := p.CreateSeq(nil)
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]int32, 20)
	for i := range tokens {
		tokens[i] = int32(100 + i)
	}
	if err := s.Append(tokens); err != nil {
		t.Fatal(err)
	}
	b, err := p.Prepare([]Seq{s}, []int{20})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for g := uint32(0); g < 2; g++ {
		table, err := s.GroupBlockTable(int(g))
		if err != nil {
			t.Fatal(err)
		}
		pt, err := b.PlanGroupTensor(g, PlanPageIndices)
		if err != nil {
			t.Fatal(err)
		}
		pages, err := pt.Int32s()
		if err != nil || len(pages) != len(table) {
			t.Fatalf("group %d pages %v (%v), table %v", g, pages, err, table)
		}
		for j := range table {
			if pages[j] != table[j] {
				t.Fatalf("group %d page %d = %d, table %v", g, j, pages[j], table)
			}
		}
		st, err := b.PlanGroupTensor(g, PlanSlotMapping)
		if err != nil {
			t.Fatal(err)
		}
		slots, err := st.Int64s()
		if err != nil || len(slots) != 20 {
			t.Fatalf("group %d slots %v (%v)", g, slots, err)
		}
		for pos := range slots {
			if want := int64(table[pos/4])*4 + int64(pos%4); slots[pos] != want {
				t.Fatalf("group %d slot of %d = %d, want %d", g, pos, slots[pos], want)
			}
		}
	}
	var e *Error
	if _, err := b.PlanGroupTensor(2, PlanPageIndices); !errors.As(err, &e) || e.Code != CodeInvalidArgument {
		t.Fatalf("group 2: %v", err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
}

func TestGroupLayerIDs(t *testing.T) {
	// A gpt-oss-like interleave, the even layers listed out of order.
	even, odd := []uint32{4, 0, 6, 2}, []uint32{1, 3, 5, 7}
	p, err := NewGroupPool(&PoolOptions{BlockSize: 4, NumBlocks: 16}, []GroupSpec{
		{Kind: GroupSlidingWindow, NumLayers: 4, NumKVHeads: 1, HeadDim: 8, SlidingWindow: 8, LayerIDs: even},
		{Kind: GroupFull, NumLayers: 4, NumKVHeads: 1, HeadDim: 8, LayerIDs: odd},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for layer := uint32(0); layer < 8; layer++ {
		ids := odd
		if layer%2 == 0 {
			ids = even
		}
		want := -1
		for i, l := range ids {
			if l == layer {
				want = i
			}
		}
		g, k, ok, err := p.GroupOfLayer(layer)
		if err != nil || !ok || g != layer%2 || int(k) != want {
			t.Fatalf("GroupOfLayer(%d) = %d, %d, %v, %v; want %d, %d", layer, g, k, ok, err, layer%2, want)
		}
	}
	if _, _, ok, err := p.GroupOfLayer(8); ok || err != nil {
		t.Fatalf("GroupOfLayer(8) = %v, %v; want not found", ok, err)
	}
	_, err = NewGroupPool(&PoolOptions{BlockSize: 4, NumBlocks: 8}, []GroupSpec{
		{Kind: GroupFull, NumLayers: 2, NumKVHeads: 1, HeadDim: 8, LayerIDs: []uint32{0}},
	})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "groups[0].LayerIDs holds 1 entries, not NumLayers 2") {
		t.Fatalf("short layer_ids: %v", err)
	}
	_, err = NewGroupPool(&PoolOptions{BlockSize: 4, NumBlocks: 8}, []GroupSpec{
		{Kind: GroupFull, NumLayers: 1, NumKVHeads: 1, HeadDim: 8, LayerIDs: []uint32{3}},
		{Kind: GroupFull, NumLayers: 1, NumKVHeads: 1, HeadDim: 8, LayerIDs: []uint32{3}},
	})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "is also groups[0]") {
		t.Fatalf("a layer twice: %v", err)
	}
}

func TestGroupRecurrentSnapshotsAtEveryBlockBoundary(t *testing.T) {
	// Jamba-like with the flag: one prefill chunk of 5 blocks + 2 tokens
	// names a snapshot slot per boundary; the engine writes its state there
	// and a later prompt sharing 3 blocks and a bit resumes from the one at 12.
	p, err := NewGroupPool(&PoolOptions{BlockSize: 4, NumBlocks: 64}, []GroupSpec{
		{Kind: GroupFull, NumLayers: 1, NumKVHeads: 2, HeadDim: 8},
		{Kind: GroupRecurrent, NumLayers: 2, StateBytes: 64, SnapshotEveryBlock: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rng := rand.New(rand.NewSource(19))
	prompt := make([]int32, 22)
	for i := range prompt {
		prompt[i] = int32(rng.Intn(50000))
	}
	a, err := p.CreateSeq(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Append(prompt); err != nil {
		t.Fatal(err)
	}
	b, err := p.Prepare([]Seq{a}, []int{22})
	if err != nil {
		t.Fatal(err)
	}
	get := func(which PlanArray) Tensor {
		pt, err := b.PlanGroupTensor(1, which)
		if err != nil {
			t.Fatal(err)
		}
		return pt
	}
	indptr, rowsT, blocksT := get(PlanSnapshotIndptr), get(PlanSnapshotRows), get(PlanSnapshotBlocks)
	ptr, _ := indptr.Int32s()
	rows, err := rowsT.Int64s()
	if err != nil {
		t.Fatal(err)
	}
	blocks, _ := blocksT.Int32s()
	if len(ptr) != 2 || ptr[0] != 0 || ptr[1] != 5 || len(blocks) != 5 {
		t.Fatalf("indptr %v blocks %v", ptr, blocks)
	}
	storage := map[int32][2]int64{} // engine-owned state, by block id
	for j, row := range rows {
		if row != int64(4*j+3) {
			t.Fatalf("rows %v", rows)
		}
		storage[blocks[j]] = [2]int64{rng.Int63(), row}
	}
	var e *Error
	if _, err := b.PlanGroupTensor(0, PlanSnapshotIndptr); !errors.As(err, &e) || e.Code != CodeInvalidArgument {
		t.Fatalf("snapshot array of a full group: %v", err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if st, _ := p.GroupStats(1); st.NumCachedBlocks != 5 {
		t.Fatalf("cached snapshots %d", st.NumCachedBlocks)
	}
	other := append(append([]int32{}, prompt[:14]...), 50001, 50002)
	c, err := p.CreateSeq(nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := c.MatchPrefix(other); err != nil || n != 12 {
		t.Fatalf("hit %d (%v), want 12", n, err)
	}
	if err := c.Append(other[12:]); err != nil {
		t.Fatal(err)
	}
	src, dst, err := p.TakeCopies(1)
	if err != nil || len(src) != 1 {
		t.Fatalf("copies %v %v (%v)", src, dst, err)
	}
	if mine, _ := c.GroupBlockTable(1); mine[0] != dst[0] {
		t.Fatalf("copy to %d, slot %v", dst[0], mine)
	}
	if storage[src[0]][1] != 11 { // the state after token 11, as written
		t.Fatalf("hit state %v", storage[src[0]])
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
}
