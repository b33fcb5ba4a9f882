package pagedkv

import (
	"math"
	"math/rand"
	"strings"
	"testing"
	"unsafe"
)

func TestPlanArrays(t *testing.T) {
	p := managerPool(t, 32)
	r := rand.New(rand.NewSource(10))
	a := seqOf(t, p, randTokens(r, 9))
	b := seqOf(t, p, randTokens(r, 4))
	ok(t, a.Append(randTokens(r, 1)))  // a: 10 tokens, 1 query (decode)
	c := seqOf(t, p, randTokens(r, 6)) // c: 6 tokens, all queries (prefill)
	batch, err := p.Prepare([]Seq{a, b, c}, []int{1, 2, 6})
	ok(t, err)
	defer batch.Close()
	info, err := batch.Info()
	ok(t, err)
	want := BatchInfo{NumSeqs: 3, NumTokens: 9, NumPages: 3 + 1 + 2, MaxContext: 10, MaxQuery: 6,
		BlockSize: 4}
	if info != want || batch.NumTokens() != 9 {
		t.Fatalf("info %+v, want %+v", info, want)
	}
	get := func(w PlanArray) []int32 {
		v, err := batch.PlanInt32s(w)
		ok(t, err)
		return v
	}
	tables := [][]int32{table(t, a), table(t, b), table(t, c)}
	ctx := []int32{10, 4, 6}
	q := []int32{1, 2, 6}
	if v := get(PlanQueryIndptr); !equalInt32(v, []int32{0, 1, 3, 9}) {
		t.Fatalf("query indptr %v", v)
	}
	if v := get(PlanPageIndptr); !equalInt32(v, []int32{0, 3, 4, 6}) {
		t.Fatalf("page indptr %v", v)
	}
	var pages []int32
	for _, bt := range tables {
		pages = append(pages, bt...)
	}
	if v := get(PlanPageIndices); !equalInt32(v, pages) {
		t.Fatalf("page indices %v want %v", v, pages)
	}
	if v := get(PlanLastPageLen); !equalInt32(v, []int32{2, 4, 2}) {
		t.Fatalf("last page len %v", v)
	}
	if v := get(PlanContextLens); !equalInt32(v, ctx) {
		t.Fatalf("context lens %v", v)
	}
	sm, err := batch.SlotMapping()
	ok(t, err)
	var wantSM []int64
	for i, bt := range tables {
		for pos := ctx[i] - q[i]; pos < ctx[i]; pos++ {
			wantSM = append(wantSM, int64(bt[pos/4])*4+int64(pos%4))
		}
	}
	if len(sm) != len(wantSM) {
		t.Fatalf("slot mapping %v want %v", sm, wantSM)
	}
	for i := range sm {
		if sm[i] != wantSM[i] {
			t.Fatalf("slot mapping %v want %v", sm, wantSM)
		}
	}
	pt, err := batch.PlanTensor(PlanSlotMapping)
	ok(t, err)
	if pt.DType != Int64 || pt.Device != CPU || len(pt.Shape) != 1 || pt.Shape[0] != 9 {
		t.Fatalf("slot mapping tensor %+v", pt)
	}
	_, err = batch.PlanTensor(99)
	wantErr(t, err, ErrInvalidArgument)
	_, err = pt.Int32s()
	wantErr(t, err, ErrInvalidArgument)
}

func TestPrepareErrors(t *testing.T) {
	p := managerPool(t, 16)
	other := managerPool(t, 16)
	s := seqOf(t, p, []int32{1, 2, 3})
	o := seqOf(t, other, []int32{1, 2, 3})
	_, err := p.Prepare([]Seq{s}, []int{1, 1})
	wantErr(t, err, ErrInvalidArgument)
	_, err = p.Prepare([]Seq{o}, []int{1})
	wantErr(t, err, ErrInvalidArgument)
	_, err = p.Prepare([]Seq{s}, []int{-1})
	wantErr(t, err, ErrInvalidArgument)
	_, err = p.Prepare([]Seq{s}, []int{4}) // more queries than tokens
	wantErr(t, err, ErrInvalidArgument)
	_, err = p.Prepare([]Seq{s, s}, []int{1, 1}) // a sequence twice
	wantErr(t, err, ErrInvalidArgument)
	gone := seqOf(t, p, []int32{1})
	ok(t, gone.Free())
	_, err = p.Prepare([]Seq{gone}, []int{1})
	wantErr(t, err, ErrNotFound)
}

