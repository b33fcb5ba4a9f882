package pagedkv

import (
	"errors"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// Tensor's host views on a malformed descriptor (a negative extent, nil
// data, a nil *Tensor) are argument errors, never a runtime panic.
func TestTensorHostViewsOfBadDescriptorsAreErrors(t *testing.T) {
	var x [4]int64
	good := unsafe.Pointer(&x[0])
	cases := []*Tensor{
		{Data: good, DType: Int32, Device: CPU, Shape: []int64{-3}},
		{Data: good, DType: Int32, Device: CPU, Shape: []int64{-2, -2}},
		{Data: nil, DType: Int32, Device: CPU, Shape: []int64{4}},
		{Data: good, DType: Int32, Device: CPU, Shape: []int64{1 << 62, 1 << 62}},
	}
	for i, c := range cases {
		for _, f := range []func() error{
			func() error { _, err := c.Int32s(); return err },
			func() error { c2 := *c; c2.DType = Int64; _, err := c2.Int64s(); return err },
			func() error { c2 := *c; c2.DType = Float32; _, err := c2.Float32s(); return err },
			func() error { c2 := *c; c2.DType = Float16; _, err := c2.Uint16s(); return err },
			func() error { c2 := *c; c2.DType = Float8E4M3; _, err := c2.Codes(); return err },
		} {
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("case %d: panic %v", i, r)
					}
				}()
				wantErr(t, f(), ErrInvalidArgument)
			}()
		}
	}
	var nilT *Tensor
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("nil tensor: panic %v", r)
			}
		}()
		_, err := nilT.Int32s()
		wantErr(t, err, ErrInvalidArgument)
		_, err = nilT.Float32s()
		wantErr(t, err, ErrInvalidArgument)
	}()
	// A zero extent is an empty view, not an error.
	z := &Tensor{Data: nil, DType: Int32, Device: CPU, Shape: []int64{0, 5}}
	got, err := z.Int32s()
	ok(t, err)
	if len(got) != 0 {
		t.Fatalf("got %v", got)
	}
}

// The MLA host calls of a closed Batch are ErrClosed like every other
// Batch method (they read the pool's options through the batch, which
// Close clears: a nil dereference).
func TestMLAHostCallsAfterBatchCloseAreErrClosed(t *testing.T) {
	for _, layout := range []KVLayout{LayoutMLA, LayoutMHA} {
		o := PoolOptions{BlockSize: 4, NumBlocks: 8, NumLayers: 1, DType: Float32, NumThreads: 1}
		if layout == LayoutMLA {
			o.KVLayout, o.KVLoRARank, o.QKRopeHeadDim = LayoutMLA, 16, 8
		} else {
			o.NumKVHeads, o.HeadDim = 1, 8
		}
		p := newPool(t, o)
		s, err := p.CreateSeq(nil)
		ok(t, err)
		ok(t, s.Append([]int32{1, 2}))
		b, err := p.Prepare([]Seq{s}, []int{2})
		ok(t, err)
		ok(t, b.Close())
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("%v: panic %v", layout, r)
				}
			}()
			// An MHA pool's batch refuses MLA calls before it looks at
			// being closed: either error, never a panic.
			want := func(err error) bool {
				return errors.Is(err, ErrClosed) || layout == LayoutMHA && errors.Is(err, ErrInvalidState)
			}
			err := b.MLACacheWrite(0, make([]float32, 2*16), make([]float32, 2*8))
			if !want(err) {
				t.Fatalf("%v: MLACacheWrite after Close: %v", layout, err)
			}
			err = b.MLAAttention(0, make([]float32, 2*16), make([]float32, 2*8), make([]float32, 2*16), nil, 0.1)
			if !want(err) {
				t.Fatalf("%v: MLAAttention after Close: %v", layout, err)
			}
		}()
	}
}

