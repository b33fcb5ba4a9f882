// Command kv_router routes requests over two engine replicas by the prefix
// hits it predicts from their KV events, received over ZeroMQ in vLLM's
// wire format exactly as a router written for vLLM receives them.
//
// Each replica is a goroutine driving its own pagedkv pool through the Go
// binding and publishing the pool's events with pagedkv's EventPublisher
// (PUB socket + replay socket). The router knows nothing else about a
// replica: it subscribes to the stream, decodes the msgpack batches
// (wire.go), keeps per replica a count of the blocks holding each hash, and
// asks the replay socket for what it missed: the history when it starts
// (the first requests are served before it subscribes) and any jump in
// sequence numbers later. For each
// request it hashes the prompt (pagedkv.HashPrefix, vLLM's int form of a
// hash) and sends it to the replica holding the longest cached prefix.
//
// The run checks itself: every predicted hit must equal the hit the
// replica then finds (MatchPrefix), the router must have replayed the
// batches it missed, and KV-aware routing must reuse more KV than
// round-robin over the same requests.
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/pagedkv/pagedkv-go"
)

const (
	blockSize = 16
	hashSeed  = "router-demo"
	topic     = "kv-events"
)

// ---------------------------------------------------------------- replica

type request struct {
	prompt []int32
	reply  chan served
}

type served struct {
	hit     int   // tokens the replica found cached
	lastSeq int64 // its publisher's last sequence number after serving
	err     error
}

// replica is one engine: a pool, its running requests and its publisher.
type replica struct {
	pool    *pagedkv.Pool
	pub     *pagedkv.EventPublisher
	running []pagedkv.Seq
	in      chan request
}

func newReplica(numBlocks uint64, encoding uint32) (*replica, error) {
	p, err := pagedkv.NewPool(&pagedkv.PoolOptions{
		BlockSize: blockSize, NumBlocks: numBlocks, HashAlgo: pagedkv.SHA256CBOR,
		HashSeed: hashSeed, EnableEvents: true,
	})
	if err != nil {
		return nil, err
	}
	pub, err := pagedkv.NewEventPublisher(p, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*",
		&pagedkv.PublisherOptions{Topic: topic, BufferSteps: 1 << 20, EventEncoding: encoding})
	if err != nil {
		p.Close()
		return nil, err
	}
	r := &replica{pool: p, pub: pub, in: make(chan request)}
	go r.loop()
	return r, nil
}

func (r *replica) loop() {
	for req := range r.in {
		hit, err := r.serve(req.prompt, 6)
		st, serr := r.pub.Stats()
		if err == nil {
			err = serr
		}
		req.reply <- served{hit: hit, lastSeq: int64(st.BatchesPublished) - 1, err: err}
	}
}

func (r *replica) close() error {
	close(r.in)
	err := r.pool.Validate()
	r.pub.Close()
	r.pool.Close()
	return err
}

// serve admits a request: attach its cached prefix, prefill the rest,
// decode a few tokens, one engine step each, publishing the step's events.
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
	_, err = r.pub.Publish()
	return hit, err
}

// step: a real engine runs the model on the plan; this one commits it as
// if it had (only computed blocks can be hit), then publishes the step's
// events, once per step as vLLM's scheduler does.
func (r *replica) step(seq pagedkv.Seq, n int) error {
	b, err := r.pool.Prepare([]pagedkv.Seq{seq}, []int{n})
	if err != nil {
		return err
	}
	err = b.Commit()
	b.Close()
	if err != nil {
		return err
	}
	_, err = r.pub.Publish()
	return err
}

func (r *replica) finishOldest() error {
	err := r.running[0].Free()
	r.running = r.running[1:]
	return err
}

// ---------------------------------------------------------------- router

// view is the router's mirror of one replica's prefix cache, built from
// its event stream alone: how many blocks hold each hash.
type view struct {
	mu       sync.Mutex
	cond     *sync.Cond
	held     map[uint64]int
	lastSeq  int64
	batches  int
	replayed int
	replays  int
	want     int64 // the batch waitFor waits for (-1: none)
	err      error
}

func newView() *view {
	v := &view{held: map[uint64]int{}, lastSeq: -1, want: -1}
	v.cond = sync.NewCond(&v.mu)
	return v
}

func (v *view) apply(seq int64, b kvBatch) error {
	for _, e := range b.events {
		switch e.kind {
		case "BlockStored":
			if e.bsize != blockSize || len(e.tokens) != len(e.hashes)*blockSize {
				return fmt.Errorf("BlockStored with %d hashes, %d tokens, block size %d",
					len(e.hashes), len(e.tokens), e.bsize)
			}
			for _, h := range e.hashes {
				v.held[h]++
			}
		case "BlockRemoved":
			for _, h := range e.hashes {
				if v.held[h]--; v.held[h] <= 0 {
					delete(v.held, h)
				}
			}
		case "AllBlocksCleared":
			v.held = map[uint64]int{}
		}
	}
	v.lastSeq = seq
	v.batches++
	return nil
}

