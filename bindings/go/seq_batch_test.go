package pagedkv

import (
	"reflect"
	"strings"
	"testing"
)

func tables(t *testing.T, p *Pool, ids []SeqID) [][]int32 {
	t.Helper()
	out := make([][]int32, len(ids))
	for i, id := range ids {
		tb, err := p.Seq(id).BlockTable()
		ok(t, err)
		out[i] = tb
	}
	return out
}

func TestAppendBatchEqualsOneAppendEach(t *testing.T) {
	a, b := managerPool(t, 64), managerPool(t, 64)
	mk := func(p *Pool) []SeqID {
		var ids []SeqID
		for i := 0; i < 6; i++ {
			s, err := p.CreateSeq(nil)
			ok(t, err)
			toks := make([]int32, 3+i)
			ok(t, s.Append(toks))
			ids = append(ids, s.ID())
		}
		return ids
	}
	ia, ib := mk(a), mk(b)
	for step := 0; step < 20; step++ {
		toks := make([]int32, len(ia))
		for i := range toks {
			toks[i] = int32(step*10 + i)
		}
		ok(t, a.AppendBatch(ia, toks))
		for i, id := range ib {
			ok(t, b.Seq(id).Append(toks[i:i+1]))
		}
		if !reflect.DeepEqual(tables(t, a, ia), tables(t, b, ib)) {
			t.Fatalf("step %d: tables differ", step)
		}
	}
	ok(t, a.Validate())
}

func TestBatchedCallsAreAllOrNothing(t *testing.T) {
	p := managerPool(t, 5)
	var ids []SeqID
	for i := 0; i < 3; i++ {
		s, err := p.CreateSeq(nil)
		ok(t, err)
		ok(t, s.Append([]int32{1, 2, 3, 4}))
		ids = append(ids, s.ID())
	}
	dead, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, dead.Free())
	before := tables(t, p, ids)
	e := wantErr(t, p.AppendBatch(ids, []int32{7, 7, 7}), ErrOutOfBlocks)
	if !strings.Contains(e.Msg, "seqs[1]") {
		t.Fatalf("message %q does not name seqs[1]", e.Msg)
	}
	wantErr(t, p.AppendBatch([]SeqID{ids[0], dead.ID()}, []int32{7, 7}), ErrNotFound)
	wantErr(t, p.AppendBatch([]SeqID{ids[0], ids[0]}, []int32{7, 7}), ErrInvalidArgument)
	wantErr(t, p.AppendBatch(ids, []int32{7}), ErrInvalidArgument)
	wantErr(t, p.FreeBatch([]SeqID{ids[2], dead.ID()}), ErrNotFound)
	// Admit's message named pkv_seq_admit_hashes (the C call it went through).
	_, _, err = p.Admit(nil, make([]int32, 100), 0)
	if e := wantErr(t, err, ErrOutOfBlocks); strings.Contains(e.Msg, "pkv_seq_admit") {
		t.Fatalf("message %q names another call", e.Msg)
	}
	// More hashes than the prompt's full blocks: an argument error, however many.
	_, _, err = p.AdmitHashes(nil, []int32{1, 2, 3, 4, 5}, make([]BlockHash, 2), 0)
	wantErr(t, err, ErrInvalidArgument)
	if !reflect.DeepEqual(before, tables(t, p, ids)) {
		t.Fatal("a failed batched call changed the tables")
	}
	ok(t, p.FreeBatch(ids))
	st, err := p.Stats()
	ok(t, err)
	if st.NumSeqs != 0 {
		t.Fatalf("%d sequences left", st.NumSeqs)
	}
}

func TestAdmitWithAndWithoutHashes(t *testing.T) {
	p := managerPool(t, 32)
	salted := &SeqOptions{CacheSalt: "tenant-a"}
	prompt := make([]int32, 17)
	for i := range prompt {
		prompt[i] = int32(i)
	}
	first, hit, err := p.Admit(salted, prompt, 0)
	ok(t, err)
	if hit != 0 {
		t.Fatalf("hit %d on an empty cache", hit)
	}
	b, err := p.Prepare([]Seq{first}, []int{17})
	ok(t, err)
	ok(t, b.Commit())
	ok(t, b.Close())
	_, hit, err = p.Admit(salted, prompt, 0)
	ok(t, err)
	if hit != 16 {
		t.Fatalf("hit %d, want 16", hit)
	}
	hashes, err := HashPrefix(&HashOptions{BlockSize: 4, CacheSalt: "tenant-a"}, prompt)
	ok(t, err)
	third, hit, err := p.AdmitHashes(salted, prompt, hashes, 0)
	ok(t, err)
	if hit != 16 {
		t.Fatalf("hit by hashes %d, want 16", hit)
	}
	t1, _ := first.BlockTable()
	t3, _ := third.BlockTable()
	if !reflect.DeepEqual(t1[:4], t3[:4]) {
		t.Fatal("hit blocks differ")
	}
	empty, err := p.CreateSeq(salted)
	ok(t, err)
	n, err := empty.MatchPrefixHashes(prompt, hashes[:2])
	ok(t, err)
	if n != 8 {
		t.Fatalf("match by 2 hashes: %d, want 8", n)
	}
	other, err := HashPrefix(&HashOptions{BlockSize: 4, CacheSalt: "tenant-b"}, prompt)
	ok(t, err)
	st0, _ := p.Stats()
	e := wantErr(t, func() error { _, _, err := p.AdmitHashes(salted, prompt, other, 0); return err }(),
		ErrInvalidArgument)
	if !strings.Contains(e.Msg, "hashes[0]") {
		t.Fatalf("message %q does not name hashes[0]", e.Msg)
	}
	wantErr(t, func() error { _, _, err := p.Admit(salted, make([]int32, 400), 0); return err }(),
		ErrOutOfBlocks)
	st1, _ := p.Stats()
	if st0.NumSeqs != st1.NumSeqs || st0.NumFreeBlocks != st1.NumFreeBlocks {
		t.Fatal("a failed admission changed the pool")
	}
	ok(t, p.Validate())
}
