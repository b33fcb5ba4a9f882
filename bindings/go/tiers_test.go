package pagedkv

import (
	"testing"
)

// Evicted blocks come back from the host and file tiers byte for byte.
func TestTiersRoundTrip(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 6, NumLayers: 1, NumKVHeads: 1,
		HeadDim: 8, DType: Float32, NumThreads: 1})
	bpb, err := p.BytesPerBlock()
	ok(t, err)
	ok(t, p.AttachTiers(TierOptions{HostBytes: 3 * bpb, FileDir: t.TempDir(), FileBytes: 2 * bpb}))
	wantErr(t, p.AttachTiers(TierOptions{HostBytes: 3 * bpb}), ErrInvalidState)
	kt, err := p.KVTensor(0, Key)
	ok(t, err)
	keys, err := kt.Float32s()
	ok(t, err)
	tokens := make([]int32, 17)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	step := func(s Seq, n int, seed float32) {
		b, err := p.Prepare([]Seq{s}, []int{n})
		ok(t, err)
		k := make([]float32, n*8)
		v := make([]float32, n*8)
		for i := range k {
			k[i] = seed + float32(i)*0.25
			v[i] = -k[i]
		}
		ok(t, b.CacheWrite(0, k, v))
		b.Close()
	}
	a, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, a.Append(tokens))
	step(a, 17, 1)
	table, err := a.BlockTable()
	ok(t, err)
	saved := make([][]float32, 4)
	for j := 0; j < 4; j++ {
		saved[j] = append([]float32(nil), keys[table[j]*32:(table[j]+1)*32]...)
	}
	ok(t, a.Free())
	other, err := p.CreateSeq(nil)
	ok(t, err)
	more := make([]int32, 20)
	for i := range more {
		more[i] = int32(1000 + i)
	}
	ok(t, other.Append(more))
	step(other, 20, 500)
	ok(t, other.Free())
	ok(t, p.FlushTiers())
	hs, err := p.TierStats(MediumHost)
	ok(t, err)
	fs, err := p.TierStats(MediumFile)
	ok(t, err)
	if hs.NumStored != 4 || hs.NumBlocks != 3 || fs.NumStored != 1 {
		t.Fatalf("host %+v file %+v", hs, fs)
	}
	c, err := p.CreateSeq(nil)
	ok(t, err)
	m, err := c.MatchPrefixTiered(tokens)
	ok(t, err)
	if m != (TierMatch{NumCached: 16, HostTokens: 12, FileTokens: 4}) {
		t.Fatalf("match %+v", m)
	}
	ok(t, p.FlushTiers()) // runs the loads
	table, err = c.BlockTable()
	ok(t, err)
	for j := 0; j < 4; j++ {
		got := keys[table[j]*32 : (table[j]+1)*32]
		for i := range got {
			if got[i] != saved[j][i] {
				t.Fatalf("block %d element %d: %v != %v", j, i, got[i], saved[j][i])
			}
		}
	}
	_, err = p.TierStats(MediumDevice)
	wantErr(t, err, ErrInvalidArgument)
	ok(t, p.Validate())
}