// subscribe follows one replica's stream until stop closes, as vLLM's
// kv_events_subscriber.py does: on a jump in sequence numbers it asks the
// replay socket for everything from the first one missed.
func subscribe(ctx *zctx, endpoint, replayEndpoint string, v *view, stop <-chan struct{}, done *sync.WaitGroup) {
	defer done.Done()
	runtime.LockOSThread() // the sockets stay on one thread
	defer runtime.UnlockOSThread()
	fail := func(err error) {
		v.mu.Lock()
		v.err = err
		v.cond.Broadcast()
		v.mu.Unlock()
	}
	sub, err := ctx.subscriber(endpoint, topic)
	if err != nil {
		fail(err)
		return
	}
	defer sub.close()
	req, err := ctx.requester(replayEndpoint)
	if err != nil {
		fail(err)
		return
	}
	defer req.close()
	// A router that starts late asks for the history first (what it would
	// otherwise see as a gap only when the next batch arrives).
	if err := replay(req, 0, v); err != nil {
		fail(err)
		return
	}
	for {
		select {
		case <-stop:
			return
		default:
		}
		if !sub.poll(20) {
			// A lost batch shows as a gap only when a later one arrives; the
			// last ones of a burst have none after them. So a router that
			// waits for a batch it has not seen asks for it after a quiet
			// poll (PUB drops messages while a subscription is still being
			// set up, and when a subscriber falls behind).
			v.mu.Lock()
			last, want := v.lastSeq, v.want
			v.mu.Unlock()
			if want > last {
				if err := replay(req, last+1, v); err != nil {
					fail(err)
					return
				}
				v.mu.Lock()
				v.cond.Broadcast()
				v.mu.Unlock()
			}
			continue
		}
		f, err := sub.recvMultipart()
		if err != nil || len(f) != 3 || len(f[1]) != 8 {
			fail(fmt.Errorf("bad message (%v, %d frames)", err, len(f)))
			return
		}
		seq := int64(binary.BigEndian.Uint64(f[1]))
		v.mu.Lock()
		last := v.lastSeq
		v.mu.Unlock()
		if seq > last+1 {
			if err := replay(req, last+1, v); err != nil {
				fail(err)
				return
			}
		}
		v.mu.Lock()
		if seq > v.lastSeq {
			b, err := decodeBatch(f[2])
			if err == nil {
				err = v.apply(seq, b)
			}
			if err != nil {
				v.err = err
			}
		}
		v.cond.Broadcast()
		v.mu.Unlock()
	}
}

func replay(req *zsock, start int64, v *view) error {
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], uint64(start))
	if err := req.sendMultipart([]byte{}, s[:]); err != nil { // the delimiter a REQ socket would add
		return err
	}
	v.mu.Lock()
	v.replays++
	v.mu.Unlock()
	for {
		if !req.poll(5000) {
			return errors.New("replay: no answer")
		}
		f, err := req.recvMultipart()
		if err != nil || len(f) != 3 || len(f[1]) != 8 {
			return fmt.Errorf("replay: bad answer (%v)", err)
		}
		if len(f[2]) == 0 { // the end marker: seq -1, empty payload
			return nil
		}
		seq := int64(binary.BigEndian.Uint64(f[1]))
		b, err := decodeBatch(f[2])
		if err != nil {
			return err
		}
		v.mu.Lock()
		if seq == v.lastSeq+1 {
			err = v.apply(seq, b)
			v.replayed++
		}
		v.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// waitFor blocks until the view has applied batch seq (events travel
// asynchronously; a real router routes on whatever it has, this one waits
// so that predictions can be checked exactly).
func (v *view) waitFor(seq int64) error {
	deadline := time.Now().Add(10 * time.Second)
	v.mu.Lock()
	defer v.mu.Unlock()
	v.want = seq
	defer func() { v.want = -1 }()
	for v.lastSeq < seq && v.err == nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("view stuck at batch %d, waiting for %d", v.lastSeq, seq)
		}
		v.mu.Unlock()
		time.Sleep(time.Millisecond)
		v.mu.Lock()
	}
	return v.err
}

// predict: the leading blocks whose hashes the replica holds, leaving one
// token to compute, as pkv_seq_match_prefix does.
func (v *view) predict(hashes []uint64, numTokens int) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n, max := 0, (numTokens-1)/blockSize
	for n < len(hashes) && n < max && v.held[hashes[n]] > 0 {
		n++
	}
	return n * blockSize
}

type result struct {
	promptTokens, hitTokens, mispredicted, batches, replays, replayed int
}

