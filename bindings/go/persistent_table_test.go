package pagedkv

import (
	"math/rand"
	"testing"
)

// PrepareEx with PreparePersistentTable: every row of the padded table
// equals the CSR plan's row over the same state (null block past it), the
// other arrays are equal, through decode steps, frees and new sequences.
func TestPersistentTableEqualsCSR(t *testing.T) {
	p := managerPool(t, 2000)
	r := rand.New(rand.NewSource(16))
	var seqs []Seq
	for i := 0; i < 6; i++ {
		seqs = append(seqs, seqOf(t, p, randTokens(r, 1+r.Intn(20))))
	}
	get := func(b *Batch, w PlanArray) []int32 {
		v, err := b.PlanInt32s(w)
		ok(t, err)
		return v
	}
	for step := 0; step < 60; step++ {
		switch k := r.Intn(10); {
		case k < 7:
			for _, s := range seqs {
				ok(t, s.Append(randTokens(r, 1)))
			}
		case k < 8:
			i := r.Intn(len(seqs))
			ok(t, seqs[i].Free())
			seqs[i] = seqOf(t, p, randTokens(r, 1+r.Intn(20)))
		default:
			seqs = append(seqs, seqOf(t, p, randTokens(r, 1+r.Intn(20))))
		}
		q := make([]int, len(seqs))
		for i, s := range seqs {
			info, err := s.Info()
			ok(t, err)
			q[i] = int(info.NumTokens - info.NumComputedTokens)
			if q[i] < 1 {
				q[i] = 1
			}
		}
		pers, err := p.PrepareEx(seqs, q, PreparePersistentTable, nil)
		ok(t, err)
		csr, err := p.Prepare(seqs, q)
		ok(t, err)
		for _, w := range []PlanArray{PlanQueryIndptr, PlanLastPageLen, PlanContextLens} {
			if a, b := get(pers, w), get(csr, w); !equalInt32(a, b) {
				t.Fatalf("step %d array %d: %v != %v", step, w, a, b)
			}
		}
		pptr, pidx := get(pers, PlanPageIndptr), get(pers, PlanPageIndices)
		cptr, cidx := get(csr, PlanPageIndptr), get(csr, PlanPageIndices)
		stride := int(pptr[1])
		if len(pidx) != stride*len(seqs) {
			t.Fatalf("step %d: %d page ids for %d rows of %d", step, len(pidx), len(seqs), stride)
		}
		for i := range seqs {
			if int(pptr[i]) != i*stride {
				t.Fatalf("step %d: page indptr %v", step, pptr)
			}
			row := cidx[cptr[i]:cptr[i+1]]
			for j := 0; j < stride; j++ {
				want := int32(0)
				if j < len(row) {
					want = row[j]
				}
				if got := pidx[i*stride+j]; got != want {
					t.Fatalf("step %d row %d page %d: %d, want %d", step, i, j, got, want)
				}
			}
		}
		ok(t, csr.Abort())
		ok(t, csr.Close())
		ok(t, pers.Commit())
		ok(t, pers.Close())
	}
	_, err := p.PrepareEx(seqs, make([]int, len(seqs)), PreparePersistentTable, nil)
	wantErr(t, err, ErrInvalidArgument)
	_, err = p.PrepareEx(seqs[:1], []int{1}, PrepareFlags(2), nil)
	wantErr(t, err, ErrInvalidArgument)
}
