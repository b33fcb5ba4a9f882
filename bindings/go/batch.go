package pagedkv

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// Batch is one step plan: the slot mapping and page table of the scheduled
// sequences, built once per step, then used per layer by CacheWrite and
// Attention. If one of its sequences changes afterwards (append, truncate,
// free) the plan is stale and its calls fail with ErrInvalidState. A Batch
// serialises its own calls, so it is safe (though pointless) to share.
//
// The step's tokens count as computed (prefix hits, sliding window) only
// once it is committed: on a pool with storage by CacheWrite succeeding for
// every layer, otherwise by Commit (the engine wrote K/V elsewhere). Close
// (and the finalizer) aborts a step that was not committed, so an error
// path that returns after `defer b.Close()` never caches K/V nobody wrote.
type Batch struct {
	h    *batchHandle // shared by copies of the struct (one destroy)
	info BatchInfo

	dtype      DType
	device     DeviceType
	hasStorage bool // NumLayers > 0 (a multi-group pool has none)
	numKVHeads int
	headDim    int
	// The MLA widths (kvLayout LayoutMLA), kept here like the fields
	// above: Close clears pool, and later calls must still fail cleanly.
	kvLayout   KVLayout
	kvLoRARank int
	qkRopeDim  int
}

// BatchInfo describes a plan.
type BatchInfo struct {
	NumSeqs    uint32
	NumTokens  uint64 // total queries: rows of q, k, v and out
	NumPages   uint64 // entries of the CSR page table
	MaxContext uint64 // longest sequence
	MaxQuery   uint32 // largest query count
	BlockSize  uint32
}

// Prepare builds the step plan for seqs with queryCounts[i] new tokens
// each (1 for decode, the chunk length for prefill): the last queryCounts[i]
// tokens of each sequence are its queries. Pending copy-on-write copies run
// here. Nothing counts as computed until the step is committed (see Batch);
// a plan whose context holds tokens nobody wrote fails with ErrInvalidState:
// compute from SeqInfo.NumComputedTokens on. Close the batch when the step
// is done.
func (p *Pool) Prepare(seqs []Seq, queryCounts []int) (*Batch, error) {
	return p.PrepareOnStream(seqs, queryCounts, nil)
}

// PrepareOnStream is Prepare running the copy-on-write copies on a CUDA
// stream (a cudaStream_t; nil for the default stream or CPU pools).
func (p *Pool) PrepareOnStream(seqs []Seq, queryCounts []int, stream unsafe.Pointer) (*Batch, error) {
	return p.prepare("pkv_batch_prepare", seqs, queryCounts, 0, stream)
}

// PrepareFlags select plan layouts for PrepareEx (PKV_PREPARE_*).
type PrepareFlags uint32

// PreparePersistentTable makes the page table a persistent block table of
// padded rows that the pool keeps across steps, rewriting only the rows
// whose sequence or block table changed: row i holds seqs[i]'s pages at
// PAGE_INDICES[i*stride+j], 0 (the null block) past them, and
// PAGE_INDPTR[i] = i*stride. Keep each sequence at the same index from
// step to step. On a multi-group pool every group has its own kept table
// and stride (PlanGroupTensor; a recurrent group's rows are one page). See
// pkv_batch_prepare_ex.
const PreparePersistentTable PrepareFlags = C.PKV_PREPARE_PERSISTENT_TABLE

// PrepareEx is PrepareOnStream with plan flags (0: the same plan).
func (p *Pool) PrepareEx(seqs []Seq, queryCounts []int, flags PrepareFlags, stream unsafe.Pointer) (*Batch, error) {
	return p.prepare("pkv_batch_prepare_ex", seqs, queryCounts, flags, stream)
}

