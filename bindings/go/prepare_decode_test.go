package pagedkv

import (
	"errors"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// PrepareDecode (pkv_batch_prepare_decode): one decode step in one call.
// Twin pools get the same random prompts and steps; each step runs as
// PrepareDecode on one and as AppendBatch then Prepare (query 1) on the
// other, and every plan array element and block table must agree. A
// failing step appends nothing.

func decodeIDs(seqs []Seq) []SeqID {
	ids := make([]SeqID, len(seqs))
	for i, s := range seqs {
		ids[i] = s.ID()
	}
	return ids
}

type tokenCounts struct{ tokens, computed uint64 }

func decodeCounts(t *testing.T, seqs []Seq) []tokenCounts {
	t.Helper()
	out := make([]tokenCounts, len(seqs))
	for i, s := range seqs {
		info, err := s.Info()
		ok(t, err)
		out[i] = tokenCounts{info.NumTokens, info.NumComputedTokens}
	}
	return out
}

func decodeTables(t *testing.T, seqs []Seq) [][]int32 {
	t.Helper()
	out := make([][]int32, len(seqs))
	for i, s := range seqs {
		bt, err := s.BlockTable()
		ok(t, err)
		out[i] = bt
	}
	return out
}

type decodeSnapshot struct {
	counts []tokenCounts
	tables [][]int32
	free   uint64
}

func snapshotOf(t *testing.T, p *Pool, seqs []Seq) decodeSnapshot {
	t.Helper()
	st, err := p.Stats()
	ok(t, err)
	return decodeSnapshot{decodeCounts(t, seqs), decodeTables(t, seqs), st.NumFreeBlocks}
}

// computeAll commits a step computing every uncomputed token of seqs.
func computeAll(t *testing.T, p *Pool, seqs []Seq) {
	t.Helper()
	q := make([]int, len(seqs))
	for i, c := range decodeCounts(t, seqs) {
		q[i] = int(c.tokens - c.computed)
	}
	b, err := p.Prepare(seqs, q)
	ok(t, err)
	ok(t, b.Commit())
	ok(t, b.Close())
}

func samePlan(t *testing.T, a, b *Batch, what string) {
	t.Helper()
	ia, err := a.Info()
	ok(t, err)
	ib, err := b.Info()
	ok(t, err)
	if ia != ib {
		t.Fatalf("%s: info %+v vs %+v", what, ia, ib)
	}
	sa, err := a.SlotMapping()
	ok(t, err)
	sb, err := b.SlotMapping()
	ok(t, err)
	if !reflect.DeepEqual(sa, sb) {
		t.Fatalf("%s: slot_mapping %v vs %v", what, sa, sb)
	}
	for _, w := range []PlanArray{PlanQueryIndptr, PlanPageIndptr, PlanPageIndices, PlanLastPageLen, PlanContextLens} {
		x, err := a.PlanInt32s(w)
		ok(t, err)
		y, err := b.PlanInt32s(w)
		ok(t, err)
		if len(x) != len(y) {
			t.Fatalf("%s: plan array %d: %d vs %d entries", what, w, len(x), len(y))
		}
		for k := range x {
			if x[k] != y[k] {
				t.Fatalf("%s: plan array %d [%d]: %d vs %d", what, w, k, x[k], y[k])
			}
		}
	}
}

func decodeTwins(t *testing.T, r *rand.Rand, n int) (pa, pb *Pool, sa, sb []Seq) {
	prompts := make([][]int32, n)
	for i := range prompts {
		prompts[i] = make([]int32, 1+r.Intn(39))
		for k := range prompts[i] {
			prompts[i][k] = int32(r.Intn(64)) // a small vocabulary: prefix hits
		}
	}
	make1 := func() (*Pool, []Seq) {
		p := managerPool(t, 4000)
		seqs := make([]Seq, n)
		for i, pr := range prompts {
			s, _, err := p.Admit(nil, pr, 0)
			ok(t, err)
			seqs[i] = s
		}
		computeAll(t, p, seqs)
		return p, seqs
	}
	pa, sa = make1()
	pb, sb = make1()
	return
}

func TestPrepareDecodeEqualsAppendBatchThenPrepare(t *testing.T) {
	for _, persistent := range []bool{false, true} {
		for seed := int64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("persistent=%v/seed=%d", persistent, seed), func(t *testing.T) {
				r := rand.New(rand.NewSource(seed))
				pa, pb, sa, sb := decodeTwins(t, r, 9)
				if !reflect.DeepEqual(decodeTables(t, sa), decodeTables(t, sb)) {
					t.Fatal("twin prompts differ")
				}
				var flags PrepareFlags
				if persistent {
					flags = PreparePersistentTable
				}
				for step := 0; step < 40; step++ {
					if step%7 == 3 { // reorder, drop and fork: plans over a changing batch
						perm := r.Perm(len(sa))
						na, nb := make([]Seq, len(sa)), make([]Seq, len(sb))
						for i, j := range perm {
							na[i], nb[i] = sa[j], sb[j]
						}
						sa, sb = na, nb
						if len(sa) > 3 {
							ok(t, sa[len(sa)-1].Free())
							ok(t, sb[len(sb)-1].Free())
							sa, sb = sa[:len(sa)-1], sb[:len(sb)-1]
						}
						k := r.Intn(len(sa))
						fa, err := sa[k].Fork()
						ok(t, err)
						fb, err := sb[k].Fork()
						ok(t, err)
						sa, sb = append(sa, fa), append(sb, fb)
					}
					toks := make([]int32, len(sa))
					for i := range toks {
						toks[i] = int32(r.Intn(64))
					}
					var da *Batch
					var err error
					if persistent {
						da, err = pa.PrepareDecodeEx(decodeIDs(sa), toks, flags, nil)
					} else {
						da, err = pa.PrepareDecode(decodeIDs(sa), toks)
					}
					ok(t, err)
					ok(t, pb.AppendBatch(decodeIDs(sb), toks))
					ones := make([]int, len(sb))
					for i := range ones {
						ones[i] = 1
					}
					db, err := pb.PrepareEx(sb, ones, flags, nil)
					ok(t, err)
					what := fmt.Sprintf("step %d", step)
					samePlan(t, da, db, what)
					qi, err := da.PlanInt32s(PlanQueryIndptr)
					ok(t, err)
					for i, v := range qi {
						if v != int32(i) {
							t.Fatalf("%s: query_indptr %v", what, qi)
						}
					}
					if !reflect.DeepEqual(decodeTables(t, sa), decodeTables(t, sb)) {
						t.Fatalf("%s: block tables differ", what)
					}
					if !reflect.DeepEqual(decodeCounts(t, sa), decodeCounts(t, sb)) {
						t.Fatalf("%s: token counts differ", what)
					}
					if step%5 == 4 { // an aborted step: the tokens stay, uncomputed
						ok(t, da.Abort())
						ok(t, db.Abort())
						if !reflect.DeepEqual(decodeCounts(t, sa), decodeCounts(t, sb)) {
							t.Fatalf("%s: counts after abort differ", what)
						}
						ok(t, da.Close())
						ok(t, db.Close())
						computeAll(t, pa, sa)
						computeAll(t, pb, sb)
					} else {
						ok(t, da.Commit())
						ok(t, db.Commit())
						ok(t, da.Close())
						ok(t, db.Close())
					}
					ok(t, pa.Validate())
					ok(t, pb.Validate())
				}
				x, err := pa.Stats()
				ok(t, err)
				y, err := pb.Stats()
				ok(t, err)
				if x.NumFreeBlocks != y.NumFreeBlocks || x.NumTokens != y.NumTokens || x.NumCOWCopies != y.NumCOWCopies {
					t.Fatalf("stats differ: %+v vs %+v", x, y)
				}
				for i := range sa {
					ha, err := sa[i].BlockHashes()
					ok(t, err)
					hb, err := sb[i].BlockHashes()
					ok(t, err)
					if !reflect.DeepEqual(ha, hb) {
						t.Fatalf("seq %d: block hashes differ", i)
					}
				}
			})
		}
	}
}

