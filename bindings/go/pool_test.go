package pagedkv

import (
	"math"
	"math/rand"
	"testing"
	"unsafe"
)

func TestNewPoolOptions(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 8, NumBlocks: 10, HashAlgo: XXH3128, HashSeed: "x",
		EnableEvents: true, MaxEvents: 100, SlidingWindow: 0, DisablePrefixCaching: true})
	o := p.Options()
	if o.BlockSize != 8 || o.NumBlocks != 10 || o.HashAlgo != XXH3128 || o.HashSeed != "x" ||
		!o.EnableEvents || o.MaxEvents != 100 || !o.DisablePrefixCaching || o.NumLayers != 0 ||
		o.Device != CPU || p.BlockSize() != 8 {
		t.Fatalf("resolved options %+v", o)
	}
	n, err := p.BytesPerBlock()
	ok(t, err)
	if n != 0 {
		t.Fatalf("manager-only pool has %d bytes per block", n)
	}
	// Defaults fill zero fields.
	d := newPool(t, PoolOptions{NumBlocks: 4})
	if o := d.Options(); o.BlockSize != 16 || o.HashAlgo != SHA256CBOR || o.DisablePrefixCaching ||
		o.EnableEvents {
		t.Fatalf("defaults %+v", o)
	}
	// Storage: num_blocks derived from a memory budget.
	per := uint64(2 * 2 * 4 * 16 * 64 * 4) // layers * (K,V) * heads * block * dim * f32
	s := newPool(t, PoolOptions{NumLayers: 2, NumKVHeads: 4, HeadDim: 64, DType: Float32,
		MemoryBudgetBytes: 10 * per, NumThreads: 1})
	n, err = s.BytesPerBlock()
	ok(t, err)
	if n != per || s.Options().NumBlocks != 10 {
		t.Fatalf("%d bytes per block (want %d), %d blocks", n, per, s.Options().NumBlocks)
	}
	st := stats(t, s)
	if st.KVBytesPerBlock != per || st.KVBytesAllocated < 10*per || st.NumBlocks != 10 {
		t.Fatalf("stats %+v", st)
	}
}

func TestNewPoolErrors(t *testing.T) {
	bad := []PoolOptions{
		{NumBlocks: 1},
		{NumBlocks: 8, BlockSize: 5000},
		{NumBlocks: 8, HashAlgo: 99},
		{NumBlocks: 8, NumLayers: 1, NumKVHeads: 1, HeadDim: 64, DType: 42},
		{NumBlocks: 8, NumLayers: 1, NumKVHeads: 1, HeadDim: 64, Device: 77},
	}
	for _, o := range bad {
		p, err := NewPool(&o)
		wantErr(t, err, ErrInvalidArgument)
		if p != nil {
			t.Fatal("a failed NewPool returned a pool")
		}
	}
	_, err := NewPool(&PoolOptions{NumBlocks: 8, HashSeed: "a\x00"})
	wantErr(t, err, ErrInvalidArgument)
	if CUDADeviceCount() == 0 {
		_, err := NewPool(&PoolOptions{NumBlocks: 8, NumLayers: 1, NumKVHeads: 1, HeadDim: 64,
			Device: CUDA})
		if err == nil {
			t.Fatal("a CUDA pool without a device")
		}
	}
}

func TestStatsEventsAndReset(t *testing.T) {
	p := managerPool(t, 9) // 8 usable blocks of 4 tokens
	r := rand.New(rand.NewSource(3))
	toks := randTokens(r, 10)
	a := seqOf(t, p, toks)
	st := stats(t, p)
	if st.NumUsedBlocks != 3 || st.NumFreeBlocks != 5 || st.NumCachedBlocks != 2 ||
		st.NumSeqs != 1 || st.NumTokens != 10 || st.BlockSize != 4 || st.NumBlocks != 9 ||
		math.Abs(st.Usage-3.0/8) > 1e-12 {
		t.Fatalf("stats %+v", st)
	}
	hashes, err := a.BlockHashes()
	ok(t, err)
	bt := table(t, a)
	evs, err := p.Events()
	ok(t, err)
	if len(evs) != 2 {
		t.Fatalf("events %+v", evs)
	}
	for i, e := range evs {
		if e.Type != EventBlockStored || e.SeqNo != uint64(i+1) || e.BlockID != bt[i] ||
			e.BlockHash != hashes[i] || e.NumTokens != 4 || e.HasParent != (i > 0) {
			t.Fatalf("event %d: %+v", i, e)
		}
	}
	if evs[1].ParentHash != hashes[0] {
		t.Fatal("parent hash")
	}
	// Drained events are gone.
	evs, err = p.DrainEvents(10)
	ok(t, err)
	if len(evs) != 0 {
		t.Fatalf("%d events after draining", len(evs))
	}
	_, err = p.DrainEvents(-1)
	wantErr(t, err, ErrInvalidArgument)
	seqOf(t, p, randTokens(r, 4))
	evs, err = p.DrainEvents(0)
	ok(t, err)
	if len(evs) != 0 {
		t.Fatal("DrainEvents(0) returned events")
	}
	evs, err = p.DrainEvents(1 << 40) // capped, not allocated
	ok(t, err)
	if len(evs) != 1 || evs[0].SeqNo != 3 {
		t.Fatalf("events %+v", evs)
	}

	// Prefix hits are counted in tokens.
	b, err := p.CreateSeq(nil)
	ok(t, err)
	n, err := b.MatchPrefix(toks)
	ok(t, err)
	if n != 8 {
		t.Fatalf("matched %d tokens", n)
	}
	st = stats(t, p)
	if st.PrefixQueryTokens != 10 || st.PrefixHitTokens != 8 {
		t.Fatalf("prefix stats %+v", st)
	}
	ok(t, p.ResetPrefixCache())
	evs, err = p.DrainEvents(1)
	ok(t, err)
	if len(evs) != 1 || evs[0].Type != EventAllCleared || evs[0].SeqNo != 4 {
		t.Fatalf("after reset: %+v", evs)
	}
	if st := stats(t, p); st.NumCachedBlocks != 0 {
		t.Fatalf("%d cached blocks after reset", st.NumCachedBlocks)
	}
	ok(t, p.Validate())
}

