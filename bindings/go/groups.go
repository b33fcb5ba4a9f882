package pagedkv

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
)

// GroupKind is what a KV group's layers cache (PKV_GROUP_*).
type GroupKind uint32

const (
	// GroupFull is full attention: K and V pages, every block kept.
	GroupFull GroupKind = C.PKV_GROUP_FULL
	// GroupSlidingWindow attends over the last SlidingWindow tokens; blocks
	// wholly outside the window of each append's first token are released.
	GroupSlidingWindow GroupKind = C.PKV_GROUP_SLIDING_WINDOW
	// GroupMLA is full attention over one KVLoraRank + RopeDim latent per token.
	GroupMLA GroupKind = C.PKV_GROUP_MLA
	// GroupRecurrent is a fixed-size state per sequence (Mamba) of
	// StateBytes per layer; snapshots at block boundaries serve prefix hits.
	GroupRecurrent GroupKind = C.PKV_GROUP_RECURRENT
)

// GroupSpec describes one group of layers (pkv_kv_group_spec). Zero
// NumLayers means 1, zero DType means BFloat16.
type GroupSpec struct {
	Kind          GroupKind
	NumLayers     uint32
	NumKVHeads    uint32 // full and sliding window
	HeadDim       uint32
	SlidingWindow uint32 // GroupSlidingWindow only
	KVLoraRank    uint32 // GroupMLA only
	RopeDim       uint32
	StateBytes    uint64 // GroupRecurrent only
	DType         DType
	// LayerIDs are the model layers of this group (NumLayers of them), e.g.
	// the odd layers of a sliding-window/full interleave. Give them for
	// every group or for none; without them layers are numbered through the
	// groups in order. Pool.GroupOfLayer maps them back.
	LayerIDs []uint32
	// SnapshotEveryBlock (GroupRecurrent only, PKV_GROUP_SNAPSHOT_EVERY_BLOCK):
	// every step plan gives a state snapshot slot at each block boundary
	// inside each query chunk (PlanSnapshotIndptr, PlanSnapshotRows,
	// PlanSnapshotBlocks), so a prompt prefilled in one chunk can be hit at
	// any of its block boundaries, not only where its appends started.
	SnapshotEveryBlock bool
}

// NewGroupPool creates a manager-only pool of several KV groups drawing
// from one block budget (pagedkv/groups.h). From opts: BlockSize,
// NumBlocks or MemoryBudgetBytes, HashAlgo, HashSeed, prefix caching.
// Sequence calls on it act on every group, all or nothing; Seq.BlockTable
// is group 0's table.
func NewGroupPool(opts *PoolOptions, groups []GroupSpec) (*Pool, error) {
	const op = "pkv_pool_create_groups"
	var arena cArena
	defer arena.free()
	var co C.pkv_pool_options
	if err := opts.toC(op, &arena, &co); err != nil {
		return nil, err
	}
	specs := make([]C.pkv_kv_group_spec, len(groups)+1) // +1: never empty
	for i, g := range groups {
		s := &specs[i]
		if err := check("pkv_kv_group_spec_init_sized", C.pkvgo_kv_group_spec_init_sized(s, C.size_t(C.sizeof_pkv_kv_group_spec))); err != nil {
			return nil, err
		}
		s.kind = C.uint32_t(g.Kind)
		if g.NumLayers != 0 {
			s.num_layers = C.uint32_t(g.NumLayers)
		}
		s.num_kv_heads = C.uint32_t(g.NumKVHeads)
		s.head_dim = C.uint32_t(g.HeadDim)
		s.sliding_window = C.uint32_t(g.SlidingWindow)
		s.kv_lora_rank = C.uint32_t(g.KVLoraRank)
		s.rope_dim = C.uint32_t(g.RopeDim)
		s.state_bytes = C.uint64_t(g.StateBytes)
		if g.DType != 0 {
			s.dtype = C.uint32_t(g.DType)
		}
		if g.SnapshotEveryBlock {
			s.flags = C.PKV_GROUP_SNAPSHOT_EVERY_BLOCK
		}
		if g.LayerIDs != nil {
			// The library reads num_layers entries: a shorter list must not reach it.
			if len(g.LayerIDs) != int(s.num_layers) {
				return nil, &Error{Code: CodeInvalidArgument, Op: op,
					Msg: fmt.Sprintf("groups[%d].LayerIDs holds %d entries, not NumLayers %d", i, len(g.LayerIDs), s.num_layers)}
			}
			s.layer_ids = arena.uint32s(g.LayerIDs)
		}
	}
	var ptr *C.pkv_pool
	// specs holds no Go pointers (layer_ids are copied into the arena's C
	// memory), so cgo may pass it.
	if err := check(op, C.pkvgo_pool_create_groups(&co, &specs[0], C.uint32_t(len(groups)), &ptr)); err != nil {
		return nil, err
	}
	return adoptPool(ptr)
}

