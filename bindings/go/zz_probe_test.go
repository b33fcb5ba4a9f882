package pagedkv

import (
	"runtime"
	"testing"
)

func TestProbeTransferPoolClosed(t *testing.T) {
	a, b := engines(t)
	o := PoolOptions{BlockSize: 16, NumBlocks: 64, NumLayers: 2, NumKVHeads: 2, HeadDim: 32, DType: Float32}
	src, _ := newPool(t, o), newPool(t, o)
	s := seqOf(t, src, []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18})
	id, desc, err := a.Export(s)
	ok(t, err)
	dst, err := NewPool(&o)
	ok(t, err)
	tr, err := b.Import(dst, nil, desc)
	ok(t, err)
	ok(t, dst.Close())
	for i := 0; i < 100; i++ {
		a.Progress()
		st, sq, err := tr.Poll()
		if st != TransferRunning || err != nil {
			t.Logf("state %d seq %v err %v", st, sq, err)
			if st == TransferDone {
				_, err := sq.Info()
				t.Logf("info: %v", err)
			}
			break
		}
	}
	n, err := tr.Bytes()
	t.Logf("bytes %d %v cancel %v", n, err, tr.Cancel())
	tr.Close()
	// exporter: close src pool, then descriptor reuse
	ok(t, src.Close())
	dst2 := newPool(t, o)
	tr2, err := b.Import(dst2, nil, desc)
	t.Logf("import after src pool closed: %v", err)
	if err == nil {
		for i := 0; i < 100; i++ {
			a.Progress()
			st, _, err := tr2.Poll()
			if st != TransferRunning || err != nil {
				t.Logf("state %d err %v", st, err)
				break
			}
		}
		tr2.Close()
	}
	t.Logf("release: %v", a.ReleaseExport(id))
	// engine closed while transfer alive
	tr3, err := b.Import(dst2, nil, desc)
	t.Logf("import3: %v", err)
	ok(t, b.Close())
	if tr3 != nil {
		st, _, err := tr3.Poll()
		t.Logf("poll after engine close: %d %v", st, err)
		tr3.Close()
	}
	runtime.GC()
}
