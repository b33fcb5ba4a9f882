package pagedkv

import (
	"bytes"
	"math/rand"
	"reflect"
	"testing"
)

func TestHashPrefixChainsAndCounts(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	toks := randTokens(r, 100)
	for _, algo := range []HashAlgo{SHA256CBOR, XXH3128} {
		opts := &HashOptions{Algo: algo, BlockSize: 16, Seed: "s"}
		all, err := HashPrefix(opts, toks)
		ok(t, err)
		if len(all) != 100/16 {
			t.Fatalf("%d hashes for 100 tokens", len(all))
		}
		// Hashes chain: a prefix of the prompt has a prefix of the hashes.
		part, err := HashPrefix(opts, toks[:40])
		ok(t, err)
		if len(part) != 2 || part[0] != all[0] || part[1] != all[1] {
			t.Fatalf("prefix hashes differ")
		}
		seen := map[BlockHash]bool{}
		for _, h := range all {
			if seen[h] {
				t.Fatal("repeated hash")
			}
			seen[h] = true
			pad := h[algo.Size():]
			if !bytes.Equal(pad, make([]byte, len(pad))) {
				t.Fatalf("%v digest not zero-padded: %v", algo, h)
			}
			if len(h.Bytes(algo)) != algo.Size() || len(h.String()) != 64 {
				t.Fatal("digest accessors")
			}
		}
		// A change in block 2 keeps blocks 0-1 and changes every later one.
		mod := append([]int32(nil), toks...)
		mod[40]++
		other, err := HashPrefix(opts, mod)
		ok(t, err)
		for i := range all {
			if (other[i] == all[i]) != (i < 2) {
				t.Fatalf("block %d: changed=%v", i, other[i] != all[i])
			}
		}
		// Seed, salt and LoRA id reach every block (salt through the chain).
		for _, o := range []*HashOptions{
			{Algo: algo, BlockSize: 16, Seed: "t"},
			{Algo: algo, BlockSize: 16, Seed: "s", CacheSalt: "tenant"},
			{Algo: algo, BlockSize: 16, Seed: "s", LoraID: 7},
			{Algo: algo, BlockSize: 16, Seed: "s", MMItems: []MMItem{{Offset: 3, Length: 5, Hash: "img"}}},
		} {
			hs, err := HashPrefix(o, toks)
			ok(t, err)
			for i := range hs {
				if hs[i] == all[i] {
					t.Fatalf("options %+v left block %d unchanged", o, i)
				}
			}
		}
	}
	// Fewer tokens than a block: no hash.
	hs, err := HashPrefix(nil, []int32{1, 2, 3})
	ok(t, err)
	if len(hs) != 0 {
		t.Fatal("partial blocks are never hashed")
	}
	hs, err = HashPrefix(nil, nil)
	ok(t, err)
	if len(hs) != 0 {
		t.Fatal("no tokens, no hashes")
	}
	// The default is 16 tokens per block.
	hs, err = HashPrefix(nil, toks)
	ok(t, err)
	if len(hs) != 6 {
		t.Fatalf("default block size gave %d hashes", len(hs))
	}
}

func TestHashErrors(t *testing.T) {
	toks := []int32{1, 2, 3, 4}
	_, err := HashPrefix(&HashOptions{Algo: 77}, toks)
	wantErr(t, err, ErrInvalidArgument)
	_, err = HashPrefix(&HashOptions{BlockSize: -1}, toks)
	wantErr(t, err, ErrInvalidArgument)
	_, err = HashPrefix(&HashOptions{Seed: "a\x00b"}, toks)
	wantErr(t, err, ErrInvalidArgument)
	_, err = HashPrefix(&HashOptions{MMItems: []MMItem{{Offset: 0, Length: 2, Hash: ""}}}, toks)
	wantErr(t, err, ErrInvalidArgument)
	_, err = HashRoot(77, "")
	wantErr(t, err, ErrInvalidArgument)
	_, err = HashRoot(SHA256CBOR, "x\x00")
	wantErr(t, err, ErrInvalidArgument)
}

