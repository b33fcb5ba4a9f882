// Command decode is an engine's decode loop on pagedkv with a tiny random
// transformer on the CPU: continuous batching of prefill chunks and decode
// tokens in one step plan, prefix caching across requests that share a
// system prompt, and preemption (free and recompute later) when the pool
// runs out of blocks.
//
// It checks itself: every request's greedy output must equal the output of
// the same request run alone in a pool of its own, so batching, chunking,
// prefix reuse and preemption change nothing but the cost.
package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand"
	"os"
	"time"

	"github.com/pagedkv/pagedkv-go"
)

const (
	vocab     = 256
	layers    = 2
	kvHeads   = 2
	qHeads    = 4
	headDim   = 64
	hidden    = qHeads * headDim
	blockSize = 16
)

// model is a causal transformer without norms or MLPs: embedding, then per
// layer q/k/v projections, paged attention, output projection, residual.
type model struct {
	embed          [][]float32 // [vocab][hidden]
	wq, wk, wv, wo [layers][]float32
}

func newModel(r *rand.Rand) *model {
	m := &model{embed: make([][]float32, vocab)}
	for i := range m.embed {
		m.embed[i] = randVec(r, hidden, 1)
	}
	s := float32(1 / math.Sqrt(hidden))
	for l := 0; l < layers; l++ {
		m.wq[l] = randVec(r, hidden*qHeads*headDim, s)
		m.wk[l] = randVec(r, hidden*kvHeads*headDim, s)
		m.wv[l] = randVec(r, hidden*kvHeads*headDim, s)
		m.wo[l] = randVec(r, qHeads*headDim*hidden, s)
	}
	return m
}

func randVec(r *rand.Rand, n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64()) * scale
	}
	return v
}

// matmul: x [rows][in] times w [in][out].
func matmul(x []float32, rows, in int, w []float32, out int) []float32 {
	y := make([]float32, rows*out)
	for r := 0; r < rows; r++ {
		yr := y[r*out : (r+1)*out]
		for i, xv := range x[r*in : (r+1)*in] {
			for o, wv := range w[i*out : (i+1)*out] {
				yr[o] += xv * wv
			}
		}
	}
	return y
}

type request struct {
	id       int
	prompt   []int32
	maxNew   int
	out      []int32
	seq      pagedkv.Seq
	active   bool
	computed int // tokens whose K/V is in the pool
}

func (q *request) tokens() []int32 { return append(append([]int32(nil), q.prompt...), q.out...) }
func (q *request) done() bool      { return len(q.out) >= q.maxNew }

type counters struct {
	steps, computedTokens, hitTokens, preemptions, generated int
	peakUsage                                                float64
}

type engine struct {
	m        *model
	pool     *pagedkv.Pool
	chunk    int // prefill tokens per sequence per step
	maxBatch int // running sequences
	waiting  []*request
	running  []*request
	c        counters
}

// admit moves waiting requests into the running set, attaching their cached
// prefix.
func (e *engine) admit() error {
	for len(e.waiting) > 0 && len(e.running) < e.maxBatch {
		q := e.waiting[0]
		seq, err := e.pool.CreateSeq(nil)
		if err != nil {
			return err
		}
		hit, err := seq.MatchPrefix(q.tokens())
		if err != nil {
			return err
		}
		q.seq, q.active, q.computed = seq, true, hit
		e.c.hitTokens += hit
		e.waiting = e.waiting[1:]
		e.running = append(e.running, q)
	}
	return nil
}

// preemptYoungest frees the most recently admitted request that has not
// been given tokens in this step and queues it for recomputation. (A
// request appended to in this step is never preempted: it is already part
// of this step's plan, whose prepare makes its new tokens count as
// computed.)
func (e *engine) preemptYoungest(keep *request, appended map[*request]bool) (bool, error) {
	for i := len(e.running) - 1; i >= 0; i-- {
		q := e.running[i]
		if q == keep || appended[q] {
			continue
		}
		if err := q.seq.Free(); err != nil {
			return false, err
		}
		q.active, q.computed = false, 0
		e.running = append(e.running[:i], e.running[i+1:]...)
		e.waiting = append([]*request{q}, e.waiting...)
		e.c.preemptions++
		return true, nil
	}
	return false, nil
}

