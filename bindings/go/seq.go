package pagedkv

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
)

// SeqID is an opaque sequence handle naming its pool, slot and generation.
// A freed or unknown id, or one of another pool, gives ErrNotFound, never a
// crash or another sequence.
type SeqID uint64

// NullBlock is the block id standing for positions outside a sliding
// window in block tables.
const NullBlock = C.PKV_NULL_BLOCK

// SeqOptions configures a new sequence; the zero value is the default.
type SeqOptions struct {
	Priority int32  // kept for the caller's scheduler
	LoraID   uint64 // 0 = base model; part of every block hash
	LoraName string // "" = none; keyed in every block hash, as current vLLM keys adapters
	// LoraPath is the adapter's path (vLLM's lora_request.lora_path), keyed
	// with LoraName on a pool with PoolOptions.VLLMTaggedKeys; ignored by
	// other pools and without LoraName.
	LoraPath  string
	CacheSalt string // "" = none; hashed into the first block
	MMItems   []MMItem
}

// String is "seq 0x%016x", the form every library message prints ids in.
func (id SeqID) String() string { return fmt.Sprintf("seq 0x%016x", uint64(id)) }

// Seq is a sequence of a pool: a small value (pool and id) that may be
// copied freely. Its methods are safe for concurrent use like the pool's.
type Seq struct {
	pool *Pool
	id   SeqID
}

// ID is the sequence's handle.
func (s Seq) ID() SeqID { return s.id }

// Pool is the pool the sequence belongs to.
func (s Seq) Pool() *Pool { return s.pool }

// Seq rebuilds the Seq value of an id of this pool (it is not checked
// until used).
func (p *Pool) Seq(id SeqID) Seq { return Seq{pool: p, id: id} }

// CreateSeq creates an empty sequence; opts may be nil.
func (p *Pool) CreateSeq(opts *SeqOptions) (Seq, error) {
	const op = "pkv_seq_create"
	var arena cArena
	defer arena.free()
	var co C.pkv_seq_options
	if err := fillSeqOptions(op, opts, &co, &arena); err != nil {
		return Seq{}, err
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return Seq{}, err
	}
	defer p.release()
	var id C.pkv_seq_id
	if err := check(op, C.pkvgo_seq_create(ptr, &co, &id)); err != nil {
		return Seq{}, err
	}
	return Seq{pool: p, id: SeqID(id)}, nil
}

// fillSeqOptions sets co from opts (nil = defaults); strings live in arena.
func fillSeqOptions(op string, opts *SeqOptions, co *C.pkv_seq_options, arena *cArena) error {
	if err := check("pkv_seq_options_init_sized", C.pkvgo_seq_options_init_sized(co, C.size_t(C.sizeof_pkv_seq_options))); err != nil {
		return err
	}
	if opts == nil {
		return nil
	}
	for _, s := range [][2]string{{"CacheSalt", opts.CacheSalt}, {"LoraName", opts.LoraName},
		{"LoraPath", opts.LoraPath}} {
		if err := checkCString(op, s[0], s[1]); err != nil {
			return err
		}
	}
	if err := checkMMItems(op, opts.MMItems); err != nil {
		return err
	}
	co.priority = C.int32_t(opts.Priority)
	co.lora_id = C.uint64_t(opts.LoraID)
	if opts.LoraName != "" {
		co.lora_name = arena.str(opts.LoraName)
	}
	if opts.LoraPath != "" {
		co.lora_path = arena.str(opts.LoraPath)
	}
	if opts.CacheSalt != "" {
		co.cache_salt = arena.str(opts.CacheSalt)
	}
	co.mm_items = arena.mmItems(opts.MMItems)
	co.num_mm_items = C.uint32_t(len(opts.MMItems))
	return nil
}

func nonNegative(op, name string, v int) error {
	if v < 0 {
		return argError(op, "%s %d is negative", name, v)
	}
	return nil
}

