package pagedkv

import (
	"errors"
	"math/rand"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// pinState reads a pool handle's scoped-view count and whether a Close
// left the C pool to the last view (tests only).
func pinState(p *Pool) (views int, pending bool) {
	p.h.vmu.Lock()
	defer p.h.vmu.Unlock()
	return p.h.views, p.h.pending != nil
}

// The copying accessors and the scoped view read and write the pool's C
// storage: what one path writes, the others (and the library: a cache
// write, a swap-out) see, at the element offsets of the dense layout.
func TestCopyingAndScopedHostViewsMatchTheStorage(t *testing.T) {
	p := storagePool(t, 2) // f32, 12 blocks, 2 heads, block size 8, dim 64
	const heads, bs, dim, blocks = 2, 8, 64, 12
	const blockElems = heads * bs * dim
	const n = blocks * blockElems
	kt, err := p.KVTensor(1, Value)
	ok(t, err)
	r := rand.New(rand.NewSource(41))

	// WriteFloat32s -> ReadFloat32s, WithFloat32s, the deprecated view.
	src := make([]float32, 3*blockElems+5)
	for i := range src {
		src[i] = r.Float32() - 0.5
	}
	const off = 2*blockElems + 7
	if m, err := kt.WriteFloat32s(off, src); err != nil || m != len(src) {
		t.Fatalf("WriteFloat32s: %d, %v", m, err)
	}
	got := make([]float32, len(src))
	if m, err := kt.ReadFloat32s(got, off); err != nil || m != len(src) {
		t.Fatalf("ReadFloat32s: %d, %v", m, err)
	}
	for i := range src {
		if got[i] != src[i] {
			t.Fatalf("ReadFloat32s[%d] = %v, wrote %v", i, got[i], src[i])
		}
	}
	calls := 0
	ok(t, kt.WithFloat32s(func(s []float32) error {
		calls++
		if len(s) != n {
			t.Fatalf("WithFloat32s lent %d elements, want %d", len(s), n)
		}
		for i := range src {
			if s[off+i] != src[i] {
				t.Fatalf("WithFloat32s[%d] = %v, wrote %v", off+i, s[off+i], src[i])
			}
		}
		s[0], s[n-1] = 1.5, -2.5 // writes through the slice reach the storage
		return nil
	}))
	if calls != 1 {
		t.Fatalf("callback called %d times", calls)
	}
	view, err := kt.Float32s() // deprecated, unchanged; the pool is open
	ok(t, err)
	if len(view) != n || view[0] != 1.5 || view[n-1] != -2.5 || view[off] != src[0] {
		t.Fatalf("Float32s: %d elements, %v %v %v", len(view), view[0], view[n-1], view[off])
	}
	uview, err := kt.UnsafeFloat32s()
	ok(t, err)
	if len(uview) != n || &uview[0] != &view[0] {
		t.Fatal("UnsafeFloat32s is not the same view as Float32s")
	}
	// The callback's error is returned as is.
	sentinel := errors.New("from the callback")
	if err := kt.WithFloat32s(func([]float32) error { return sentinel }); err != sentinel {
		t.Fatalf("WithFloat32s returned %v, want the callback's error", err)
	}

	// The library reads what WriteFloat32s wrote: a swap-out of block 4.
	blk := make([]float32, blockElems)
	for i := range blk {
		blk[i] = float32(i) - 100
	}
	_, err = kt.WriteFloat32s(4*blockElems, blk)
	ok(t, err)
	per, err := p.BytesPerBlock()
	ok(t, err)
	buf := make([]byte, per)
	ok(t, p.SwapBlocks([]int32{4}, buf, SwapOut))
	f := unsafe.Slice((*float32)(unsafe.Pointer(&buf[0])), len(buf)/4)
	// Layout: [block][layer][K,V][heads][block_size][dim]: layer 1, V.
	sw := f[(1*2+1)*blockElems : (1*2+2)*blockElems]
	for i := range blk {
		if sw[i] != blk[i] {
			t.Fatalf("swap-out[%d] = %v, WriteFloat32s wrote %v", i, sw[i], blk[i])
		}
	}

	// ReadFloat32s and WithFloat32s read what the library wrote: a cache
	// write of 11 tokens, at [block, head, slot, dim].
	s, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append(randTokens(r, 11)))
	batch, err := p.Prepare([]Seq{s}, []int{11})
	ok(t, err)
	defer batch.Close()
	sm, err := batch.SlotMapping()
	ok(t, err)
	kv := make([]float32, 11*heads*dim)
	for i := range kv {
		kv[i] = r.Float32() - 0.5
	}
	ok(t, batch.CacheWrite(1, kv, kv))
	row := make([]float32, dim)
	for tok := 0; tok < 11; tok++ {
		b, slot := int(sm[tok])/bs, int(sm[tok])%bs
		for h := 0; h < heads; h++ {
			at := ((b*heads+h)*bs + slot) * dim
			if m, err := kt.ReadFloat32s(row, at); err != nil || m != dim {
				t.Fatalf("ReadFloat32s at %d: %d, %v", at, m, err)
			}
			for d := range row {
				if row[d] != kv[(tok*heads+h)*dim+d] {
					t.Fatalf("token %d head %d dim %d: read %v, cache write wrote %v", tok, h, d,
						row[d], kv[(tok*heads+h)*dim+d])
				}
			}
		}
	}
	ok(t, batch.Commit())
	ok(t, p.Validate())
}

