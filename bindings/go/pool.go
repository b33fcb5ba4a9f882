package pagedkv

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"
)

// PoolOptions configures NewPool. Zero fields take the library defaults:
// 16 tokens per block, SHA256CBOR, prefix caching on, seed "", no sliding
// window, events off (65536 kept when on), BF16 storage on the CPU, as many
// kernel threads as hardware threads. NumLayers == 0 makes a manager-only
// pool (block tables and plans, no storage).
type PoolOptions struct {
	BlockSize            uint32 // tokens per block, 1..1024 (storage or not)
	NumBlocks            uint64 // total blocks incl. the null block; 0 = from MemoryBudgetBytes
	MemoryBudgetBytes    uint64 // KV bytes to spend when NumBlocks == 0
	HashAlgo             HashAlgo
	DisablePrefixCaching bool
	HashSeed             string
	SlidingWindow        uint32 // tokens; 0 = none
	EnableEvents         bool
	MaxEvents            uint32
	NumLayers            uint32
	NumKVHeads           uint32
	HeadDim              uint32 // 1..4096 on the CPU; 64, 80, 96, 128, 256 on CUDA
	DType                DType  // Float32, Float16 or BFloat16
	Device               DeviceType
	DeviceID             int32
	NumThreads           uint32
	// StrictKeyDomains keeps cache salts and multimodal item hashes in
	// separate hash domains (no item hash can equal a salt). Off (default):
	// vLLM-compatible hashes; keep salts secret and high-entropy and never
	// take item hashes from tenants.
	StrictKeyDomains bool
	// VLLMTaggedKeys hashes extra keys as vLLM 0.33's tagged keys
	// (PKV_KEY_DOMAINS_VLLM_TAGGED): ("lora", LoraName, LoraPath),
	// ("mm", hash, offset), ("cache_salt", salt). It keeps the domains apart
	// as StrictKeyDomains does, with the bytes of that vLLM's hashes, and
	// keys SeqOptions.LoraPath. Off by default; setting it together with
	// StrictKeyDomains is an error.
	VLLMTaggedKeys bool
	// EnablePartialReuse allows partial-block prefix hits
	// (Seq.MatchPrefixPartial); it keeps the token ids of cached blocks.
	EnablePartialReuse bool
	// EnableRetention turns on retention priorities (Seq.SetRetention):
	// lower priorities are evicted first, LRU within one.
	EnableRetention bool
	// MaxPinnedBlocks caps the cached blocks pinned (never evicted) at once;
	// below NumBlocks - 1, with EnableRetention. 0 = no pinning.
	MaxPinnedBlocks uint64
	// FP8 pools (DType Float8E4M3 or Float8E5M2): the dequantisation scales,
	// one K and one V scale per layer (KVScalePerTensor, vLLM's
	// k_scale/v_scale) or per layer and KV head (KVScalePerHead, layer
	// major); each finite and > 0. Empty = every scale 1.0. PoolOptions
	// returned by Options() leave them empty: see KVScales.
	KVScaleGranularity KVScaleGranularity
	KScales, VScales   []float32
	// KVLayout MLA makes a DeepSeek-style pool: per layer one latent tensor
	// [num_blocks, block_size, KVLoRARank + QKRopeHeadDim], no V (mla.go);
	// NumKVHeads and HeadDim then stay 0 (or 1 and the sum).
	KVLayout      KVLayout
	KVLoRARank    uint32 // MLA: latent width (DeepSeek-V3: 512)
	QKRopeHeadDim uint32 // MLA: rotary key width (DeepSeek-V3: 64)
}

// KVScaleGranularity says how an FP8 pool's K/V scales are given.
type KVScaleGranularity uint32

const (
	KVScalePerTensor KVScaleGranularity = C.PKV_KV_SCALE_PER_TENSOR
	KVScalePerHead   KVScaleGranularity = C.PKV_KV_SCALE_PER_HEAD
)

// isFP8 reports whether d is an FP8 storage dtype.
func isFP8(d DType) bool { return d == Float8E4M3 || d == Float8E5M2 }

// floats copies s into C memory owned by the arena (nil for an empty s).
func (a *cArena) floats(s []float32) *C.float { return (*C.float)(cCopy(a, s)) }

