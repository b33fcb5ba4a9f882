package pagedkv

import (
	"math/rand"
	"testing"
	"unsafe"
)

// Issue 23: a plan's token positions and last-token rows for random mixes
// of prefill, chunked prefill and decode, checked against the test's own
// bookkeeping.
func TestTokenPositionsFollowTheSchedule(t *testing.T) {
	p := managerPool(t, 512)
	r := rand.New(rand.NewSource(23))
	seqs := make([]Seq, 6)
	total := make([]int, len(seqs))
	computed := make([]int, len(seqs))
	for i := range seqs {
		s, err := p.CreateSeq(nil)
		ok(t, err)
		total[i] = 1 + r.Intn(29)
		ok(t, s.Append(randTokens(r, total[i])))
		seqs[i] = s
	}
	for step := 0; step < 12; step++ {
		var sched []Seq
		var counts []int
		var wantPos, wantLast []int64
		for i, s := range seqs {
			if computed[i] == total[i] {
				ok(t, s.Append(randTokens(r, 1))) // decode
				total[i]++
			}
			if r.Intn(4) == 0 && !(len(sched) == 0 && i+1 == len(seqs)) {
				continue // not scheduled this step
			}
			left := total[i] - computed[i]
			chunk := 1 + r.Intn(left)
			if chunk < left { // chunked prefill: the rest of the prompt waits
				ok(t, s.Truncate(computed[i]+chunk))
				total[i] = computed[i] + chunk
			}
			sched = append(sched, s)
			counts = append(counts, chunk)
			for j := 0; j < chunk; j++ {
				wantPos = append(wantPos, int64(computed[i]+j))
			}
			wantLast = append(wantLast, int64(len(wantPos)-1))
			computed[i] += chunk
		}
		b, err := p.Prepare(sched, counts)
		ok(t, err)
		pos, err := b.TokenPositions()
		ok(t, err)
		last, err := b.LastTokenIndices()
		ok(t, err)
		if !equalInt64(pos, wantPos) || !equalInt64(last, wantLast) {
			t.Fatalf("step %d: positions %v last %v, want %v %v", step, pos, last, wantPos, wantLast)
		}
		// The descriptor is the plan's own memory (zero-copy), the same on
		// every call, and holds the same values.
		v1, err := b.TokenPositionsTensor()
		ok(t, err)
		v2, err := b.TokenPositionsTensor()
		ok(t, err)
		if v1.Data != v2.Data || v1.DType != Int64 || len(v1.Shape) != 1 || v1.Shape[0] != int64(len(wantPos)) {
			t.Fatalf("positions tensor %+v / %+v", v1, v2)
		}
		view := unsafe.Slice((*int64)(unsafe.Add(v1.Data, v1.ByteOffset)), len(wantPos))
		if !equalInt64(view, wantPos) {
			t.Fatalf("view %v want %v", view, wantPos)
		}
		lt, err := b.LastTokenIndicesTensor()
		ok(t, err)
		if lt.Shape[0] != int64(len(wantLast)) {
			t.Fatalf("last tensor shape %v", lt.Shape)
		}
		ok(t, b.Commit())
		ok(t, b.Close())
		_, err = b.TokenPositions()
		wantErr(t, err, ErrInvalidState)
		_, err = b.LastTokenIndicesTensor()
		wantErr(t, err, ErrInvalidState)
	}
}