// Offsets and lengths: a read copies what there is from offset on, a write
// all of src or (ErrInvalidArgument) nothing; wrong dtypes, nil tensors and
// nil callbacks are argument errors, never a panic.
func TestHostViewBounds(t *testing.T) {
	p := storagePool(t, 1)
	kt, err := p.KVTensor(0, Key)
	ok(t, err)
	n := int(kt.NumElements())
	tail := []float32{1, 2, 3, 4}
	_, err = kt.WriteFloat32s(n-4, tail)
	ok(t, err)

	dst := make([]float32, 10)
	if m, err := kt.ReadFloat32s(dst, n-4); err != nil || m != 4 || dst[0] != 1 || dst[3] != 4 {
		t.Fatalf("ReadFloat32s of the last 4 elements into 10: %d, %v, %v", m, dst[:4], err)
	}
	if m, err := kt.ReadFloat32s(dst, n); err != nil || m != 0 {
		t.Fatalf("ReadFloat32s at the end: %d, %v", m, err)
	}
	if m, err := kt.ReadFloat32s(nil, 0); err != nil || m != 0 {
		t.Fatalf("ReadFloat32s into nil: %d, %v", m, err)
	}
	for _, o := range []int{-1, n + 1, -1 << 62, 1 << 62} {
		_, err := kt.ReadFloat32s(dst, o)
		wantErr(t, err, ErrInvalidArgument)
	}
	for _, c := range []struct{ off, len int }{{n - 3, 4}, {n, 1}, {-1, 1}, {n + 1, 0}, {1 << 62, 1}} {
		src := make([]float32, c.len)
		for i := range src {
			src[i] = 99
		}
		m, err := kt.WriteFloat32s(c.off, src)
		wantErr(t, err, ErrInvalidArgument)
		if m != 0 {
			t.Fatalf("a refused write reports %d elements", m)
		}
	}
	if m, err := kt.WriteFloat32s(n, nil); err != nil || m != 0 {
		t.Fatalf("an empty write at the end: %d, %v", m, err)
	}
	got := make([]float32, 4)
	_, err = kt.ReadFloat32s(got, n-4)
	ok(t, err)
	for i := range got {
		if got[i] != tail[i] {
			t.Fatalf("a refused write changed the storage: %v", got)
		}
	}

	// Wrong element types, nil tensors, nil callbacks.
	_, err = kt.ReadUint16s(make([]uint16, 4), 0)
	wantErr(t, err, ErrInvalidArgument)
	_, err = kt.WriteCodes(0, []uint8{1})
	wantErr(t, err, ErrInvalidArgument)
	wantErr(t, kt.WithUint16s(func([]uint16) error { t.Fatal("called"); return nil }), ErrInvalidArgument)
	wantErr(t, kt.WithFloat32s(nil), ErrInvalidArgument)
	var nilT *Tensor
	_, err = nilT.ReadFloat32s(dst, 0)
	wantErr(t, err, ErrInvalidArgument)
	_, err = nilT.WriteUint16s(0, nil)
	wantErr(t, err, ErrInvalidArgument)
	wantErr(t, nilT.WithCodes(func([]uint8) error { return nil }), ErrInvalidArgument)
	_, err = nilT.UnsafeFloat32s()
	wantErr(t, err, ErrInvalidArgument)

	// A descriptor changed to reach past the storage is refused, as for
	// the other views.
	big := kt
	big.Shape, big.Strides = []int64{int64(n) + 1}, nil
	_, err = big.ReadFloat32s(dst, 0)
	wantErr(t, err, ErrInvalidArgument)
	wantErr(t, big.WithFloat32s(func([]float32) error { return nil }), ErrInvalidArgument)
	// A reshaped view of part of it works, at its own offsets.
	part := kt
	part.Shape, part.Strides, part.ByteOffset = []int64{4}, nil, uint64(n-4)*4
	if m, err := part.ReadFloat32s(dst, 0); err != nil || m != 4 || dst[0] != 1 {
		t.Fatalf("a view of the last 4 elements: %d, %v, %v", m, dst[:4], err)
	}

	// A step plan's array is read-only: no write or scoped view through a
	// descriptor retyped to f32 (it may still be read, as Float32s could).
	s, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append([]int32{1, 2, 3}))
	batch, err := p.Prepare([]Seq{s}, []int{3})
	ok(t, err)
	defer batch.Close()
	plan, err := batch.PlanTensor(PlanQueryIndptr)
	ok(t, err)
	plan.DType = Float32 // i32 -> f32: same size
	_, err = plan.WriteFloat32s(0, []float32{1})
	wantErr(t, err, ErrInvalidArgument)
	wantErr(t, plan.WithFloat32s(func([]float32) error { t.Fatal("called"); return nil }), ErrInvalidArgument)
	if _, err := plan.ReadFloat32s(dst, 0); err != nil {
		t.Fatalf("reading a plan array: %v", err)
	}
}

