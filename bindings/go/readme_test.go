package pagedkv_test

import (
	"errors"
	"log"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/pagedkv/pagedkv-go"
)

// README.md's Go block, as a reader runs it: the code between the markers
// is the block (TestREADMEBlockIsRun keeps the two the same, whitespace
// aside); around it only what the reader supplies, the prompt and the
// step's bf16 tensors.
func readmeQuickStart(t *testing.T, prompt []int32, k, v, q, out []uint16) {
	// README begin
	pool, err := pagedkv.NewPool(&pagedkv.PoolOptions{NumBlocks: 1024, NumLayers: 32, NumKVHeads: 8,
		HeadDim: 128, DType: pagedkv.BFloat16})
	if err != nil {
		log.Fatal(err) // err is a *pagedkv.Error with the library's message
	}
	defer pool.Close()
	seq, _ := pool.CreateSeq(nil)
	cached, _ := seq.MatchPrefix(prompt) // tokens already in the prefix cache
	if err := seq.Append(prompt[cached:]); errors.Is(err, pagedkv.ErrOutOfBlocks) {
		// nothing changed: preempt a sequence (Seq.Free) and retry
	}
	batch, _ := pool.Prepare([]pagedkv.Seq{seq}, []int{len(prompt) - cached})
	defer batch.Close()
	for layer := 0; layer < 32; layer++ {
		batch.CacheWrite16(layer, k, v)            // []uint16 bf16 bits, [tokens, kv heads, head dim]
		batch.Attention16(layer, q, out, nil, nil) // [tokens, q heads, head dim]
	}
	// every layer written: the step is committed (Commit() for pools without storage)
	// README end

	info, err := seq.Info()
	if err != nil {
		t.Fatal(err)
	}
	if info.NumComputedTokens != uint64(len(prompt)) {
		t.Errorf("after the block's step: %d of %d tokens computed, want all (the step committed)",
			info.NumComputedTokens, len(prompt))
	}
}

func TestREADMEQuickStart(t *testing.T) {
	const tokens, kvHeads, qHeads, headDim = 100, 8, 32, 128
	prompt := make([]int32, tokens)
	for i := range prompt {
		prompt[i] = int32(1000 + i)
	}
	kv := make([]float32, tokens*kvHeads*headDim)
	for i := range kv {
		kv[i] = float32(i%7) / 7
	}
	qf := make([]float32, tokens*qHeads*headDim)
	for i := range qf {
		qf[i] = float32(i%3) / 3
	}
	k, v, q := pagedkv.ToBF16(kv), pagedkv.ToBF16(kv), pagedkv.ToBF16(qf)
	out := make([]uint16, len(q))
	readmeQuickStart(t, prompt, k, v, q, out)
}

// The block above is README.md's, whitespace aside.
func TestREADMEBlockIsRun(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)\n```go\n(.*?)\n```").FindSubmatch(readme)
	mirror := regexp.MustCompile(`(?s)// README begin\n(.*?)\n\s*// README end`).FindSubmatch(self)
	if block == nil || mirror == nil {
		t.Fatal("README.md's ```go block or this file's README markers not found")
	}
	// gofmt moves the closing brace of a one-line if and aligns comments.
	norm := func(b []byte) string { return strings.Join(strings.Fields(string(b)), " ") }
	if a, b := norm(block[1]), norm(mirror[1]); a != b {
		t.Errorf("README.md's Go block differs from the one readme_test.go runs:\nREADME: %s\ntest:   %s", a, b)
	}
}
