package pagedkv

import (
	"math"
	"math/rand"
	"testing"
)

// MLA pools: latent page layout, the latent cache write committing the
// step, and absorbed attention over prefill, chunked prefill and decode
// against a float64 reference over the latents written (random, never 0).
func TestMLAStepsMatchFloat64(t *testing.T) {
	const layers, rank, rope, heads, bs = 2, 32, 8, 16, 4
	const scale = float32(0.15)
	p := newPool(t, PoolOptions{BlockSize: bs, NumBlocks: 40, NumLayers: layers, DType: Float32,
		NumThreads: 2, KVLayout: LayoutMLA, KVLoRARank: rank, QKRopeHeadDim: rope})
	o := p.Options()
	if o.KVLayout != LayoutMLA || o.NumKVHeads != 1 || o.HeadDim != rank+rope {
		t.Fatalf("options %+v", o)
	}
	bpb, err := p.BytesPerBlock()
	ok(t, err)
	if bpb != layers*bs*(rank+rope)*4 {
		t.Fatalf("bytes per block %d", bpb)
	}
	r := rand.New(rand.NewSource(3))
	val := func() float32 {
		for {
			if x := r.Float32()*2 - 1; math.Abs(float64(x)) > 1e-3 {
				return x
			}
		}
	}
	a, err := p.CreateSeq(nil)
	ok(t, err)
	b, err := p.CreateSeq(nil)
	ok(t, err)
	rows := map[Seq][][]float64{} // per seq: per layer, [pos*(rank+rope)]
	rows[a] = make([][]float64, layers)
	rows[b] = make([][]float64, layers)
	type step struct{ appendA, appendB int }
	for _, st := range []step{{9, 3}, {1, 4}, {1, 1}} {
		ok(t, a.Append(randTokens(r, st.appendA)))
		ok(t, b.Append(randTokens(r, st.appendB)))
		batch, err := p.Prepare([]Seq{a, b}, []int{st.appendA, st.appendB})
		ok(t, err)
		n := batch.NumTokens()
		counts := []int{st.appendA, st.appendB}
		for l := 0; l < layers; l++ {
			kvC := make([]float32, n*rank)
			kPe := make([]float32, n*rope)
			row := 0
			for si, s := range []Seq{a, b} {
				for i := 0; i < counts[si]; i++ {
					for d := 0; d < rank+rope; d++ {
						x := val()
						if d < rank {
							kvC[row*rank+d] = x
						} else {
							kPe[row*rope+d-rank] = x
						}
						rows[s][l] = append(rows[s][l], float64(x))
					}
					row++
				}
			}
			ok(t, batch.MLACacheWrite(l, kvC, kPe))
			ql := make([]float32, n*heads*rank)
			qp := make([]float32, n*heads*rope)
			for i := range ql {
				ql[i] = val()
			}
			for i := range qp {
				qp[i] = val()
			}
			out := make([]float32, len(ql))
			lse := make([]float32, n*heads)
			ok(t, batch.MLAAttention(l, ql, qp, out, lse, scale))
			row = 0
			for si, s := range []Seq{a, b} {
				all := rows[s][l]
				total := len(all) / (rank + rope)
				for i := 0; i < counts[si]; i++ {
					pos := total - counts[si] + i
					for h := 0; h < heads; h++ {
						q := (row*heads + h)
						x := make([]float64, pos+1)
						m := math.Inf(-1)
						for k := 0; k <= pos; k++ {
							dot := 0.0
							for d := 0; d < rank; d++ {
								dot += float64(ql[q*rank+d]) * all[k*(rank+rope)+d]
							}
							for d := 0; d < rope; d++ {
								dot += float64(qp[q*rope+d]) * all[k*(rank+rope)+rank+d]
							}
							x[k] = float64(scale) * dot
							m = math.Max(m, x[k])
						}
						sum := 0.0
						for k := range x {
							x[k] = math.Exp(x[k] - m)
							sum += x[k]
						}
						for d := 0; d < rank; d++ {
							want := 0.0
							for k := 0; k <= pos; k++ {
								want += x[k] / sum * all[k*(rank+rope)+d]
							}
							if got := float64(out[q*rank+d]); math.Abs(got-want) > 2e-5+1e-4*math.Abs(want) {
								t.Fatalf("layer %d seq %d query %d head %d dim %d: %v, want %v", l, si, i, h, d, got, want)
							}
						}
						if wantL := m + math.Log(sum); math.Abs(float64(lse[q])-wantL) > 1e-4+1e-5*math.Abs(wantL) {
							t.Fatalf("lse %v, want %v", lse[q], wantL)
						}
					}
					row++
				}
			}
		}
		info, err := a.Info()
		ok(t, err)
		if info.NumComputedTokens != info.NumTokens {
			t.Fatalf("step not committed: %+v", info)
		}
		ok(t, batch.Close())
	}
}

func TestMLAWrongCalls(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 8, NumLayers: 1, DType: Float32,
		KVLayout: LayoutMLA, KVLoRARank: 16, QKRopeHeadDim: 4})
	s, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append([]int32{1, 2}))
	b, err := p.Prepare([]Seq{s}, []int{2})
	ok(t, err)
	defer b.Close()
	wantErr(t, b.CacheWrite(0, make([]float32, 2*20), make([]float32, 2*20)), ErrInvalidState)
	wantErr(t, b.MLACacheWrite(0, make([]float32, 2*15), make([]float32, 2*4)), ErrInvalidArgument)
	ok(t, b.MLACacheWrite(0, make([]float32, 2*16), make([]float32, 2*4)))
	wantErr(t, b.MLAAttention(0, make([]float32, 2*16), make([]float32, 2*4), make([]float32, 2*16), nil, 0),
		ErrInvalidArgument)
	_, err = NewPool(&PoolOptions{BlockSize: 4, NumBlocks: 8, NumLayers: 1, DType: Float32,
		KVLayout: LayoutMLA, KVLoRARank: 16, NumKVHeads: 2})
	wantErr(t, err, ErrInvalidArgument)

	m := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 8, NumLayers: 1, NumKVHeads: 1, HeadDim: 20, DType: Float32})
	ms, err := m.CreateSeq(nil)
	ok(t, err)
	ok(t, ms.Append([]int32{1}))
	mb, err := m.Prepare([]Seq{ms}, []int{1})
	ok(t, err)
	defer mb.Close()
	wantErr(t, mb.MLACacheWrite(0, make([]float32, 16), make([]float32, 4)), ErrInvalidState)
}