func (o *PoolOptions) toC(op string, arena *cArena, out *C.pkv_pool_options) error {
	if err := check("pkv_pool_options_init_sized", C.pkvgo_pool_options_init_sized(out, C.size_t(C.sizeof_pkv_pool_options))); err != nil {
		return err
	}
	if o == nil {
		return nil
	}
	if err := checkCString(op, "HashSeed", o.HashSeed); err != nil {
		return err
	}
	if o.BlockSize != 0 {
		out.block_size = C.uint32_t(o.BlockSize)
	}
	out.num_blocks = C.uint64_t(o.NumBlocks)
	if o.MemoryBudgetBytes != 0 {
		out.memory_budget_bytes = C.uint64_t(o.MemoryBudgetBytes)
	}
	if o.HashAlgo != 0 {
		out.hash_algo = C.uint32_t(o.HashAlgo)
	}
	if o.DisablePrefixCaching {
		out.enable_prefix_caching = 0
	}
	if o.HashSeed != "" {
		out.hash_seed = arena.str(o.HashSeed)
	}
	out.sliding_window = C.uint32_t(o.SlidingWindow)
	if o.EnableEvents {
		out.enable_events = 1
	}
	if o.MaxEvents != 0 {
		out.max_events = C.uint32_t(o.MaxEvents)
	}
	out.num_layers = C.uint32_t(o.NumLayers)
	out.num_kv_heads = C.uint32_t(o.NumKVHeads)
	out.head_dim = C.uint32_t(o.HeadDim)
	if o.DType != 0 {
		out.dtype = C.uint32_t(o.DType)
	}
	if o.Device != 0 {
		out.device_type = C.int32_t(o.Device)
	}
	out.device_id = C.int32_t(o.DeviceID)
	if o.NumThreads != 0 {
		out.num_threads = C.uint32_t(o.NumThreads)
	}
	domains, err := keyDomains(op, o.StrictKeyDomains, o.VLLMTaggedKeys)
	if err != nil {
		return err
	}
	out.strict_key_domains = domains
	out.kv_scale_granularity = C.uint32_t(o.KVScaleGranularity)
	if len(o.KScales) != len(o.VScales) {
		return argError(op, "KScales and VScales differ in length (%d vs %d)", len(o.KScales), len(o.VScales))
	}
	if int64(len(o.KScales)) > 1<<32-1 {
		return argError(op, "KScales: %d scales", len(o.KScales))
	}
	out.num_kv_scales = C.uint32_t(len(o.KScales))
	out.k_scales = arena.floats(o.KScales)
	out.v_scales = arena.floats(o.VScales)
	if o.EnablePartialReuse {
		out.enable_partial_reuse = 1
	}
	if o.EnableRetention {
		out.enable_retention = 1
	}
	out.max_pinned_blocks = C.uint64_t(o.MaxPinnedBlocks)
	out.kv_layout = C.uint32_t(o.KVLayout)
	out.kv_lora_rank = C.uint32_t(o.KVLoRARank)
	out.qk_rope_head_dim = C.uint32_t(o.QKRopeHeadDim)
	return nil
}

func poolOptionsFromC(c *C.pkv_pool_options) PoolOptions {
	o := PoolOptions{
		BlockSize:            uint32(c.block_size),
		NumBlocks:            uint64(c.num_blocks),
		MemoryBudgetBytes:    uint64(c.memory_budget_bytes),
		HashAlgo:             HashAlgo(c.hash_algo),
		DisablePrefixCaching: c.enable_prefix_caching == 0,
		SlidingWindow:        uint32(c.sliding_window),
		EnableEvents:         c.enable_events != 0,
		MaxEvents:            uint32(c.max_events),
		NumLayers:            uint32(c.num_layers),
		NumKVHeads:           uint32(c.num_kv_heads),
		HeadDim:              uint32(c.head_dim),
		DType:                DType(c.dtype),
		Device:               DeviceType(c.device_type),
		DeviceID:             int32(c.device_id),
		NumThreads:           uint32(c.num_threads),
		StrictKeyDomains:     c.strict_key_domains == C.PKV_KEY_DOMAINS_STRICT,
		VLLMTaggedKeys:       c.strict_key_domains == C.PKV_KEY_DOMAINS_VLLM_TAGGED,
		KVScaleGranularity:   KVScaleGranularity(c.kv_scale_granularity),
		EnablePartialReuse:   c.enable_partial_reuse != 0,
		EnableRetention:      c.enable_retention != 0,
		MaxPinnedBlocks:      uint64(c.max_pinned_blocks),
		KVLayout:             KVLayout(c.kv_layout),
		KVLoRARank:           uint32(c.kv_lora_rank),
		QKRopeHeadDim:        uint32(c.qk_rope_head_dim),
	}
	if c.hash_seed != nil {
		o.HashSeed = C.GoString(c.hash_seed)
	}
	return o
}

