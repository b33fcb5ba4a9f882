package pagedkv

import (
	"errors"
	"math/rand"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Many goroutines drive one pool the way an engine's request handlers
// would: shared system prompt, prefix matching, appends with preemption on
// ErrOutOfBlocks, forks, truncation, frees, stats and tables.
func TestConcurrentGoroutinesOnOnePool(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 96, EnableEvents: true, MaxEvents: 256})
	system := randTokens(rand.New(rand.NewSource(13)), 24)
	const workers, iters = 16, 150
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(100 + w)))
			var mine []Seq
			fail := func(err error) { errc <- err }
			// An engine step over what s has not computed yet (an
			// earlier prefill may have been preempted before its step):
			// those tokens count as computed once it is committed.
			compute := func(s Seq, _ int) error {
				info, err := s.Info()
				if err != nil {
					return err
				}
				q := int(info.NumTokens - info.NumComputedTokens)
				if q < 1 {
					q = 1
				}
				b, err := p.Prepare([]Seq{s}, []int{q})
				if err != nil {
					return err
				}
				if err := b.Commit(); err != nil {
					return err
				}
				return b.Close()
			}
			for i := 0; i < iters; i++ {
				switch op := r.Intn(10); {
				case op < 4 || len(mine) == 0:
					s, err := p.CreateSeq(nil)
					if err != nil {
						fail(err)
						return
					}
					prompt := append(append([]int32(nil), system...), randTokens(r, r.Intn(12))...)
					n, err := s.MatchPrefix(prompt)
					if err != nil {
						fail(err)
						return
					}
					for {
						err = s.Append(prompt[n:])
						if !errors.Is(err, ErrOutOfBlocks) || len(mine) == 0 {
							break
						}
						if err := mine[0].Free(); err != nil { // preempt our oldest
							fail(err)
							return
						}
						mine = mine[1:]
					}
					if errors.Is(err, ErrOutOfBlocks) {
						err = s.Free() // gives back the prefix hits
					} else if err == nil {
						mine = append(mine, s)
						// Some prefills are preempted before their step
						// runs: their new full blocks leave the cache.
						if r.Intn(4) != 0 {
							err = compute(s, len(prompt)-n)
						}
					}
					if err != nil {
						fail(err)
						return
					}
				case op < 6:
					s := mine[r.Intn(len(mine))]
					k := 1 + r.Intn(3)
					err := s.Append(randTokens(r, k))
					if err == nil {
						err = compute(s, k)
					}
					if err != nil && !errors.Is(err, ErrOutOfBlocks) {
						fail(err)
						return
					}
				case op < 7:
					f, err := mine[r.Intn(len(mine))].Fork()
					if err != nil {
						fail(err)
						return
					}
					mine = append(mine, f)
				case op < 8:
					s := mine[r.Intn(len(mine))]
					info, err := s.Info()
					if err == nil && info.NumTokens > 0 {
						err = s.Truncate(r.Intn(int(info.NumTokens)))
					}
					if err != nil {
						fail(err)
						return
					}
				case op < 9:
					k := r.Intn(len(mine))
					if err := mine[k].Free(); err != nil {
						fail(err)
						return
					}
					mine = append(mine[:k], mine[k+1:]...)
				default:
					if _, err := p.Stats(); err != nil {
						fail(err)
						return
					}
					if _, err := mine[0].BlockTable(); err != nil {
						fail(err)
						return
					}
					if _, err := p.DrainEvents(16); err != nil {
						fail(err)
						return
					}
				}
			}
			for _, s := range mine {
				if err := s.Free(); err != nil {
					fail(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	ok(t, p.Validate())
	st := stats(t, p)
	if st.NumSeqs != 0 || st.NumUsedBlocks != 0 || st.NumFreeBlocks != 95 {
		t.Fatalf("stats after every sequence was freed: %+v", st)
	}
}

// Each failed call's message is the one its own call produced, however the
// goroutines migrate between OS threads.
func TestErrorMessagesStayWithTheirCall(t *testing.T) {
	p := managerPool(t, 16)
	s := seqOf(t, p, []int32{1, 2, 3})
	calls := []func() error{
		func() error { _, err := p.Seq(987654321).Info(); return err },
		func() error { return s.Truncate(50) },
		func() error { _, err := NewPool(&PoolOptions{NumBlocks: 1}); return err },
		func() error { _, err := HashPrefix(&HashOptions{Algo: 77}, []int32{1}); return err },
		func() error { _, err := p.Prepare([]Seq{s}, []int{9}); return err },
	}
	want := make([]string, len(calls))
	for i, c := range calls {
		err := c()
		if err == nil {
			t.Fatalf("call %d did not fail", i)
		}
		want[i] = err.Error()
		for j := 0; j < i; j++ {
			if want[j] == want[i] {
				t.Fatalf("calls %d and %d fail alike: %s", i, j, want[i])
			}
		}
	}
	var wg sync.WaitGroup
	bad := make(chan string, 16)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(w)))
			for i := 0; i < 300; i++ {
				k := r.Intn(len(calls))
				if got := calls[k]().Error(); got != want[k] {
					bad <- got + " != " + want[k]
					return
				}
				if i%7 == 0 {
					runtime.Gosched()
				}
			}
		}(w)
	}
	wg.Wait()
	close(bad)
	for b := range bad {
		t.Fatal(b)
	}
}