func TestCacheWriteLandsInSlots(t *testing.T) {
	p := storagePool(t, 2)
	r := rand.New(rand.NewSource(11))
	a := seqOf(t, p, randTokens(r, 11))
	b := seqOf(t, p, randTokens(r, 3))
	batch, err := p.Prepare([]Seq{a, b}, []int{11, 3})
	ok(t, err)
	defer batch.Close()
	sm, err := batch.SlotMapping()
	ok(t, err)
	const heads, dim, bs = 2, 64, 8
	n := batch.NumTokens()
	for layer := 0; layer < 2; layer++ {
		k := make([]float32, n*heads*dim)
		v := make([]float32, n*heads*dim)
		for i := range k {
			k[i], v[i] = r.Float32()-0.5, r.Float32()-0.5
		}
		ok(t, batch.CacheWrite(layer, k, v))
		for w, src := range [][]float32{k, v} {
			kt, err := p.KVTensor(layer, []KVKind{Key, Value}[w])
			ok(t, err)
			store, err := kt.Float32s()
			ok(t, err)
			for row := 0; row < n; row++ {
				blk, off := int(sm[row])/bs, int(sm[row])%bs
				for h := 0; h < heads; h++ {
					for d := 0; d < dim; d++ {
						got := store[((blk*heads+h)*bs+off)*dim+d]
						if got != src[(row*heads+h)*dim+d] {
							t.Fatalf("layer %d kv %d row %d head %d dim %d: %v", layer, w, row, h, d, got)
						}
					}
				}
			}
		}
	}
	bad := make([]float32, n*heads*dim-1)
	good := make([]float32, n*heads*dim)
	wantErr(t, batch.CacheWrite(0, bad, good), ErrInvalidArgument)
	wantErr(t, batch.CacheWrite(0, good, bad), ErrInvalidArgument)
	wantErr(t, batch.CacheWrite(2, good, good), ErrInvalidArgument)
	wantErr(t, batch.CacheWrite(-1, good, good), ErrInvalidArgument)
	wantErr(t, batch.CacheWrite16(0, make([]uint16, len(good)), make([]uint16, len(good))),
		ErrInvalidArgument)
	q := make([]float32, n*4*dim)
	wantErr(t, batch.Attention(0, q[1:], q[1:], nil, nil), ErrInvalidArgument)
	wantErr(t, batch.Attention(0, q, q[:len(q)-dim], nil, nil), ErrInvalidArgument)
	wantErr(t, batch.Attention(0, q, make([]float32, len(q)), make([]float32, 3), nil),
		ErrInvalidArgument)
	// 3 q heads over 2 kv heads is not GQA.
	q3 := make([]float32, n*3*dim)
	wantErr(t, batch.Attention(0, q3, make([]float32, len(q3)), nil, nil), ErrInvalidArgument)

	// A tensor in Go memory may not be passed as a raw Tensor, but one with
	// a bad shape is refused before anything reaches C.
	wantErr(t, batch.CacheWriteTensor(0, &Tensor{DType: Float32, Device: CPU}, &Tensor{}, nil),
		ErrInvalidArgument)
	wantErr(t, batch.AttentionTensor(0, nil, nil, nil, nil, nil), ErrInvalidArgument)

	// The plan goes stale when one of its sequences changes.
	ok(t, a.Append([]int32{1}))
	wantErr(t, batch.CacheWrite(0, good, good), ErrInvalidState)
	wantErr(t, batch.Attention(0, q, make([]float32, len(q)), nil, nil), ErrInvalidState)
}

func TestHostCallsOnManagerPoolFail(t *testing.T) {
	p := managerPool(t, 8)
	s := seqOf(t, p, []int32{1, 2})
	batch, err := p.Prepare([]Seq{s}, []int{2})
	ok(t, err)
	defer batch.Close()
	if err := batch.CacheWrite(0, nil, nil); err == nil {
		t.Fatal("a manager-only pool cannot store KV")
	}
}