// Pool is a block pool with its prefix cache, sequences and KV storage. It
// is safe for concurrent use by any number of goroutines. Use it through
// the *Pool NewPool returns; a copy of the struct shares its handle (one
// Close closes both, never twice).
type Pool struct {
	h    *poolHandle // shared by copies of the struct
	opts PoolOptions // as resolved by the library
	// serial orders pools by creation: calls holding several pools take
	// them in this order (holdKernelOperands).
	serial uint64
}

// poolHandle is what a Pool's calls lock and Close destroys. It lives
// behind a pointer so that a copy of a Pool value (`cp := *pool`) shares
// it: the copy's Close and the original's destroy the C pool once.
type poolHandle struct {
	mu  sync.RWMutex // read-held by every call, write-held by Close
	ptr *C.pkv_pool

	// Scoped views of the storage (Tensor.WithFloat32s and the others)
	// count themselves in views while their callback runs. They hold no
	// lock meanwhile (a callback calling the pool, or Close, must not
	// deadlock), so a Close that finds views > 0 leaves the C pool in
	// pending, and the last view to end destroys it. vmu guards both.
	vmu     sync.Mutex
	views   int
	pending *C.pkv_pool
}

func (h *poolHandle) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ptr != nil {
		h.vmu.Lock()
		destroy := h.ptr
		if h.views > 0 {
			h.pending, destroy = h.ptr, nil
		}
		h.ptr = nil
		h.vmu.Unlock()
		if destroy != nil {
			C.pkv_pool_destroy(destroy)
		}
		runtime.SetFinalizer(h, nil)
	}
}

// pinStorage keeps the pool's storage allocated until the returned
// function is called, without holding the pool's lock: Close meanwhile
// makes the pool's calls ErrClosed at once and leaves the destruction to
// the last pin let go. ErrClosed when the pool is closed already.
func (p *Pool) pinStorage(op string) (func(), error) {
	if _, err := p.acquire(op); err != nil {
		return nil, err
	}
	h := p.h
	h.vmu.Lock()
	h.views++
	h.vmu.Unlock()
	p.release()
	return func() {
		h.vmu.Lock()
		h.views--
		var destroy *C.pkv_pool
		if h.views == 0 {
			destroy, h.pending = h.pending, nil
		}
		h.vmu.Unlock()
		if destroy != nil {
			C.pkv_pool_destroy(destroy)
		}
		runtime.KeepAlive(p)
	}, nil
}

// poolSerial numbers the pools created (Pool.serial).
var poolSerial uint64

// NewPool creates a pool; opts may be nil for the defaults. Close it when
// done.
func NewPool(opts *PoolOptions) (*Pool, error) {
	var arena cArena
	defer arena.free()
	var co C.pkv_pool_options
	if err := opts.toC("pkv_pool_create", &arena, &co); err != nil {
		return nil, err
	}
	var ptr *C.pkv_pool
	if err := check("pkv_pool_create", C.pkvgo_pool_create(&co, &ptr)); err != nil {
		return nil, err
	}
	return adoptPool(ptr)
}

// adoptPool wraps a pool the library just created, reading back its
// resolved options; on failure it destroys the pool.
func adoptPool(ptr *C.pkv_pool) (*Pool, error) {
	var resolved C.pkv_pool_options
	err := check("pkv_pool_options_init_sized", C.pkvgo_pool_options_init_sized(&resolved, C.size_t(C.sizeof_pkv_pool_options)))
	if err == nil {
		err = check("pkv_pool_get_options", C.pkvgo_pool_get_options(ptr, &resolved))
	}
	if err != nil {
		C.pkv_pool_destroy(ptr)
		return nil, err
	}
	h := &poolHandle{ptr: ptr}
	// On the handle, which every copy of the Pool (and everything made
	// from one: Seq, Batch, Tensor) keeps reachable.
	runtime.SetFinalizer(h, (*poolHandle).close)
	p := &Pool{h: h, opts: poolOptionsFromC(&resolved), serial: atomic.AddUint64(&poolSerial, 1)}
	return p, nil
}