func (p *Pool) prepare(op string, seqs []Seq, queryCounts []int, flags PrepareFlags, stream unsafe.Pointer) (*Batch, error) {
	if len(seqs) != len(queryCounts) {
		return nil, argError(op, "%d sequences but %d query counts", len(seqs), len(queryCounts))
	}
	if int64(len(seqs)) > 1<<32-1 {
		return nil, argError(op, "too many sequences (%d)", len(seqs))
	}
	ids := make([]C.pkv_seq_id, len(seqs))
	counts := make([]C.uint32_t, len(seqs))
	for i, s := range seqs {
		// Copies of a Pool value (`cp := *pool`) share one pool: a Seq
		// made through either is one of p's.
		if s.pool != p && (s.pool == nil || p == nil || s.pool.h != p.h) {
			return nil, argError(op, "seqs[%d] belongs to another pool", i)
		}
		if queryCounts[i] < 0 || int64(queryCounts[i]) > 1<<32-1 {
			return nil, argError(op, "queryCounts[%d] = %d out of range", i, queryCounts[i])
		}
		ids[i] = C.pkv_seq_id(s.id)
		counts[i] = C.uint32_t(queryCounts[i])
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return nil, err
	}
	defer p.release()
	var idp *C.pkv_seq_id
	var cp *C.uint32_t
	if len(seqs) > 0 {
		idp, cp = &ids[0], &counts[0]
	}
	var bp *C.pkv_batch
	if err := callChecked(op, []pointerArg{{"stream", stream, false}}, func() C.pkvgo_result {
		if flags == 0 {
			return C.pkvgo_batch_prepare(ptr, idp, cp, C.uint32_t(len(seqs)), stream, &bp)
		}
		return C.pkvgo_batch_prepare_ex(ptr, idp, cp, C.uint32_t(len(seqs)), C.uint32_t(flags), stream, &bp)
	}); err != nil {
		return nil, err
	}
	return p.newBatch(bp)
}

// PrepareDecode is one decode step in one call (pkv_batch_prepare_decode):
// it appends tokens[i] (one token) to seqs[i] and builds the plan whose
// queries are those tokens, as AppendBatch then Prepare with every query
// count 1 would. The Batch is committed, aborted and closed as Prepare's.
//
// All or nothing: when the plan cannot be built (a stale id: ErrNotFound; a
// repeated one: ErrInvalidArgument; too few free blocks: ErrOutOfBlocks; a
// context no committed step wrote: ErrInvalidState) nothing is appended. ErrUnsupported on a multi-group pool (Seq.Append,
// then Prepare); an argument error when seqs and tokens differ in length.
func (p *Pool) PrepareDecode(seqs []SeqID, tokens []int32) (*Batch, error) {
	return p.PrepareDecodeEx(seqs, tokens, 0, nil)
}

// PrepareDecodeEx is PrepareDecode with plan flags (PreparePersistentTable:
// the page table is the pool's persistent block table, as PrepareEx lays
// it out; keep each sequence at the same index from step to step) and a
// CUDA stream (nil for the default stream or CPU pools). Device errors on
// a CUDA pool (pending copy-on-write copies, the plan's upload) come after
// the appends, which then stay, uncomputed.
func (p *Pool) PrepareDecodeEx(seqs []SeqID, tokens []int32, flags PrepareFlags, stream unsafe.Pointer) (*Batch, error) {
	const op = "pkv_batch_prepare_decode"
	if len(seqs) != len(tokens) {
		return nil, argError(op, "seqs and tokens differ in length (%d vs %d)", len(seqs), len(tokens))
	}
	if int64(len(seqs)) > 1<<32-1 {
		return nil, argError(op, "too many sequences (%d)", len(seqs))
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return nil, err
	}
	defer p.release()
	var bp *C.pkv_batch
	err = callChecked(op, []pointerArg{{"stream", stream, false}}, func() C.pkvgo_result {
		return C.pkvgo_batch_prepare_decode(ptr, seqIDPtr(seqs), int32Ptr(tokens), C.uint32_t(len(seqs)),
			C.uint32_t(flags), stream, &bp)
	})
	runtime.KeepAlive(seqs)
	runtime.KeepAlive(tokens)
	if err != nil {
		return nil, err
	}
	return p.newBatch(bp)
}

// newBatch wraps a plan the library just built on p.
func (p *Pool) newBatch(bp *C.pkv_batch) (*Batch, error) {
	b := &Batch{
		h:          &batchHandle{ptr: bp, pool: p},
		dtype:      p.opts.DType,
		device:     p.opts.Device,
		hasStorage: p.opts.NumLayers > 0,
		numKVHeads: int(p.opts.NumKVHeads),
		headDim:    int(p.opts.HeadDim),
		kvLayout:   p.opts.KVLayout,
		kvLoRARank: int(p.opts.KVLoRARank),
		qkRopeDim:  int(p.opts.QKRopeHeadDim),
	}
	var ci C.pkv_batch_info
	err := check("pkv_batch_info_init_sized", C.pkvgo_batch_info_init_sized(&ci, C.size_t(C.sizeof_pkv_batch_info)))
	if err == nil {
		err = check("pkv_batch_get_info", C.pkvgo_batch_get_info(bp, &ci))
	}
	if err != nil {
		C.pkv_batch_destroy(bp)
		return nil, err
	}
	b.info = batchInfoFromC(&ci)
	runtime.SetFinalizer(b.h, (*batchHandle).close)
	return b, nil
}