// Close waits for calls in flight; every call after it fails with
// ErrClosed; nothing crashes.
func TestCloseWhileInUse(t *testing.T) {
	p, err := NewPool(&PoolOptions{BlockSize: 4, NumBlocks: 64})
	ok(t, err)
	var wg sync.WaitGroup
	start := make(chan struct{})
	errc := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; ; i++ {
				s, err := p.CreateSeq(nil)
				if err == nil {
					err = s.Append([]int32{1, 2, 3, 4, 5})
					var b *Batch
					if err == nil {
						b, err = p.Prepare([]Seq{s}, []int{5})
					}
					if err == nil {
						b.Close()
						err = s.Free()
					}
				}
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil && !errors.Is(err, ErrOutOfBlocks) {
					errc <- err
					return
				}
			}
		}()
	}
	close(start)
	runtime.Gosched()
	ok(t, p.Close())
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if _, err := p.Stats(); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
}

// Step plans of different sequences run their kernels concurrently.
func TestConcurrentBatches(t *testing.T) {
	// 4 sequences of 20 tokens take 12 blocks of 8: room for all at once.
	p := newPool(t, PoolOptions{BlockSize: 8, NumBlocks: 16, NumLayers: 2, NumKVHeads: 2,
		HeadDim: 64, DType: Float32, NumThreads: 2})
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(w)))
			s, err := p.CreateSeq(nil)
			if err != nil {
				errc <- err
				return
			}
			defer s.Free()
			for i := 0; i < 10 && err == nil; i++ {
				if err = s.Append(randTokens(r, 2)); err != nil {
					break
				}
				var b *Batch
				if b, err = p.Prepare([]Seq{s}, []int{2}); err != nil {
					break
				}
				kv := make([]float32, 2*2*64)
				q := make([]float32, 2*4*64)
				out := make([]float32, len(q))
				for j := range kv {
					kv[j] = r.Float32()
				}
				for j := range q {
					q[j] = r.Float32()
				}
				// Both layers written: the step commits, so the next
				// step's context is written.
				if err = b.CacheWrite(0, kv, kv); err == nil {
					err = b.CacheWrite(1, kv, kv)
				}
				if err == nil {
					err = b.Attention(1, q, out, nil, nil)
				}
				for _, x := range out {
					if x != x || x < 0 || x > 1 { // a mean of values in [0, 1)
						err = errors.New("attention output out of range")
					}
				}
				b.Close()
			}
			if err != nil {
				errc <- err
			}
		}(w)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	ok(t, p.Validate())
}

// Forgotten pools and batches are released by their finalizers.
func TestFinalizersRelease(t *testing.T) {
	for i := 0; i < 20; i++ {
		p, err := NewPool(&PoolOptions{BlockSize: 8, NumBlocks: 64, NumLayers: 2, NumKVHeads: 2,
			HeadDim: 64, DType: Float32, NumThreads: 1})
		ok(t, err)
		s := seqOf(t, p, []int32{1, 2, 3})
		_, err = p.Prepare([]Seq{s}, []int{3})
		ok(t, err)
		runtime.GC()
	}
	runtime.GC()
	runtime.GC()
}