// acquire read-locks the pool for one call; release must follow.
func (p *Pool) acquire(op string) (*C.pkv_pool, error) {
	if p == nil || p.h == nil { // never had one: ErrClosed as a closed pool, said apart
		return nil, &Error{Code: CodeInvalidState, Op: op,
			Msg: "no pool (a nil *Pool, a zero Pool, or a zero Seq that no pool made)", cause: ErrClosed}
	}
	p.h.mu.RLock()
	if p.h.ptr == nil {
		p.h.mu.RUnlock()
		return nil, closedError(op, "pool")
	}
	return p.h.ptr, nil
}

func (p *Pool) release() {
	p.h.mu.RUnlock()
	runtime.KeepAlive(p)
}

// Close destroys the pool, its sequences and its storage. It waits for
// calls on the pool in flight, is idempotent, and makes later calls fail
// with ErrClosed. A scoped view of the storage (Tensor.WithFloat32s,
// WithUint16s, WithCodes) whose callback is running when Close is called
// keeps the storage: Close returns without waiting for it (the callback
// may itself call Close or the pool's other methods, which are ErrClosed
// from then on), and the pool is destroyed when the last such callback
// returns. Batches prepared from the pool stay safe to use: a kernel
// call already running on another goroutine finishes (the library keeps the
// storage until it returns) and later calls that need the pool (Commit,
// the kernels) fail with ErrInvalidState; their plan arrays and Info stay
// readable and Abort succeeds.
func (p *Pool) Close() error {
	if p == nil || p.h == nil {
		return nil
	}
	p.h.close()
	return nil
}

// Options returns the options the pool was created with, NumBlocks
// resolved. They stay readable after Close.
func (p *Pool) Options() PoolOptions {
	if p == nil {
		return PoolOptions{}
	}
	return p.opts
}

// BlockSize is the number of tokens per block.
func (p *Pool) BlockSize() int { return int(p.Options().BlockSize) }

// KVScales returns an FP8 pool's K and V scales (the granularity it was
// created with); CodeInvalidState for other dtypes.
func (p *Pool) KVScales() (k, v []float32, err error) {
	const op = "pkv_pool_get_kv_scales"
	o := p.Options()
	n := int(o.NumLayers)
	if o.KVScaleGranularity == KVScalePerHead {
		n *= int(o.NumKVHeads)
	}
	if n == 0 {
		n = 1
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return nil, nil, err
	}
	defer p.release()
	k, v = make([]float32, n), make([]float32, n)
	var got C.uint64_t
	if err := check(op, C.pkvgo_pool_get_kv_scales(ptr, (*C.float)(unsafe.Pointer(&k[0])),
		(*C.float)(unsafe.Pointer(&v[0])), C.uint64_t(n), &got)); err != nil {
		return nil, nil, err
	}
	return k[:got], v[:got], nil
}

// SetKVScales replaces an FP8 pool's scales (as many of each as KVScales
// returns; finite and > 0). Safe while other goroutines run kernels on the
// pool: they finish with the old scales. Stored codes stay and are read
// with the new scales.
func (p *Pool) SetKVScales(k, v []float32) error {
	const op = "pkv_pool_set_kv_scales"
	if len(k) != len(v) {
		return argError(op, "k and v differ in length (%d vs %d)", len(k), len(v))
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return err
	}
	defer p.release()
	var kp, vp *C.float
	if len(k) > 0 {
		kp, vp = (*C.float)(unsafe.Pointer(&k[0])), (*C.float)(unsafe.Pointer(&v[0]))
	}
	r := C.pkvgo_pool_set_kv_scales(ptr, kp, vp, C.uint64_t(len(k)))
	runtime.KeepAlive(k)
	runtime.KeepAlive(v)
	return check(op, r)
}

// BytesPerBlock is the K plus V storage one block takes over all layers (0
// for a manager-only pool).
func (p *Pool) BytesPerBlock() (uint64, error) {
	const op = "pkv_pool_bytes_per_block"
	ptr, err := p.acquire(op)
	if err != nil {
		return 0, err
	}
	defer p.release()
	var n C.uint64_t
	if err := check(op, C.pkvgo_pool_bytes_per_block(ptr, &n)); err != nil {
		return 0, err
	}
	return uint64(n), nil
}