// Raw tensors over C memory (here: the pool's own storage) work like Go
// slices; this is the path CUDA callers take with device pointers.
func TestTensorVariants(t *testing.T) {
	p := storagePool(t, 2)
	r := rand.New(rand.NewSource(12))
	s := seqOf(t, p, randTokens(r, 8))
	batch, err := p.Prepare([]Seq{s}, []int{8})
	ok(t, err)
	defer batch.Close()
	// Layer 1's key storage is C memory large enough to act as k and v
	// [8, 2, 64] for a write into layer 0.
	src, err := p.KVTensor(1, Key)
	ok(t, err)
	view, err := src.Float32s()
	ok(t, err)
	for i := range view {
		view[i] = float32(math.Sin(float64(i)))
	}
	k, err := NewTensor(src.Data, Float32, CPU, 0, []int64{8, 2, 64})
	ok(t, err)
	if k.NumElements() != 8*2*64 || (k.Strides != nil && !equalInt64(k.Strides, []int64{128, 64, 1})) {
		t.Fatalf("tensor %+v", k)
	}
	ok(t, batch.CacheWriteTensor(0, &k, &k, nil))
	sm, err := batch.SlotMapping()
	ok(t, err)
	dst, err := p.KVTensor(0, Value)
	ok(t, err)
	dv, err := dst.Float32s()
	ok(t, err)
	for row := 0; row < 8; row++ {
		blk, off := int(sm[row])/8, int(sm[row])%8
		for h := 0; h < 2; h++ {
			for d := 0; d < 64; d++ {
				if dv[((blk*2+h)*8+off)*64+d] != view[(row*2+h)*64+d] {
					t.Fatal("raw tensor write")
				}
			}
		}
	}
	_, err = NewTensor(src.Data, 42, CPU, 0, []int64{8})
	wantErr(t, err, ErrInvalidArgument)
	_, err = NewTensor(src.Data, Float32, CPU, 0, []int64{-1})
	wantErr(t, err, ErrInvalidArgument)
	_, err = NewTensor(src.Data, Float32, CPU, 0, nil)
	wantErr(t, err, ErrInvalidArgument)
}

func equalInt64(a, b []int64) bool {
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

// A Tensor holding a pointer to Go memory breaks cgo's pointer rules, and
// so does a stream or host buffer pointing at Go memory that holds Go
// pointers. cgo's check (on by default) stops them before C sees them; it
// used to panic ("cgo argument has Go pointer to Go pointer") out of
// CacheWriteTensor and every call taking such a pointer. Each is an
// ErrInvalidArgument naming the argument, and nothing changed.
func TestGoPointersCgoRefusesAreArgumentErrors(t *testing.T) {
	p := storagePool(t, 1)
	s := seqOf(t, p, []int32{1})
	ok(t, s.Append([]int32{2}))
	b, err := p.Prepare([]Seq{s}, []int{1})
	ok(t, err)
	defer b.Close()
	goMem := make([]float32, 4*64)
	k := Tensor{Data: unsafe.Pointer(&goMem[0]), DType: Float32, Device: CPU,
		Shape: []int64{1, 2, 64}}
	made, err := NewTensor(unsafe.Pointer(&goMem[0]), Float32, CPU, 0, []int64{1, 4, 64})
	ok(t, err) // no Go pointer inside goMem: cgo lets it through, the Tensor holds one
	ptrs := []*int{new(int), new(int)}
	goPtrs := unsafe.Pointer(&ptrs[0])
	before := stats(t, p)
	for _, c := range []struct {
		name, arg string
		call      func() error
	}{
		{"CacheWriteTensor", "k", func() error { return b.CacheWriteTensor(0, &k, &k, nil) }},
		{"AttentionTensor", "q", func() error { return b.AttentionTensor(0, &made, &made, nil, nil, nil) }},
		{"MLACacheWriteTensor", "kvC", func() error { return b.MLACacheWriteTensor(0, &k, nil, nil) }},
		{"MLAAttentionTensor", "qLatent", func() error {
			return b.MLAAttentionTensor(0, &made, nil, &made, nil, &AttentionParams{SoftmaxScale: 1}, nil)
		}},
		{"NewTensor", "data", func() error {
			_, err := NewTensor(goPtrs, Int64, CPU, 0, []int64{2})
			return err
		}},
		{"CopyBlocks", "stream", func() error { return p.CopyBlocks(nil, nil, goPtrs) }},
		{"PrepareOnStream", "stream", func() error {
			_, err := p.PrepareOnStream([]Seq{s}, []int{1}, goPtrs)
			return err
		}},
		{"PrepareDecodeEx", "stream", func() error {
			_, err := p.PrepareDecodeEx([]SeqID{s.ID()}, []int32{3}, 0, goPtrs)
			return err
		}},
		{"SwapBlocksPinned", "host", func() error {
			return p.SwapBlocksPinned([]int32{1}, goPtrs, 16, SwapOut, nil)
		}},
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("%s panicked: %v", c.name, r)
				}
			}()
			e := wantErr(t, c.call(), ErrInvalidArgument)
			if !strings.HasPrefix(e.Msg, c.arg+" ") && !strings.HasPrefix(e.Msg, c.arg+".") {
				t.Fatalf("%s: %v does not name %s first", c.name, e, c.arg)
			}
		}()
	}
	if after := stats(t, p); after != before {
		t.Fatalf("stats changed: %+v -> %+v", before, after)
	}
	ok(t, p.Validate())
}