func TestPrepareDecodeUncomputedAppendsNothing(t *testing.T) {
	p := managerPool(t, 64)
	seqs := make([]Seq, 3)
	for i := range seqs {
		s, _, err := p.Admit(nil, []int32{5, 6, 7, int32(i), 9}, 0)
		ok(t, err)
		seqs[i] = s
	}
	computeAll(t, p, seqs[:2]) // seqs[2]'s prompt was never computed
	before := snapshotOf(t, p, seqs)
	_, err := p.PrepareDecode(decodeIDs(seqs), []int32{1, 2, 3})
	if e := wantErr(t, err, ErrInvalidState); !strings.Contains(e.Msg, "seqs[2]") {
		t.Fatalf("message %q does not name seqs[2]", e.Msg)
	}
	if got := snapshotOf(t, p, seqs); !reflect.DeepEqual(got, before) {
		t.Fatalf("state changed: %+v vs %+v", got, before)
	}
	_, err = p.PrepareDecodeEx([]SeqID{seqs[2].ID(), seqs[0].ID()}, []int32{1, 2}, PreparePersistentTable, nil)
	wantErr(t, err, ErrInvalidState)
	if got := snapshotOf(t, p, seqs); !reflect.DeepEqual(got, before) {
		t.Fatalf("state changed: %+v vs %+v", got, before)
	}
	ok(t, p.Validate())
}