// Stats is a snapshot of the pool's counters.
type Stats struct {
	BlockSize         uint32
	NumBlocks         uint64 // total, incl. the null block
	NumFreeBlocks     uint64 // in the free queue (incl. cached ones)
	NumUsedBlocks     uint64 // ref count > 0
	NumCachedBlocks   uint64 // holding a hash in the prefix cache
	NumSeqs           uint64
	NumTokens         uint64 // over all sequences
	Usage             float64
	PrefixQueryTokens uint64
	PrefixHitTokens   uint64
	NumEvictions      uint64
	NumCOWCopies      uint64
	NumEventsDropped  uint64
	KVBytesPerBlock   uint64
	KVBytesAllocated  uint64
	KVBytesUsed       uint64
	KVBytesWasted     uint64
	NumPartialHits    uint64 // partial-block hits (EnablePartialReuse)
	PartialHitTokens  uint64 // tokens they reused (also in PrefixHitTokens)
	NumPinnedBlocks   uint64 // cached blocks at PriorityPinned
	NumPinsDegraded   uint64 // pins the budget turned into PriorityPinned - 1
}

// Stats returns the pool's counters.
func (p *Pool) Stats() (Stats, error) {
	const op = "pkv_pool_get_stats"
	ptr, err := p.acquire(op)
	if err != nil {
		return Stats{}, err
	}
	defer p.release()
	var c C.pkv_pool_stats
	if err := check("pkv_pool_stats_init_sized", C.pkvgo_pool_stats_init_sized(&c, C.size_t(C.sizeof_pkv_pool_stats))); err != nil {
		return Stats{}, err
	}
	if err := check(op, C.pkvgo_pool_get_stats(ptr, &c)); err != nil {
		return Stats{}, err
	}
	return Stats{
		BlockSize:         uint32(c.block_size),
		NumBlocks:         uint64(c.num_blocks),
		NumFreeBlocks:     uint64(c.num_free_blocks),
		NumUsedBlocks:     uint64(c.num_used_blocks),
		NumCachedBlocks:   uint64(c.num_cached_blocks),
		NumSeqs:           uint64(c.num_seqs),
		NumTokens:         uint64(c.num_tokens),
		Usage:             float64(c.usage),
		PrefixQueryTokens: uint64(c.prefix_query_tokens),
		PrefixHitTokens:   uint64(c.prefix_hit_tokens),
		NumEvictions:      uint64(c.num_evictions),
		NumCOWCopies:      uint64(c.num_cow_copies),
		NumEventsDropped:  uint64(c.num_events_dropped),
		KVBytesPerBlock:   uint64(c.kv_bytes_per_block),
		KVBytesAllocated:  uint64(c.kv_bytes_allocated),
		KVBytesUsed:       uint64(c.kv_bytes_used),
		KVBytesWasted:     uint64(c.kv_bytes_wasted),
		NumPartialHits:    uint64(c.num_partial_hits),
		PartialHitTokens:  uint64(c.partial_hit_tokens),
		NumPinnedBlocks:   uint64(c.num_pinned_blocks),
		NumPinsDegraded:   uint64(c.num_pins_degraded),
	}, nil
}

// EventType is the kind of a KV event.
type EventType uint32

// KV event types.
const (
	EventBlockStored  EventType = C.PKV_EVENT_BLOCK_STORED  // a full block entered the prefix cache
	EventBlockRemoved EventType = C.PKV_EVENT_BLOCK_REMOVED // a cached block was evicted
	EventAllCleared   EventType = C.PKV_EVENT_ALL_CLEARED   // the prefix cache was reset
	// EventBlockPriority: a cached block's retention priority changed;
	// NumTokens holds the new priority.
	EventBlockPriority EventType = C.PKV_EVENT_BLOCK_PRIORITY
)

func (t EventType) String() string {
	switch t {
	case EventBlockStored:
		return "stored"
	case EventBlockRemoved:
		return "removed"
	case EventAllCleared:
		return "all-cleared"
	case EventBlockPriority:
		return "priority"
	}
	return "event(" + strconv.FormatUint(uint64(t), 10) + ")"
}

