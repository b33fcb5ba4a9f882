// Command router is a KV-aware request router over several engine
// replicas, each with its own pagedkv pool.
//
// The router never asks a replica what it caches. It mirrors each
// replica's prefix cache from the pool's KV events (block stored, block
// removed, all cleared), as a real router would from events published by
// remote engines, and predicts a prompt's prefix-cache hit on every replica
// by hashing the prompt with pagedkv.HashPrefix under the replicas' hash
// settings. A request goes to the replica with the longest predicted hit,
// less a penalty for load.
//
// The run checks itself: every predicted hit must equal the hit the chosen
// replica then reports (MatchPrefix), and routing by predicted hits must
// reuse more KV than round-robin over the same requests.
package main

import (
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"

	"github.com/pagedkv/pagedkv-go"
)

const (
	blockSize = 16
	hashSeed  = "router-demo"
)

// replicaView is the router's mirror of one replica's prefix cache: how
// many blocks hold each hash (equal hashes may sit in several blocks).
type replicaView struct {
	held    map[pagedkv.BlockHash]int
	lastSeq uint64
}

func (v *replicaView) apply(evs []pagedkv.Event) {
	for _, e := range evs {
		if v.lastSeq != 0 && e.SeqNo != v.lastSeq+1 {
			// Events were dropped: the mirror can no longer be trusted,
			// so forget it rather than route on stale data.
			v.held = map[pagedkv.BlockHash]int{}
		}
		v.lastSeq = e.SeqNo
		switch e.Type {
		case pagedkv.EventBlockStored:
			v.held[e.BlockHash]++
		case pagedkv.EventBlockRemoved:
			if v.held[e.BlockHash]--; v.held[e.BlockHash] <= 0 {
				delete(v.held, e.BlockHash)
			}
		case pagedkv.EventAllCleared:
			v.held = map[pagedkv.BlockHash]int{}
		}
	}
}

// predictHit is the number of prompt tokens the replica would find cached:
// the leading blocks whose hashes it holds, leaving at least one token to
// compute, as pkv_seq_match_prefix does.
func (v *replicaView) predictHit(hashes []pagedkv.BlockHash, numTokens int) int {
	maxBlocks := (numTokens - 1) / blockSize
	n := 0
	for n < len(hashes) && n < maxBlocks && v.held[hashes[n]] > 0 {
		n++
	}
	return n * blockSize
}

// replica is one engine: a pool and its running requests.
type replica struct {
	pool    *pagedkv.Pool
	running []pagedkv.Seq
}

func newReplica(numBlocks uint64) (*replica, error) {
	p, err := pagedkv.NewPool(&pagedkv.PoolOptions{
		BlockSize:    blockSize,
		NumBlocks:    numBlocks,
		HashAlgo:     pagedkv.SHA256CBOR,
		HashSeed:     hashSeed,
		EnableEvents: true,
	})
	if err != nil {
		return nil, err
	}
	return &replica{pool: p}, nil
}

// serve admits a request: attach its cached prefix, reserve the rest of
// the prompt and a few generated tokens, preempting the oldest running
// requests while blocks run out. It returns the tokens found cached.
func (r *replica) serve(prompt []int32, maxRunning int) (int, error) {
	seq, err := r.pool.CreateSeq(nil)
	if err != nil {
		return 0, err
	}
	hit, err := seq.MatchPrefix(prompt)
	if err != nil {
		return 0, err
	}
	for {
		err = seq.Append(prompt[hit:])
		if err == nil || !errors.Is(err, pagedkv.ErrOutOfBlocks) || len(r.running) == 0 {
			break
		}
		if err := r.finishOldest(); err != nil {
			return 0, err
		}
	}
	if err != nil {
		seq.Free()
		return 0, err
	}
	// Prefill, then decode a few tokens. The model is not part of this
	// example, but each step's plan is: tokens count as computed once a
	// plan covering them is prepared, and only computed blocks stay cached
	// (and in the router's mirror) after the request finishes.
	if err := r.step(seq, len(prompt)-hit); err != nil {
		seq.Free()
		return 0, err
	}
	for i := 0; i < 8; i++ {
		if err := seq.Append([]int32{int32(i)}); err != nil {
			break
		}
		if err := r.step(seq, 1); err != nil {
			seq.Free()
			return 0, err
		}
	}
	r.running = append(r.running, seq)
	for len(r.running) > maxRunning {
		if err := r.finishOldest(); err != nil {
			return 0, err
		}
	}
	return hit, nil
}