// batchHandle is what a Batch's calls lock and Close destroys, behind a
// pointer so that copies of a Batch value share it.
type batchHandle struct {
	mu        sync.Mutex
	ptr       *C.pkv_batch
	committed bool
	// pool keeps the Pool reachable while the batch is: its finalizer must
	// not destroy the pool under a batch still in use on some goroutine.
	pool *Pool
}

func (h *batchHandle) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ptr != nil {
		if !h.committed {
			C.pkv_batch_abort(h.ptr) // refused, harmlessly, if every layer was written
		}
		C.pkv_batch_destroy(h.ptr)
		h.ptr = nil
		h.pool = nil
		runtime.SetFinalizer(h, nil)
	}
}

func batchInfoFromC(c *C.pkv_batch_info) BatchInfo {
	return BatchInfo{
		NumSeqs:    uint32(c.num_seqs),
		NumTokens:  uint64(c.num_tokens),
		NumPages:   uint64(c.num_pages),
		MaxContext: uint64(c.max_context),
		MaxQuery:   uint32(c.max_query),
		BlockSize:  uint32(c.block_size),
	}
}

func (b *Batch) acquire(op string) (*C.pkv_batch, error) {
	if b == nil || b.h == nil {
		return nil, closedError(op, "batch")
	}
	b.h.mu.Lock()
	if b.h.ptr == nil {
		b.h.mu.Unlock()
		return nil, closedError(op, "batch")
	}
	return b.h.ptr, nil
}

func (b *Batch) release() {
	b.h.mu.Unlock()
	runtime.KeepAlive(b)
}

// Commit says the step's writes happened: its tokens count as computed.
// Idempotent; ErrInvalidState after Abort.
func (b *Batch) Commit() error {
	const op = "pkv_batch_commit"
	ptr, err := b.acquire(op)
	if err != nil {
		return err
	}
	defer b.release()
	if err := check(op, C.pkvgo_batch_commit(ptr)); err != nil {
		return err
	}
	b.h.committed = true
	return nil
}

// Abort says the step failed before its writes: nothing of it counts.
// Idempotent; ErrInvalidState if the step already committed (every layer
// written).
func (b *Batch) Abort() error {
	const op = "pkv_batch_abort"
	ptr, err := b.acquire(op)
	if err != nil {
		return err
	}
	defer b.release()
	return check(op, C.pkvgo_batch_abort(ptr))
}

// Close aborts the step unless it was committed, then destroys the plan;
// idempotent.
func (b *Batch) Close() error {
	if b == nil || b.h == nil {
		return nil
	}
	b.h.close()
	return nil
}

// Info describes the plan, as the library reports it.
func (b *Batch) Info() (BatchInfo, error) {
	const op = "pkv_batch_get_info"
	ptr, err := b.acquire(op)
	if err != nil {
		return BatchInfo{}, err
	}
	defer b.release()
	var ci C.pkv_batch_info
	if err := check("pkv_batch_info_init_sized", C.pkvgo_batch_info_init_sized(&ci, C.size_t(C.sizeof_pkv_batch_info))); err != nil {
		return BatchInfo{}, err
	}
	if err := check(op, C.pkvgo_batch_get_info(ptr, &ci)); err != nil {
		return BatchInfo{}, err
	}
	return batchInfoFromC(&ci), nil
}

// NumTokens is the number of query rows of the plan.
func (b *Batch) NumTokens() int {
	if b == nil {
		return 0
	}
	return int(b.info.NumTokens)
}

// PlanArray selects one of a plan's arrays.
type PlanArray uint32

