package pagedkv

import (
	"errors"
	"math/rand"
	"runtime"
	"strings"
	"testing"
	"unsafe"
)

// Issue 14: a *Pool that becomes unreachable while its batch is still in use
// must not be finalized under the batch.
func TestBatchKeepsPoolReachable(t *testing.T) {
	p, err := NewPool(&PoolOptions{BlockSize: 8, NumBlocks: 12, NumLayers: 1, NumKVHeads: 2,
		HeadDim: 64, DType: Float32, NumThreads: 1})
	ok(t, err)
	s, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append(randTokens(rand.New(rand.NewSource(3)), 9)))
	batch, err := p.Prepare([]Seq{s}, []int{9})
	ok(t, err)
	defer batch.Close()
	p, s = nil, Seq{} // only the batch refers to the pool now
	for i := 0; i < 5; i++ {
		runtime.GC()
	}
	kv := make([]float32, 9*2*64)
	for i := range kv {
		kv[i] = float32(i%7) - 3
	}
	if err := batch.CacheWrite(0, kv, kv); err != nil {
		t.Fatalf("the pool was finalized under its batch: %v", err)
	}
}

// attend runs one step over fresh pool state; tamper, if set, writes into
// the batch's plan arrays first.
func attendOnce(t *testing.T, tamper func(*Batch)) []float32 {
	p := storagePool(t, 1)
	r := rand.New(rand.NewSource(21))
	a := seqOf(t, p, randTokens(r, 13))
	b := seqOf(t, p, randTokens(r, 5))
	batch, err := p.Prepare([]Seq{a, b}, []int{13, 5}) // every key written
	ok(t, err)
	defer batch.Close()
	if tamper != nil {
		tamper(batch)
	}
	n := batch.NumTokens()
	kv := make([]float32, n*2*64)
	q := make([]float32, n*4*64)
	for i := range kv {
		kv[i] = r.Float32() - 0.5
	}
	for i := range q {
		q[i] = r.Float32() - 0.5
	}
	ok(t, batch.CacheWrite(0, kv, kv))
	out := make([]float32, len(q))
	ok(t, batch.Attention(0, q, out, nil, nil))
	return out
}

// Issue 14 item 2: the plan arrays are the callers' copy; writes into them
// (possible only through unsafe) do not reach the kernels.
func TestPlanArrayWritesDoNotReachKernels(t *testing.T) {
	want := attendOnce(t, nil)
	got := attendOnce(t, func(b *Batch) {
		for _, which := range []PlanArray{PlanQueryIndptr, PlanPageIndptr, PlanPageIndices} {
			pt, err := b.PlanTensor(which)
			ok(t, err)
			arr := unsafe.Slice((*int32)(unsafe.Add(pt.Data, pt.ByteOffset)), pt.Shape[0])
			for i := 1; i < len(arr); i++ {
				arr[i] = 1000
			}
		}
		qi, err := b.PlanInt32s(PlanQueryIndptr)
		ok(t, err)
		if qi[1] != 1000 {
			t.Fatalf("the write did not land in the callers' copy: %v", qi)
		}
	})
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("out[%d] = %v after plan writes, %v without", i, got[i], want[i])
		}
	}
}

// Issue 14 item 6 through Go: out = q (in place) is refused, naming both.
func TestAttentionOutAliasingQIsRefused(t *testing.T) {
	p := storagePool(t, 1)
	s := seqOf(t, p, randTokens(rand.New(rand.NewSource(5)), 6))
	batch, err := p.Prepare([]Seq{s}, []int{6})
	ok(t, err)
	defer batch.Close()
	kv := make([]float32, 6*2*64)
	ok(t, batch.CacheWrite(0, kv, kv))
	q := make([]float32, 6*4*64)
	err = batch.Attention(0, q, q, nil, nil)
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "out overlaps q") {
		t.Fatalf("Attention(q, q): %v", err)
	}
}