// Every Batch method on a nil *Batch, a closed Batch and a Batch whose pool
// was closed returns an error or (the orphan's readable arrays) its answer,
// never a panic; Close stays idempotent.
func TestBatchMethodsOnNilClosedAndOrphanedBatches(t *testing.T) {
	o := PoolOptions{BlockSize: 4, NumBlocks: 8, NumLayers: 1, NumKVHeads: 1, HeadDim: 8,
		DType: Float32, NumThreads: 1}
	f := make([]float32, 16)
	u := make([]uint16, 16)
	// No data (a Go pointer may not be passed inside a Tensor): refused by
	// the library, or before it by the closed checks.
	tensor := &Tensor{DType: Float32, Device: CPU, Shape: []int64{2, 1, 8}}
	calls := map[string]func(b *Batch) error{
		"Commit":           func(b *Batch) error { return b.Commit() },
		"Abort":            func(b *Batch) error { return b.Abort() },
		"Info":             func(b *Batch) error { _, err := b.Info(); return err },
		"PlanTensor":       func(b *Batch) error { _, err := b.PlanTensor(PlanSlotMapping); return err },
		"PlanInt32s":       func(b *Batch) error { _, err := b.PlanInt32s(PlanContextLens); return err },
		"PlanGroupTensor":  func(b *Batch) error { _, err := b.PlanGroupTensor(0, PlanContextLens); return err },
		"SlotMapping":      func(b *Batch) error { _, err := b.SlotMapping(); return err },
		"TokenPositions":   func(b *Batch) error { _, err := b.TokenPositions(); return err },
		"LastTokenIndices": func(b *Batch) error { _, err := b.LastTokenIndices(); return err },
		"CacheWrite":       func(b *Batch) error { return b.CacheWrite(0, f, f) },
		"CacheWrite16":     func(b *Batch) error { return b.CacheWrite16(0, u, u) },
		"Attention":        func(b *Batch) error { return b.Attention(0, f, f, nil, nil) },
		"Attention16":      func(b *Batch) error { return b.Attention16(0, u, u, nil, nil) },
		"CacheWriteTensor": func(b *Batch) error { return b.CacheWriteTensor(0, tensor, tensor, nil) },
		"AttentionTensor":  func(b *Batch) error { return b.AttentionTensor(0, tensor, tensor, nil, nil, nil) },
		"MLACacheWrite":    func(b *Batch) error { return b.MLACacheWrite(0, f, f) },
		"MLAAttention":     func(b *Batch) error { return b.MLAAttention(0, f, f, f, nil, 1) },
		"MLACacheWriteTensor": func(b *Batch) error {
			return b.MLACacheWriteTensor(0, tensor, tensor, nil)
		},
		"MLAAttentionTensor": func(b *Batch) error {
			return b.MLAAttentionTensor(0, tensor, tensor, tensor, nil, nil, nil)
		},
	}
	for _, state := range []string{"nil", "closed", "orphaned"} {
		var b *Batch
		if state != "nil" {
			p, err := NewPool(&o)
			ok(t, err)
			s, err := p.CreateSeq(nil)
			ok(t, err)
			ok(t, s.Append([]int32{1, 2}))
			b, err = p.Prepare([]Seq{s}, []int{2})
			ok(t, err)
			if state == "closed" {
				ok(t, b.Close())
			}
			ok(t, p.Close())
		}
		for name, call := range calls {
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("%s batch: %s panicked: %v", state, name, r)
					}
				}()
				err := call(b)
				// A plan outlives its pool: its arrays stay readable and
				// aborting it is harmless; what needs the pool fails.
				readable := map[string]bool{"Info": true, "PlanTensor": true, "PlanInt32s": true,
					"PlanGroupTensor": true, "SlotMapping": true, "TokenPositions": true,
					"LastTokenIndices": true, "Abort": true}
				if state == "orphaned" && readable[name] {
					ok(t, err)
				} else if err == nil {
					t.Errorf("%s batch: %s succeeded", state, name)
				}
			}()
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("%s batch: NumTokens panicked: %v", state, r)
				}
			}()
			_ = b.NumTokens()
		}()
		ok(t, b.Close())
		ok(t, b.Close())
	}
}

