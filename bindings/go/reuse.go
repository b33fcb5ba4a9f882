package pagedkv

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// Retention priorities (Seq.SetRetention).
const (
	PriorityMin     = C.PKV_PRIORITY_MIN
	PriorityDefault = C.PKV_PRIORITY_DEFAULT // every block without a range
	PriorityMax     = C.PKV_PRIORITY_MAX
	PriorityPinned  = C.PKV_PRIORITY_PINNED // never evicted; capped by MaxPinnedBlocks
	// TokenEnd as a range's End: every later token too.
	TokenEnd = ^uint64(0)
)

// PrefixMatch is what MatchPrefixPartial attached: NumCached tokens count
// as computed, whole cached blocks plus PartialTokens reused from the first
// slots of block CopySrc, copied into the sequence's new block CopyDst. A
// pool with storage copies them itself; an engine keeping its own K/V
// (NumLayers 0) copies slots [0, PartialTokens) of every layer before its
// next step's writes. Both are NullBlock when no copy is needed.
type PrefixMatch struct {
	NumCached     uint64
	PartialTokens uint32
	CopySrc       int32
	CopyDst       int32
}

// RetentionRange keeps tokens [Begin, End) at Priority (0..100) for
// Duration nanoseconds of the pool's clock once their blocks are free (0 =
// for good).
type RetentionRange struct {
	Begin, End uint64
	Priority   uint32
	DurationNs uint64
}

// MatchPrefixPartial is MatchPrefix, then (pool created with
// EnablePartialReuse) a partial hit: the first k tokens of a cached block
// that the next tokens agree with are copied into a new block and count as
// computed.
func (s Seq) MatchPrefixPartial(tokens []int32) (PrefixMatch, error) {
	const op = "pkv_seq_match_prefix_partial"
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return PrefixMatch{}, err
	}
	defer s.pool.release()
	var m C.pkv_prefix_match
	if err := check("pkv_prefix_match_init_sized", C.pkvgo_prefix_match_init_sized(&m, C.size_t(C.sizeof_pkv_prefix_match))); err != nil {
		return PrefixMatch{}, err
	}
	r := C.pkvgo_seq_match_prefix_partial(ptr, C.pkv_seq_id(s.id), int32Ptr(tokens),
		C.uint64_t(len(tokens)), &m)
	runtime.KeepAlive(tokens)
	if err := check(op, r); err != nil {
		return PrefixMatch{}, err
	}
	return PrefixMatch{
		NumCached:     uint64(m.num_cached),
		PartialTokens: uint32(m.partial_tokens),
		CopySrc:       int32(m.copy_src),
		CopyDst:       int32(m.copy_dst),
	}, nil
}

// SetRetention replaces the sequence's retention ranges (pool created with
// EnableRetention). Pins beyond MaxPinnedBlocks give ErrOutOfBlocks and
// change nothing.
func (s Seq) SetRetention(ranges []RetentionRange) error {
	const op = "pkv_seq_set_retention"
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return err
	}
	defer s.pool.release()
	// C memory: the library reads it during the call only.
	n := len(ranges)
	var cr *C.pkv_retention_range
	if n > 0 {
		cr = (*C.pkv_retention_range)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.pkv_retention_range{}))))
		if cr == nil {
			return argError(op, "cannot allocate %d ranges", n)
		}
		defer C.free(unsafe.Pointer(cr))
		cs := unsafe.Slice(cr, n)
		for i, r := range ranges {
			cs[i].token_begin = C.uint64_t(r.Begin)
			cs[i].token_end = C.uint64_t(r.End)
			cs[i].priority = C.uint32_t(r.Priority)
			cs[i].duration_ns = C.uint64_t(r.DurationNs)
		}
	}
	return check(op, C.pkvgo_seq_set_retention(ptr, C.pkv_seq_id(s.id), cr, C.uint64_t(n)))
}

// SetClock makes the pool's clock for retention durations read nowNs from
// now on (tests, simulations; it never runs back).
func (p *Pool) SetClock(nowNs uint64) error {
	const op = "pkv_pool_set_clock"
	ptr, err := p.acquire(op)
	if err != nil {
		return err
	}
	defer p.release()
	return check(op, C.pkvgo_pool_set_clock(ptr, C.uint64_t(nowNs)))
}

// PriorityCounts is the number of cached blocks per retention priority
// (index = priority, 0..100).
func (p *Pool) PriorityCounts() ([]uint64, error) {
	const op = "pkv_pool_get_priority_counts"
	ptr, err := p.acquire(op)
	if err != nil {
		return nil, err
	}
	defer p.release()
	out := make([]uint64, PriorityMax+1)
	// Go memory passed for the call only (no Go pointer inside it).
	var n C.uint64_t
	r := C.pkvgo_pool_get_priority_counts(ptr, (*C.uint64_t)(unsafe.Pointer(&out[0])),
		C.uint64_t(len(out)), &n)
	if err := check(op, r); err != nil {
		return nil, err
	}
	return out[:n], nil
}