// The 16-bit and FP8 forms on bf16, f16 and FP8 pools.
func TestUint16AndCodeHostViews(t *testing.T) {
	for _, dt := range []DType{BFloat16, Float16, Float8E4M3} {
		p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 6, NumLayers: 1, NumKVHeads: 1,
			HeadDim: 16, DType: dt, NumThreads: 1})
		kt, err := p.KVTensor(0, Key)
		ok(t, err)
		n := int(kt.NumElements())
		if isFP8(dt) {
			src := []uint8{0x38, 0x40, 0x7f, 0x80, 0x01}
			_, err := kt.WriteCodes(n-5, src)
			ok(t, err)
			got := make([]uint8, 5)
			if m, err := kt.ReadCodes(got, n-5); err != nil || m != 5 {
				t.Fatalf("%v ReadCodes: %d, %v", dt, m, err)
			}
			codes, err := kt.Codes()
			ok(t, err)
			ok(t, kt.WithCodes(func(s []uint8) error {
				for i := range src {
					if got[i] != src[i] || s[n-5+i] != src[i] || codes[n-5+i] != src[i] {
						t.Fatalf("%v code %d: read %#x, scoped %#x, Codes %#x, wrote %#x", dt, i,
							got[i], s[n-5+i], codes[n-5+i], src[i])
					}
				}
				return nil
			}))
			_, err = kt.ReadFloat32s(make([]float32, 1), 0)
			wantErr(t, err, ErrInvalidArgument)
			continue
		}
		src := []uint16{ToBF16([]float32{1.5})[0], ToF16([]float32{-2})[0], 0x7c00, 0xffff}
		_, err = kt.WriteUint16s(3, src)
		ok(t, err)
		got := make([]uint16, 4)
		if m, err := kt.ReadUint16s(got, 3); err != nil || m != 4 {
			t.Fatalf("%v ReadUint16s: %d, %v", dt, m, err)
		}
		u, err := kt.Uint16s()
		ok(t, err)
		ok(t, kt.WithUint16s(func(s []uint16) error {
			if len(s) != n {
				t.Fatalf("%v WithUint16s lent %d elements, want %d", dt, len(s), n)
			}
			for i := range src {
				if got[i] != src[i] || s[3+i] != src[i] || u[3+i] != src[i] {
					t.Fatalf("%v element %d: read %#x, scoped %#x, Uint16s %#x, wrote %#x", dt, i,
						got[i], s[3+i], u[3+i], src[i])
				}
			}
			return nil
		}))
		_, err = kt.WriteUint16s(n-3, src)
		wantErr(t, err, ErrInvalidArgument)
		wantErr(t, kt.WithCodes(func([]uint8) error { return nil }), ErrInvalidArgument)
	}
}

