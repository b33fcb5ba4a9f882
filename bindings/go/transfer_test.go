package pagedkv

import (
	"errors"
	"math/rand"
	"runtime"
	"strings"
	"testing"
	"time"
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
	// K and V of 2 layers, 5 blocks of 2 heads x 16 slots x 32 f32.
	if n, err := tr.Bytes(); err != nil || n != 2*2*5*2*16*32*4 {
		t.Fatalf("Bytes() = %d, %v; want %d", n, err, 2*2*5*2*16*32*4)
	}
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
	ok(t, tr.Close())
	if _, err := tr.Bytes(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Bytes() after Close: %v, want ErrClosed", err)
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

// A Transfer or TransferEngine dropped without Close was never destroyed
// (no finalizer, unlike Pool, Batch and EventPublisher): a running import
// kept its blocks allocated in the pool for good. The collector now cancels
// and frees it.
func TestDroppedTransferIsCancelledByTheCollector(t *testing.T) {
	a, b := engines(t)
	src, dst := transferPools(t)
	s := seqOf(t, src, randTokens(rand.New(rand.NewSource(9)), 70))
	id, desc, err := a.Export(s)
	ok(t, err)
	free0 := stats(t, dst).NumFreeBlocks
	func() {
		tr, err := b.Import(dst, nil, desc)
		ok(t, err)
		if f := stats(t, dst).NumFreeBlocks; f == free0 {
			t.Fatalf("the running import holds no blocks")
		}
		_ = tr // dropped without Close; the exporter makes no progress, so it keeps running
	}()
	for i := 0; i < 100 && stats(t, dst).NumFreeBlocks != free0; i++ {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if f := stats(t, dst).NumFreeBlocks; f != free0 {
		t.Fatalf("free blocks %d after the dropped transfer was collected, want %d", f, free0)
	}
	ok(t, dst.Validate())
	ok(t, a.ReleaseExport(id))
	// An engine dropped without Close is destroyed too: its exports are
	// released, so the blocks they pinned come back.
	srcFree := stats(t, src).NumFreeBlocks
	s2 := seqOf(t, src, randTokens(rand.New(rand.NewSource(10)), 40))
	func() {
		e, err := NewTransferEngine(&TransferOptions{Transports: "tcp"})
		ok(t, err)
		_, _, err = e.Export(s2)
		ok(t, err)
	}()
	ok(t, s2.Free()) // the export still pins its blocks
	if f := stats(t, src).NumFreeBlocks; f == srcFree {
		t.Fatalf("the export pins no blocks")
	}
	for i := 0; i < 100 && stats(t, src).NumFreeBlocks != srcFree; i++ {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if f := stats(t, src).NumFreeBlocks; f != srcFree {
		t.Fatalf("free blocks %d after the dropped engine was collected, want %d", f, srcFree)
	}
	ok(t, src.Validate())
}

// An import still reading when the exporting side closes its pool and
// releases the export: the exporter's engine serves the reads over TCP at
// the arena's address, and the library used to free the arena with the
// export, so Progress died of a SIGSEGV. Now the importer gets stale bytes
// (as for a release too early) and nothing crashes.
func TestReadsOfAReleasedExportOfAClosedPoolDoNotCrashTheExporter(t *testing.T) {
	a, b := engines(t)
	src, dst := transferPools(t)
	s := seqOf(t, src, randTokens(rand.New(rand.NewSource(9)), 40))
	id, desc, err := a.Export(s)
	ok(t, err)
	tr, err := b.Import(dst, nil, desc)
	ok(t, err)
	defer tr.Close()
	ok(t, src.Close())
	ok(t, a.ReleaseExport(id)) // the pool's last reference
	deadline := time.Now().Add(time.Minute)
	state := TransferRunning
	for state == TransferRunning && time.Now().Before(deadline) {
		ok(t, a.Progress())
		if state, _, err = tr.Poll(); err != nil {
			break
		}
	}
	if state == TransferRunning {
		t.Fatal("the import never ended")
	}
	ok(t, dst.Validate())
}

// Transports naming nothing UCX has here (a typo, a transport of another
// machine) were ErrUnsupported "UCX could not be initialised (ucp_init): No
// such device", the answer of a build without UCX: the caller's option was
// not named. It is ErrInvalidArgument naming Transports.
func TestUnknownTransportsAreAnArgumentError(t *testing.T) {
	if !TransferAvailable() {
		t.Skip("built without UCX")
	}
	for _, tls := range []string{"no_such_transport", "tcpp,shmm"} {
		e, err := NewTransferEngine(&TransferOptions{Transports: tls})
		if e != nil {
			e.Close()
			t.Fatalf("transports %q: an engine was made", tls)
		}
		got := wantErr(t, err, ErrInvalidArgument)
		if !strings.Contains(got.Msg, "TransferOptions.Transports") || !strings.Contains(got.Msg, tls) {
			t.Fatalf("transports %q: %v does not name the option", tls, err)
		}
	}
	e, err := NewTransferEngine(&TransferOptions{Transports: "tcp"})
	ok(t, err)
	ok(t, e.Close())
}

// A pool without KV storage (NumLayers 0) was ErrInvalidArgument for an
// export and an import, where every other call needing storage (KVTensor,
// the kernels, CopyBlocks, AttachTiers) says ErrInvalidState "no KV
// storage": the pool's state, not an argument, is what is wrong.
func TestTransferOfAPoolWithoutStorageIsInvalidState(t *testing.T) {
	a, b := engines(t)
	src, _ := transferPools(t)
	manager := managerPool(t, 64)
	ms := seqOf(t, manager, randTokens(rand.New(rand.NewSource(4)), 20))
	_, _, err := a.Export(ms)
	if e := wantErr(t, err, ErrInvalidState); !strings.Contains(e.Msg, "no KV storage") {
		t.Fatalf("export: %v", err)
	}
	s := seqOf(t, src, randTokens(rand.New(rand.NewSource(5)), 20))
	id, desc, err := a.Export(s)
	ok(t, err)
	before := stats(t, manager)
	_, err = b.Import(manager, nil, desc)
	if e := wantErr(t, err, ErrInvalidState); !strings.Contains(e.Msg, "no KV storage") {
		t.Fatalf("import: %v", err)
	}
	if after := stats(t, manager); after != before {
		t.Fatalf("a refused import changed the pool: %+v, was %+v", after, before)
	}
	ok(t, a.ReleaseExport(id))
	n, err := a.NumExports()
	ok(t, err)
	if n != 0 {
		t.Fatalf("%d exports held after a refused export and a release", n)
	}
	ok(t, manager.Validate())
}