// step runs one engine step over seq's last n tokens: a real engine would
// run the model's cache writes and attention on the plan; this one commits
// it as if it had (only committed tokens can be prefix hits).
func (r *replica) step(seq pagedkv.Seq, n int) error {
	b, err := r.pool.Prepare([]pagedkv.Seq{seq}, []int{n})
	if err != nil {
		return err
	}
	defer b.Close()
	return b.Commit()
}

func (r *replica) finishOldest() error {
	err := r.running[0].Free()
	r.running = r.running[1:]
	return err
}

type result struct {
	promptTokens, hitTokens, mispredicted int
}

func run(requests [][]int32, replicas, numBlocks int, kvAware bool) (result, error) {
	var res result
	reps := make([]*replica, replicas)
	views := make([]*replicaView, replicas)
	for i := range reps {
		r, err := newReplica(uint64(numBlocks))
		if err != nil {
			return res, err
		}
		defer r.pool.Close()
		reps[i] = r
		views[i] = &replicaView{held: map[pagedkv.BlockHash]int{}}
	}
	hopts := &pagedkv.HashOptions{Algo: pagedkv.SHA256CBOR, BlockSize: blockSize, Seed: hashSeed}
	for i, prompt := range requests {
		hashes, err := pagedkv.HashPrefix(hopts, prompt)
		if err != nil {
			return res, err
		}
		best, bestScore, predicted := i%replicas, -1<<62, 0
		if kvAware {
			for j, v := range views {
				st, err := reps[j].pool.Stats()
				if err != nil {
					return res, err
				}
				hit := v.predictHit(hashes, len(prompt))
				// Tokens saved, less a penalty for a replica near full.
				score := hit - int(st.Usage*float64(blockSize)*4)
				if score > bestScore {
					best, bestScore, predicted = j, score, hit
				}
			}
		} else {
			predicted = views[best].predictHit(hashes, len(prompt))
		}
		hit, err := reps[best].serve(prompt, 6)
		if err != nil {
			return res, fmt.Errorf("replica %d: %w", best, err)
		}
		if hit != predicted {
			res.mispredicted++
		}
		res.promptTokens += len(prompt)
		res.hitTokens += hit
		// In a deployment the events arrive over the network; here the
		// router drains them from every replica after each request.
		for j, r := range reps {
			evs, err := r.pool.Events()
			if err != nil {
				return res, err
			}
			views[j].apply(evs)
		}
	}
	for _, r := range reps {
		if err := r.pool.Validate(); err != nil {
			return res, err
		}
	}
	return res, nil
}

func main() {
	numRequests := flag.Int("requests", 300, "requests to route")
	replicas := flag.Int("replicas", 4, "engine replicas")
	numBlocks := flag.Int("blocks", 96, "KV blocks per replica")
	seed := flag.Int64("seed", 1, "workload seed")
	flag.Parse()

	// Workload: conversations sharing one of a few long system prompts,
	// each with a distinct user turn.
	r := rand.New(rand.NewSource(*seed))
	systems := make([][]int32, 6)
	for i := range systems {
		systems[i] = randTokens(r, 150+r.Intn(150))
	}
	requests := make([][]int32, *numRequests)
	for i := range requests {
		sys := systems[r.Intn(len(systems))]
		requests[i] = append(append([]int32(nil), sys...), randTokens(r, 10+r.Intn(60))...)
	}

	fmt.Printf("pagedkv %s: %d requests, %d replicas x %d blocks of %d tokens\n",
		pagedkv.Version(), *numRequests, *replicas, *numBlocks, blockSize)
	fmt.Printf("%-12s %14s %12s %9s %14s\n", "policy", "prompt tokens", "hit tokens", "hit rate",
		"mispredicted")
	var rates [2]float64
	for i, kvAware := range []bool{false, true} {
		res, err := run(requests, *replicas, *numBlocks, kvAware)
		if err != nil {
			fmt.Fprintln(os.Stderr, "router:", err)
			os.Exit(1)
		}
		name := map[bool]string{false: "round-robin", true: "kv-aware"}[kvAware]
		rates[i] = float64(res.hitTokens) / float64(res.promptTokens)
		fmt.Printf("%-12s %14d %12d %8.1f%% %14d\n", name, res.promptTokens, res.hitTokens,
			100*rates[i], res.mispredicted)
		if res.mispredicted != 0 {
			fmt.Fprintln(os.Stderr, "router: the event mirror mispredicted prefix hits")
			os.Exit(1)
		}
	}
	if rates[1] <= rates[0] {
		fmt.Fprintln(os.Stderr, "router: kv-aware routing reused no more KV than round-robin")
		os.Exit(1)
	}
	fmt.Printf("kv-aware / round-robin hit rate: %.2fx\n", rates[1]/rates[0])
}

func randTokens(r *rand.Rand, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(r.Intn(32000))
	}
	return out
}