// The reported crash (a 1024-block f32 pool's K view used after Close)
// through the safe forms: ErrClosed, the callback never called, nothing
// read or written. The deprecated Float32s is ErrClosed after Close too;
// a slice it returned before Close is not touched here.
func TestHostViewsOfAClosedPoolAreErrClosed(t *testing.T) {
	for _, dt := range []DType{Float32, BFloat16, Float8E5M2} {
		p, err := NewPool(&PoolOptions{BlockSize: 16, NumBlocks: 1024, NumLayers: 1, NumKVHeads: 8,
			HeadDim: 128, DType: dt, NumThreads: 1})
		ok(t, err)
		kt, err := p.KVTensor(0, Key)
		ok(t, err)
		copied := kt
		ok(t, p.Close())
		never := func() { t.Fatalf("%v: a callback was called after Close", dt) }
		for _, tt := range []*Tensor{&kt, &copied} {
			var errs []error
			switch dt {
			case Float32:
				_, e1 := tt.ReadFloat32s(make([]float32, 8), 0)
				_, e2 := tt.WriteFloat32s(0, []float32{1, 2, 3})
				e3 := tt.WithFloat32s(func([]float32) error { never(); return nil })
				_, e4 := tt.UnsafeFloat32s()
				_, e5 := tt.Float32s()
				errs = []error{e1, e2, e3, e4, e5}
			case BFloat16:
				_, e1 := tt.ReadUint16s(make([]uint16, 8), 0)
				_, e2 := tt.WriteUint16s(0, []uint16{1, 2, 3})
				e3 := tt.WithUint16s(func([]uint16) error { never(); return nil })
				_, e4 := tt.UnsafeUint16s()
				_, e5 := tt.Uint16s()
				errs = []error{e1, e2, e3, e4, e5}
			default:
				_, e1 := tt.ReadCodes(make([]uint8, 8), 0)
				_, e2 := tt.WriteCodes(0, []uint8{1, 2, 3})
				e3 := tt.WithCodes(func([]uint8) error { never(); return nil })
				_, e4 := tt.UnsafeCodes()
				_, e5 := tt.Codes()
				errs = []error{e1, e2, e3, e4, e5}
			}
			for i, err := range errs {
				if !errors.Is(err, ErrClosed) || !errors.Is(err, ErrInvalidState) {
					t.Fatalf("%v form %d after Close: %v, want ErrClosed", dt, i, err)
				}
			}
		}
	}
}

// The finalizer half of the report: a Tensor keeps its pool reachable, so
// with only the Tensor left the pool is not finalized, and the safe forms
// keep working on live storage.
func TestHostViewsKeepTheirPoolFromTheFinalizer(t *testing.T) {
	p, err := NewPool(&PoolOptions{BlockSize: 16, NumBlocks: 1024, NumLayers: 1, NumKVHeads: 8,
		HeadDim: 128, DType: Float32, NumThreads: 1})
	ok(t, err)
	kt, err := p.KVTensor(0, Key)
	ok(t, err)
	p = nil // only the Tensor refers to the pool now
	for i := 0; i < 5; i++ {
		runtime.GC()
		time.Sleep(time.Millisecond) // finalizers run on their own goroutine
	}
	_, err = kt.WriteFloat32s(0, []float32{3, 4})
	ok(t, err)
	ok(t, kt.WithFloat32s(func(s []float32) error {
		if s[0] != 3 || s[1] != 4 {
			t.Fatalf("scoped view reads %v %v", s[0], s[1])
		}
		return nil
	}))
	ok(t, kt.owner.(*Pool).Close())
}

