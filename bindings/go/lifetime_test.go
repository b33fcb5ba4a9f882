package pagedkv

import (
	"errors"
	"math"
	"math/rand"
	"runtime"
	"strings"
	"testing"
	"time"
)

// storageStep returns a pool holding one sequence of n tokens with random
// K/V written, a decode plan over it and the values written. The pool is
// not closed by the test framework: callers close it, or drop it.
func storageStep(t *testing.T, r *rand.Rand, n int) (*Pool, *Batch, []float32) {
	t.Helper()
	p, err := NewPool(&PoolOptions{BlockSize: 16, NumBlocks: uint64(n/16 + 2), NumLayers: 1,
		NumKVHeads: 1, HeadDim: 64, DType: Float32, NumThreads: 2})
	ok(t, err)
	s, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append(randTokens(r, n)))
	k, v := make([]float32, n*64), make([]float32, n*64)
	for i := range k {
		k[i], v[i] = r.Float32()*2-1, r.Float32()*2-1
	}
	all, err := p.Prepare([]Seq{s}, []int{n})
	ok(t, err)
	ok(t, all.CacheWrite(0, k, v))
	ok(t, all.Close())
	b, err := p.Prepare([]Seq{s}, []int{1})
	ok(t, err)
	return p, b, v
}

// convex fails unless out is a convex combination of the value rows, as an
// attention output over intact storage is.
func convex(out, v []float32) bool {
	for d := range out {
		lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
		for t := d; t < len(v); t += len(out) {
			if v[t] < lo {
				lo = v[t]
			}
			if v[t] > hi {
				hi = v[t]
			}
		}
		if !(out[d] >= lo-1e-4 && out[d] <= hi+1e-4) {
			return false
		}
	}
	return true
}

// Issue 14: Pool.Close while another goroutine runs Batch.Attention. The
// library keeps the storage until the running call returns; later calls
// fail with ErrInvalidState.
func TestPoolCloseDuringAttention(t *testing.T) {
	r := rand.New(rand.NewSource(31))
	for round := 0; round < 6; round++ {
		p, b, v := storageStep(t, r, 16384)
		q := make([]float32, 64)
		for i := range q {
			q[i] = r.Float32()*2 - 1
		}
		started := make(chan struct{})
		errc := make(chan error, 1)
		go func() {
			out := make([]float32, 64)
			for n := 0; ; n++ {
				if err := b.Attention(0, q, out, nil, nil); err != nil {
					errc <- err
					return
				}
				if !convex(out, v) {
					errc <- nil
					return
				}
				if n == 0 {
					close(started)
				}
			}
		}()
		<-started
		time.Sleep(time.Duration(r.Intn(2000)) * time.Microsecond)
		ok(t, p.Close())
		err := <-errc
		if err == nil {
			t.Fatal("attention returned garbage while the pool was closed")
		}
		wantErr(t, err, ErrInvalidState)
		wantErr(t, b.Attention(0, q, make([]float32, 64), nil, nil), ErrInvalidState)
		info, err := b.Info()
		ok(t, err)
		if info.NumTokens != 1 {
			t.Fatalf("info %+v", info)
		}
		ok(t, b.Close())
	}
}

// Issue 14: a *Pool nobody references any more while a goroutine still uses
// its batch. The batch holds the pool, so its finalizer does not run under
// the batch: every call succeeds.
func TestBatchKeepsItsPoolAlive(t *testing.T) {
	r := rand.New(rand.NewSource(32))
	b, v := func() (*Batch, []float32) {
		_, b, v := storageStep(t, r, 2048)
		return b, v // the *Pool is unreachable from here on, except through b
	}()
	q := make([]float32, 64)
	for i := range q {
		q[i] = r.Float32()*2 - 1
	}
	done := make(chan error)
	go func() {
		out := make([]float32, 64)
		for i := 0; i < 200; i++ {
			if err := b.Attention(0, q, out, nil, nil); err != nil {
				done <- err
				return
			}
			if !convex(out, v) {
				t.Error("attention output out of range")
			}
		}
		done <- nil
	}()
	for running := true; running; {
		runtime.GC() // runs any finalizer that became due
		select {
		case err := <-done:
			ok(t, err)
			running = false
		case <-time.After(time.Millisecond):
		}
	}
	ok(t, b.Close())
	runtime.GC() // now the pool may go (its finalizer closes it)
}

