package pagedkv

import (
	"math/rand"
	"testing"
)

// Benchmarks of the binding's per-call cost (go test -bench . -run ^$);
// never run by ctest.

func BenchmarkStats(b *testing.B) {
	p := managerPool(b, 64)
	for i := 0; i < b.N; i++ {
		if _, err := p.Stats(); err != nil {
			b.Fatal(err)
		}
	}
}

// One decode step of one sequence: append a token, roll it back.
func BenchmarkAppendTruncate(b *testing.B) {
	p := newPool(b, PoolOptions{BlockSize: 16, NumBlocks: 64})
	s := seqOf(b, p, make([]int32, 8))
	tok := []int32{1}
	for i := 0; i < b.N; i++ {
		if err := s.Append(tok); err != nil {
			b.Fatal(err)
		}
		if err := s.Truncate(8); err != nil {
			b.Fatal(err)
		}
	}
}

// A failing call: the message copy is the binding's extra cost.
func BenchmarkFailingCall(b *testing.B) {
	p := managerPool(b, 8)
	s := p.Seq(12345)
	for i := 0; i < b.N; i++ {
		if _, err := s.Info(); err == nil {
			b.Fatal("no error")
		}
	}
}

func BenchmarkHashPrefix4k(b *testing.B) {
	toks := randTokens(rand.New(rand.NewSource(1)), 4096)
	b.SetBytes(4096 * 4)
	for i := 0; i < b.N; i++ {
		if _, err := HashPrefix(nil, toks); err != nil {
			b.Fatal(err)
		}
	}
}

// Decode attention for 32 sequences of 512 tokens, f32, 8 q / 2 kv heads.
func BenchmarkDecodeAttention(b *testing.B) {
	p := newPool(b, PoolOptions{BlockSize: 16, NumBlocks: 1100, NumLayers: 1, NumKVHeads: 2,
		HeadDim: 128, DType: Float32})
	var seqs []Seq
	var counts []int
	for i := 0; i < 32; i++ {
		seqs = append(seqs, seqOf(b, p, make([]int32, 512)))
		counts = append(counts, 1)
	}
	batch, err := p.Prepare(seqs, counts)
	ok(b, err)
	defer batch.Close()
	q := make([]float32, 32*8*128)
	out := make([]float32, len(q))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := batch.Attention(0, q, out, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
}