// NumGroups is the number of KV groups (1 for a pool from NewPool).
func (p *Pool) NumGroups() (int, error) {
	const op = "pkv_pool_num_groups"
	ptr, err := p.acquire(op)
	if err != nil {
		return 0, err
	}
	defer p.release()
	var n C.uint32_t
	if err := check(op, C.pkvgo_pool_num_groups(ptr, &n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// GroupOfLayer returns the group holding model layer layer and the
// layer's index among that group's layers; ok is false for a layer that no
// group holds.
func (p *Pool) GroupOfLayer(layer uint32) (group, index uint32, ok bool, err error) {
	const op = "pkv_pool_group_of_layer"
	ptr, err := p.acquire(op)
	if err != nil {
		return 0, 0, false, err
	}
	defer p.release()
	var g, k C.uint32_t
	if err := check(op, C.pkvgo_pool_group_of_layer(ptr, C.uint32_t(layer), &g, &k)); err != nil {
		if errors.Is(err, ErrNotFound) {
			return 0, 0, false, nil
		}
		return 0, 0, false, err
	}
	return uint32(g), uint32(k), true, nil
}

// GroupBlockTable returns the sequence's block table in group (NullBlock
// where its sliding window released a block).
func (s Seq) GroupBlockTable(group int) ([]int32, error) {
	const op = "pkv_seq_group_block_table"
	if group < 0 || group > 1<<31 {
		return nil, &Error{Code: CodeInvalidArgument, Op: op, Msg: "group is out of range"}
	}
	ptr, err := s.pool.acquire(op)
	if err != nil {
		return nil, err
	}
	defer s.pool.release()
	buf := make([]int32, 16)
	for {
		var n C.uint64_t
		r := C.pkvgo_seq_group_block_table(ptr, C.pkv_seq_id(s.id), C.uint32_t(group),
			int32Ptr(buf), C.uint64_t(len(buf)), &n)
		err := check(op, r)
		if err == nil {
			return buf[:n], nil
		}
		if err.(*Error).Code == CodeBufferTooSmall && int(n) > len(buf) {
			buf = make([]int32, int(n)+16)
			continue
		}
		return nil, err
	}
}

// GroupStats are the counters of one group (pkv_group_stats).
type GroupStats struct {
	Kind            GroupKind
	NumUsedBlocks   uint64
	NumCachedBlocks uint64
	NumNullEntries  uint64
	BytesPerBlock   uint64
}

// GroupStats returns the counters of one group of a multi-group pool.
func (p *Pool) GroupStats(group int) (GroupStats, error) {
	const op = "pkv_pool_group_stats"
	if group < 0 || group > 1<<31 {
		return GroupStats{}, &Error{Code: CodeInvalidArgument, Op: op, Msg: "group is out of range"}
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return GroupStats{}, err
	}
	defer p.release()
	var s C.pkv_group_stats
	if err := check("pkv_group_stats_init_sized", C.pkvgo_group_stats_init_sized(&s, C.size_t(C.sizeof_pkv_group_stats))); err != nil {
		return GroupStats{}, err
	}
	if err := check(op, C.pkvgo_pool_group_stats(ptr, C.uint32_t(group), &s)); err != nil {
		return GroupStats{}, err
	}
	return GroupStats{GroupKind(s.kind), uint64(s.num_used_blocks), uint64(s.num_cached_blocks),
		uint64(s.num_null_entries), uint64(s.bytes_per_block)}, nil
}

// TakeCopies returns the copy-on-write copies (src[i] -> dst[i]) of group
// recorded since the last call; the engine copies those pages in every
// layer of the group before the next step writes.
func (p *Pool) TakeCopies(group int) (src, dst []int32, err error) {
	const op = "pkv_pool_group_take_copies"
	if group < 0 || group > 1<<31 {
		return nil, nil, &Error{Code: CodeInvalidArgument, Op: op, Msg: "group is out of range"}
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return nil, nil, err
	}
	defer p.release()
	n := 16
	for {
		src, dst = make([]int32, n), make([]int32, n)
		var got C.uint64_t
		r := C.pkvgo_pool_group_take_copies(ptr, C.uint32_t(group), int32Ptr(src), int32Ptr(dst),
			C.uint64_t(n), &got)
		err := check(op, r)
		if err == nil {
			return src[:got], dst[:got], nil
		}
		if err.(*Error).Code == CodeBufferTooSmall && int(got) > n {
			n = int(got)
			continue
		}
		return nil, nil, err
	}
}