func TestPrepareDecodeBadArgumentsChangeNothing(t *testing.T) {
	p := managerPool(t, 5)
	seqs := make([]Seq, 3)
	for i := range seqs {
		s, _, err := p.Admit(nil, []int32{1, 2, int32(i)}, 0)
		ok(t, err)
		seqs[i] = s
	}
	computeAll(t, p, seqs)
	ids := decodeIDs(seqs)
	before := snapshotOf(t, p, seqs)
	same := func() {
		t.Helper()
		if got := snapshotOf(t, p, seqs); !reflect.DeepEqual(got, before) {
			t.Fatalf("state changed: %+v vs %+v", got, before)
		}
	}
	_, err := p.PrepareDecode([]SeqID{ids[0], ids[1], ids[0]}, []int32{7, 7, 7})
	if e := wantErr(t, err, ErrInvalidArgument); !strings.Contains(e.Msg, "seqs[2]") {
		t.Fatalf("message %q does not name seqs[2]", e.Msg)
	}
	same()
	_, err = p.PrepareDecode(ids, []int32{7, 7})
	if e := wantErr(t, err, ErrInvalidArgument); !strings.Contains(e.Msg, "differ in length") {
		t.Fatalf("message %q", e.Msg)
	}
	_, err = p.PrepareDecodeEx(ids[:2], []int32{7, 7, 7}, PreparePersistentTable, nil)
	wantErr(t, err, ErrInvalidArgument)
	_, err = p.PrepareDecodeEx(ids, []int32{7, 7, 7}, PrepareFlags(6), nil)
	wantErr(t, err, ErrInvalidArgument)
	_, err = p.PrepareDecode(nil, nil)
	wantErr(t, err, ErrInvalidArgument)
	_, err = p.PrepareDecode([]SeqID{ids[0], 12345}, []int32{7, 7})
	if e := wantErr(t, err, ErrNotFound); !strings.Contains(e.Msg, "seqs[1]") {
		t.Fatalf("message %q does not name seqs[1]", e.Msg)
	}
	same()
	// a step that fills every block
	b, err := p.PrepareDecode(ids, []int32{7, 7, 7})
	ok(t, err)
	cl, err := b.PlanInt32s(PlanContextLens)
	ok(t, err)
	if !reflect.DeepEqual(cl, []int32{4, 4, 4}) {
		t.Fatalf("context_lens %v", cl)
	}
	ok(t, b.Commit())
	ok(t, b.Close())
	// three new blocks are needed, one is free
	before = snapshotOf(t, p, seqs)
	if before.free != 1 {
		t.Fatalf("free blocks %d, want 1", before.free)
	}
	_, err = p.PrepareDecodeEx(ids, []int32{8, 8, 8}, PreparePersistentTable, nil)
	if e := wantErr(t, err, ErrOutOfBlocks); !strings.Contains(e.Msg, "nothing was appended") {
		t.Fatalf("message %q", e.Msg)
	}
	same()
	b, err = p.PrepareDecode(ids[1:2], []int32{8})
	ok(t, err)
	cl, err = b.PlanInt32s(PlanContextLens)
	ok(t, err)
	if !reflect.DeepEqual(cl, []int32{5}) {
		t.Fatalf("context_lens %v", cl)
	}
	ok(t, b.Commit())
	ok(t, b.Close())
	want := []tokenCounts{{4, 4}, {5, 5}, {4, 4}}
	if got := decodeCounts(t, seqs); !reflect.DeepEqual(got, want) {
		t.Fatalf("counts %+v, want %+v", got, want)
	}
	ok(t, p.Validate())
}