func TestEvictionEvents(t *testing.T) {
	p := managerPool(t, 5) // 4 usable blocks
	r := rand.New(rand.NewSource(4))
	a := seqOf(t, p, randTokens(r, 8)) // blocks 1, 2, both cached
	ok(t, a.Free())
	_, err := p.Events()
	ok(t, err)
	// Four new blocks: the two free uncached ones first, then the cached
	// ones, evicted lazily as they are reused.
	seqOf(t, p, randTokens(r, 13))
	evs, err := p.Events()
	ok(t, err)
	removed := map[int32]bool{}
	for _, e := range evs {
		if e.Type == EventBlockRemoved {
			removed[e.BlockID] = true
		}
	}
	if len(removed) != 2 || !removed[1] || !removed[2] {
		t.Fatalf("events %+v", evs)
	}
	if st := stats(t, p); st.NumEvictions != 2 {
		t.Fatalf("%d evictions", st.NumEvictions)
	}

	// Blocks that filled after the last prepared plan hold no K/V: freeing
	// their sequence before any plan covered them takes them out of the
	// cache at once (REMOVED) and returns them to the head of
	// the free queue, so they are reused before anything cached and no
	// later prefix match can hit them (pool.h, pkv_seq_free).
	q := managerPool(t, 5)
	toks := randTokens(r, 8)
	u := seqOf(t, q, randTokens(r, 4)) // block 1, computed
	ok(t, u.Free())                    // cached, at the tail: 2 3 4 1
	v, err := q.CreateSeq(nil)
	ok(t, err)
	ok(t, v.Append(toks)) // blocks 2, 3; no plan prepared
	bt := table(t, v)
	if !equalInt32(bt, []int32{2, 3}) {
		t.Fatalf("block table %v", bt)
	}
	hashes, err := v.BlockHashes()
	ok(t, err)
	_, err = q.Events()
	ok(t, err)
	ok(t, v.Free())
	evs, err = q.Events()
	ok(t, err)
	if len(evs) != 2 {
		t.Fatalf("events %+v", evs)
	}
	for i, e := range evs {
		j := int(e.BlockID) - int(bt[0])
		if e.Type != EventBlockRemoved || j < 0 || j > 1 || e.BlockHash != hashes[j] ||
			(i == 1 && e.BlockID == evs[0].BlockID) {
			t.Fatalf("event %d: %+v", i, e)
		}
	}
	if st := stats(t, q); st.NumCachedBlocks != 1 || st.NumEvictions != 0 || st.NumFreeBlocks != 4 {
		t.Fatalf("stats %+v", st)
	}
	w, err := q.CreateSeq(nil)
	ok(t, err)
	n, err := w.MatchPrefix(append(toks, 1))
	ok(t, err)
	if n != 0 {
		t.Fatalf("matched %d tokens of blocks that were never computed", n)
	}
	// The head now holds 3, 2 (one run, in the order freed: the tail block
	// first), then 4, then the cached 1, evicted only when nothing else is left.
	ok(t, w.Append(randTokens(r, 16)))
	if bt := table(t, w); !equalInt32(bt, []int32{3, 2, 4, 1}) {
		t.Fatalf("block table %v", bt)
	}
	if st := stats(t, q); st.NumEvictions != 1 {
		t.Fatalf("%d evictions", st.NumEvictions)
	}
	ok(t, q.Validate())
}