// Event is one change of the prefix cache, for routers mirroring which
// blocks a replica holds. SeqNo counts 1, 2, 3... per pool; a gap means
// events were dropped (see Stats.NumEventsDropped).
type Event struct {
	SeqNo      uint64
	Type       EventType
	BlockID    int32
	BlockHash  BlockHash
	ParentHash BlockHash // meaningful when HasParent
	HasParent  bool
	NumTokens  uint32 // tokens in the block (stored)
	LoraID     uint64
}

// maxDrain bounds the buffer one DrainEvents call allocates.
const maxDrain = 1 << 16

// DrainEvents removes and returns up to max of the oldest events (at most
// 65536 per call), in order. Pools record events only with
// PoolOptions.EnableEvents.
func (p *Pool) DrainEvents(max int) ([]Event, error) {
	const op = "pkv_pool_drain_events"
	if max < 0 {
		return nil, argError(op, "max %d is negative", max)
	}
	if max > maxDrain {
		max = maxDrain
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return nil, err
	}
	defer p.release()
	return drain(op, ptr, max)
}

func drain(op string, ptr *C.pkv_pool, max int) ([]Event, error) {
	buf := make([]C.pkv_event, max)
	var n C.uint64_t
	var first *C.pkv_event
	if max > 0 {
		first = &buf[0]
	}
	if err := check(op, C.pkvgo_pool_drain_events(ptr, first, C.uint64_t(max), &n)); err != nil {
		return nil, err
	}
	out := make([]Event, int(n))
	for i := range out {
		c := &buf[i]
		out[i] = Event{
			SeqNo:      uint64(c.seq_no),
			Type:       EventType(c._type),
			BlockID:    int32(c.block_id),
			BlockHash:  *(*BlockHash)(unsafe.Pointer(&c.block_hash)),
			ParentHash: *(*BlockHash)(unsafe.Pointer(&c.parent_hash)),
			HasParent:  c.has_parent != 0,
			NumTokens:  uint32(c.num_tokens),
			LoraID:     uint64(c.lora_id),
		}
	}
	return out, nil
}

// Events removes and returns every pending event, in order.
func (p *Pool) Events() ([]Event, error) {
	const op = "pkv_pool_drain_events"
	ptr, err := p.acquire(op)
	if err != nil {
		return nil, err
	}
	defer p.release()
	const chunk = 1024
	var all []Event
	for {
		evs, err := drain(op, ptr, chunk)
		if err != nil {
			return all, err
		}
		all = append(all, evs...)
		if len(evs) < chunk {
			return all, nil
		}
	}
}

// ResetPrefixCache forgets every cached hash (blocks in use stay allocated
// but stop being shareable) and records EventAllCleared.
func (p *Pool) ResetPrefixCache() error {
	const op = "pkv_pool_reset_prefix_cache"
	ptr, err := p.acquire(op)
	if err != nil {
		return err
	}
	defer p.release()
	return check(op, C.pkvgo_pool_reset_prefix_cache(ptr))
}

// Validate checks every invariant of the block manager; an ErrInvariant
// error names the broken one.
func (p *Pool) Validate() error {
	const op = "pkv_pool_validate"
	ptr, err := p.acquire(op)
	if err != nil {
		return err
	}
	defer p.release()
	return check(op, C.pkvgo_pool_validate(ptr))
}

// KVKind selects the key or the value storage of a layer.
type KVKind uint32

// Key and value storage.
const (
	Key   KVKind = C.PKV_KV_KEY
	Value KVKind = C.PKV_KV_VALUE
)

// KVTensor describes one layer's K or V storage, shape [num_blocks,
// num_kv_heads, block_size, head_dim]. The memory belongs to the pool: it
// is valid until Close (the Tensor keeps the pool reachable, so its
// finalizer does not close it meanwhile). On the CPU, Tensor.ReadFloat32s
// and WriteFloat32s (ReadUint16s, WriteUint16s, ReadCodes, WriteCodes)
// copy elements out of and into it, and Tensor.WithFloat32s (WithUint16s,
// WithCodes) lends a slice over it to a callback, during which Close
// cannot free it. After Close all of them, and kernel calls given the
// Tensor, are ErrClosed. The deprecated Tensor.Float32s, Uint16s and Codes
// (and UnsafeFloat32s, UnsafeUint16s, UnsafeCodes) return slices that
// nothing ties to the pool: used after Close they read and write freed
// memory.
func (p *Pool) KVTensor(layer int, which KVKind) (Tensor, error) {
	const op = "pkv_pool_kv_tensor"
	if layer < 0 || int64(layer) > 1<<32-1 {
		return Tensor{}, argError(op, "layer %d out of range", layer)
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return Tensor{}, err
	}
	defer p.release()
	var t C.pkv_tensor
	if err := check(op, C.pkvgo_pool_kv_tensor(ptr, C.uint32_t(layer), C.uint32_t(which), &t)); err != nil {
		return Tensor{}, err
	}
	// The Tensor keeps p reachable: p's finalizer would free the storage.
	return ownedBy(fromC(&t), p), nil
}