func TestPrepareDecodeFreedSeqOtherPoolClosedPool(t *testing.T) {
	p := managerPool(t, 32)
	a, _, err := p.Admit(nil, []int32{1, 2, 3}, 0)
	ok(t, err)
	gone, _, err := p.Admit(nil, []int32{1, 2, 3}, 0)
	ok(t, err)
	computeAll(t, p, []Seq{a, gone})
	ok(t, gone.Free())
	_, err = p.PrepareDecode([]SeqID{a.ID(), gone.ID()}, []int32{4, 4})
	if e := wantErr(t, err, ErrNotFound); !strings.Contains(e.Msg, "seqs[1]") {
		t.Fatalf("message %q does not name seqs[1]", e.Msg)
	}
	other := managerPool(t, 32)
	_, err = other.PrepareDecode([]SeqID{a.ID()}, []int32{4})
	wantErr(t, err, ErrNotFound)
	if got := decodeCounts(t, []Seq{a}); got[0] != (tokenCounts{3, 3}) {
		t.Fatalf("counts %+v", got)
	}
	// a plan outliving its pool, and calls on the closed pool: clean errors
	b, err := p.PrepareDecode([]SeqID{a.ID()}, []int32{4})
	ok(t, err)
	ok(t, p.Close())
	_, err = p.PrepareDecode([]SeqID{a.ID()}, []int32{5})
	wantErr(t, err, ErrInvalidState)
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("%v is not ErrClosed", err)
	}
	_, err = p.PrepareDecodeEx([]SeqID{a.ID()}, []int32{5}, PreparePersistentTable, nil)
	wantErr(t, err, ErrInvalidState)
	wantErr(t, b.Commit(), ErrInvalidState)
	ok(t, b.Close())
	ok(t, b.Close())
	var nilPool *Pool
	_, err = nilPool.PrepareDecode([]SeqID{a.ID()}, []int32{5})
	wantErr(t, err, ErrInvalidState)
}

func TestPrepareDecodeMultiGroupUnsupported(t *testing.T) {
	p, err := NewGroupPool(&PoolOptions{BlockSize: 4, NumBlocks: 32}, []GroupSpec{
		{Kind: GroupFull, NumLayers: 1, NumKVHeads: 2, HeadDim: 8},
		{Kind: GroupRecurrent, NumLayers: 7, StateBytes: 4096},
	})
	ok(t, err)
	defer p.Close()
	s, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append([]int32{1, 2, 3}))
	compute(t, s, 3)
	_, err = p.PrepareDecode([]SeqID{s.ID()}, []int32{4})
	wantErr(t, err, ErrUnsupported)
	_, err = p.PrepareDecodeEx([]SeqID{s.ID()}, []int32{4}, PreparePersistentTable, nil)
	wantErr(t, err, ErrUnsupported)
	if got := decodeCounts(t, []Seq{s}); got[0] != (tokenCounts{3, 3}) {
		t.Fatalf("counts %+v", got)
	}
	// the way there: append, then prepare
	ok(t, s.Append([]int32{4}))
	compute(t, s, 1)
	if got := decodeCounts(t, []Seq{s}); got[0] != (tokenCounts{4, 4}) {
		t.Fatalf("counts %+v", got)
	}
}