// The plan's arrays (see batch.h).
const (
	PlanSlotMapping PlanArray = C.PKV_PLAN_SLOT_MAPPING  // i64 [num_tokens]
	PlanQueryIndptr PlanArray = C.PKV_PLAN_QUERY_INDPTR  // i32 [num_seqs+1]
	PlanPageIndptr  PlanArray = C.PKV_PLAN_PAGE_INDPTR   // i32 [num_seqs+1]
	PlanPageIndices PlanArray = C.PKV_PLAN_PAGE_INDICES  // i32 [num_pages]
	PlanLastPageLen PlanArray = C.PKV_PLAN_LAST_PAGE_LEN // i32 [num_seqs]
	PlanContextLens PlanArray = C.PKV_PLAN_CONTEXT_LENS  // i32 [num_seqs]
	// A recurrent group's state snapshots (GroupSpec.SnapshotEveryBlock;
	// PlanGroupTensor only): CSR offsets per sequence, the query row after
	// which each state is saved, and its state slot (block id).
	PlanSnapshotIndptr PlanArray = C.PKV_PLAN_SNAPSHOT_INDPTR // i32 [num_seqs+1]
	PlanSnapshotRows   PlanArray = C.PKV_PLAN_SNAPSHOT_ROWS   // i64 [num_snapshots]
	PlanSnapshotBlocks PlanArray = C.PKV_PLAN_SNAPSHOT_BLOCKS // i32 [num_snapshots]
)

// PlanTensor describes one of the plan's arrays on the pool's device, for
// engines bringing their own kernels. The memory belongs to the batch: it
// is valid until Close, and read-only (the library's kernels use their own
// copy, so writing into it through Data only misleads the writer).
// PlanInt32s and SlotMapping return copies.
func (b *Batch) PlanTensor(which PlanArray) (Tensor, error) {
	const op = "pkv_batch_plan_tensor"
	ptr, err := b.acquire(op)
	if err != nil {
		return Tensor{}, err
	}
	defer b.release()
	var t C.pkv_tensor
	if err := check(op, C.pkvgo_batch_plan_tensor(ptr, C.uint32_t(which), &t)); err != nil {
		return Tensor{}, err
	}
	// The Tensor keeps b reachable: b's finalizer would free (recycle) the
	// plan memory it describes.
	return ownedBy(fromC(&t), b), nil
}

// PlanInt32s copies one of a CPU plan's i32 arrays into a new slice.
func (b *Batch) PlanInt32s(which PlanArray) ([]int32, error) {
	ptr, err := b.acquire("Batch.PlanInt32s")
	if err != nil {
		return nil, err
	}
	defer b.release()
	var t C.pkv_tensor
	if err := check("pkv_batch_plan_tensor", C.pkvgo_batch_plan_tensor(ptr, C.uint32_t(which), &t)); err != nil {
		return nil, err
	}
	gt := fromC(&t)
	return gt.Int32s()
}

// PlanGroupTensor is PlanTensor for one KV group of a plan over a
// multi-group pool (pkv_batch_plan_tensor_group): that group's page table and
// slot mapping (a recurrent group: one page per sequence, its state slot);
// query offsets and context lengths are shared. Group 0 of a single-group
// plan is PlanTensor.
func (b *Batch) PlanGroupTensor(group uint32, which PlanArray) (Tensor, error) {
	const op = "pkv_batch_plan_tensor_group"
	ptr, err := b.acquire(op)
	if err != nil {
		return Tensor{}, err
	}
	defer b.release()
	var t C.pkv_tensor
	if err := check(op, C.pkvgo_batch_plan_tensor_group(ptr, C.uint32_t(group), C.uint32_t(which), &t)); err != nil {
		return Tensor{}, err
	}
	return ownedBy(fromC(&t), b), nil
}

// SlotMapping copies a CPU plan's slot mapping (block_id*block_size+offset
// per query row) into a new slice.
func (b *Batch) SlotMapping() ([]int64, error) {
	ptr, err := b.acquire("Batch.SlotMapping")
	if err != nil {
		return nil, err
	}
	defer b.release()
	var t C.pkv_tensor
	if err := check("pkv_batch_plan_tensor", C.pkvgo_batch_plan_tensor(ptr, C.PKV_PLAN_SLOT_MAPPING, &t)); err != nil {
		return nil, err
	}
	gt := fromC(&t)
	return gt.Int64s()
}

// TokenPositionsTensor describes the position in its sequence of each query
// row (i64 [num_tokens]: a model's rotary position ids) on the pool's
// device, zero-copy: valid until Close, read-only, like PlanTensor. Built on
// the first call (on a CUDA pool uploaded on the prepare stream).
func (b *Batch) TokenPositionsTensor() (Tensor, error) {
	return b.positionsView("pkv_batch_token_positions", false, nil)
}

