package pagedkv_test

import (
	"errors"
	"fmt"

	"github.com/pagedkv/pagedkv-go"
)

// A manager-only pool: block tables and prefix caching without storage.
func Example() {
	pool, err := pagedkv.NewPool(&pagedkv.PoolOptions{BlockSize: 4, NumBlocks: 9})
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	prompt := []int32{10, 11, 12, 13, 14, 15, 16, 17, 18, 19}
	a, _ := pool.CreateSeq(nil)
	if err := a.Append(prompt); err != nil {
		panic(err)
	}
	table, _ := a.BlockTable()
	fmt.Println("a's blocks:", table)
	// a's step: the engine wrote its K/V (elsewhere: this pool has no
	// storage) and commits. Only computed blocks can be prefix hits.
	step, err := pool.Prepare([]pagedkv.Seq{a}, []int{len(prompt)})
	if err != nil {
		panic(err)
	}
	if err := step.Commit(); err != nil {
		panic(err)
	}
	step.Close()

	// A second request with the same prompt finds its full blocks cached.
	b, _ := pool.CreateSeq(nil)
	cached, _ := b.MatchPrefix(prompt)
	fmt.Println("b found cached:", cached, "tokens")
	if err := b.Append(prompt[cached:]); err != nil {
		panic(err)
	}

	// Out of blocks is an ordinary, recoverable error.
	c, _ := pool.CreateSeq(nil)
	err = c.Append(make([]int32, 100))
	fmt.Println("out of blocks:", errors.Is(err, pagedkv.ErrOutOfBlocks))
	st, _ := pool.Stats()
	fmt.Println("used blocks:", st.NumUsedBlocks, "prefix hits:", st.PrefixHitTokens)
	// Output:
	// a's blocks: [1 2 3]
	// b found cached: 8 tokens
	// out of blocks: true
	// used blocks: 4 prefix hits: 8
}

// Routers predict prefix-cache hits without asking the engine.
func ExampleHashPrefix() {
	opts := &pagedkv.HashOptions{Algo: pagedkv.SHA256CBOR, BlockSize: 4, Seed: "model-a"}
	h1, _ := pagedkv.HashPrefix(opts, []int32{1, 2, 3, 4, 5, 6, 7, 8, 9})
	h2, _ := pagedkv.HashPrefix(opts, []int32{1, 2, 3, 4, 5, 6, 7, 0})
	fmt.Println(len(h1), "full blocks;", "first block shared:", h1[0] == h2[0],
		"second shared:", h1[1] == h2[1])
	// Output: 2 full blocks; first block shared: true second shared: false
}