func lookahead32(op string, v int) (C.uint32_t, error) {
	if v < 0 || int64(v) > 1<<32-1 {
		return 0, argError(op, "lookahead %d out of range", v)
	}
	return C.uint32_t(v), nil
}

// MatchPrefix attaches to an empty sequence the longest run of leading full
// blocks of tokens already in the prefix cache (leaving at least one token
// to compute) and returns how many tokens that covers, a multiple of the
// block size. Those tokens need no prefill; append the rest.
func (s Seq) MatchPrefix(tokens []int32) (int, error) {
	const op = "pkv_seq_match_prefix"
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return 0, err
	}
	defer s.pool.release()
	var n C.uint64_t
	r := C.pkvgo_seq_match_prefix(ptr, C.pkv_seq_id(s.id), int32Ptr(tokens),
		C.uint64_t(len(tokens)), &n)
	runtime.KeepAlive(tokens)
	if err := check(op, r); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Append appends tokens, allocating blocks as needed. All or nothing: on
// ErrOutOfBlocks nothing changed (preempt a sequence and retry).
func (s Seq) Append(tokens []int32) error { return s.AppendLookahead(tokens, 0) }

// AppendLookahead is Append that also reserves lookahead further slots for
// speculative tokens.
func (s Seq) AppendLookahead(tokens []int32, lookahead int) error {
	const op = "pkv_seq_append"
	la, err := lookahead32(op, lookahead)
	if err != nil {
		return err
	}
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return err
	}
	defer s.pool.release()
	r := C.pkvgo_seq_append(ptr, C.pkv_seq_id(s.id), int32Ptr(tokens), C.uint64_t(len(tokens)), la)
	runtime.KeepAlive(tokens)
	return check(op, r)
}

// BlocksNeeded is how many free blocks appending numTokens (plus lookahead
// slots) would take, for schedulers deciding what fits.
func (s Seq) BlocksNeeded(numTokens, lookahead int) (int, error) {
	const op = "pkv_seq_blocks_needed"
	if err := nonNegative(op, "numTokens", numTokens); err != nil {
		return 0, err
	}
	la, err := lookahead32(op, lookahead)
	if err != nil {
		return 0, err
	}
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return 0, err
	}
	defer s.pool.release()
	var n C.uint64_t
	r := C.pkvgo_seq_blocks_needed(ptr, C.pkv_seq_id(s.id), C.uint64_t(numTokens), la, &n)
	if err := check(op, r); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Fork creates a child sharing every block of s (parallel sampling, beam
// search); a shared partial block is copied when either side writes to it.
func (s Seq) Fork() (Seq, error) {
	const op = "pkv_seq_fork"
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return Seq{}, err
	}
	defer s.pool.release()
	var child C.pkv_seq_id
	if err := check(op, C.pkvgo_seq_fork(ptr, C.pkv_seq_id(s.id), &child)); err != nil {
		return Seq{}, err
	}
	return Seq{pool: s.pool, id: SeqID(child)}, nil
}

// Truncate drops tokens from the tail so numTokens remain, releasing
// blocks that become empty (speculative-decoding rollback). Released full
// blocks that no prepared plan computed leave the prefix cache.
func (s Seq) Truncate(numTokens int) error {
	const op = "pkv_seq_truncate"
	if err := nonNegative(op, "numTokens", numTokens); err != nil {
		return err
	}
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return err
	}
	defer s.pool.release()
	return check(op, C.pkvgo_seq_truncate(ptr, C.pkv_seq_id(s.id), C.uint64_t(numTokens)))
}

// Reserve is a capacity hint: it makes room in the sequence's host memory
// (token ids, block table, block hashes) for numTokens tokens in all, so
// that appends up to that length never reallocate them. Call it at
// admission with the prompt plus the most tokens the request may generate:
// its decode steps then grow no slices in the library. It takes no blocks
// and changes nothing Info, BlockTable or Stats show; at or below the
// current room it does nothing. ErrInvalidArgument for a negative count or
// one above 2^31 - 1 tokens.
func (s Seq) Reserve(numTokens int) error {
	const op = "pkv_seq_reserve"
	if err := nonNegative(op, "numTokens", numTokens); err != nil {
		return err
	}
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return err
	}
	defer s.pool.release()
	return check(op, C.pkvgo_seq_reserve(ptr, C.pkv_seq_id(s.id), C.uint64_t(numTokens)))
}