// LastTokenIndicesTensor describes the query row of each sequence's last
// scheduled token (i64 [num_seqs]: the rows to compute logits for), like
// TokenPositionsTensor.
func (b *Batch) LastTokenIndicesTensor() (Tensor, error) {
	return b.positionsView("pkv_batch_last_token_indices", true, nil)
}

// TokenPositions copies a CPU plan's token positions into a new slice (a Go
// slice must not outlive Close; TokenPositionsTensor is the zero-copy form).
func (b *Batch) TokenPositions() ([]int64, error) {
	var out []int64
	_, err := b.positionsView("pkv_batch_token_positions", false, &out)
	return out, err
}

// LastTokenIndices copies a CPU plan's last-token rows into a new slice.
func (b *Batch) LastTokenIndices() ([]int64, error) {
	var out []int64
	_, err := b.positionsView("pkv_batch_last_token_indices", true, &out)
	return out, err
}

// positionsView gets one of the two arrays and, with copyTo, copies it while
// the batch is held (Close cannot free it mid-copy).
func (b *Batch) positionsView(op string, last bool, copyTo *[]int64) (Tensor, error) {
	ptr, err := b.acquire(op)
	if err != nil {
		return Tensor{}, err
	}
	defer b.release()
	var t C.pkv_tensor
	var r C.pkvgo_result
	if last {
		r = C.pkvgo_batch_last_token_indices(ptr, &t)
	} else {
		r = C.pkvgo_batch_token_positions(ptr, &t)
	}
	if err := check(op, r); err != nil {
		return Tensor{}, err
	}
	gt := fromC(&t)
	if copyTo != nil {
		// Copied before gt names b as its owner: b is held here already.
		*copyTo, err = gt.Int64s()
	}
	return ownedBy(gt, b), err
}

// AttentionParams tunes Attention; the zero value is the default.
type AttentionParams struct {
	SoftmaxScale  float32 // 0 = 1/sqrt(head_dim)
	SlidingWindow uint32  // tokens; a query at p sees keys k with p-window < k <= p; 0 = none
	LogitSoftcap  float32 // 0 = none; else logits = c*tanh(logits/c)
}

func (a *AttentionParams) toC(out *C.pkv_attention_params) error {
	if err := check("pkv_attention_params_init_sized", C.pkvgo_attention_params_init_sized(out, C.size_t(C.sizeof_pkv_attention_params))); err != nil {
		return err
	}
	if a == nil {
		return nil
	}
	out.softmax_scale = C.float(a.SoftmaxScale)
	out.sliding_window = C.uint32_t(a.SlidingWindow)
	out.logit_softcap = C.float(a.LogitSoftcap)
	return nil
}

// hostCheck validates a host call's layer and the pool's device and dtype
// before any pointer goes to C.
func (b *Batch) hostCheck(op string, layer int, want16 bool) error {
	if layer < 0 || int64(layer) > 1<<32-1 {
		return argError(op, "layer %d out of range", layer)
	}
	// A closed (or zero) Batch is ErrClosed before anything its fields say.
	if _, err := b.acquire(op); err != nil {
		return err
	}
	b.release()
	// Before the dtype: a pool without storage has a dtype nothing is
	// stored in, and the library says what is wrong with the call.
	if !b.hasStorage {
		return &Error{Code: CodeInvalidState, Op: op,
			Msg: "the pool has no KV storage (created with NumLayers 0, or a multi-group pool)"}
	}
	if b.device != CPU {
		return &Error{Code: CodeUnsupported, Op: op,
			Msg: "Go slices hold host memory but the pool is on " + b.device.String() +
				"; use the Tensor variant with device pointers"}
	}
	is16 := b.dtype == Float16 || b.dtype == BFloat16
	if want16 && !is16 {
		return argError(op, "the pool stores %v; pass []float32", b.dtype)
	}
	if !want16 && b.dtype != Float32 && !isFP8(b.dtype) {
		return argError(op, "the pool stores %v; pass []uint16 (bit patterns)", b.dtype)
	}
	return nil
}

// hostDType is the dtype of the Go slices of the host calls: the pool's,
// or float32 for an FP8 pool (which quantises on write).
func (b *Batch) hostDType() DType {
	if isFP8(b.dtype) {
		return Float32
	}
	return b.dtype
}