// Close while a scoped view's callback runs: Close returns at once, the
// pool's calls (and new views) are ErrClosed from then on, the storage
// stays allocated for the callback, and the callback's return destroys the
// pool. Run under -race (CTest's go_test_race).
func TestCloseDuringAScopedView(t *testing.T) {
	p, err := NewPool(&PoolOptions{BlockSize: 16, NumBlocks: 1024, NumLayers: 1, NumKVHeads: 8,
		HeadDim: 128, DType: Float32, NumThreads: 1})
	ok(t, err)
	defer p.Close()
	kt, err := p.KVTensor(0, Key)
	ok(t, err)
	// proceed says whether the storage was kept: a regression fails the
	// test instead of faulting on freed memory.
	entered, proceed, done := make(chan struct{}), make(chan bool, 1), make(chan error, 1)
	go func() {
		done <- kt.WithFloat32s(func(s []float32) error {
			close(entered)
			if !<-proceed {
				return nil
			}
			// The pool is closed now; its storage is not freed.
			for i := range s {
				s[i] = float32(i & 1023)
			}
			var sum float32
			for _, x := range s {
				sum += x
			}
			if _, err := p.Stats(); !errors.Is(err, ErrClosed) {
				return errors.New("a pool call inside the view after Close was not ErrClosed")
			}
			_ = sum
			return nil
		})
	}()
	<-entered
	if views, pending := pinState(p); views != 1 || pending {
		t.Fatalf("inside the view: %d views, pending %v", views, pending)
	}
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("Close blocked on a running scoped view")
	}
	if views, pending := pinState(p); views != 1 || !pending {
		proceed <- false
		t.Fatalf("Close during the view: %d views, pending %v (the storage must be kept)", views, pending)
	}
	if _, err := p.Stats(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Stats after Close: %v", err)
	}
	if _, err := kt.ReadFloat32s(make([]float32, 4), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("ReadFloat32s after Close: %v", err)
	}
	if err := kt.WithFloat32s(func([]float32) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("a new scoped view after Close: %v", err)
	}
	proceed <- true
	ok(t, <-done)
	if views, pending := pinState(p); views != 0 || pending {
		t.Fatalf("after the view: %d views, pending %v (the pool was not destroyed)", views, pending)
	}
}

// A callback may call the pool, nest views and Close the pool itself
// (no deadlock); a panicking callback lets go of its pin.
func TestScopedViewCallbacksCallingThePool(t *testing.T) {
	p, err := NewPool(&PoolOptions{BlockSize: 8, NumBlocks: 12, NumLayers: 1, NumKVHeads: 2,
		HeadDim: 64, DType: Float32, NumThreads: 1})
	ok(t, err)
	defer p.Close()
	kt, err := p.KVTensor(0, Key)
	ok(t, err)
	vt, err := p.KVTensor(0, Value)
	ok(t, err)

	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v", r)
			}
		}()
		_ = kt.WithFloat32s(func([]float32) error { panic("boom") })
	}()
	if views, _ := pinState(p); views != 0 {
		t.Fatalf("a panicking callback left %d views", views)
	}

	ok(t, kt.WithFloat32s(func(k []float32) error {
		if _, err := p.Stats(); err != nil {
			return err
		}
		return vt.WithFloat32s(func(v []float32) error {
			if views, _ := pinState(p); views != 2 {
				t.Errorf("nested views: %d", views)
			}
			copy(v, k[:8])
			if err := p.Close(); err != nil { // returns: no deadlock
				return err
			}
			if _, err := p.Stats(); !errors.Is(err, ErrClosed) {
				t.Errorf("Stats after Close inside the view: %v", err)
			}
			if views, pending := pinState(p); views != 2 || !pending {
				t.Errorf("Close inside the views: %d views, pending %v (the storage must be kept)",
					views, pending)
				return nil
			}
			k[0], v[len(v)-1] = 1, 2 // still allocated
			return nil
		})
	}))
	if views, pending := pinState(p); views != 0 || pending {
		t.Fatalf("after the views: %d views, pending %v", views, pending)
	}
}

// Many goroutines opening scoped views and copying while others Close:
// every view either is ErrClosed or runs on allocated storage, and the pool
// is destroyed exactly once, when the last view ends (-race checks the
// bookkeeping).
func TestScopedViewsRacingClose(t *testing.T) {
	for round := 0; round < 20; round++ {
		p, err := NewPool(&PoolOptions{BlockSize: 8, NumBlocks: 64, NumLayers: 1, NumKVHeads: 2,
			HeadDim: 64, DType: Float32, NumThreads: 1})
		ok(t, err)
		kt, err := p.KVTensor(0, Key)
		ok(t, err)
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := 0; i < 20; i++ {
					err := kt.WithFloat32s(func(s []float32) error {
						for j := range s {
							s[j] = float32(g)
						}
						runtime.Gosched()
						return nil
					})
					if err == nil {
						_, err = kt.WriteFloat32s(i, []float32{1, 2})
					}
					if err == nil {
						_, err = kt.ReadFloat32s(make([]float32, 16), i)
					}
					if err != nil && !errors.Is(err, ErrClosed) {
						errs <- err
						return
					}
				}
			}(g)
		}
		for c := 0; c < 2; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.Gosched()
				p.Close()
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if views, pending := pinState(p); views != 0 || pending || p.h.ptr != nil {
			t.Fatalf("round %d: %d views, pending %v, open %v", round, views, pending, p.h.ptr != nil)
		}
	}
}
