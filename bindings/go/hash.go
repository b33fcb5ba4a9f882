package pagedkv

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/hex"
	"runtime"
	"strconv"
	"strings"
	"unsafe"
)

// HashAlgo selects the block hash function (PKV_HASH_*).
type HashAlgo uint32

// Block hash algorithms.
const (
	// SHA256CBOR is SHA-256 over canonical CBOR, byte-compatible with
	// vLLM's sha256_cbor for the same seed (the library default).
	SHA256CBOR HashAlgo = C.PKV_HASH_SHA256_CBOR
	// XXH3128 is xxHash3-128 over the same bytes: fast, for trusted tenants.
	XXH3128 HashAlgo = C.PKV_HASH_XXH3_128
)

// Size is the digest length in bytes, 0 for an unknown algorithm.
func (a HashAlgo) Size() int { return int(C.pkv_hash_size(C.uint32_t(a))) }

// BlockHash is one block's hash, zero-padded to 32 bytes; comparable and
// usable as a map key.
type BlockHash [C.PKV_HASH_MAX_BYTES]byte

// String is the hex form of all 32 bytes.
func (h BlockHash) String() string { return hex.EncodeToString(h[:]) }

// Bytes returns the meaningful digest of an algorithm's hash.
func (h BlockHash) Bytes(algo HashAlgo) []byte {
	n := algo.Size()
	if n == 0 || n > len(h) {
		n = len(h)
	}
	out := make([]byte, n)
	copy(out, h[:n])
	return out
}

// BlockHash and pkv_block_hash are the same bytes, so slices of one are
// passed to C as the other without copying.
var _ [unsafe.Sizeof(C.pkv_block_hash{}) - unsafe.Sizeof(BlockHash{})]struct{}
var _ [unsafe.Sizeof(BlockHash{}) - unsafe.Sizeof(C.pkv_block_hash{})]struct{}

func hashPtr(s []BlockHash) *C.pkv_block_hash {
	if len(s) == 0 {
		return nil
	}
	return (*C.pkv_block_hash)(unsafe.Pointer(&s[0]))
}

// MMItem is a multimodal item occupying tokens [Offset, Offset+Length) of a
// prompt, identified by a content hash string (e.g. the image's hex digest).
type MMItem struct {
	Offset uint64
	Length uint64
	Hash   string
}

// HashOptions configures HashPrefix. Zero fields take the library defaults
// (SHA256CBOR, 16 tokens per block, seed ""). Use the same Algo, BlockSize
// and Seed as the pools whose caches you predict.
type HashOptions struct {
	Algo      HashAlgo
	BlockSize int
	Seed      string
	LoraID    uint64
	LoraName  string // LoRA adapter name, as current vLLM keys adapters; "" = none
	// LoraPath is the adapter's path, keyed with LoraName with
	// VLLMTaggedKeys (as SeqOptions.LoraPath); ignored otherwise.
	LoraPath  string
	CacheSalt string
	MMItems   []MMItem // sorted by offset, non-overlapping
	// StrictKeyDomains hashes like a pool created with
	// PoolOptions.StrictKeyDomains.
	StrictKeyDomains bool
	// VLLMTaggedKeys hashes like a pool created with
	// PoolOptions.VLLMTaggedKeys (vLLM 0.33's tagged keys). Not together
	// with StrictKeyDomains.
	VLLMTaggedKeys bool
}

// keyDomains is strict_key_domains (PKV_KEY_DOMAINS_*) of the two flags;
// both set is an error, the library takes one mode.
func keyDomains(op string, strict, tagged bool) (C.uint32_t, error) {
	switch {
	case strict && tagged:
		return 0, argError(op, "StrictKeyDomains and VLLMTaggedKeys are both set; choose one")
	case strict:
		return C.PKV_KEY_DOMAINS_STRICT, nil
	case tagged:
		return C.PKV_KEY_DOMAINS_VLLM_TAGGED, nil
	}
	return C.PKV_KEY_DOMAINS_VLLM, nil
}