// CacheWrite scatters the step's new keys and values, k and v of shape
// [NumTokens, num_kv_heads, head_dim] row-major, into their slots of layer
// of an f32 CPU pool, or of an FP8 CPU pool (stored as x / scale, rounded
// to nearest even, saturated).
func (b *Batch) CacheWrite(layer int, k, v []float32) error {
	const op = "pkv_cache_write"
	if b == nil {
		return closedError(op, "batch")
	}
	if err := b.hostCheck(op, layer, false); err != nil {
		return err
	}
	if err := b.kvLens(op, len(k), len(v)); err != nil {
		return err
	}
	return b.writeHost(op, layer, f32Ptr(k), f32Ptr(v), k, v)
}

// CacheWrite16 is CacheWrite for f16 and bf16 pools, values as bit
// patterns.
func (b *Batch) CacheWrite16(layer int, k, v []uint16) error {
	const op = "pkv_cache_write"
	if b == nil {
		return closedError(op, "batch")
	}
	if err := b.hostCheck(op, layer, true); err != nil {
		return err
	}
	if err := b.kvLens(op, len(k), len(v)); err != nil {
		return err
	}
	return b.writeHost(op, layer, u16Ptr(k), u16Ptr(v), k, v)
}

func (b *Batch) kvLens(op string, nk, nv int) error {
	want := b.NumTokens() * b.numKVHeads * b.headDim
	if nk != want {
		return argError(op, "k has %d elements, want %d = [%d tokens, %d kv heads, %d head dim]",
			nk, want, b.NumTokens(), b.numKVHeads, b.headDim)
	}
	if nv != want {
		return argError(op, "v has %d elements, want %d = [%d tokens, %d kv heads, %d head dim]",
			nv, want, b.NumTokens(), b.numKVHeads, b.headDim)
	}
	return nil
}

func (b *Batch) writeHost(op string, layer int, k, v unsafe.Pointer, keepK, keepV interface{}) error {
	ptr, err := b.acquire(op)
	if err != nil {
		return err
	}
	defer b.release()
	r := C.pkvgo_cache_write_host(ptr, C.uint32_t(layer), C.uint32_t(b.hostDType()), k, v,
		C.int64_t(b.NumTokens()), C.int64_t(b.numKVHeads), C.int64_t(b.headDim))
	runtime.KeepAlive(keepK)
	runtime.KeepAlive(keepV)
	return check(op, r)
}

// Attention runs paged attention for every query of the plan on an f32 CPU
// pool: q and out [NumTokens, num_q_heads, head_dim] (num_q_heads a
// multiple of num_kv_heads), lse nil or [NumTokens, num_q_heads] to receive
// the natural-log sum-exp of the scaled logits. params may be nil.
func (b *Batch) Attention(layer int, q, out, lse []float32, params *AttentionParams) error {
	const op = "pkv_attention_forward"
	if b == nil {
		return closedError(op, "batch")
	}
	if err := b.hostCheck(op, layer, false); err != nil {
		return err
	}
	heads, err := b.qHeads(op, len(q), len(out), lse)
	if err != nil {
		return err
	}
	return b.attendHost(op, layer, f32Ptr(q), f32Ptr(out), lse, heads, params, q, out)
}

// Attention16 is Attention for f16 and bf16 pools: q and out as bit
// patterns of the pool's dtype, lse still f32.
func (b *Batch) Attention16(layer int, q, out []uint16, lse []float32, params *AttentionParams) error {
	const op = "pkv_attention_forward"
	if b == nil {
		return closedError(op, "batch")
	}
	if err := b.hostCheck(op, layer, true); err != nil {
		return err
	}
	heads, err := b.qHeads(op, len(q), len(out), lse)
	if err != nil {
		return err
	}
	return b.attendHost(op, layer, u16Ptr(q), u16Ptr(out), lse, heads, params, q, out)
}