// Issue 14: sequence ids name their pool; another pool's id is ErrNotFound
// there and changes nothing.
func TestAnotherPoolsIDIsNotFound(t *testing.T) {
	a, b := managerPool(t, 16), managerPool(t, 16)
	sa, err := a.CreateSeq(nil)
	ok(t, err)
	sb, err := b.CreateSeq(nil)
	ok(t, err)
	if sa.ID() == sb.ID() {
		t.Fatalf("two pools handed out the same id %v", sa.ID())
	}
	ok(t, sb.Append([]int32{1, 2, 3}))
	foreign := b.Seq(sa.ID())
	wantErr(t, foreign.Free(), ErrNotFound)
	wantErr(t, foreign.Append([]int32{1}), ErrNotFound)
	_, err = foreign.Info()
	wantErr(t, err, ErrNotFound)
	info, err := sb.Info()
	ok(t, err)
	if info.NumTokens != 3 {
		t.Fatalf("b's sequence changed: %+v", info)
	}
	ok(t, sa.Free())
}

// Issue 14 item 9: the default follows vLLM (an unsalted request whose LoRA
// name equals a salt shares the salted first block); StrictKeyDomains keeps
// them apart, and HashPrefix follows the mode.
func TestStrictKeyDomains(t *testing.T) {
	prompt := []int32{10, 11, 12, 13, 14, 15, 16, 17, 18}
	for _, strict := range []bool{false, true} {
		p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 16, StrictKeyDomains: strict})
		if p.Options().StrictKeyDomains != strict {
			t.Fatalf("options %+v", p.Options())
		}
		holder, err := p.CreateSeq(&SeqOptions{CacheSalt: "tenant-a-salt"})
		ok(t, err)
		ok(t, holder.Append(prompt[:8]))
		step, err := p.Prepare([]Seq{holder}, []int{8}) // its step ran
		ok(t, err)
		ok(t, step.Commit())
		ok(t, step.Close())
		// An adapter name reads like the salt in the first block (the name
		// keys every block, the salt only the first).
		probe, err := p.CreateSeq(&SeqOptions{LoraName: "tenant-a-salt"})
		ok(t, err)
		hit, err := probe.MatchPrefix(prompt)
		ok(t, err)
		want := 4
		if strict {
			want = 0
		}
		if hit != want {
			t.Fatalf("strict %v: hit %d, want %d", strict, hit, want)
		}
		lib, err := HashPrefix(&HashOptions{BlockSize: 4, CacheSalt: "tenant-a-salt", StrictKeyDomains: strict}, prompt[:8])
		ok(t, err)
		got, err := holder.BlockHashes()
		ok(t, err)
		if len(lib) != 2 || len(got) != 2 || lib[0] != got[0] || lib[1] != got[1] {
			t.Fatalf("strict %v: HashPrefix %v, pool %v", strict, lib, got)
		}
	}
}