func checkCString(op, name, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return argError(op, "%s contains a NUL byte", name)
	}
	return nil
}

func checkMMItems(op string, items []MMItem) error {
	if len(items) > 1<<32-1 {
		return argError(op, "too many multimodal items (%d)", len(items))
	}
	for i, it := range items {
		if err := checkCString(op, "MMItems["+strconv.Itoa(i)+"].Hash", it.Hash); err != nil {
			return err
		}
	}
	return nil
}

// HashPrefix returns the hashes of the full blocks of tokens, as a pool
// with the same options would compute them. Routers use it to predict which
// replica already caches a prompt's prefix.
func HashPrefix(opts *HashOptions, tokens []int32) ([]BlockHash, error) {
	const op = "pkv_hash_prefix"
	var o C.pkv_hash_options
	if err := check("pkv_hash_options_init_sized", C.pkvgo_hash_options_init_sized(&o, C.size_t(C.sizeof_pkv_hash_options))); err != nil {
		return nil, err
	}
	var arena cArena
	defer arena.free()
	if opts != nil {
		if opts.BlockSize < 0 || int64(opts.BlockSize) > 1<<32-1 {
			return nil, argError(op, "BlockSize %d out of range", opts.BlockSize)
		}
		for _, s := range [][2]string{{"Seed", opts.Seed}, {"CacheSalt", opts.CacheSalt},
			{"LoraName", opts.LoraName}, {"LoraPath", opts.LoraPath}} {
			if err := checkCString(op, s[0], s[1]); err != nil {
				return nil, err
			}
		}
		if err := checkMMItems(op, opts.MMItems); err != nil {
			return nil, err
		}
		if opts.Algo != 0 {
			o.algo = C.uint32_t(opts.Algo)
		}
		if opts.BlockSize != 0 {
			o.block_size = C.uint32_t(opts.BlockSize)
		}
		if opts.Seed != "" {
			o.seed = arena.str(opts.Seed)
		}
		o.lora_id = C.uint64_t(opts.LoraID)
		if opts.LoraName != "" {
			o.lora_name = arena.str(opts.LoraName)
		}
		if opts.LoraPath != "" {
			o.lora_path = arena.str(opts.LoraPath)
		}
		if opts.CacheSalt != "" {
			o.cache_salt = arena.str(opts.CacheSalt)
		}
		o.mm_items = arena.mmItems(opts.MMItems)
		o.num_mm_items = C.uint32_t(len(opts.MMItems))
		domains, err := keyDomains(op, opts.StrictKeyDomains, opts.VLLMTaggedKeys)
		if err != nil {
			return nil, err
		}
		o.strict_key_domains = domains
	}
	capacity := 1
	if o.block_size > 0 {
		capacity = len(tokens)/int(o.block_size) + 1
	}
	for {
		out := make([]BlockHash, capacity)
		var n C.uint64_t
		r := C.pkvgo_hash_prefix(&o, int32Ptr(tokens), C.uint64_t(len(tokens)), hashPtr(out),
			C.uint64_t(len(out)), &n)
		runtime.KeepAlive(tokens)
		err := check(op, r)
		if err == nil {
			return out[:n], nil
		}
		if e := err.(*Error); e.Code == CodeBufferTooSmall && int(n) > capacity {
			capacity = int(n)
			continue
		}
		return nil, err
	}
}

// HashRoot returns the root hash h(-1) of an algorithm and seed.
func HashRoot(algo HashAlgo, seed string) (BlockHash, error) {
	const op = "pkv_hash_root"
	var h BlockHash
	if err := checkCString(op, "seed", seed); err != nil {
		return h, err
	}
	cs := C.CString(seed)
	defer C.free(unsafe.Pointer(cs))
	var out C.pkv_block_hash
	if err := check(op, C.pkvgo_hash_root(C.uint32_t(algo), cs, &out)); err != nil {
		return h, err
	}
	h = *(*BlockHash)(unsafe.Pointer(&out))
	return h, nil
}