// qHeads derives num_q_heads from q's length and checks out and lse.
func (b *Batch) qHeads(op string, nq, nout int, lse []float32) (int, error) {
	rows := b.NumTokens() * b.headDim
	if rows == 0 {
		if nq != 0 || nout != 0 || len(lse) != 0 {
			return 0, argError(op, "the plan has no query rows but q has %d elements", nq)
		}
		return b.numKVHeads, nil
	}
	if nq == 0 || nq%rows != 0 {
		return 0, argError(op, "q has %d elements, not a multiple of %d tokens * %d head dim",
			nq, b.NumTokens(), b.headDim)
	}
	heads := nq / rows
	if nout != nq {
		return 0, argError(op, "out has %d elements, want %d like q", nout, nq)
	}
	if lse != nil && len(lse) != b.NumTokens()*heads {
		return 0, argError(op, "lse has %d elements, want %d = [%d tokens, %d q heads]",
			len(lse), b.NumTokens()*heads, b.NumTokens(), heads)
	}
	return heads, nil
}

func (b *Batch) attendHost(op string, layer int, q, out unsafe.Pointer, lse []float32, heads int,
	params *AttentionParams, keepQ, keepOut interface{}) error {
	var cp C.pkv_attention_params
	if err := params.toC(&cp); err != nil {
		return err
	}
	var lp *C.float
	if len(lse) > 0 {
		lp = (*C.float)(unsafe.Pointer(&lse[0]))
	}
	ptr, err := b.acquire(op)
	if err != nil {
		return err
	}
	defer b.release()
	r := C.pkvgo_attention_host(ptr, C.uint32_t(layer), C.uint32_t(b.hostDType()), q, out, lp,
		C.int64_t(b.NumTokens()), C.int64_t(heads), C.int64_t(b.headDim), &cp)
	runtime.KeepAlive(keepQ)
	runtime.KeepAlive(keepOut)
	runtime.KeepAlive(lse)
	return check(op, r)
}

// CacheWriteTensor is CacheWrite for memory outside Go (CUDA device
// memory for CUDA pools), on stream (a cudaStream_t, or nil).
func (b *Batch) CacheWriteTensor(layer int, k, v *Tensor, stream unsafe.Pointer) error {
	const op = "pkv_cache_write"
	if layer < 0 || int64(layer) > 1<<32-1 {
		return argError(op, "layer %d out of range", layer)
	}
	var ck, cv C.pkv_tensor
	if err := k.toC(op, "k", &ck); err != nil {
		return err
	}
	if err := v.toC(op, "v", &cv); err != nil {
		return err
	}
	ptr, err := b.acquire(op)
	if err != nil {
		return err
	}
	defer b.release()
	done, err := holdKernelOperands(op, []string{"k", "v"}, k, v)
	if err != nil {
		return err
	}
	defer done()
	return callChecked(op, []pointerArg{{"k", unsafe.Pointer(&ck), true}, {"v", unsafe.Pointer(&cv), true},
		{"stream", stream, false}}, func() C.pkvgo_result {
		return C.pkvgo_cache_write(ptr, C.uint32_t(layer), &ck, &cv, stream)
	})
}

// AttentionTensor is Attention for memory outside Go (CUDA device memory
// for CUDA pools), on stream. lse may be nil.
func (b *Batch) AttentionTensor(layer int, q, out, lse *Tensor, params *AttentionParams,
	stream unsafe.Pointer) error {
	const op = "pkv_attention_forward"
	if layer < 0 || int64(layer) > 1<<32-1 {
		return argError(op, "layer %d out of range", layer)
	}
	var cq, cout, clse C.pkv_tensor
	if err := q.toC(op, "q", &cq); err != nil {
		return err
	}
	if err := out.toC(op, "out", &cout); err != nil {
		return err
	}
	var lp *C.pkv_tensor
	if lse != nil {
		if err := lse.toC(op, "lse", &clse); err != nil {
			return err
		}
		lp = &clse
	}
	var cp C.pkv_attention_params
	if err := params.toC(&cp); err != nil {
		return err
	}
	ptr, err := b.acquire(op)
	if err != nil {
		return err
	}
	defer b.release()
	done, err := holdKernelOperands(op, []string{"q", "out", "lse"}, q, out, lse)
	if err != nil {
		return err
	}
	defer done()
	return callChecked(op, []pointerArg{{"q", unsafe.Pointer(&cq), true}, {"out", unsafe.Pointer(&cout), true},
		{"lse", unsafe.Pointer(lp), true}, {"stream", stream, false}}, func() C.pkvgo_result {
		return C.pkvgo_attention_forward(ptr, C.uint32_t(layer), &cq, &cout, lp, &cp, stream)
	})
}

func f32Ptr(s []float32) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}

func u16Ptr(s []uint16) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}