// callAll calls every method of v with zero arguments (nil slices,
// pointers and tensors, 0 counts), failing on a panic: a bad argument or a
// nil, closed or orphaned receiver must be an error.
func callAll(t *testing.T, label string, v reflect.Value) {
	ty := v.Type()
	for i := 0; i < ty.NumMethod(); i++ {
		m := ty.Method(i)
		args := []reflect.Value{v}
		for j := 1; j < m.Type.NumIn(); j++ {
			args = append(args, reflect.Zero(m.Type.In(j)))
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s.%s panicked: %v", label, m.Name, r)
				}
			}()
			m.Func.Call(args)
		}()
	}
}

func TestZeroArgumentCallsNeverPanic(t *testing.T) {
	callAll(t, "nil *Pool", reflect.ValueOf((*Pool)(nil)))
	callAll(t, "Seq{}", reflect.ValueOf(Seq{}))
	callAll(t, "nil *Batch", reflect.ValueOf((*Batch)(nil)))
	callAll(t, "nil *Tensor", reflect.ValueOf((*Tensor)(nil)))
	callAll(t, "nil *EventPublisher", reflect.ValueOf((*EventPublisher)(nil)))
	callAll(t, "nil *TransferEngine", reflect.ValueOf((*TransferEngine)(nil)))
	callAll(t, "nil *Transfer", reflect.ValueOf((*Transfer)(nil)))
	o := PoolOptions{BlockSize: 4, NumBlocks: 8, NumLayers: 1, NumKVHeads: 1, HeadDim: 8,
		DType: Float32, EnableEvents: true}
	p, err := NewPool(&o)
	ok(t, err)
	s, err := p.CreateSeq(nil)
	ok(t, err)
	p.Close()
	callAll(t, "closed *Pool", reflect.ValueOf(p))
	callAll(t, "Seq of closed", reflect.ValueOf(s))
	// Live receivers (the pool's own Close comes in the loop, so the Seq
	// goes first).
	p2, err := NewPool(&o)
	ok(t, err)
	defer p2.Close()
	s2, err := p2.CreateSeq(nil)
	ok(t, err)
	ok(t, s2.Append([]int32{1, 2, 3}))
	b, err := p2.Prepare([]Seq{s2}, []int{3})
	ok(t, err)
	callAll(t, "live Batch", reflect.ValueOf(b))
	callAll(t, "live Seq", reflect.ValueOf(s2))
	callAll(t, "live *Pool", reflect.ValueOf(p2))
}

// slotTensor returns a plan's slot mapping as a zero-copy Tensor (and a
// copy of it); the Batch is unreachable once it returns.
func slotTensor(t *testing.T, p *Pool, s Seq) (Tensor, []int64) {
	b, err := p.Prepare([]Seq{s}, []int{9})
	ok(t, err)
	ok(t, b.Commit())
	tt, err := b.PlanTensor(PlanSlotMapping)
	ok(t, err)
	want, err := tt.Int64s()
	ok(t, err)
	return tt, want
}

// A Tensor the library handed out keeps its Batch reachable: the batch's
// finalizer used to run while the Tensor was still in use, recycling the
// plan memory, and the Tensor then read the slot mapping of a later plan.
func TestPlanTensorKeepsItsBatchAlive(t *testing.T) {
	p := managerPool(t, 64)
	s, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append([]int32{1, 2, 3, 4, 5, 6, 7, 8, 9}))
	tt, want := slotTensor(t, p, s)
	for i := 0; i < 5; i++ {
		runtime.GC()
		time.Sleep(2 * time.Millisecond)
	}
	for i := 0; i < 3; i++ {
		s2, err := p.CreateSeq(nil)
		ok(t, err)
		ok(t, s2.Append([]int32{11, 12, 13, 14, 15, 16, 17, 18, 19}))
		b, err := p.Prepare([]Seq{s2}, []int{9})
		ok(t, err)
		_, err = b.SlotMapping()
		ok(t, err)
		got, err := tt.Int64s()
		ok(t, err)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("plan %d: the first plan's tensor reads %v, want %v", i, got, want)
		}
		ok(t, b.Close())
	}
	runtime.KeepAlive(tt)
}