// step runs one engine step over every running request.
func (e *engine) step() error {
	if err := e.admit(); err != nil {
		return err
	}
	type item struct {
		q    *request
		feed []int32
	}
	var items []item
	appended := map[*request]bool{}
	for _, q := range append([]*request(nil), e.running...) {
		if !q.active {
			continue // preempted earlier in this loop
		}
		all := q.tokens()
		end := q.computed + e.chunk
		if end > len(all) {
			end = len(all)
		}
		feed := all[q.computed:end]
		for {
			err := q.seq.Append(feed)
			if err == nil {
				appended[q] = true
				items = append(items, item{q, feed})
				break
			}
			if !errors.Is(err, pagedkv.ErrOutOfBlocks) {
				return err
			}
			ok, perr := e.preemptYoungest(q, appended)
			if perr != nil {
				return perr
			}
			if !ok {
				if len(items) == 0 {
					return fmt.Errorf("request %d does not fit in the pool alone", q.id)
				}
				break // q waits for the next step
			}
		}
	}
	seqs := make([]pagedkv.Seq, len(items))
	counts := make([]int, len(items))
	var rows []int32
	for i, it := range items {
		seqs[i], counts[i] = it.q.seq, len(it.feed)
		rows = append(rows, it.feed...)
	}
	b, err := e.pool.Prepare(seqs, counts)
	if err != nil {
		return err
	}
	defer b.Close()
	n := len(rows)
	h := make([]float32, 0, n*hidden)
	for _, tok := range rows {
		h = append(h, e.m.embed[tok]...)
	}
	attn := make([]float32, n*qHeads*headDim)
	for l := 0; l < layers; l++ {
		q := matmul(h, n, hidden, e.m.wq[l], qHeads*headDim)
		k := matmul(h, n, hidden, e.m.wk[l], kvHeads*headDim)
		v := matmul(h, n, hidden, e.m.wv[l], kvHeads*headDim)
		if err := b.CacheWrite(l, k, v); err != nil {
			return err
		}
		if err := b.Attention(l, q, attn, nil, nil); err != nil {
			return err
		}
		o := matmul(attn, n, qHeads*headDim, e.m.wo[l], hidden)
		for i := range h {
			h[i] += o[i]
		}
	}
	// Sample (greedily) for requests whose feed reached their last token.
	row := 0
	for _, it := range items {
		q := it.q
		q.computed += len(it.feed)
		row += len(it.feed)
		if q.computed == len(q.prompt)+len(q.out) {
			q.out = append(q.out, argmaxLogit(e.m, h[(row-1)*hidden:row*hidden]))
			e.c.generated++
		}
	}
	e.c.computedTokens += n
	e.c.steps++
	st, err := e.pool.Stats()
	if err != nil {
		return err
	}
	e.c.peakUsage = math.Max(e.c.peakUsage, st.Usage)
	// Finished requests leave; their full blocks stay cached for others.
	live := e.running[:0]
	for _, q := range e.running {
		if q.done() {
			if err := q.seq.Free(); err != nil {
				return err
			}
			q.active = false
		} else {
			live = append(live, q)
		}
	}
	e.running = live
	return nil
}

func argmaxLogit(m *model, h []float32) int32 {
	best, bestV := 0, float32(math.Inf(-1))
	for t, e := range m.embed {
		var s float32
		for i, x := range h {
			s += x * e[i]
		}
		if s > bestV {
			best, bestV = t, s
		}
	}
	return int32(best)
}

