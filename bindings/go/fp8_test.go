package pagedkv

import (
	"math"
	"math/rand"
	"strings"
	"testing"
)

// fp8Value is the value of an FP8 code from the format's fields.
func fp8Value(d DType, c uint8) float64 {
	mbits, bias := 3, 7
	if d == Float8E5M2 {
		mbits, bias = 2, 15
	}
	sign := 1.0
	if c&0x80 != 0 {
		sign = -1
	}
	e, m := int(c&0x7f)>>mbits, float64(int(c)&(1<<mbits-1))
	if d == Float8E4M3 && c&0x7f == 0x7f {
		return math.NaN()
	}
	if d == Float8E5M2 && e == 31 {
		if m != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	if e == 0 {
		return sign * math.Ldexp(m/float64(int(1)<<mbits), 1-bias)
	}
	return sign * math.Ldexp(1+m/float64(int(1)<<mbits), e-bias)
}

// fp8Encode is the nearest finite code to x, ties to the even code,
// saturating: the library's documented encoding, by search.
func fp8Encode(d DType, x float64) uint8 {
	top := uint8(0x7e)
	if d == Float8E5M2 {
		top = 0x7b
	}
	var sign uint8
	if math.Signbit(x) {
		sign = 0x80
	}
	ax := math.Abs(x)
	best := uint8(0)
	for c := uint8(1); c <= top; c++ {
		db, dc := math.Abs(fp8Value(d, best)-ax), math.Abs(fp8Value(d, c)-ax)
		if dc < db || (dc == db && c%2 == 0) {
			best = c
		}
	}
	return sign | best
}

func TestFP8ScalesAndErrors(t *testing.T) {
	p := newPool(t, PoolOptions{NumBlocks: 16, BlockSize: 8, NumLayers: 2, NumKVHeads: 2, HeadDim: 64,
		DType: Float8E4M3, NumThreads: 1, KScales: []float32{0.5, 0.25}, VScales: []float32{2, 4}})
	if p.Options().DType != Float8E4M3 || p.Options().KVScaleGranularity != KVScalePerTensor {
		t.Fatalf("options %+v", p.Options())
	}
	k, v, err := p.KVScales()
	ok(t, err)
	if len(k) != 2 || k[0] != 0.5 || k[1] != 0.25 || v[0] != 2 || v[1] != 4 {
		t.Fatalf("scales %v %v", k, v)
	}
	ok(t, p.SetKVScales([]float32{3, 5}, []float32{7, 9}))
	for _, bad := range []float32{0, -1, float32(math.NaN()), float32(math.Inf(1))} {
		e := wantErr(t, p.SetKVScales([]float32{1, bad}, []float32{1, 1}), ErrInvalidArgument)
		if !strings.HasPrefix(e.Msg, "k[1] ") {
			t.Fatalf("message %q", e.Msg)
		}
	}
	wantErr(t, p.SetKVScales([]float32{1}, []float32{1, 1}), ErrInvalidArgument)
	wantErr(t, p.SetKVScales([]float32{1, 1, 1}, []float32{1, 1, 1}), ErrInvalidArgument)
	k, v, err = p.KVScales()
	ok(t, err)
	if k[1] != 5 || v[0] != 7 {
		t.Fatalf("a failed call changed the scales: %v %v", k, v)
	}
	b := newPool(t, PoolOptions{NumBlocks: 16, BlockSize: 8, NumLayers: 2, NumKVHeads: 2, HeadDim: 64,
		DType: BFloat16, NumThreads: 1})
	_, _, err = b.KVScales()
	wantErr(t, err, ErrInvalidState)
	nf, _ := p.BytesPerBlock()
	nb, _ := b.BytesPerBlock()
	if 2*nf != nb {
		t.Fatalf("fp8 %d bytes per block, bf16 %d", nf, nb)
	}
	h := newPool(t, PoolOptions{NumBlocks: 8, NumLayers: 2, NumKVHeads: 2, HeadDim: 64,
		DType: Float8E5M2, KVScaleGranularity: KVScalePerHead})
	k, _, err = h.KVScales()
	ok(t, err)
	if len(k) != 4 || k[3] != 1 {
		t.Fatalf("per-head default scales %v", k)
	}
	_, err = NewPool(&PoolOptions{NumBlocks: 8, NumLayers: 2, NumKVHeads: 2, HeadDim: 64,
		DType: Float8E5M2, KScales: []float32{1}, VScales: []float32{1}})
	wantErr(t, err, ErrInvalidArgument)
	_, err = NewPool(&PoolOptions{NumBlocks: 8, NumLayers: 2, NumKVHeads: 2, HeadDim: 64,
		DType: Float8E5M2, KScales: []float32{1, 1}, VScales: []float32{1}})
	wantErr(t, err, ErrInvalidArgument)
}

func TestFP8WriteAndAttention(t *testing.T) {
	for _, dt := range []DType{Float8E4M3, Float8E5M2} {
		const n, hkv, hq, d, bs = 11, 2, 4, 64, 8
		fmax := float32(448)
		if dt == Float8E5M2 {
			fmax = 57344
		}
		// The second layer's V scale makes some values saturate.
		ks := []float32{1.5 / fmax, 1.2 / fmax}
		vs := []float32{1.3 / fmax, 0.3 / fmax}
		p := newPool(t, PoolOptions{NumBlocks: 16, BlockSize: bs, NumLayers: 2, NumKVHeads: hkv,
			HeadDim: d, DType: dt, NumThreads: 1, KScales: ks, VScales: vs})
		s, err := p.CreateSeq(nil)
		ok(t, err)
		r := rand.New(rand.NewSource(int64(dt)))
		ok(t, s.Append(randTokens(r, n)))
		nz := func() float32 {
			x := float32(0.05 + 0.95*r.Float64())
			if r.Intn(2) == 0 {
				return -x
			}
			return x
		}
		fill := func(m int) []float32 {
			out := make([]float32, m)
			for i := range out {
				out[i] = nz()
			}
			return out
		}
		k, v, q := fill(n*hkv*d), fill(n*hkv*d), fill(n*hq*d)
		out := make([]float32, len(q))
		batch, err := p.Prepare([]Seq{s}, []int{n})
		ok(t, err)
		for l := 0; l < 2; l++ {
			ok(t, batch.CacheWrite(l, k, v))
		}
		const layer = 1
		ok(t, batch.Attention(layer, q, out, nil, nil))
		ok(t, batch.Close())
		table, err := s.BlockTable()
		ok(t, err)
		bpb, err := p.BytesPerBlock()
		ok(t, err)
		host := make([]byte, int(bpb)*len(table))
		ok(t, p.SwapBlocks(table, host, SwapOut))
		plane := int(bpb) / 4 // [layer][K,V] planes of one block
		kd, vd := make([]float64, n*hkv*d), make([]float64, n*hkv*d)
		for bi := range table {
			for w, src := range [][]float32{k, v} {
				sc := []float32{ks[layer], vs[layer]}[w]
				dst := [][]float64{kd, vd}[w]
				base := bi*int(bpb) + (layer*2+w)*plane
				for h := 0; h < hkv; h++ {
					for slot := 0; slot < bs && bi*bs+slot < n; slot++ {
						pos := bi*bs + slot
						for e := 0; e < d; e++ {
							c := host[base+(h*bs+slot)*d+e]
							x := src[(pos*hkv+h)*d+e]
							if want := fp8Encode(dt, float64(x/sc)); c != want {
								t.Fatalf("%v code at pos %d head %d dim %d: %#x, want %#x", dt, pos, h, e, c, want)
							}
							dst[(pos*hkv+h)*d+e] = fp8Value(dt, c) * float64(sc)
						}
					}
				}
			}
		}
		scale := 1 / math.Sqrt(d)
		for i := 0; i < n; i++ {
			for h := 0; h < hq; h++ {
				kh := h / (hq / hkv)
				w := make([]float64, i+1)
				mx := math.Inf(-1)
				for j := 0; j <= i; j++ {
					for e := 0; e < d; e++ {
						w[j] += float64(q[(i*hq+h)*d+e]) * kd[(j*hkv+kh)*d+e]
					}
					w[j] *= scale
					mx = math.Max(mx, w[j])
				}
				sum := 0.0
				for j := range w {
					w[j] = math.Exp(w[j] - mx)
					sum += w[j]
				}
				for e := 0; e < d; e++ {
					ref := 0.0
					for j := 0; j <= i; j++ {
						ref += w[j] / sum * vd[(j*hkv+kh)*d+e]
					}
					got := float64(out[(i*hq+h)*d+e])
					if math.Abs(got-ref) > 2e-5+1e-4*math.Abs(ref) {
						t.Fatalf("%v out[%d, %d, %d] = %v, reference %v", dt, i, h, e, got, ref)
					}
				}
			}
		}
		kt, err := p.KVTensor(layer, Value)
		ok(t, err)
		codes, err := kt.Codes()
		ok(t, err)
		if kt.DType != dt || len(codes) != int(p.Options().NumBlocks)*hkv*bs*d {
			t.Fatalf("KVTensor %v, %d codes", kt.DType, len(codes))
		}
	}
}