func TestEventsDisabledAndDropped(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 16})
	seqOf(t, p, make([]int32, 12))
	evs, err := p.Events()
	ok(t, err)
	if len(evs) != 0 {
		t.Fatal("events recorded without EnableEvents")
	}
	q := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 16, EnableEvents: true, MaxEvents: 2})
	seqOf(t, q, []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	evs, err = q.Events()
	ok(t, err)
	if len(evs) != 2 || evs[0].SeqNo != 3 || evs[1].SeqNo != 4 {
		t.Fatalf("kept %+v", evs)
	}
	if st := stats(t, q); st.NumEventsDropped != 2 {
		t.Fatalf("%d dropped", st.NumEventsDropped)
	}
}

// storagePool is a small f32 CPU pool with storage.
func storagePool(t testing.TB, layers uint32) *Pool {
	return newPool(t, PoolOptions{BlockSize: 8, NumBlocks: 12, NumLayers: layers, NumKVHeads: 2,
		HeadDim: 64, DType: Float32, NumThreads: 2, EnableEvents: true})
}

func TestKVTensorCopyAndSwap(t *testing.T) {
	p := storagePool(t, 2)
	views := make([][]float32, 4)
	for l := 0; l < 2; l++ {
		for w, which := range []KVKind{Key, Value} {
			kt, err := p.KVTensor(l, which)
			ok(t, err)
			want := []int64{12, 2, 8, 64}
			if kt.DType != Float32 || kt.Device != CPU || len(kt.Shape) != 4 || kt.Data == nil {
				t.Fatalf("kv tensor %+v", kt)
			}
			for i := range want {
				if kt.Shape[i] != want[i] {
					t.Fatalf("shape %v", kt.Shape)
				}
			}
			v, err := kt.Float32s()
			ok(t, err)
			if len(v) != 12*2*8*64 {
				t.Fatalf("view of %d elements", len(v))
			}
			views[2*l+w] = v
		}
	}
	_, err := p.KVTensor(2, Key)
	wantErr(t, err, ErrInvalidArgument)
	_, err = p.KVTensor(0, 5)
	wantErr(t, err, ErrInvalidArgument)
	_, err = p.KVTensor(-1, Key)
	wantErr(t, err, ErrInvalidArgument)
	_, err = managerPool(t, 4).KVTensor(0, Key)
	if err == nil {
		t.Fatal("a manager-only pool has no storage")
	}

	r := rand.New(rand.NewSource(5))
	for _, v := range views {
		for i := range v {
			v[i] = r.Float32()
		}
	}
	blockElems := 2 * 8 * 64
	blk := func(v []float32, b int) []float32 { return v[b*blockElems : (b+1)*blockElems] }
	ok(t, p.CopyBlocks([]int32{3, 4}, []int32{7, 9}, nil))
	for _, v := range views {
		for i, src := range []int{3, 4} {
			dst := []int{7, 9}[i]
			for j, x := range blk(v, src) {
				if blk(v, dst)[j] != x {
					t.Fatalf("block %d not copied to %d", src, dst)
				}
			}
		}
	}
	wantErr(t, p.CopyBlocks([]int32{1}, []int32{2, 3}, nil), ErrInvalidArgument)
	wantErr(t, p.CopyBlocks([]int32{1}, []int32{12}, nil), ErrInvalidArgument)

	per, err := p.BytesPerBlock()
	ok(t, err)
	if per != uint64(2*2*blockElems*4) {
		t.Fatalf("%d bytes per block", per)
	}
	buf := make([]byte, 2*per)
	ok(t, p.SwapBlocks([]int32{5, 2}, buf, SwapOut))
	// Layout: [block][layer][K,V][heads][block_size][dim].
	f := unsafe.Slice((*float32)(unsafe.Pointer(&buf[0])), len(buf)/4)
	for bi, b := range []int{5, 2} {
		for l := 0; l < 2; l++ {
			for w := 0; w < 2; w++ {
				off := ((bi*2+l)*2 + w) * blockElems
				for j, x := range blk(views[2*l+w], b) {
					if f[off+j] != x {
						t.Fatalf("swap out: block %d layer %d kv %d differs", b, l, w)
					}
				}
			}
		}
	}
	ok(t, p.SwapBlocks([]int32{10, 11}, buf, SwapIn))
	for _, v := range views {
		for j := range blk(v, 5) {
			if blk(v, 10)[j] != blk(v, 5)[j] || blk(v, 11)[j] != blk(v, 2)[j] {
				t.Fatal("swap in did not restore the blocks")
			}
		}
	}
	wantErr(t, p.SwapBlocks([]int32{1, 2}, buf[:per], SwapOut), ErrInvalidArgument)
	wantErr(t, p.SwapBlocks([]int32{1}, buf, 7), ErrInvalidArgument)
	ok(t, p.Validate())
}