func runEngine(m *model, reqs []*request, numBlocks uint64, chunk, maxBatch int) (counters, error) {
	pool, err := pagedkv.NewPool(&pagedkv.PoolOptions{
		BlockSize: blockSize, NumBlocks: numBlocks, NumLayers: layers, NumKVHeads: kvHeads,
		HeadDim: headDim, DType: pagedkv.Float32, NumThreads: 2,
	})
	if err != nil {
		return counters{}, err
	}
	defer pool.Close()
	e := &engine{m: m, pool: pool, chunk: chunk, maxBatch: maxBatch, waiting: reqs}
	for len(e.waiting) > 0 || len(e.running) > 0 {
		if err := e.step(); err != nil {
			return e.c, err
		}
	}
	if err := pool.Validate(); err != nil {
		return e.c, err
	}
	st, err := pool.Stats()
	if err != nil {
		return e.c, err
	}
	if st.NumUsedBlocks != 0 || st.NumSeqs != 0 {
		return e.c, fmt.Errorf("blocks still in use after every request finished: %+v", st)
	}
	return e.c, nil
}

func main() {
	numReqs := flag.Int("requests", 12, "requests")
	maxNew := flag.Int("new", 24, "tokens generated per request")
	numBlocks := flag.Uint64("blocks", 40, "KV blocks in the pool (small enough to force preemption)")
	flag.Parse()

	r := rand.New(rand.NewSource(7))
	m := newModel(r)
	systems := [][]int32{randTokens(r, 70), randTokens(r, 45)}
	mk := func() []*request {
		rr := rand.New(rand.NewSource(8))
		reqs := make([]*request, *numReqs)
		for i := range reqs {
			p := append(append([]int32(nil), systems[i%2]...), randTokens(rr, 5+rr.Intn(40))...)
			reqs[i] = &request{id: i, prompt: p, maxNew: *maxNew}
		}
		return reqs
	}

	batched := mk()
	start := time.Now()
	c, err := runEngine(m, batched, *numBlocks, 32, 8)
	elapsed := time.Since(start)
	if err != nil {
		fmt.Fprintln(os.Stderr, "decode:", err)
		os.Exit(1)
	}
	// Reference: each request alone in a pool of its own.
	solo := mk()
	for _, q := range solo {
		if _, err := runEngine(m, []*request{q}, 64, 1<<20, 1); err != nil {
			fmt.Fprintln(os.Stderr, "decode (solo):", err)
			os.Exit(1)
		}
	}
	same := 0
	for i := range batched {
		if equal(batched[i].out, solo[i].out) {
			same++
		}
	}
	fmt.Printf("pagedkv %s decode loop: %d requests, %d new tokens each, %d blocks of %d tokens\n",
		pagedkv.Version(), *numReqs, *maxNew, *numBlocks, blockSize)
	fmt.Printf("%-28s %10d\n", "engine steps", c.steps)
	fmt.Printf("%-28s %10d\n", "tokens computed", c.computedTokens)
	fmt.Printf("%-28s %10d\n", "prompt tokens from cache", c.hitTokens)
	fmt.Printf("%-28s %10d\n", "preemptions", c.preemptions)
	fmt.Printf("%-28s %10d\n", "tokens generated", c.generated)
	fmt.Printf("%-28s %9.0f%%\n", "peak pool usage", 100*c.peakUsage)
	fmt.Printf("%-28s %10.0f\n", "generated tokens/s", float64(c.generated)/elapsed.Seconds())
	fmt.Printf("%-28s %7d/%d\n", "outputs equal to solo runs", same, len(batched))
	if same != len(batched) || c.hitTokens == 0 || c.preemptions == 0 {
		fmt.Fprintln(os.Stderr, "decode: self-check failed (outputs, prefix hits or preemption)")
		os.Exit(1)
	}
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func randTokens(r *rand.Rand, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(r.Intn(vocab))
	}
	return out
}
