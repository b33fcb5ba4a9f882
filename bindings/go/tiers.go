package pagedkv

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import "runtime"

// Media of the offload tiers (TierStats, events).
const (
	MediumDevice = C.PKV_MEDIUM_DEVICE
	MediumHost   = C.PKV_MEDIUM_HOST
	MediumFile   = C.PKV_MEDIUM_FILE
)

// TierOptions configures the offload tiers of a pool with storage (CPU or
// CUDA; a CUDA pool's host tier is page-locked memory): a
// host tier of HostBytes and, with FileDir set, a file tier of FileBytes
// below it (one file, created and unlinked at once in FileDir). HostBytes 0
// with FileDir set: a file tier alone, each evicted block hashed and written
// straight from the pool (one pass).
type TierOptions struct {
	HostBytes uint64
	FileDir   string
	FileBytes uint64
}

// TierMatch is what MatchPrefixTiered attached, in tokens per medium.
type TierMatch struct {
	NumCached, DeviceTokens, HostTokens, FileTokens uint64
}

// TierStats are the counters of one tier. BytesLoaded / LoadNs is the load
// bandwidth in bytes per nanosecond.
type TierStats struct {
	Medium                              uint32
	CapacityBlocks, NumBlocks, Bytes    uint64
	NumStored, NumRemoved, NumHits      uint64
	NumLoaded, BytesStored, BytesLoaded uint64
	LoadNs, NumChecksumFailures         uint64
	NumIOErrors, NumDropped             uint64
}

// AttachTiers gives the pool offload tiers, once: blocks evicted from its
// prefix cache are copied there and found again by MatchPrefixTiered.
func (p *Pool) AttachTiers(o TierOptions) error {
	const op = "pkv_pool_attach_tiers"
	if err := checkCString(op, "FileDir", o.FileDir); err != nil {
		return err // C would read the path up to the NUL: another directory
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return err
	}
	defer p.release()
	var a cArena
	defer a.free()
	var c C.pkv_tier_options
	if err := check("pkv_tier_options_init_sized", C.pkvgo_tier_options_init_sized(&c, C.size_t(C.sizeof_pkv_tier_options))); err != nil {
		return err
	}
	c.host_bytes = C.uint64_t(o.HostBytes)
	c.file_bytes = C.uint64_t(o.FileBytes)
	if o.FileDir != "" {
		c.file_dir = a.str(o.FileDir)
	}
	return check(op, C.pkvgo_pool_attach_tiers(ptr, &c))
}

// MatchPrefixTiered is MatchPrefix continued with the blocks found in the
// offload tiers; the next Prepare loads those (checksum verified) before
// anything reads them.
func (s Seq) MatchPrefixTiered(tokens []int32) (TierMatch, error) {
	const op = "pkv_seq_match_prefix_tiered"
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return TierMatch{}, err
	}
	defer s.pool.release()
	var m C.pkv_tier_match
	if err := check("pkv_tier_match_init_sized", C.pkvgo_tier_match_init_sized(&m, C.size_t(C.sizeof_pkv_tier_match))); err != nil {
		return TierMatch{}, err
	}
	r := C.pkvgo_seq_match_prefix_tiered(ptr, C.pkv_seq_id(s.id), int32Ptr(tokens),
		C.uint64_t(len(tokens)), &m)
	runtime.KeepAlive(tokens)
	if err := check(op, r); err != nil {
		return TierMatch{}, err
	}
	return tierMatch(&m), nil
}

// MatchPrefixHashesTiered is MatchPrefixHashes continued into the offload
// tiers as MatchPrefixTiered: the engine's block hashes of tokens are
// checked as there and followed through the tiers too. All or nothing.
func (s Seq) MatchPrefixHashesTiered(tokens []int32, hashes []BlockHash) (TierMatch, error) {
	const op = "pkv_seq_match_prefix_hashes_tiered"
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return TierMatch{}, err
	}
	defer s.pool.release()
	// A non-NULL pointer selects the hash path even with no hashes.
	var none C.pkv_block_hash
	hp := hashPtr(hashes)
	if hp == nil {
		hp = &none
	}
	var m C.pkv_tier_match
	if err := check("pkv_tier_match_init_sized", C.pkvgo_tier_match_init_sized(&m, C.size_t(C.sizeof_pkv_tier_match))); err != nil {
		return TierMatch{}, err
	}
	r := C.pkvgo_seq_match_prefix_hashes_tiered(ptr, C.pkv_seq_id(s.id), int32Ptr(tokens),
		C.uint64_t(len(tokens)), hp, C.uint64_t(len(hashes)), &m)
	runtime.KeepAlive(tokens)
	runtime.KeepAlive(hashes)
	if err := check(op, r); err != nil {
		return TierMatch{}, err
	}
	return tierMatch(&m), nil
}

