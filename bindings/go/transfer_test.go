package pagedkv

import (
	"math/rand"
	"testing"
)

func transferPools(t *testing.T) (*Pool, *Pool) {
	o := PoolOptions{BlockSize: 16, NumBlocks: 64, NumLayers: 2, NumKVHeads: 2, HeadDim: 32, DType: Float32}
	return newPool(t, o), newPool(t, o)
}

func engines(t *testing.T) (*TransferEngine, *TransferEngine) {
	if !TransferAvailable() {
		t.Skip("built without UCX")
	}
	a, err := NewTransferEngine(&TransferOptions{Transports: "tcp"})
	ok(t, err)
	b, err := NewTransferEngine(&TransferOptions{Transports: "tcp"})
	ok(t, err)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestTransferImportIsComputedAndPrefixCacheable(t *testing.T) {
	a, b := engines(t)
	src, dst := transferPools(t)
	tokens := randTokens(rand.New(rand.NewSource(7)), 70)
	s := seqOf(t, src, tokens)
	id, desc, err := a.Export(s)
	ok(t, err)
	free0 := stats(t, dst).NumFreeBlocks
	tr, err := b.Import(dst, nil, desc)
	ok(t, err)
	defer tr.Close()
	state, got := TransferRunning, Seq{}
	for state == TransferRunning {
		ok(t, a.Progress())
		state, got, err = tr.Poll()
		ok(t, err)
	}
	if state != TransferDone {
		t.Fatalf("state %d, want done", state)
	}
	info, err := got.Info()
	ok(t, err)
	if info.NumTokens != 70 || info.NumComputedTokens != 70 {
		t.Fatalf("imported %+v, want 70 computed tokens", info)
	}
	probe, err := dst.CreateSeq(nil)
	ok(t, err)
	hit, err := probe.MatchPrefix(append(append([]int32{}, tokens...), 1))
	ok(t, err)
	if hit != 64 {
		t.Fatalf("prefix hit %d tokens, want 64", hit)
	}
	ok(t, probe.Free())
	ok(t, got.Free())
	if f := stats(t, dst).NumFreeBlocks; f != free0 {
		t.Fatalf("free blocks %d, want %d", f, free0)
	}
	ok(t, a.ReleaseExport(id))
	wantErr(t, a.ReleaseExport(id), ErrNotFound)
	ok(t, dst.Validate())
}

func TestTransferRefusalsChangeNothing(t *testing.T) {
	a, b := engines(t)
	src, _ := transferPools(t)
	other := newPool(t, PoolOptions{BlockSize: 32, NumBlocks: 64, NumLayers: 2, NumKVHeads: 2, HeadDim: 32,
		DType: Float32})
	tiny := newPool(t, PoolOptions{BlockSize: 16, NumBlocks: 3, NumLayers: 2, NumKVHeads: 2, HeadDim: 32,
		DType: Float32})
	s := seqOf(t, src, randTokens(rand.New(rand.NewSource(8)), 100))
	id, desc, err := a.Export(s)
	ok(t, err)
	_, err = b.Import(other, nil, desc)
	wantErr(t, err, ErrInvalidArgument)
	_, err = b.Import(tiny, nil, desc)
	wantErr(t, err, ErrOutOfBlocks)
	_, err = b.Import(tiny, nil, desc[:10])
	wantErr(t, err, ErrInvalidArgument)
	for _, p := range []*Pool{other, tiny} {
		if st := stats(t, p); st.NumSeqs != 0 {
			t.Fatalf("a refused import left %d sequences", st.NumSeqs)
		}
		ok(t, p.Validate())
	}
	tr, err := b.Import(src, nil, desc)
	ok(t, err)
	ok(t, tr.Cancel())
	state, _, err := tr.Poll()
	ok(t, err)
	if state != TransferCancelled {
		t.Fatalf("state %d, want cancelled", state)
	}
	ok(t, tr.Close())
	ok(t, tr.Close())
	ok(t, a.ReleaseExport(id))
	ok(t, src.Validate())
}