func TestHashRoot(t *testing.T) {
	a, err := HashRoot(SHA256CBOR, "")
	ok(t, err)
	b, err := HashRoot(SHA256CBOR, "seed")
	ok(t, err)
	c, err := HashRoot(XXH3128, "seed")
	ok(t, err)
	if a == b || b == c || a == (BlockHash{}) {
		t.Fatal("roots must depend on algorithm and seed")
	}
}

// A pool's block hashes are what a router computes with HashPrefix.
func TestPoolHashesMatchHashPrefix(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	toks := randTokens(r, 37)
	for _, algo := range []HashAlgo{SHA256CBOR, XXH3128} {
		p := newPool(t, PoolOptions{BlockSize: 8, NumBlocks: 32, HashAlgo: algo, HashSeed: "seed"})
		so := &SeqOptions{LoraID: 3, CacheSalt: "salt"}
		s, err := p.CreateSeq(so)
		ok(t, err)
		ok(t, s.Append(toks))
		got, err := s.BlockHashes()
		ok(t, err)
		want, err := HashPrefix(&HashOptions{Algo: algo, BlockSize: 8, Seed: "seed", LoraID: 3,
			CacheSalt: "salt"}, toks)
		ok(t, err)
		if len(got) != 4 || len(want) != 4 {
			t.Fatalf("%d and %d hashes", len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("block %d: pool %v, HashPrefix %v", i, got[i], want[i])
			}
		}
	}
}

// Digests from tests/hash/pyref.py (vLLM's current block hashing: cbor2
// canonical + hashlib), seed "", block size 4.
var (
	loraNameVector = []string{
		"57a891e4b6cb6a32257a80070b41e8c2c4be378d75682997a00ddd87bb9f150a",
		"31c575fbacde4474bd78de3f5395b099a1441ffbad28bb57d4e0a65b81463087",
	}
	mmDecodeVector = []string{
		"f4283c434ecdbd4d07af2439f6d3cf09a926973908760be4f5e9bd4a1c64cfc5",
		"202b0131f1b2bd1c7b42bd9755db8693dd644c8fb7645086adf68a68310ff122",
	}
)

func hexes(hs []BlockHash, n int) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.String()[:2*n]
	}
	return out
}

func TestLoraNameAndMMOffsetsMatchVLLMVectors(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 16})
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	named, err := p.CreateSeq(&SeqOptions{LoraName: "sql-lora"})
	ok(t, err)
	ok(t, named.Append(prompt))
	got, err := named.BlockHashes()
	ok(t, err)
	if h := hexes(got, 32); !reflect.DeepEqual(h, loraNameVector) {
		t.Fatalf("LoRA-name hashes %v, want %v", h, loraNameVector)
	}
	viaHash, err := HashPrefix(&HashOptions{BlockSize: 4, LoraName: "sql-lora"}, prompt)
	ok(t, err)
	if !reflect.DeepEqual(hexes(viaHash, 32), loraNameVector) {
		t.Fatal("HashPrefix with LoraName differs from the pool")
	}
	for _, o := range []*SeqOptions{{LoraName: "other"}, {LoraID: 1}, nil} {
		s, err := p.CreateSeq(o)
		ok(t, err)
		if n, err := s.MatchPrefix(prompt); err != nil || n != 0 {
			t.Fatalf("options %+v hit %d tokens (%v)", o, n, err)
		}
	}
	mm, err := p.CreateSeq(&SeqOptions{MMItems: []MMItem{{Offset: 0, Length: 4, Hash: "img"}}})
	ok(t, err)
	ok(t, mm.Append([]int32{-1, -1, -1, -1, 5, 6}))
	ok(t, mm.Append([]int32{7}))
	ok(t, mm.Append([]int32{8}))
	got, err = mm.BlockHashes()
	ok(t, err)
	if h := hexes(got, 32); !reflect.DeepEqual(h, mmDecodeVector) {
		t.Fatalf("multimodal hashes %v, want %v", h, mmDecodeVector)
	}
	_, err = p.CreateSeq(&SeqOptions{LoraName: "a\x00b"})
	if e := wantErr(t, err, ErrInvalidArgument); !bytes.Contains([]byte(e.Msg), []byte("LoraName")) {
		t.Fatalf("message %q does not name LoraName", e.Msg)
	}
}
