package pagedkv

import (
	"fmt"
	"math"
	"math/rand"
	"testing"
)

// refSeq is one sequence's K and V as written, for the float64 reference:
// k[pos][head][dim], rounded to the pool's dtype.
type refSeq struct {
	seq  Seq
	k, v [][]float64
}

type attnCase struct {
	dtype         DType
	qHeads        int
	kvHeads       int
	headDim       int
	blockSize     uint32
	scale         float32
	window        uint32
	softcap       float32
	withLSE       bool
	atol, rtol    float64
	narrow        func(float32) uint16
	widen         func(uint16) float32
	decodeSteps   int
	sharedPrefix  bool
	poisonPattern uint16
}

func (c attnCase) String() string {
	return fmt.Sprintf("%v_q%d_kv%d_d%d_bs%d_w%d_cap%v", c.dtype, c.qHeads, c.kvHeads, c.headDim,
		c.blockSize, c.window, c.softcap)
}

// round gives the value a float32 takes once stored in the case's dtype.
func (c *attnCase) round(f float32) float64 {
	if c.dtype == Float32 {
		return float64(f)
	}
	return float64(c.widen(c.narrow(f)))
}

func TestAttentionMatchesFloat64Reference(t *testing.T) {
	cases := []attnCase{
		{dtype: Float32, qHeads: 4, kvHeads: 2, headDim: 64, blockSize: 16, atol: 2e-5, rtol: 1e-4,
			withLSE: true, decodeSteps: 3, sharedPrefix: true},
		{dtype: Float32, qHeads: 2, kvHeads: 2, headDim: 128, blockSize: 8, scale: 0.3, window: 13,
			softcap: 5, atol: 2e-5, rtol: 1e-4, withLSE: true, decodeSteps: 2},
		{dtype: Float32, qHeads: 8, kvHeads: 1, headDim: 80, blockSize: 32, scale: 0.2, softcap: 3,
			atol: 2e-5, rtol: 1e-4, withLSE: true, decodeSteps: 2},
		{dtype: BFloat16, qHeads: 4, kvHeads: 2, headDim: 64, blockSize: 16, atol: 2e-2, rtol: 2e-2,
			withLSE: true, narrow: Float32ToBF16, widen: BF16ToFloat32, decodeSteps: 2,
			sharedPrefix: true, poisonPattern: 0x7fc0},
		{dtype: Float16, qHeads: 4, kvHeads: 4, headDim: 64, blockSize: 16, window: 20, atol: 3e-3,
			rtol: 3e-3, narrow: Float32ToF16, widen: F16ToFloat32, decodeSteps: 2,
			poisonPattern: 0x7e00},
	}
	for _, c := range cases {
		c := c
		t.Run(c.String(), func(t *testing.T) {
			if c.dtype == BFloat16 && !SupportedFeatures().Has(FeatureBF16) {
				t.Skip("library built without bf16")
			}
			runAttentionCase(t, &c)
		})
	}
}

