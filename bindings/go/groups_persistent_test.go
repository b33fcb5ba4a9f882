package pagedkv

import "testing"

// PrepareEx with PreparePersistentTable on a multi-group pool: every group's
// page table is padded rows of its own stride (a recurrent group's: one
// page), equal to the group's block table, kept and updated across steps.
func TestGroupPoolPersistentTable(t *testing.T) {
	p, err := NewGroupPool(&PoolOptions{BlockSize: 4, NumBlocks: 96}, []GroupSpec{
		{Kind: GroupSlidingWindow, NumLayers: 1, NumKVHeads: 1, HeadDim: 8, SlidingWindow: 5},
		{Kind: GroupFull, NumLayers: 1, NumKVHeads: 1, HeadDim: 8},
		{Kind: GroupRecurrent, NumLayers: 1, StateBytes: 64},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	next := int32(7)
	tok := func(k int) []int32 {
		out := make([]int32, k)
		for i := range out {
			next = (next*31 + 11) % 997
			out[i] = next
		}
		return out
	}
	seqs := make([]Seq, 3)
	all := make([]int, 3)
	for i := range seqs {
		if seqs[i], err = p.CreateSeq(nil); err != nil {
			t.Fatal(err)
		}
		if err := seqs[i].Append(tok(3 + 4*i)); err != nil {
			t.Fatal(err)
		}
		all[i] = 3 + 4*i
	}
	first, err := p.Prepare(seqs, all)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(); err != nil {
		t.Fatal(err)
	}
	first.Close()
	for step := 0; step < 10; step++ {
		for i, s := range seqs {
			k := 1
			if (step+i)%4 == 0 {
				k = 3
			}
			if err := s.Append(tok(k)); err != nil {
				t.Fatal(err)
			}
		}
		order := append(append([]Seq{}, seqs[step%3:]...), seqs[:step%3]...)
		q := make([]int, len(order))
		for i, s := range order {
			info, err := s.Info()
			if err != nil {
				t.Fatal(err)
			}
			q[i] = int(info.NumTokens - info.NumComputedTokens)
		}
		b, err := p.PrepareEx(order, q, PreparePersistentTable, nil)
		if err != nil {
			t.Fatal(err)
		}
		for g := uint32(0); g < 3; g++ {
			it, err := b.PlanGroupTensor(g, PlanPageIndptr)
			if err != nil {
				t.Fatal(err)
			}
			indptr, err := it.Int32s()
			if err != nil {
				t.Fatal(err)
			}
			stride := int(indptr[1])
			for i := range indptr {
				if int(indptr[i]) != i*stride {
					t.Fatalf("group %d indptr %v", g, indptr)
				}
			}
			if g == 2 && stride != 1 {
				t.Fatalf("recurrent stride %d", stride)
			}
			pt, err := b.PlanGroupTensor(g, PlanPageIndices)
			if err != nil {
				t.Fatal(err)
			}
			pages, err := pt.Int32s()
			if err != nil || len(pages) != len(order)*stride {
				t.Fatalf("group %d: %d pages (%v), stride %d", g, len(pages), err, stride)
			}
			for i, s := range order {
				table, err := s.GroupBlockTable(int(g))
				if err != nil {
					t.Fatal(err)
				}
				info, _ := s.Info()
				np := int(info.NumTokens+3) / 4
				if g == 2 {
					np = 1
				}
				for j := 0; j < stride; j++ {
					want := int32(NullBlock)
					if j < np {
						want = table[j]
					}
					if pages[i*stride+j] != want {
						t.Fatalf("step %d group %d row %d page %d = %d, want %d", step, g, i, j, pages[i*stride+j], want)
					}
				}
			}
		}
		for g := 0; g < 3; g++ {
			if _, _, err := p.TakeCopies(g); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		b.Close()
	}
	win, err := seqs[2].GroupBlockTable(0)
	if err != nil || win[0] != NullBlock {
		t.Fatalf("window table %v (%v)", win, err)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
}
