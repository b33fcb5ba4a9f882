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

// AdmitTiered and MatchPrefixHashesTiered take host and file tier hits, whose
// bytes the next plan loads back exactly; another tenant's salt finds none.
func TestTiersAdmitAndHashLookup(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 6, NumLayers: 1, NumKVHeads: 1,
		HeadDim: 8, DType: Float32, NumThreads: 1})
	bpb, err := p.BytesPerBlock()
	ok(t, err)
	ok(t, p.AttachTiers(TierOptions{HostBytes: 3 * bpb, FileDir: t.TempDir(), FileBytes: 2 * bpb}))
	kt, err := p.KVTensor(0, Key)
	ok(t, err)
	keys, err := kt.Float32s()
	ok(t, err)
	tokens := make([]int32, 17)
	for i := range tokens {
		tokens[i] = int32(5*i + 2)
	}
	a, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, a.Append(tokens))
	b, err := p.Prepare([]Seq{a}, []int{17})
	ok(t, err)
	k := make([]float32, 17*8)
	for i := range k {
		k[i] = 0.5 + float32(i)*0.125
	}
	ok(t, b.CacheWrite(0, k, k))
	b.Close()
	hashes, err := a.BlockHashes()
	ok(t, err)
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
	ok(t, other.Append(more)) // evicts a's blocks (other stays unwritten)
	ok(t, other.Free())
	ok(t, p.FlushTiers())

	// Another tenant: no hit anywhere, with or without its own hashes.
	salted, m, err := p.AdmitTiered(&SeqOptions{CacheSalt: "tenant-b"}, tokens, nil, 0)
	ok(t, err)
	if m.NumCached != 0 {
		t.Fatalf("salted match %+v", m)
	}
	ok(t, salted.Free())
	_, _, err = p.AdmitTiered(&SeqOptions{CacheSalt: "tenant-b"}, tokens, hashes, 0)
	wantErr(t, err, ErrInvalidArgument)
	_, _, err = p.AdmitTiered(nil, tokens, nil, 8) // does not fit: nothing taken
	wantErr(t, err, ErrOutOfBlocks)

	c, m, err := p.AdmitTiered(nil, tokens, hashes, 0)
	ok(t, err)
	if m != (TierMatch{NumCached: 16, HostTokens: 12, FileTokens: 4}) {
		t.Fatalf("admit %+v", m)
	}
	ok(t, p.FlushTiers()) // runs the loads
	check := func(s Seq) {
		table, err := s.BlockTable()
		ok(t, err)
		for j := 0; j < 4; j++ {
			got := keys[table[j]*32 : (table[j]+1)*32]
			for i := range got {
				if got[i] != saved[j][i] {
					t.Fatalf("block %d element %d: %v != %v", j, i, got[i], saved[j][i])
				}
			}
		}
	}
	check(c)
	info, err := c.Info()
	ok(t, err)
	if info.NumComputedTokens != 16 {
		t.Fatalf("computed %d", info.NumComputedTokens)
	}
	ok(t, c.Free())
	// Loaded blocks are device hits now, through the hash lookup too.
	d, err := p.CreateSeq(nil)
	ok(t, err)
	m, err = d.MatchPrefixHashesTiered(tokens, hashes)
	ok(t, err)
	if m != (TierMatch{NumCached: 16, DeviceTokens: 16}) {
		t.Fatalf("hash lookup %+v", m)
	}
	check(d)
	hs, err := p.TierStats(MediumHost)
	ok(t, err)
	if hs.NumLoaded != 3 || hs.NumChecksumFailures != 0 {
		t.Fatalf("host %+v", hs)
	}
	ok(t, p.Validate())
}

// HostBytes 0 with a file tier: no host tier; blocks go straight to the file
// in one pass and come back byte for byte.
func TestFileTierAlone(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 6, NumLayers: 1, NumKVHeads: 1,
		HeadDim: 8, DType: Float32, NumThreads: 1})
	bpb, err := p.BytesPerBlock()
	ok(t, err)
	ok(t, p.AttachTiers(TierOptions{HostBytes: 0, FileDir: t.TempDir(), FileBytes: 4 * bpb}))
	kt, err := p.KVTensor(0, Key)
	ok(t, err)
	keys, err := kt.Float32s()
	ok(t, err)
	tokens := make([]int32, 17)
	for i := range tokens {
		tokens[i] = int32(9*i + 1)
	}
	a, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, a.Append(tokens))
	b, err := p.Prepare([]Seq{a}, []int{17})
	ok(t, err)
	k := make([]float32, 17*8)
	for i := range k {
		k[i] = -2 + float32(i)*0.375
	}
	ok(t, b.CacheWrite(0, k, k))
	b.Close()
	table, err := a.BlockTable()
	ok(t, err)
	saved := append([]float32(nil), keys[table[0]*32:(table[0]+1)*32]...)
	ok(t, a.Free())
	other, err := p.CreateSeq(nil)
	ok(t, err)
	more := make([]int32, 20)
	for i := range more {
		more[i] = int32(3000 + i)
	}
	ok(t, other.Append(more))
	ok(t, other.Free())
	ok(t, p.FlushTiers())
	_, err = p.TierStats(MediumHost)
	wantErr(t, err, ErrInvalidState)
	c, m, err := p.AdmitTiered(nil, tokens, nil, 0)
	ok(t, err)
	if m != (TierMatch{NumCached: 16, FileTokens: 16}) {
		t.Fatalf("admit %+v", m)
	}
	ok(t, p.FlushTiers())
	table, err = c.BlockTable()
	ok(t, err)
	got := keys[table[0]*32 : (table[0]+1)*32]
	for i := range got {
		if got[i] != saved[i] {
			t.Fatalf("element %d: %v != %v", i, got[i], saved[i])
		}
	}
	fs, err := p.TierStats(MediumFile)
	ok(t, err)
	if fs.NumStored != 4 || fs.NumLoaded != 4 || fs.NumChecksumFailures != 0 {
		t.Fatalf("file %+v", fs)
	}
	ok(t, p.Validate())
}