func run(requests [][]int32, numReplicas, numBlocks, warmup int, kvAware bool, encoding uint32) (res result, err error) {
	reps := make([]*replica, numReplicas)
	for i := range reps {
		if reps[i], err = newReplica(uint64(numBlocks), encoding); err != nil {
			return res, err
		}
	}
	ctx := newContext()
	stop := make(chan struct{})
	var subs sync.WaitGroup
	views := make([]*view, numReplicas)
	defer func() {
		close(stop)
		subs.Wait()
		ctx.close()
		for _, r := range reps {
			if cerr := r.close(); cerr != nil && err == nil {
				err = cerr
			}
		}
	}()
	ask := func(j int, prompt []int32) (served, error) {
		reply := make(chan served)
		reps[j].in <- request{prompt, reply}
		s := <-reply
		return s, s.err
	}
	lastSeq := make([]int64, numReplicas)
	for j := range lastSeq {
		lastSeq[j] = -1 // nothing published yet
	}
	// Served before the router subscribes: it learns of these by replay.
	for i := 0; i < warmup; i++ {
		s, err := ask(i%numReplicas, requests[i])
		if err != nil {
			return res, err
		}
		lastSeq[i%numReplicas] = s.lastSeq
	}
	for j, r := range reps {
		ep, err := r.pub.Endpoint()
		if err != nil {
			return res, err
		}
		rep, err := r.pub.ReplayEndpoint()
		if err != nil {
			return res, err
		}
		if os.Getenv("KV_ROUTER_DEBUG") != "" {
			fmt.Println("replica", j, ep, rep)
		}
		views[j] = newView()
		subs.Add(1)
		go subscribe(ctx, ep, rep, views[j], stop, &subs)
	}
	hopts := &pagedkv.HashOptions{Algo: pagedkv.SHA256CBOR, BlockSize: blockSize, Seed: hashSeed}
	load := make([]int, numReplicas)
	for i := warmup; i < len(requests); i++ {
		prompt := requests[i]
		digests, err := pagedkv.HashPrefix(hopts, prompt)
		if err != nil {
			return res, err
		}
		hashes := make([]uint64, len(digests))
		for k, d := range digests {
			hashes[k] = binary.BigEndian.Uint64(d[24:32]) // vLLM's int form of a SHA-256 hash
		}
		for j, v := range views {
			if err := v.waitFor(lastSeq[j]); err != nil {
				return res, fmt.Errorf("replica %d: %w", j, err)
			}
		}
		best := i % numReplicas
		if kvAware {
			bestHit := -1
			for j, v := range views {
				if h := v.predict(hashes, len(prompt)); h > bestHit || (h == bestHit && load[j] < load[best]) {
					best, bestHit = j, h
				}
			}
		}
		predicted := views[best].predict(hashes, len(prompt))
		s, err := ask(best, prompt)
		if err != nil {
			return res, fmt.Errorf("replica %d: %w", best, err)
		}
		lastSeq[best] = s.lastSeq
		load[best]++
		if s.hit != predicted {
			res.mispredicted++
		}
		res.promptTokens += len(prompt)
		res.hitTokens += s.hit
	}
	for j, v := range views {
		if err := v.waitFor(lastSeq[j]); err != nil {
			return res, err
		}
		v.mu.Lock()
		res.batches += v.batches
		res.replays += v.replays
		res.replayed += v.replayed
		v.mu.Unlock()
	}
	return res, nil
}

func main() {
	numRequests := flag.Int("requests", 200, "requests to route")
	numBlocks := flag.Int("blocks", 96, "KV blocks per replica")
	warmup := flag.Int("warmup", 6, "requests served before the router subscribes")
	seed := flag.Int64("seed", 1, "workload seed")
	array := flag.Bool("array", false, "publish vLLM <= 0.23's array-encoded events")
	flag.Parse()
	const replicas = 2
	encoding := pagedkv.EventsEncodingMap
	if *array {
		encoding = pagedkv.EventsEncodingArray
	}

	// Conversations sharing one of a few long system prompts.
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

	fmt.Printf("pagedkv %s: %d requests (%d before subscribing), %d replicas x %d blocks of %d tokens,"+
		" events over ZeroMQ (%s encoding)\n", pagedkv.Version(), *numRequests, *warmup, replicas,
		*numBlocks, blockSize, map[bool]string{false: "map", true: "array"}[*array])
	fmt.Printf("%-12s %14s %12s %9s %13s %8s %8s\n", "policy", "routed tokens", "hit tokens", "hit rate",
		"mispredicted", "batches", "replayed")
	var rates [2]float64
	for i, kvAware := range []bool{false, true} {
		res, err := run(requests, replicas, *numBlocks, *warmup, kvAware, encoding)
		if errors.Is(err, pagedkv.ErrUnsupported) {
			fmt.Println("kv_router: this libpagedkv has no event publisher (PAGEDKV_EVENTS off); skipped")
			return
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "kv_router:", err)
			os.Exit(1)
		}
		name := map[bool]string{false: "round-robin", true: "kv-aware"}[kvAware]
		rates[i] = float64(res.hitTokens) / float64(res.promptTokens)
		fmt.Printf("%-12s %14d %12d %8.1f%% %13d %8d %8d\n", name, res.promptTokens, res.hitTokens,
			100*rates[i], res.mispredicted, res.batches, res.replayed)
		if res.mispredicted != 0 {
			fmt.Fprintln(os.Stderr, "kv_router: predictions from the event stream missed real hits")
			os.Exit(1)
		}
		if *warmup > 0 && res.replayed == 0 {
			fmt.Fprintln(os.Stderr, "kv_router: the batches sent before subscribing were never replayed")
			os.Exit(1)
		}
	}
	if rates[1] <= rates[0] {
		fmt.Fprintln(os.Stderr, "kv_router: kv-aware routing reused no more KV than round-robin")
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