// Tensor's host views on descriptors the library would refuse (fewer
// strides than dimensions) or whose byte count no host memory can hold are
// argument errors: they used to index past Strides, or reach unsafe.Slice
// and make with a length they panic on.
func TestTensorHostViewsOfMalformedStridesAndHugeShapesAreErrors(t *testing.T) {
	var x [16]int64
	good := unsafe.Pointer(&x[0])
	cases := []Tensor{
		{Data: good, Device: CPU, Shape: []int64{2, 3}, Strides: []int64{1}},
		{Data: good, Device: CPU, Shape: []int64{2, 3}, Strides: []int64{}},
		{Data: good, Device: CPU, Shape: []int64{2}, Strides: []int64{1, 1}},
		{Data: good, Device: CPU, Shape: []int64{1 << 62}},
		{Data: good, Device: CPU, Shape: []int64{1 << 61}},
		{Data: good, Device: CPU, Shape: []int64{1 << 31, 1 << 30}},
	}
	views := []struct {
		dtype DType
		f     func(*Tensor) error
	}{
		{Int32, func(c *Tensor) error { _, err := c.Int32s(); return err }},
		{Int64, func(c *Tensor) error { _, err := c.Int64s(); return err }},
		{Float32, func(c *Tensor) error { _, err := c.Float32s(); return err }},
		{BFloat16, func(c *Tensor) error { _, err := c.Uint16s(); return err }},
		{Float8E5M2, func(c *Tensor) error { _, err := c.Codes(); return err }},
	}
	for i, c := range cases {
		for _, v := range views {
			c2 := c
			c2.DType = v.dtype
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("case %d (%v): panic %v", i, v.dtype, r)
					}
				}()
				wantErr(t, v.f(&c2), ErrInvalidArgument)
			}()
		}
	}
}

// A Tensor the library handed out (a pool's KV storage, a plan array)
// describes memory its owner frees on Close: its host views after that
// Close are ErrClosed, never a slice over freed memory (Float32s of a
// closed pool's storage used to be a view of unmapped pages, a fatal
// SIGSEGV on the first read; Int64s of a closed batch's plan array copied
// freed heap memory).
func TestTensorHostViewsAfterTheirOwnerClosedAreErrClosed(t *testing.T) {
	p, err := NewPool(&PoolOptions{BlockSize: 16, NumBlocks: 2048, NumLayers: 1, NumKVHeads: 8,
		HeadDim: 128, DType: Float32, NumThreads: 1})
	ok(t, err)
	kt, err := p.KVTensor(0, Key)
	ok(t, err)
	if f, err := kt.Float32s(); err != nil || len(f) == 0 {
		t.Fatalf("Float32s of a live pool's storage: %d elements, %v", len(f), err)
	}
	copied := kt // a copy of the descriptor names the same owner
	ok(t, p.Close())
	for name, view := range map[string]func() error{
		"Float32s":      func() error { _, err := kt.Float32s(); return err },
		"copy.Float32s": func() error { _, err := copied.Float32s(); return err },
	} {
		if err := view(); !errors.Is(err, ErrClosed) || !errors.Is(err, ErrInvalidState) {
			t.Fatalf("%s after Pool.Close: %v, want ErrClosed", name, err)
		}
	}

	m := managerPool(t, 64)
	s, err := m.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append([]int32{1, 2, 3, 4, 5, 6, 7, 8, 9}))
	b, err := m.Prepare([]Seq{s}, []int{9})
	ok(t, err)
	slots, err := b.PlanTensor(PlanSlotMapping)
	ok(t, err)
	indptr, err := b.PlanTensor(PlanQueryIndptr)
	ok(t, err)
	pos, err := b.TokenPositionsTensor()
	ok(t, err)
	if _, err := slots.Int64s(); err != nil {
		t.Fatalf("Int64s of a live plan array: %v", err)
	}
	ok(t, b.Close())
	for name, view := range map[string]func() error{
		"slot mapping Int64s":    func() error { _, err := slots.Int64s(); return err },
		"query indptr Int32s":    func() error { _, err := indptr.Int32s(); return err },
		"token positions Int64s": func() error { _, err := pos.Int64s(); return err },
	} {
		if err := view(); !errors.Is(err, ErrClosed) {
			t.Fatalf("%s after Batch.Close: %v, want ErrClosed", name, err)
		}
	}
}