// AdmitTiered is Admit (hashes nil) or AdmitHashes whose lookup goes on into
// the offload tiers after the device hits. The prompt fits exactly when it
// fits Admit (tier hits take blocks the prompt needs anyway), and then every
// tier hit is taken; on ErrOutOfBlocks no sequence exists and no hit was
// taken. NumCached tokens need no prefill; the next Prepare loads the host
// and file ones.
func (p *Pool) AdmitTiered(opts *SeqOptions, tokens []int32, hashes []BlockHash, lookahead int) (Seq, TierMatch, error) {
	const op = "pkv_seq_admit_tiered"
	la, err := lookahead32(op, lookahead)
	if err != nil {
		return Seq{}, TierMatch{}, err
	}
	var arena cArena
	defer arena.free()
	var co C.pkv_seq_options
	if err := fillSeqOptions(op, opts, &co, &arena); err != nil {
		return Seq{}, TierMatch{}, err
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return Seq{}, TierMatch{}, err
	}
	defer p.release()
	// nil hashes: NULL, the pool hashes the prompt; a non-nil empty slice
	// selects the hash path with no hashes, as AdmitHashes.
	var none C.pkv_block_hash
	hp := hashPtr(hashes)
	if hp == nil && hashes != nil {
		hp = &none
	}
	var id C.pkv_seq_id
	var m C.pkv_tier_match
	if err := check("pkv_tier_match_init_sized", C.pkvgo_tier_match_init_sized(&m, C.size_t(C.sizeof_pkv_tier_match))); err != nil {
		return Seq{}, TierMatch{}, err
	}
	r := C.pkvgo_seq_admit_tiered(ptr, &co, int32Ptr(tokens), C.uint64_t(len(tokens)), hp,
		C.uint64_t(len(hashes)), la, &id, &m)
	runtime.KeepAlive(tokens)
	runtime.KeepAlive(hashes)
	if err := check(op, r); err != nil {
		return Seq{}, TierMatch{}, err
	}
	return Seq{pool: p, id: SeqID(id)}, tierMatch(&m), nil
}

func tierMatch(m *C.pkv_tier_match) TierMatch {
	return TierMatch{uint64(m.num_cached), uint64(m.device_tokens), uint64(m.host_tokens),
		uint64(m.file_tokens)}
}

// TierStats returns the counters of the host (MediumHost) or file
// (MediumFile) tier.
func (p *Pool) TierStats(medium uint32) (TierStats, error) {
	const op = "pkv_pool_get_tier_stats"
	ptr, err := p.acquire(op)
	if err != nil {
		return TierStats{}, err
	}
	defer p.release()
	var c C.pkv_tier_stats
	if err := check("pkv_tier_stats_init_sized", C.pkvgo_tier_stats_init_sized(&c, C.size_t(C.sizeof_pkv_tier_stats))); err != nil {
		return TierStats{}, err
	}
	if err := check(op, C.pkvgo_pool_get_tier_stats(ptr, C.uint32_t(medium), &c)); err != nil {
		return TierStats{}, err
	}
	return TierStats{
		Medium: uint32(c.medium), CapacityBlocks: uint64(c.capacity_blocks),
		NumBlocks: uint64(c.num_blocks), Bytes: uint64(c.bytes), NumStored: uint64(c.num_stored),
		NumRemoved: uint64(c.num_removed), NumHits: uint64(c.num_hits),
		NumLoaded: uint64(c.num_loaded), BytesStored: uint64(c.bytes_stored),
		BytesLoaded: uint64(c.bytes_loaded), LoadNs: uint64(c.load_ns),
		NumChecksumFailures: uint64(c.num_checksum_failures),
		NumIOErrors:         uint64(c.num_io_errors), NumDropped: uint64(c.num_dropped),
	}, nil
}

// FlushTiers waits until queued offloads are in their tier and pending
// loads ran.
func (p *Pool) FlushTiers() error {
	const op = "pkv_pool_flush_tiers"
	ptr, err := p.acquire(op)
	if err != nil {
		return err
	}
	defer p.release()
	return check(op, C.pkvgo_pool_flush_tiers(ptr))
}