// Free releases the sequence and its blocks; its id becomes stale. Full
// blocks a prepared plan computed (or prefix hits) stay cached; those no
// plan covered yet leave the cache and are reused first.
func (s Seq) Free() error {
	const op = "pkv_seq_free"
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return err
	}
	defer s.pool.release()
	return check(op, C.pkvgo_seq_free(ptr, C.pkv_seq_id(s.id)))
}

// SeqInfo describes a sequence.
type SeqInfo struct {
	Priority        int32
	NumTokens       uint64 // tokens appended, incl. the cached prefix
	NumCachedTokens uint64 // tokens attached by MatchPrefix
	NumBlocks       uint64 // entries in the block table
	NumSlots        uint64 // capacity incl. lookahead
	LoraID          uint64
	// Leading tokens whose K/V is written (committed steps, written prefix
	// hits): a step's queries must cover every token from here on.
	NumComputedTokens uint64
}

// Info describes the sequence.
func (s Seq) Info() (SeqInfo, error) {
	const op = "pkv_seq_get_info"
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return SeqInfo{}, err
	}
	defer s.pool.release()
	var c C.pkv_seq_info
	if err := check("pkv_seq_info_init_sized", C.pkvgo_seq_info_init_sized(&c, C.size_t(C.sizeof_pkv_seq_info))); err != nil {
		return SeqInfo{}, err
	}
	if err := check(op, C.pkvgo_seq_get_info(ptr, C.pkv_seq_id(s.id), &c)); err != nil {
		return SeqInfo{}, err
	}
	return SeqInfo{
		Priority:          int32(c.priority),
		NumTokens:         uint64(c.num_tokens),
		NumCachedTokens:   uint64(c.num_cached_tokens),
		NumBlocks:         uint64(c.num_blocks),
		NumSlots:          uint64(c.num_slots),
		LoraID:            uint64(c.lora_id),
		NumComputedTokens: uint64(c.num_computed_tokens),
	}, nil
}

// BlockTable returns the sequence's block ids in order (NullBlock where a
// sliding window released a block).
func (s Seq) BlockTable() ([]int32, error) {
	const op = "pkv_seq_get_block_table"
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return nil, err
	}
	defer s.pool.release()
	buf := make([]int32, 16)
	for {
		var n C.uint64_t
		r := C.pkvgo_seq_get_block_table(ptr, C.pkv_seq_id(s.id), int32Ptr(buf),
			C.uint64_t(len(buf)), &n)
		err := check(op, r)
		if err == nil {
			return buf[:n], nil
		}
		// Another goroutine may grow the sequence between two tries.
		if err.(*Error).Code == CodeBufferTooSmall && int(n) > len(buf) {
			buf = make([]int32, int(n)+16)
			continue
		}
		return nil, err
	}
}

// BlockHashes returns the hashes of the sequence's full blocks, in order.
func (s Seq) BlockHashes() ([]BlockHash, error) {
	const op = "pkv_seq_get_block_hashes"
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return nil, err
	}
	defer s.pool.release()
	buf := make([]BlockHash, 8)
	for {
		var n C.uint64_t
		r := C.pkvgo_seq_get_block_hashes(ptr, C.pkv_seq_id(s.id), hashPtr(buf),
			C.uint64_t(len(buf)), &n)
		err := check(op, r)
		if err == nil {
			return buf[:n], nil
		}
		if err.(*Error).Code == CodeBufferTooSmall && int(n) > len(buf) {
			buf = make([]BlockHash, int(n)+8)
			continue
		}
		return nil, err
	}
}