// A Tensor the library handed out and passed to a kernel call after its
// owner closed is refused, never read: a reshaped view of a closed pool's
// KV storage given to another pool's CacheWriteTensor made the library
// read unmapped memory, a fatal SIGSEGV. While such a call runs it holds
// the owner, so Close waits for it. Plan arrays (read-only i32/i64) are no
// kernel operand.
func TestKernelCallsRefuseTensorsOfClosedOwners(t *testing.T) {
	o := PoolOptions{BlockSize: 16, NumBlocks: 2048, NumLayers: 1, NumKVHeads: 8, HeadDim: 128,
		DType: Float32, NumThreads: 1}
	a, err := NewPool(&o)
	ok(t, err)
	kt, err := a.KVTensor(0, Key)
	ok(t, err)
	k := kt // the first slots of the storage as one token's [1, 8, 128]
	k.Shape, k.Strides = []int64{1, 8, 128}, nil

	b := newPool(t, o)
	s := seqOf(t, b, make([]int32, 16))
	ok(t, s.Append([]int32{1}))
	bt, err := b.Prepare([]Seq{s}, []int{1})
	ok(t, err)
	defer bt.Close()
	ok(t, bt.CacheWriteTensor(0, &k, &k, nil))

	slots, err := bt.PlanTensor(PlanSlotMapping)
	ok(t, err)
	wantErr(t, bt.CacheWriteTensor(0, &slots, &k, nil), ErrInvalidArgument)
	wantErr(t, bt.AttentionTensor(0, &k, &slots, nil, nil, nil), ErrInvalidArgument)

	ok(t, a.Close())
	if err := bt.CacheWriteTensor(0, &k, &k, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("CacheWriteTensor with a closed pool's storage: %v, want ErrClosed", err)
	}
	if err := bt.AttentionTensor(0, &k, &k, nil, nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("AttentionTensor with a closed pool's storage: %v, want ErrClosed", err)
	}
	ok(t, b.Validate())
}

// The host kernel calls on a plan of a pool without KV storage (NumLayers 0,
// or a multi-group pool) failed with ErrInvalidArgument "the pool stores
// bf16; pass []uint16" (the dtype check saw the manager pool's default
// dtype first), where the library and the Tensor forms answer
// ErrInvalidState "the pool has no KV storage".
func TestHostKernelCallsOnAPoolWithoutStorageAreInvalidState(t *testing.T) {
	manager := managerPool(t, 16)
	group, err := NewGroupPool(&PoolOptions{BlockSize: 4, NumBlocks: 16},
		[]GroupSpec{{Kind: GroupFull, NumKVHeads: 1, HeadDim: 8}})
	ok(t, err)
	defer group.Close()
	f := make([]float32, 3*8)
	u := make([]uint16, 3*8)
	for name, p := range map[string]*Pool{"manager": manager, "group": group} {
		s, err := p.CreateSeq(nil)
		ok(t, err)
		ok(t, s.Append([]int32{1, 2, 3}))
		b, err := p.Prepare([]Seq{s}, []int{3})
		ok(t, err)
		for call, err := range map[string]error{
			"CacheWrite":    b.CacheWrite(0, f, f),
			"CacheWrite16":  b.CacheWrite16(0, u, u),
			"Attention":     b.Attention(0, f, f, nil, nil),
			"Attention16":   b.Attention16(0, u, u, nil, nil),
			"MLACacheWrite": b.MLACacheWrite(0, f, f),
			"MLAAttention":  b.MLAAttention(0, f, f, f, nil, 1),
		} {
			e := wantErr(t, err, ErrInvalidState)
			if !strings.Contains(e.Msg, "no KV storage") {
				t.Errorf("%s pool: %s: %v, want the pool's missing storage named", name, call, err)
			}
		}
		ok(t, b.Close())
		// Closed, the same calls are ErrClosed.
		if err := b.CacheWrite(0, f, f); !errors.Is(err, ErrClosed) {
			t.Errorf("%s pool: CacheWrite of a closed batch: %v, want ErrClosed", name, err)
		}
		ok(t, s.Free())
		ok(t, p.Validate())
	}
}

