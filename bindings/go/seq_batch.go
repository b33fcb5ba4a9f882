package pagedkv

// #include "shim.h"
import "C"

import (
	"runtime"
	"unsafe"
)

// Batched and fused sequence calls: one library call (and one pool lock)
// for what engines otherwise loop over. Each is all or nothing: an error
// names the offending index (seqs[i]) and changes nothing.

func seqIDPtr(s []SeqID) *C.pkv_seq_id {
	if len(s) == 0 {
		return nil
	}
	return (*C.pkv_seq_id)(unsafe.Pointer(&s[0]))
}

// AppendBatch appends tokens[i] (one token) to seqs[i] for distinct
// sequences: a decode step's appends in one call.
func (p *Pool) AppendBatch(seqs []SeqID, tokens []int32) error {
	const op = "pkv_seq_append_batch"
	if len(seqs) != len(tokens) {
		return argError(op, "seqs and tokens differ in length (%d vs %d)", len(seqs), len(tokens))
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return err
	}
	defer p.release()
	r := C.pkvgo_seq_append_batch(ptr, seqIDPtr(seqs), int32Ptr(tokens), C.uint64_t(len(seqs)))
	runtime.KeepAlive(seqs)
	runtime.KeepAlive(tokens)
	return check(op, r)
}

// FreeBatch frees distinct sequences in one call; a stale or repeated id
// frees none.
func (p *Pool) FreeBatch(seqs []SeqID) error {
	const op = "pkv_seq_free_batch"
	ptr, err := p.acquire(op)
	if err != nil {
		return err
	}
	defer p.release()
	r := C.pkvgo_seq_free_batch(ptr, seqIDPtr(seqs), C.uint64_t(len(seqs)))
	runtime.KeepAlive(seqs)
	return check(op, r)
}

// Admit creates a sequence (opts may be nil), attaches the cached prefix of
// tokens and appends the rest plus lookahead slots, in one call. On
// ErrOutOfBlocks no sequence exists and no hit was taken. Returns the
// sequence and the tokens found cached.
func (p *Pool) Admit(opts *SeqOptions, tokens []int32, lookahead int) (Seq, int, error) {
	return p.admit("pkv_seq_admit", opts, tokens, nil, false, lookahead)
}

// AdmitHashes is Admit with the prompt's block hashes computed beforehand
// (HashPrefix with the pool's algorithm, seed and key-domain mode and the
// request's keys), so the lookup does not hash the prompt again. The first
// block's hash and the last link used are checked (an argument error naming
// hashes[i]).
func (p *Pool) AdmitHashes(opts *SeqOptions, tokens []int32, hashes []BlockHash, lookahead int) (Seq, int, error) {
	return p.admit("pkv_seq_admit_hashes", opts, tokens, hashes, true, lookahead)
}

func (p *Pool) admit(op string, opts *SeqOptions, tokens []int32, hashes []BlockHash, byHash bool,
	lookahead int) (Seq, int, error) {
	la, err := lookahead32(op, lookahead)
	if err != nil {
		return Seq{}, 0, err
	}
	var arena cArena
	defer arena.free()
	var co C.pkv_seq_options
	if err := fillSeqOptions(op, opts, &co, &arena); err != nil {
		return Seq{}, 0, err
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return Seq{}, 0, err
	}
	defer p.release()
	var id C.pkv_seq_id
	var cached C.uint64_t
	var r C.pkvgo_result
	if byHash {
		// A non-NULL pointer selects the hash path even with no hashes.
		var none C.pkv_block_hash
		hp := hashPtr(hashes)
		if hp == nil {
			hp = &none
		}
		r = C.pkvgo_seq_admit_hashes(ptr, &co, int32Ptr(tokens), C.uint64_t(len(tokens)), hp,
			C.uint64_t(len(hashes)), la, &id, &cached)
	} else {
		r = C.pkvgo_seq_admit(ptr, &co, int32Ptr(tokens), C.uint64_t(len(tokens)), la, &id, &cached)
	}
	runtime.KeepAlive(tokens)
	runtime.KeepAlive(hashes)
	if err := check(op, r); err != nil {
		return Seq{}, 0, err
	}
	return Seq{pool: p, id: SeqID(id)}, int(cached), nil
}

// MatchPrefixHashes is MatchPrefix with the block hashes of tokens computed
// beforehand (see AdmitHashes).
func (s Seq) MatchPrefixHashes(tokens []int32, hashes []BlockHash) (int, error) {
	const op = "pkv_seq_match_prefix_hashes"
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return 0, err
	}
	defer s.pool.release()
	var none C.pkv_block_hash
	hp := hashPtr(hashes)
	if hp == nil {
		hp = &none
	}
	var n C.uint64_t
	r := C.pkvgo_seq_match_prefix_hashes(ptr, C.pkv_seq_id(s.id), int32Ptr(tokens),
		C.uint64_t(len(tokens)), hp, C.uint64_t(len(hashes)), &n)
	runtime.KeepAlive(tokens)
	runtime.KeepAlive(hashes)
	if err := check(op, r); err != nil {
		return 0, err
	}
	return int(n), nil
}