func runAttentionCase(t *testing.T, c *attnCase) {
	r := rand.New(rand.NewSource(int64(c.headDim)*31 + int64(c.qHeads)))
	p := newPool(t, PoolOptions{BlockSize: c.blockSize, NumBlocks: 64, NumLayers: 2,
		NumKVHeads: uint32(c.kvHeads), HeadDim: uint32(c.headDim), DType: c.dtype, NumThreads: 2})
	poison(t, p, c)

	// Scatter the free queue so block tables are not in id order: allocate
	// a few throwaway sequences of random sizes and free them in random
	// order.
	var junk []Seq
	for i := 0; i < 5; i++ {
		junk = append(junk, seqOf(t, p, randTokens(r, 1+r.Intn(int(c.blockSize)*3))))
	}
	r.Shuffle(len(junk), func(i, j int) { junk[i], junk[j] = junk[j], junk[i] })
	for _, s := range junk {
		ok(t, s.Free())
	}
	ok(t, p.ResetPrefixCache())

	// Prompts: three sequences of different lengths (one shorter than a
	// block, the others with partial last pages) prefilled in one step;
	// with sharedPrefix a fourth sequence reuses the first one's cached
	// blocks and prefills only the rest, in a second step.
	lens := []int{3, int(c.blockSize)*2 + 5, int(c.blockSize)*3 + 1}
	prompts := make([][]int32, len(lens))
	seqs := make([]*refSeq, len(lens))
	for i, n := range lens {
		prompts[i] = randTokens(r, n)
		s, err := p.CreateSeq(nil)
		ok(t, err)
		seqs[i] = &refSeq{seq: s}
	}
	// Interleave the appends so the sequences' blocks interleave too.
	for pos := 0; pos < lens[2]; pos += int(c.blockSize) / 2 {
		for i := range seqs {
			lo, hi := pos, pos+int(c.blockSize)/2
			if lo >= lens[i] {
				continue
			}
			if hi > lens[i] {
				hi = lens[i]
			}
			ok(t, seqs[i].seq.Append(prompts[i][lo:hi]))
		}
	}
	step(t, c, r, p, seqs, lens)

	if c.sharedPrefix {
		extra := randTokens(r, 7)
		tokens := append(append([]int32(nil), prompts[2]...), extra...)
		s, err := p.CreateSeq(nil)
		ok(t, err)
		cached, err := s.MatchPrefix(tokens)
		ok(t, err)
		if cached != 3*int(c.blockSize) {
			t.Fatalf("prefix hit of %d tokens", cached)
		}
		ok(t, s.Append(tokens[cached:]))
		rs := &refSeq{seq: s, k: seqs[2].k[:cached:cached], v: seqs[2].v[:cached:cached]}
		seqs = append(seqs, rs)
		step(t, c, r, p, []*refSeq{rs, seqs[0]}, []int{len(tokens) - cached, 0})
	}
	for d := 0; d < c.decodeSteps; d++ {
		counts := make([]int, len(seqs))
		for i, s := range seqs {
			ok(t, s.seq.Append(randTokens(r, 1)))
			counts[i] = 1
		}
		step(t, c, r, p, seqs, counts)
	}
	ok(t, p.Validate())
}

// poison fills every slot of storage with NaN, so a kernel reading a slot
// that holds no token of its sequence produces NaN.
func poison(t *testing.T, p *Pool, c *attnCase) {
	for layer := 0; layer < 2; layer++ {
		for _, w := range []KVKind{Key, Value} {
			kt, err := p.KVTensor(layer, w)
			ok(t, err)
			if c.dtype == Float32 {
				v, err := kt.Float32s()
				ok(t, err)
				for i := range v {
					v[i] = float32(math.NaN())
				}
			} else {
				v, err := kt.Uint16s()
				ok(t, err)
				for i := range v {
					v[i] = c.poisonPattern
				}
			}
		}
	}
}