// A copy of a Pool, Batch, EventPublisher, TransferEngine or Transfer value
// (`cp := *pool`) held the C handle twice: the copy's Close and the
// original's each destroyed it (a double free: the process aborted or
// crashed at the second Close), and the original's finalizer destroyed it
// under the copy. Copies share one handle: the first Close destroys it,
// later ones do nothing, and every call on either is ErrClosed. Zero values
// of the structs are closed objects, never a nil dereference.
func TestCopiesOfHandlesCloseOnce(t *testing.T) {
	p, err := NewPool(&PoolOptions{BlockSize: 4, NumBlocks: 16, EnableEvents: true})
	ok(t, err)
	s, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append([]int32{1, 2, 3}))
	b, err := p.Prepare([]Seq{s}, []int{3})
	ok(t, err)
	bc := *b
	ok(t, bc.Commit())
	ok(t, bc.Close())
	ok(t, b.Close())
	if err := b.Commit(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Commit of a batch whose copy was closed: %v", err)
	}
	if info, err := s.Info(); err != nil || info.NumComputedTokens != 3 {
		t.Fatalf("committed through the copy: %+v, %v", info, err)
	}

	if pub, err := NewEventPublisher(p, "inproc://copies-close-once", "", nil); err == nil {
		pc := *pub
		ok(t, pc.Close())
		ok(t, pub.Close())
		if _, err := pub.Publish(); !errors.Is(err, ErrClosed) {
			t.Fatalf("Publish after the copy's Close: %v", err)
		}
	} else if !errors.Is(err, ErrUnsupported) {
		t.Fatal(err)
	}

	if TransferAvailable() {
		e, err := NewTransferEngine(&TransferOptions{Transports: "tcp"})
		ok(t, err)
		ec := *e
		ok(t, ec.Close())
		ok(t, e.Close())
		if _, err := e.NumExports(); !errors.Is(err, ErrClosed) {
			t.Fatalf("NumExports after the copy's Close: %v", err)
		}
	}

	pc := *p
	runtime.GC() // the original's finalizer must not run while the copy lives
	if _, err := pc.Stats(); err != nil {
		t.Fatalf("Stats of a live copy: %v", err)
	}
	ok(t, pc.Close())
	ok(t, p.Close())
	if _, err := p.Stats(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Stats after the copy's Close: %v", err)
	}

	var zp Pool
	var zb Batch
	var ze EventPublisher
	var zt TransferEngine
	var ztr Transfer
	for name, err := range map[string]error{
		"Pool.Stats":       func() error { _, err := zp.Stats(); return err }(),
		"Pool.CreateSeq":   func() error { _, err := zp.CreateSeq(nil); return err }(),
		"Pool.Close":       zp.Close(),
		"Batch.Commit":     zb.Commit(),
		"Batch.Close":      zb.Close(),
		"Publisher.Stats":  func() error { _, err := ze.Stats(); return err }(),
		"Publisher.Close":  ze.Close(),
		"Engine.Progress":  zt.Progress(),
		"Engine.Close":     zt.Close(),
		"Transfer.Cancel":  ztr.Cancel(),
		"Transfer.Bytes":   func() error { _, err := ztr.Bytes(); return err }(),
		"Transfer.Close":   ztr.Close(),
		"Transfer.Poll":    func() error { _, _, err := ztr.Poll(); return err }(),
		"Batch.CacheWrite": zb.CacheWrite(0, nil, nil),
		"Pool.SwapBlocks":  zp.SwapBlocks([]int32{1}, make([]byte, 8), SwapOut),
	} {
		if strings.HasSuffix(name, ".Close") {
			if err != nil {
				t.Fatalf("%s of a zero value: %v", name, err)
			}
			continue
		}
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("%s of a zero value: %v, want ErrClosed", name, err)
		}
	}
}

// Prepare refused a sequence made through a copy of its Pool value
// (`cp := *pool`; cp.CreateSeq, or cp.Seq(id)) as "seqs[0] belongs to
// another pool": the check compared *Pool pointers, while copies share one
// pool. A sequence of a really different pool is still refused, naming it.
func TestPrepareTakesSequencesOfCopiesOfItsPool(t *testing.T) {
	p := managerPool(t, 16)
	cp := *p
	s, err := cp.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append([]int32{1, 2, 3}))
	for name, c := range map[string]struct {
		pool *Pool
		seq  Seq
	}{
		"pool.Prepare(a Seq of the copy)": {p, s},
		"cp.Prepare(pool.Seq(id))":        {&cp, p.Seq(s.ID())},
	} {
		b, err := c.pool.Prepare([]Seq{c.seq}, []int{3})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if info, err := b.Info(); err != nil || info.NumSeqs != 1 || info.NumTokens != 3 {
			t.Fatalf("%s: plan %+v, %v", name, info, err)
		}
		ok(t, b.Abort())
		ok(t, b.Close())
	}
	other := managerPool(t, 16)
	o, err := other.CreateSeq(nil)
	ok(t, err)
	ok(t, o.Append([]int32{1, 2, 3}))
	before := stats(t, p)
	e := wantErr(t, func() error { _, err := p.Prepare([]Seq{s, o}, []int{3, 3}); return err }(), ErrInvalidArgument)
	if !strings.Contains(e.Msg, "seqs[1] belongs to another pool") {
		t.Fatalf("a sequence of another pool: %v", e)
	}
	if _, err := p.Prepare([]Seq{{}}, []int{1}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a zero Seq: %v, want ErrInvalidArgument", err)
	}
	if after := stats(t, p); after != before {
		t.Fatalf("refused prepares changed the pool: %+v -> %+v", before, after)
	}
	if _, err := (*Pool)(nil).Prepare([]Seq{s}, []int{3}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a nil Pool's Prepare of a live pool's Seq: %v, want ErrInvalidArgument", err)
	}
}