// Kernel calls given views of two pools in opposite orders (A's storage as
// k and B's as v on one batch, B's then A's on another) while both pools
// close: each call held the first pool it was given and waited for the
// second, whose waiting Close blocked new readers, so the two calls and the
// two Closes waited on each other for ever. The hook stops both calls after
// the first pool each takes until both Closes wait.
func TestKernelCallsGivenEachOthersPoolsDoNotDeadlockWithClose(t *testing.T) {
	mk := func() (*Pool, *Batch, Tensor) {
		p, err := NewPool(&PoolOptions{BlockSize: 8, NumBlocks: 12, NumLayers: 1, NumKVHeads: 2,
			HeadDim: 64, DType: Float32, NumThreads: 1})
		ok(t, err)
		s, err := p.CreateSeq(nil)
		ok(t, err)
		ok(t, s.Append([]int32{1, 2}))
		b, err := p.Prepare([]Seq{s}, []int{2})
		ok(t, err)
		kt, err := p.KVTensor(0, Key)
		ok(t, err)
		kt.Shape, kt.Strides = []int64{2, 2, 64}, nil // the first two slots, as the step's k and v
		return p, b, kt
	}
	pa, ba, ta := mk()
	pb, bb, tb := mk()

	var hooked int32
	arrived, resume := make(chan struct{}, 2), make(chan struct{})
	holdOperandHook = func() {
		if atomic.AddInt32(&hooked, 1) <= 2 {
			arrived <- struct{}{}
			<-resume
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Add(2)
	go func() { defer wg.Done(); errs[0] = ba.CacheWriteTensor(0, &ta, &tb, nil) }()
	go func() { defer wg.Done(); errs[1] = bb.CacheWriteTensor(0, &tb, &ta, nil) }()
	<-arrived
	<-arrived // each call holds one pool
	wg.Add(2)
	go func() { defer wg.Done(); pa.Close() }()
	go func() { defer wg.Done(); pb.Close() }()
	time.Sleep(100 * time.Millisecond) // both Closes wait
	close(resume)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		// (Nothing closes the batches: the stuck calls hold them.)
		t.Fatal("the two kernel calls and the two Closes still wait after 10 s")
	}
	holdOperandHook = nil
	ok(t, ba.Close())
	ok(t, bb.Close())
	for i, err := range errs {
		if err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("call %d: %v, want success or ErrClosed", i, err)
		}
	}
}

// Two views of one pool taken through copies of its Pool value (which
// share one handle) are one pool to a kernel call: it read-locked the
// handle once per copy, and a Close waiting between the two read locks
// blocked the second, so the call and the Close waited on each other.
func TestKernelOperandsFromCopiesOfAPoolDoNotDeadlockWithClose(t *testing.T) {
	p, err := NewPool(&PoolOptions{BlockSize: 8, NumBlocks: 12, NumLayers: 2, NumKVHeads: 2,
		HeadDim: 64, DType: Float32, NumThreads: 1})
	ok(t, err)
	s, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append([]int32{1, 2}))
	b, err := p.Prepare([]Seq{s}, []int{2})
	ok(t, err)
	cp := *p
	k, err := p.KVTensor(0, Key)
	ok(t, err)
	v, err := cp.KVTensor(0, Value)
	ok(t, err)
	k.Shape, k.Strides = []int64{2, 2, 64}, nil
	v.Shape, v.Strides = []int64{2, 2, 64}, nil

	var hooked int32
	arrived, resume := make(chan struct{}, 2), make(chan struct{})
	holdOperandHook = func() {
		if atomic.AddInt32(&hooked, 1) == 1 {
			arrived <- struct{}{}
			<-resume
		}
	}
	defer func() { holdOperandHook = nil }()
	var wg sync.WaitGroup
	var callErr error
	wg.Add(2)
	go func() { defer wg.Done(); callErr = b.CacheWriteTensor(1, &k, &v, nil) }() // layer 0's slots as layer 1's k, v
	<-arrived
	go func() { defer wg.Done(); p.Close() }()
	time.Sleep(100 * time.Millisecond) // Close waits
	close(resume)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("the kernel call and Close still wait after 10 s")
	}
	if callErr != nil && !errors.Is(callErr, ErrClosed) {
		t.Fatalf("CacheWriteTensor: %v", callErr)
	}
	ok(t, b.Close())
}