// CopyBlocks copies the contents of blocks src[i] to dst[i] in every layer,
// K and V. The pairs are copied at once: a destination may not be another
// pair's source or destination (an invalid-argument error, nothing copied).
// stream is a cudaStream_t for CUDA pools, nil otherwise.
func (p *Pool) CopyBlocks(src, dst []int32, stream unsafe.Pointer) error {
	const op = "pkv_pool_copy_blocks"
	if len(src) != len(dst) {
		return argError(op, "src has %d blocks, dst %d", len(src), len(dst))
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return err
	}
	defer p.release()
	err = callChecked(op, []pointerArg{{"stream", stream, false}}, func() C.pkvgo_result {
		return C.pkvgo_pool_copy_blocks(ptr, int32Ptr(src), int32Ptr(dst), C.uint64_t(len(src)), stream)
	})
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
	return err
}

// SwapDirection says which way SwapBlocks moves bytes.
type SwapDirection uint32

// Swap directions.
const (
	SwapOut SwapDirection = C.PKV_SWAP_OUT // pool blocks -> host buffer
	SwapIn  SwapDirection = C.PKV_SWAP_IN  // host buffer -> pool blocks
)

// SwapBlocks moves the contents of blocks between a CPU pool and buf, laid
// out [len(blocks)][layers][2 (K,V)][kv_heads][block_size][head_dim] in the
// pool's dtype; buf needs len(blocks)*BytesPerBlock bytes. Block ids and
// reference counts stay the caller's business. For CUDA pools use
// SwapBlocksPinned: an asynchronous copy may not read or write Go memory.
func (p *Pool) SwapBlocks(blocks []int32, buf []byte, dir SwapDirection) error {
	const op = "pkv_pool_swap_blocks"
	if p != nil && p.h != nil && p.opts.Device != CPU { // a zero Pool is ErrClosed below
		return &Error{Code: CodeUnsupported, Op: op,
			Msg: "a Go buffer can only be swapped with a CPU pool; use SwapBlocksPinned"}
	}
	var data unsafe.Pointer
	if len(buf) > 0 {
		data = unsafe.Pointer(&buf[0])
	}
	return renameArgs(p.swap(op, blocks, data, uint64(len(buf)), dir, nil, buf), op,
		map[string]string{"num_blocks": "len(blocks)", "host_bytes": "len(buf)", "host_buffer": "buf"})
}

// SwapBlocksPinned is SwapBlocks with a host buffer outside Go memory
// (pinned with cudaHostAlloc for CUDA pools) of hostBytes bytes, on stream.
func (p *Pool) SwapBlocksPinned(blocks []int32, host unsafe.Pointer, hostBytes uint64,
	dir SwapDirection, stream unsafe.Pointer) error {
	const op = "pkv_pool_swap_blocks"
	return renameArgs(p.swap(op, blocks, host, hostBytes, dir, stream, nil), op,
		map[string]string{"num_blocks": "len(blocks)", "host_bytes": "hostBytes", "host_buffer": "host"})
}

func (p *Pool) swap(op string, blocks []int32, host unsafe.Pointer, hostBytes uint64,
	dir SwapDirection, stream unsafe.Pointer, keep []byte) error {
	ptr, err := p.acquire(op)
	if err != nil {
		return err
	}
	defer p.release()
	err = callChecked(op, []pointerArg{{"host", host, false}, {"stream", stream, false}},
		func() C.pkvgo_result {
			return C.pkvgo_pool_swap_blocks(ptr, int32Ptr(blocks), C.uint64_t(len(blocks)), host,
				C.uint64_t(hostBytes), C.uint32_t(dir), stream)
		})
	runtime.KeepAlive(blocks)
	runtime.KeepAlive(keep)
	return err
}