// A Tensor the library handed out has exported fields: changed to describe
// more than the library did (a larger shape, a byte offset past the
// storage, wider strides), its host views were slices past the pool's
// storage or the plan's array (Float32s of a KV tensor reshaped to 2^30
// elements faulted on the first read past the arena: fatal SIGSEGV), and
// as a kernel operand the library read or wrote those bytes. Such views
// and calls are argument errors; a view within the original bytes (a few
// slots of the storage, as TestKernelCallsRefuseTensorsOfClosedOwners
// uses) still works.
func TestHandedOutTensorsChangedToReachPastTheirMemoryAreRefused(t *testing.T) {
	p := storagePool(t, 1)
	kt, err := p.KVTensor(0, Key)
	ok(t, err)
	total := kt.NumElements() // [12, 2, 8, 64] f32

	grown := kt
	grown.Shape, grown.Strides = []int64{1 << 30}, nil
	past := kt
	past.Shape, past.Strides, past.ByteOffset = []int64{4}, nil, uint64(total)*4-8
	strided := kt
	strided.Shape, strided.Strides = []int64{2, 64}, []int64{total, 1}
	for name, c := range map[string]Tensor{"grown": grown, "past": past, "strided": strided} {
		c := c
		if f, err := c.Float32s(); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%s: Float32s gave %d elements, %v; want ErrInvalidArgument", name, len(f), err)
		}
	}
	// Within the storage: the last token's slots of the last block.
	last := kt
	last.Shape, last.Strides, last.ByteOffset = []int64{64}, nil, uint64(total-64)*4
	f, err := last.Float32s()
	ok(t, err)
	if len(f) != 64 {
		t.Fatalf("Float32s of the last 64 elements: %d", len(f))
	}

	// As a kernel operand of another pool's step.
	q := newPool(t, p.Options())
	s := seqOf(t, q, make([]int32, 8))
	ok(t, s.Append([]int32{1}))
	b, err := q.Prepare([]Seq{s}, []int{1})
	ok(t, err)
	defer b.Close()
	k := kt
	k.Shape, k.Strides, k.ByteOffset = []int64{1, 2, 64}, nil, uint64(total)*4
	wantErr(t, b.CacheWriteTensor(0, &k, &k, nil), ErrInvalidArgument)
	k.ByteOffset = uint64(total-128) * 4
	ok(t, b.CacheWriteTensor(0, &k, &k, nil))

	// A plan array's copy.
	m := managerPool(t, 64)
	ms, err := m.CreateSeq(nil)
	ok(t, err)
	ok(t, ms.Append([]int32{1, 2, 3}))
	mb, err := m.Prepare([]Seq{ms}, []int{3})
	ok(t, err)
	defer mb.Close()
	slots, err := mb.PlanTensor(PlanSlotMapping)
	ok(t, err)
	slots.Shape = []int64{1 << 28}
	if got, err := slots.Int64s(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Int64s of a grown plan array: %d elements, %v", len(got), err)
	}
	ok(t, p.Validate())
	ok(t, q.Validate())
}