// step runs one plan over seqs with counts[i] queries each (0 = the
// sequence is not scheduled): writes fresh random K/V for the new tokens in
// both layers, attends, and checks every output element against the
// float64 reference.
func step(t *testing.T, c *attnCase, r *rand.Rand, p *Pool, seqs []*refSeq, counts []int) {
	t.Helper()
	var sched []*refSeq
	var qc []int
	var list []Seq
	for i, s := range seqs {
		if counts[i] > 0 {
			sched = append(sched, s)
			qc = append(qc, counts[i])
			list = append(list, s.seq)
		}
	}
	batch, err := p.Prepare(list, qc)
	ok(t, err)
	defer batch.Close()
	n := batch.NumTokens()
	kvw, qw := c.kvHeads*c.headDim, c.qHeads*c.headDim
	rows := make([][]float32, 3) // k, v, q of the step
	for i := range rows {
		w := kvw
		if i == 2 {
			w = qw
		}
		rows[i] = make([]float32, n*w)
		for j := range rows[i] {
			rows[i][j] = float32(r.NormFloat64())
		}
	}
	// Layer 1 gets the data checked; layer 0 gets different data, so a
	// kernel mixing up layers fails.
	for layer := 0; layer < 2; layer++ {
		k, v := rows[0], rows[1]
		if layer == 0 {
			k, v = rows[1], rows[0]
		}
		if c.dtype == Float32 {
			ok(t, batch.CacheWrite(layer, k, v))
		} else {
			ok(t, batch.CacheWrite16(layer, mapSlice(k, c.narrow), mapSlice(v, c.narrow)))
		}
	}
	// Record the new K/V in the reference (rounded as stored).
	row := 0
	for i, s := range sched {
		for j := 0; j < qc[i]; j++ {
			kr, vr := make([]float64, kvw), make([]float64, kvw)
			for e := 0; e < kvw; e++ {
				kr[e] = c.round(rows[0][row*kvw+e])
				vr[e] = c.round(rows[1][row*kvw+e])
			}
			s.k, s.v = append(s.k, kr), append(s.v, vr)
			row++
		}
	}
	var lse []float32
	if c.withLSE {
		lse = make([]float32, n*c.qHeads)
		for i := range lse {
			lse[i] = float32(math.NaN())
		}
	}
	params := &AttentionParams{SoftmaxScale: c.scale, SlidingWindow: c.window, LogitSoftcap: c.softcap}
	out := make([]float64, n*qw)
	if c.dtype == Float32 {
		o := make([]float32, n*qw)
		ok(t, batch.Attention(1, rows[2], o, lse, params))
		for i := range o {
			out[i] = float64(o[i])
		}
	} else {
		o := make([]uint16, n*qw)
		ok(t, batch.Attention16(1, mapSlice(rows[2], c.narrow), o, lse, params))
		for i := range o {
			out[i] = float64(c.widen(o[i]))
		}
	}

	scale := float64(c.scale)
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(c.headDim))
	}
	group := c.qHeads / c.kvHeads
	row = 0
	for i, s := range sched {
		ctx := len(s.k)
		for j := 0; j < qc[i]; j++ {
			pos := ctx - qc[i] + j
			lo := 0
			if c.window > 0 && pos-int(c.window)+1 > lo {
				lo = pos - int(c.window) + 1
			}
			for h := 0; h < c.qHeads; h++ {
				kh := h / group
				q := rows[2][(row*c.qHeads+h)*c.headDim : (row*c.qHeads+h+1)*c.headDim]
				logits := make([]float64, pos+1-lo)
				m := math.Inf(-1)
				for tk := lo; tk <= pos; tk++ {
					var dot float64
					kvec := s.k[tk][kh*c.headDim : (kh+1)*c.headDim]
					for d, x := range q {
						dot += c.round(x) * kvec[d]
					}
					l := dot * scale
					if c.softcap > 0 {
						l = float64(c.softcap) * math.Tanh(l/float64(c.softcap))
					}
					logits[tk-lo] = l
					m = math.Max(m, l)
				}
				var sum float64
				for _, l := range logits {
					sum += math.Exp(l - m)
				}
				for d := 0; d < c.headDim; d++ {
					var acc float64
					for tk := lo; tk <= pos; tk++ {
						acc += math.Exp(logits[tk-lo]-m) * s.v[tk][kh*c.headDim+d]
					}
					want := acc / sum
					got := out[(row*c.qHeads+h)*c.headDim+d]
					if !(math.Abs(got-want) <= c.atol+c.rtol*math.Abs(want)) {
						t.Fatalf("seq %d query %d (pos %d) head %d dim %d: got %v want %v",
							i, j, pos, h, d, got, want)
					}
				}
				if c.withLSE {
					want := m + math.Log(sum)
					got := float64(lse[row*c.qHeads+h])
					if !(math.Abs(got-want) <= 1e-3+1e-4*math.Abs(want)) {
						t.Fatalf("lse seq %d query %d head %d: got %v want %v", i, j, h, got, want)
					}
				}
			}
			row++
		}
	}
}

func mapSlice(src []float32, f func(float32) uint16) []uint16 {
	out := make([]uint16, len(src))
	for i, x := range src {
		out[i] = f(x)
	}
	return out
}

// The window's edge as batch.h pins it: a query at p sees p - w < k <= p.
func TestSlidingWindowSeesExactlyWKeys(t *testing.T) {
	for _, w := range []int{1, 2, 5, 13} {
		if n := windowKeysSeen(t, w); n != w {
			t.Fatalf("sliding_window %d: a query sees %d keys", w, n)
		}
	}
}

// windowKeysSeen measures how many keys a late query sees with a sliding
// window w: with zero queries every visible key weighs the same, and value
// k of key k makes the output the mean of the visible positions.
func windowKeysSeen(t *testing.T, w int) int {
	p := newPool(t, PoolOptions{BlockSize: 16, NumBlocks: 4, NumLayers: 1, NumKVHeads: 1,
		HeadDim: 64, DType: Float32, NumThreads: 1})
	const n = 20
	s := seqOf(t, p, make([]int32, n))
	b, err := p.Prepare([]Seq{s}, []int{n})
	ok(t, err)
	defer b.Close()
	k, v := make([]float32, n*64), make([]float32, n*64)
	for i := 0; i < n; i++ {
		v[i*64] = float32(i)
	}
	ok(t, b.CacheWrite(0, k, v))
	out := make([]float32, n*64)
	ok(t, b.Attention(0, make([]float32, n*64), out, nil,
		&AttentionParams{SlidingWindow: uint32(w)}))
	// Keys lo..n-1 have mean (lo+n-1)/2.
	lo := int(math.Round(float64(2*out[(n-1)*64]))) - (n - 1)
	return n - lo
}
