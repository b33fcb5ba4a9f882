//! The block pool: options, sequences, stats, events, storage access.

use std::ffi::c_void;
use std::fmt;
use std::ptr::{self, NonNull};

use pagedkv_sys as sys;

use crate::batch::Batch;
use crate::error::{check, check_as, Error, ErrorKind, Result};
use crate::hash::{c_string, opt_c_string, opt_ptr, MmItem, RawMmItems};
use crate::names::Renames;
use crate::tensor::{RawTensor, Stream};
use crate::types::{BlockHash, DType, Device, Element, HashAlgo, KvLayout, KvScaleGranularity};

/// How to create a [`Pool`]. `PoolOptions::default()` takes the library's
/// defaults (block size 16, SHA-256 prefix caching, bf16 CPU storage...);
/// set the fields you need.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolOptions {
    /// Tokens per block: 1..=1024, with storage or without.
    pub block_size: u32,
    /// Total blocks including the null block (>= 2); 0 = derive from
    /// `memory_budget_bytes`.
    pub num_blocks: u64,
    /// KV bytes to spend when `num_blocks` is 0.
    pub memory_budget_bytes: u64,
    pub hash_algo: HashAlgo,
    pub enable_prefix_caching: bool,
    /// Root seed string of the block hashes.
    pub hash_seed: String,
    /// Tokens; 0 = none. Blocks wholly outside the window are released.
    pub sliding_window: u32,
    /// Record KV events for [`Pool::drain_events`].
    pub enable_events: bool,
    /// Events kept before the oldest are dropped.
    pub max_events: u32,
    /// 0 makes a manager-only pool without KV storage.
    pub num_layers: u32,
    pub num_kv_heads: u32,
    /// 1..=4096 on a CPU pool; 64, 80, 96, 128 or 256 on a CUDA pool.
    pub head_dim: u32,
    /// Storage dtype: F32, F16 or BF16.
    pub dtype: DType,
    pub device: Device,
    /// CPU kernel threads; 0 = hardware concurrency.
    pub num_threads: u32,
    /// Keep cache salts and multimodal item hashes in separate hash domains
    /// (no item hash can equal a salt). Off (default) = vLLM-compatible
    /// hashes: then keep salts secret and high-entropy and never take item
    /// hashes from tenants.
    pub strict_key_domains: bool,
    /// vLLM 0.33's tagged extra keys (`PKV_KEY_DOMAINS_VLLM_TAGGED`):
    /// `("lora", lora_name, lora_path)`, `("mm", hash, offset)`,
    /// `("cache_salt", salt)`. Keeps the domains apart as
    /// `strict_key_domains` does, with the bytes of that vLLM's hashes, and
    /// keys [`SeqOptions::lora_path`]. Off by default; setting it together
    /// with `strict_key_domains` is an error.
    pub vllm_tagged_keys: bool,
    /// FP8 pools: per tensor (one K and one V scale per layer) or per head.
    pub kv_scale_granularity: KvScaleGranularity,
    /// FP8 pools: the dequantisation scales (a stored code c means c *
    /// scale), `num_layers` (per tensor) or `num_layers * num_kv_heads`
    /// (per head, layer major) each, finite and > 0; empty = all 1.0.
    /// [`Pool::options`] returns them empty: read them with
    /// [`Pool::kv_scales`].
    pub k_scales: Vec<f32>,
    pub v_scales: Vec<f32>,
    /// Partial-block prefix hits through [`Pool::match_prefix_partial`]
    /// (keeps the token ids of cached blocks). Off by default.
    pub enable_partial_reuse: bool,
    /// Retention priorities ([`Pool::set_retention`]): lower priorities are
    /// evicted first, LRU within one. Off by default (LRU only).
    pub enable_retention: bool,
    /// With `enable_retention`: the most cached blocks pinned (never
    /// evicted) at once; below `num_blocks - 1`. 0 = no pinning.
    pub max_pinned_blocks: u64,
    /// [`KvLayout::Mla`]: one latent tensor per layer (num_kv_heads and
    /// head_dim then 0, or 1 and `kv_lora_rank + qk_rope_head_dim`).
    pub kv_layout: KvLayout,
    /// MLA: the latent width (DeepSeek-V3: 512); 0 otherwise.
    pub kv_lora_rank: u32,
    /// MLA: the rotary key width (DeepSeek-V3: 64); 0 otherwise.
    pub qk_rope_head_dim: u32,
}

impl Default for PoolOptions {
    fn default() -> PoolOptions {
        let raw = init_sized!(sys::pkv_pool_options_init_sized, sys::pkv_pool_options)
            .expect("the sized init of a struct of its own size");
        PoolOptions::from_raw(&raw).expect("library defaults are valid")
    }
}

impl PoolOptions {
    fn from_raw(raw: &sys::pkv_pool_options) -> Result<PoolOptions> {
        let unknown = |what: &str, v: u32| {
            Error::new(
                ErrorKind::Internal,
                format!("library reported unknown {what} {v}"),
            )
        };
        Ok(PoolOptions {
            block_size: raw.block_size,
            num_blocks: raw.num_blocks,
            memory_budget_bytes: raw.memory_budget_bytes,
            hash_algo: HashAlgo::from_raw(raw.hash_algo)
                .ok_or_else(|| unknown("hash algo", raw.hash_algo))?,
            enable_prefix_caching: raw.enable_prefix_caching != 0,
            // SAFETY: NULL or a NUL-terminated string owned by the library
            // (or by the init call's static defaults).
            hash_seed: unsafe { crate::cstr_to_string(raw.hash_seed) },
            sliding_window: raw.sliding_window,
            enable_events: raw.enable_events != 0,
            max_events: raw.max_events,
            num_layers: raw.num_layers,
            num_kv_heads: raw.num_kv_heads,
            head_dim: raw.head_dim,
            dtype: DType::from_raw(raw.dtype).ok_or_else(|| unknown("dtype", raw.dtype))?,
            device: Device::from_raw(raw.device_type, raw.device_id)?,
            num_threads: raw.num_threads,
            strict_key_domains: match raw.strict_key_domains {
                sys::PKV_KEY_DOMAINS_VLLM | sys::PKV_KEY_DOMAINS_VLLM_TAGGED => false,
                sys::PKV_KEY_DOMAINS_STRICT => true,
                v => return Err(unknown("key domains", v)),
            },
            vllm_tagged_keys: raw.strict_key_domains == sys::PKV_KEY_DOMAINS_VLLM_TAGGED,
            kv_scale_granularity: if raw.kv_scale_granularity == sys::PKV_KV_SCALE_PER_HEAD {
                KvScaleGranularity::PerHead
            } else {
                KvScaleGranularity::PerTensor
            },
            k_scales: Vec::new(),
            v_scales: Vec::new(),
            enable_partial_reuse: raw.enable_partial_reuse != 0,
            enable_retention: raw.enable_retention != 0,
            max_pinned_blocks: raw.max_pinned_blocks,
            kv_layout: KvLayout::from_raw(raw.kv_layout)
                .ok_or_else(|| unknown("kv layout", raw.kv_layout))?,
            kv_lora_rank: raw.kv_lora_rank,
            qk_rope_head_dim: raw.qk_rope_head_dim,
        })
    }
}

// The common length of a K and a V scale list (the C ABI reads that many
// of each, so they must match).
fn scale_count(k: &[f32], v: &[f32], prefix: &str) -> Result<usize> {
    if k.len() != v.len() {
        return Err(Error::invalid(format!(
            "{prefix}k_scales and {prefix}v_scales differ in length ({} vs {})",
            k.len(),
            v.len()
        )));
    }
    Ok(k.len())
}

/// What [`Pool::match_prefix_partial`] attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Tokens attached and counted as computed: whole cached blocks plus
    /// `partial_tokens`.
    pub num_cached: u64,
    /// Tokens of a partial hit (0 = none).
    pub partial_tokens: u32,
    /// The cached block whose first `partial_tokens` slots were reused, and
    /// the sequence's new block receiving them ([`NULL_BLOCK`] both when no
    /// copy is needed). A pool with storage copies them itself; an engine
    /// with its own K/V (no storage) copies slots `0..partial_tokens` of
    /// every layer before its next step's writes.
    pub copy_src: i32,
    pub copy_dst: i32,
}

/// Retention priority of tokens `token_begin..token_end` of a sequence
/// ([`Pool::set_retention`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionRange {
    pub token_begin: u64,
    /// [`RetentionRange::END`] = every later token too.
    pub token_end: u64,
    /// 0..=100; [`RetentionRange::PINNED`] is never evicted.
    pub priority: u32,
    /// How long the priority lasts once the block is free (nanoseconds of
    /// the pool's clock); 0 = for good.
    pub duration_ns: u64,
}

impl RetentionRange {
    pub const END: u64 = u64::MAX;
    pub const PRIORITY_MIN: u32 = sys::PKV_PRIORITY_MIN;
    pub const PRIORITY_DEFAULT: u32 = sys::PKV_PRIORITY_DEFAULT;
    pub const PRIORITY_MAX: u32 = sys::PKV_PRIORITY_MAX;
    pub const PINNED: u32 = sys::PKV_PRIORITY_PINNED;
    /// The most ranges [`Pool::set_retention`] takes.
    pub const MAX_RANGES: usize = sys::PKV_RETENTION_MAX_RANGES as usize;

    /// Tokens `token_begin..token_end` at `priority`, for good.
    pub fn new(token_begin: u64, token_end: u64, priority: u32) -> RetentionRange {
        RetentionRange {
            token_begin,
            token_end,
            priority,
            duration_ns: 0,
        }
    }
}

/// The block id standing in a block table for positions a sliding window
/// released.
pub const NULL_BLOCK: i32 = sys::PKV_NULL_BLOCK;

/// A sequence handle, opaque: it names its pool, a slot and a generation.
/// Using a freed or unknown id, or one of another pool, is a clean
/// [`ErrorKind::NotFound`], never undefined behaviour or another sequence.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct SeqId(sys::pkv_seq_id);

impl SeqId {
    /// The id no sequence ever has.
    pub const INVALID: SeqId = SeqId(sys::PKV_SEQ_ID_INVALID);

    /// The raw `pkv_seq_id`.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// Wraps a raw id (e.g. one stored by your scheduler). Any value is
    /// safe; unknown ones give [`ErrorKind::NotFound`].
    pub fn from_raw(raw: u64) -> SeqId {
        SeqId(raw)
    }
}

/// `seq 0x0000000100000002`: the form every pagedkv message and binding
/// prints sequence ids in.
impl fmt::Debug for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seq {:#018x}", self.0)
    }
}

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Options of a new sequence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqOptions {
    /// Kept for the caller's scheduler.
    pub priority: i32,
    /// 0 = base model; part of every block hash.
    pub lora_id: u64,
    /// The LoRA adapter's name, part of every block hash as current vLLM
    /// keys adapters (older vLLM keyed `lora_id`). `None` or "" = none.
    pub lora_name: Option<String>,
    /// The LoRA adapter's path (vLLM's `lora_request.lora_path`), keyed
    /// with `lora_name` on a pool with
    /// [`PoolOptions::vllm_tagged_keys`]; ignored by other pools and
    /// without `lora_name`. `None` = "".
    pub lora_path: Option<String>,
    /// Hashed into the first block: sequences with different salts never
    /// share cached blocks.
    pub cache_salt: Option<String>,
    /// Multimodal items of the prompt.
    pub mm_items: Vec<MmItem>,
}

/// State of one sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeqInfo {
    pub priority: i32,
    /// Tokens appended, including the cached prefix.
    pub num_tokens: u64,
    /// Tokens attached by [`Pool::match_prefix`].
    pub num_cached_tokens: u64,
    /// Entries in the block table.
    pub num_blocks: u64,
    /// Capacity including lookahead: `num_blocks * block_size`.
    pub num_slots: u64,
    pub lora_id: u64,
    /// Leading tokens whose K/V is written (committed steps, written prefix
    /// hits): a step's queries must cover every token from here on.
    pub num_computed_tokens: u64,
}

/// Pool-wide counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolStats {
    pub block_size: u32,
    /// Total, including the null block.
    pub num_blocks: u64,
    /// In the free queue (including cached ones).
    pub num_free_blocks: u64,
    /// Ref count > 0.
    pub num_used_blocks: u64,
    /// Holding a hash in the prefix cache.
    pub num_cached_blocks: u64,
    pub num_seqs: u64,
    /// Over all sequences.
    pub num_tokens: u64,
    /// Used / usable blocks, in [0, 1].
    pub usage: f64,
    /// Tokens asked of [`Pool::match_prefix`].
    pub prefix_query_tokens: u64,
    /// Tokens it found cached.
    pub prefix_hit_tokens: u64,
    /// Cached blocks reused for new content.
    pub num_evictions: u64,
    /// Copy-on-write copies recorded.
    pub num_cow_copies: u64,
    /// Events lost to `max_events`.
    pub num_events_dropped: u64,
    pub kv_bytes_per_block: u64,
    pub kv_bytes_allocated: u64,
    pub kv_bytes_used: u64,
    pub kv_bytes_wasted: u64,
    /// Partial-block hits and the tokens they reused (also counted in
    /// `prefix_hit_tokens`).
    pub num_partial_hits: u64,
    pub partial_hit_tokens: u64,
    /// Cached blocks pinned, and pins the budget turned into priority 99.
    pub num_pinned_blocks: u64,
    pub num_pins_degraded: u64,
}

/// What happened to a cached block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A full block entered the prefix cache.
    BlockStored,
    /// A cached block was evicted.
    BlockRemoved,
    /// The prefix cache was reset.
    AllCleared,
    /// A cached block's retention priority changed; `num_tokens` holds it.
    BlockPriority,
    /// A kind this crate does not know (from a newer library).
    Other(u32),
}

/// A KV-cache event (for KV-aware routers), in pool order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// 1, 2, 3... per pool, gap-free unless events were dropped.
    pub seq_no: u64,
    pub kind: EventKind,
    pub block_id: i32,
    pub block_hash: BlockHash,
    /// `None` for the first block of a sequence.
    pub parent_hash: Option<BlockHash>,
    /// Tokens in the block (stored events).
    pub num_tokens: u32,
    pub lora_id: u64,
}

impl Event {
    pub(crate) fn from_raw(e: &sys::pkv_event) -> Event {
        Event {
            seq_no: e.seq_no,
            kind: match e.type_ {
                sys::PKV_EVENT_BLOCK_STORED => EventKind::BlockStored,
                sys::PKV_EVENT_BLOCK_REMOVED => EventKind::BlockRemoved,
                sys::PKV_EVENT_ALL_CLEARED => EventKind::AllCleared,
                sys::PKV_EVENT_BLOCK_PRIORITY => EventKind::BlockPriority,
                other => EventKind::Other(other),
            },
            block_id: e.block_id,
            block_hash: BlockHash::from_raw(&e.block_hash),
            parent_hash: if e.has_parent != 0 {
                Some(BlockHash::from_raw(&e.parent_hash))
            } else {
                None
            },
            num_tokens: e.num_tokens,
            lora_id: e.lora_id,
        }
    }
}

/// Iterator draining a pool's events in order; see [`Pool::events`]. It
/// borrows the pool:
///
/// ```compile_fail
/// # fn main() -> pagedkv::Result<()> {
/// let events = {
///     let pool = pagedkv::Pool::new(&pagedkv::PoolOptions { block_size: 4, num_blocks: 8, ..Default::default() })?;
///     pool.events() // error[E0597]: `pool` does not live long enough
/// };
/// for e in events {
///     e?;
/// }
/// # Ok(()) }
/// ```
pub struct Events<'p> {
    pool: &'p Pool,
    buf: std::vec::IntoIter<Event>,
    done: bool,
}

impl Iterator for Events<'_> {
    type Item = Result<Event>;

    fn next(&mut self) -> Option<Result<Event>> {
        if let Some(e) = self.buf.next() {
            return Some(Ok(e));
        }
        if self.done {
            return None;
        }
        match self.pool.drain_events(256) {
            Ok(v) => {
                self.done = v.len() < 256;
                self.buf = v.into_iter();
                self.buf.next().map(Ok)
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// K or V storage of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kv {
    Key,
    Value,
}

impl Kv {
    fn raw(self) -> u32 {
        match self {
            Kv::Key => sys::PKV_KV_KEY,
            Kv::Value => sys::PKV_KV_VALUE,
        }
    }
}

/// Direction of [`Pool::swap_blocks_raw`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SwapDirection {
    /// Pool blocks -> host buffer.
    Out,
    /// Host buffer -> pool blocks.
    In,
}

/// A pool of KV blocks with its prefix cache and sequences.
///
/// `Pool` is `Send + Sync`: the C pool serialises every operation, so
/// share it between threads with `&Pool` or `Arc<Pool>`. Dropping it frees
/// the pool; step plans ([`Batch`]) made from it stay valid objects whose
/// calls that need the pool (commit, the kernels) then fail with
/// [`ErrorKind::InvalidState`].
///
/// ```
/// use pagedkv::{Pool, PoolOptions, ErrorKind};
/// // A manager-only pool (no KV storage): 1 null block + 4 usable blocks.
/// let pool = Pool::new(&PoolOptions { block_size: 4, num_blocks: 5, ..Default::default() })?;
/// let seq = pool.create_seq()?;
/// pool.append(seq, &[1, 2, 3, 4, 5, 6])?;        // 2 blocks
/// assert_eq!(pool.block_table(seq)?.len(), 2);
/// let err = pool.append(seq, &[0; 16]).unwrap_err(); // needs 4 more, 2 free
/// assert_eq!(err.kind(), ErrorKind::OutOfBlocks);
/// assert_eq!(pool.seq_info(seq)?.num_tokens, 6);     // nothing changed
/// pool.free_seq(seq)?;
/// # Ok::<(), pagedkv::Error>(())
/// ```
pub struct Pool {
    raw: NonNull<sys::pkv_pool>,
    device: Device,
    dtype: DType,
    has_storage: bool,
}

// SAFETY: every pkv_pool function may be called from any thread,
// concurrently; the pool serialises them (docs/threading.md). Destroy needs
// exclusive ownership, which Drop has.
unsafe impl Send for Pool {}
unsafe impl Sync for Pool {}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: we own the pool; no borrow of it is alive.
        unsafe { sys::pkv_pool_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("device", &self.device)
            .field("dtype", &self.dtype)
            .finish_non_exhaustive()
    }
}

pub(crate) fn to_u64(n: usize) -> u64 {
    n as u64
}

/// Calls `f(ptr, capacity, &mut len)` for a variable-length output, growing
/// the buffer while the library answers `PKV_E_BUFFER_TOO_SMALL` (another
/// thread may grow the data between calls).
pub(crate) fn read_vec<T: Clone>(
    init: T,
    mut cap: usize,
    mut f: impl FnMut(*mut T, u64, &mut u64) -> sys::pkv_status,
) -> Result<Vec<T>> {
    for _ in 0..8 {
        let mut out = vec![init.clone(); cap];
        let mut len = 0u64;
        let ptr = if cap == 0 {
            ptr::null_mut()
        } else {
            out.as_mut_ptr()
        };
        let status = f(ptr, to_u64(cap), &mut len);
        if status == sys::PKV_E_BUFFER_TOO_SMALL && len as usize > cap {
            cap = len as usize;
            continue;
        }
        check(status)?;
        out.truncate(len as usize);
        return Ok(out);
    }
    Err(Error::new(
        ErrorKind::Internal,
        "output kept growing between calls",
    ))
}

// swap_in / swap_out take the host buffer as a slice.
const SAFE_SWAP_NAMES: Renames = &[("host_buffer", "host"), ("host_bytes", "host.len()")];

impl Pool {
    /// The most events one [`drain_events`](Pool::drain_events) call
    /// returns (the Go binding's cap).
    pub const MAX_DRAIN: usize = 1 << 16;

    /// Creates a pool.
    pub fn new(opts: &PoolOptions) -> Result<Pool> {
        let seed = c_string(&opts.hash_seed, "PoolOptions::hash_seed")?;
        let mut raw = init_sized!(sys::pkv_pool_options_init_sized, sys::pkv_pool_options)?;
        raw.block_size = opts.block_size;
        raw.num_blocks = opts.num_blocks;
        raw.memory_budget_bytes = opts.memory_budget_bytes;
        raw.hash_algo = opts.hash_algo.raw();
        raw.enable_prefix_caching = opts.enable_prefix_caching as u32;
        raw.hash_seed = seed.as_ptr();
        raw.sliding_window = opts.sliding_window;
        raw.enable_events = opts.enable_events as u32;
        raw.max_events = opts.max_events;
        raw.num_layers = opts.num_layers;
        raw.num_kv_heads = opts.num_kv_heads;
        raw.head_dim = opts.head_dim;
        raw.dtype = opts.dtype.raw();
        let (device_type, device_id) = opts.device.raw();
        raw.device_type = device_type;
        raw.device_id = device_id;
        raw.num_threads = opts.num_threads;
        raw.strict_key_domains = key_domains(opts.strict_key_domains, opts.vllm_tagged_keys)?;
        raw.kv_scale_granularity = opts.kv_scale_granularity.raw();
        let nscales = scale_count(&opts.k_scales, &opts.v_scales, "PoolOptions::")?;
        if nscales > 0 {
            raw.num_kv_scales = u32::try_from(nscales)
                .map_err(|_| Error::invalid("PoolOptions::k_scales: more than 2^32 - 1 scales"))?;
            raw.k_scales = opts.k_scales.as_ptr();
            raw.v_scales = opts.v_scales.as_ptr();
        }
        raw.enable_partial_reuse = opts.enable_partial_reuse as u32;
        raw.enable_retention = opts.enable_retention as u32;
        raw.max_pinned_blocks = opts.max_pinned_blocks;
        raw.kv_layout = opts.kv_layout.raw();
        raw.kv_lora_rank = opts.kv_lora_rank;
        raw.qk_rope_head_dim = opts.qk_rope_head_dim;
        let mut out = ptr::null_mut();
        // SAFETY: raw and the seed it points to outlive the call.
        check(unsafe { sys::pkv_pool_create(&raw, &mut out) })?;
        let raw_pool = NonNull::new(out)
            .ok_or_else(|| Error::new(ErrorKind::Internal, "pkv_pool_create returned no pool"))?;
        Ok(Pool {
            raw: raw_pool,
            device: opts.device,
            dtype: opts.dtype,
            has_storage: opts.num_layers > 0,
        })
    }

    pub(crate) fn ptr(&self) -> *mut sys::pkv_pool {
        self.raw.as_ptr()
    }

    /// Takes ownership of a manager-only pool the library created
    /// (multi-group pools, groups.rs).
    pub(crate) fn from_manager(raw: NonNull<sys::pkv_pool>) -> Pool {
        Pool {
            raw,
            device: Device::Cpu,
            dtype: DType::BF16,
            has_storage: false,
        }
    }

    /// The raw handle, for calling the C ABI directly. It stays owned by
    /// this `Pool`.
    pub fn as_raw(&self) -> *mut sys::pkv_pool {
        self.ptr()
    }

    /// The options the pool was created with, `num_blocks` resolved.
    pub fn options(&self) -> Result<PoolOptions> {
        let mut raw = init_sized!(sys::pkv_pool_options_init_sized, sys::pkv_pool_options)?;
        // SAFETY: valid out-parameter; struct_size tells the library how
        // much it may write.
        check(unsafe { sys::pkv_pool_get_options(self.ptr(), &mut raw) })?;
        PoolOptions::from_raw(&raw)
    }

    /// Bytes of K plus V storage one block takes over all layers (0 without
    /// storage).
    pub fn bytes_per_block(&self) -> Result<u64> {
        let mut n = 0u64;
        // SAFETY: valid handle and out-parameter.
        check(unsafe { sys::pkv_pool_bytes_per_block(self.ptr(), &mut n) })?;
        Ok(n)
    }

    // ------------------------------------------------------------ FP8 scales

    /// The K and V scales of an FP8 pool (the granularity it was created
    /// with). [`ErrorKind::InvalidState`] for other dtypes.
    pub fn kv_scales(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        let mut raw = init_sized!(sys::pkv_pool_options_init_sized, sys::pkv_pool_options)?;
        // SAFETY: valid out-parameters.
        check(unsafe { sys::pkv_pool_get_options(self.ptr(), &mut raw) })?;
        let cap = raw.num_kv_scales.max(1) as usize;
        let (mut k, mut v) = (vec![0f32; cap], vec![0f32; cap]);
        let mut n = 0u64;
        // SAFETY: k and v hold cap floats each.
        check(unsafe {
            sys::pkv_pool_get_kv_scales(
                self.ptr(),
                k.as_mut_ptr(),
                v.as_mut_ptr(),
                cap as u64,
                &mut n,
            )
        })?;
        k.truncate(n as usize);
        v.truncate(n as usize);
        Ok((k, v))
    }

    /// Replaces an FP8 pool's scales (as many of each as
    /// [`kv_scales`](Pool::kv_scales) returns; finite and > 0). Safe while
    /// other threads run kernels on the pool: they finish with the old
    /// scales. Stored codes stay and are read with the new scales.
    pub fn set_kv_scales(&self, k_scales: &[f32], v_scales: &[f32]) -> Result<()> {
        let n = scale_count(k_scales, v_scales, "")?;
        // SAFETY: both slices hold n floats.
        check(unsafe {
            sys::pkv_pool_set_kv_scales(self.ptr(), k_scales.as_ptr(), v_scales.as_ptr(), n as u64)
        })
    }

    // ------------------------------------------------------------ sequences

    /// Creates an empty sequence with default options and returns its bare
    /// id: the caller frees it ([`free_seq`](Pool::free_seq)), or it lives
    /// until the pool is dropped. [`sequence`](Pool::sequence) returns a
    /// [`Seq`](crate::Seq) that frees itself on drop instead.
    pub fn create_seq(&self) -> Result<SeqId> {
        let mut id = 0;
        // SAFETY: NULL options mean defaults.
        check(unsafe { sys::pkv_seq_create(self.ptr(), ptr::null(), &mut id) })?;
        Ok(SeqId(id))
    }

    /// Creates an empty sequence (a bare id, as [`create_seq`](Pool::create_seq)).
    pub fn create_seq_with(&self, opts: &SeqOptions) -> Result<SeqId> {
        with_raw_seq_options(opts, |raw| {
            let mut id = 0;
            // SAFETY: every pointer in raw outlives the call; strings are copied.
            check(unsafe { sys::pkv_seq_create(self.ptr(), raw, &mut id) })?;
            Ok(SeqId(id))
        })
    }

    /// For an empty sequence: attaches the longest run of leading full
    /// blocks of `tokens` already cached (leaving at least one token to
    /// compute) and returns how many tokens that covers. Those tokens become
    /// the sequence's first tokens; append the rest.
    pub fn match_prefix(&self, seq: SeqId, tokens: &[i32]) -> Result<u64> {
        let mut cached = 0u64;
        // SAFETY: tokens is valid for its length.
        check(unsafe {
            sys::pkv_seq_match_prefix(
                self.ptr(),
                seq.0,
                tokens.as_ptr(),
                to_u64(tokens.len()),
                &mut cached,
            )
        })?;
        Ok(cached)
    }

    /// [`match_prefix`](Pool::match_prefix), then (pool created with
    /// `enable_partial_reuse`) a partial hit: the first k tokens of a cached
    /// block that the next tokens agree with are copied into a new block
    /// and count as computed.
    pub fn match_prefix_partial(&self, seq: SeqId, tokens: &[i32]) -> Result<PrefixMatch> {
        let mut raw = init_sized!(sys::pkv_prefix_match_init_sized, sys::pkv_prefix_match)?;
        // SAFETY: valid out-parameter; tokens is valid for its length.
        check(unsafe {
            sys::pkv_seq_match_prefix_partial(
                self.ptr(),
                seq.0,
                tokens.as_ptr(),
                to_u64(tokens.len()),
                &mut raw,
            )
        })?;
        Ok(PrefixMatch {
            num_cached: raw.num_cached,
            partial_tokens: raw.partial_tokens,
            copy_src: raw.copy_src,
            copy_dst: raw.copy_dst,
        })
    }

    /// Replaces the sequence's retention ranges (pool created with
    /// `enable_retention`). Pins beyond `max_pinned_blocks` fail with
    /// [`ErrorKind::OutOfBlocks`] and change nothing.
    pub fn set_retention(&self, seq: SeqId, ranges: &[RetentionRange]) -> Result<()> {
        let raw: Vec<sys::pkv_retention_range> = ranges
            .iter()
            .map(|r| sys::pkv_retention_range {
                token_begin: r.token_begin,
                token_end: r.token_end,
                priority: r.priority,
                reserved: 0,
                duration_ns: r.duration_ns,
            })
            .collect();
        // SAFETY: raw is valid for its length (or empty with a dangling,
        // unread pointer).
        check(unsafe {
            sys::pkv_seq_set_retention(self.ptr(), seq.0, raw.as_ptr(), to_u64(raw.len()))
        })
    }

    /// Appends tokens (their K/V is written by the next step), allocating
    /// blocks as needed. All or nothing: [`ErrorKind::OutOfBlocks`] changes
    /// nothing, so the caller can preempt a sequence and retry.
    pub fn append(&self, seq: SeqId, tokens: &[i32]) -> Result<()> {
        self.append_with_lookahead(seq, tokens, 0)
    }

    /// [`append`](Pool::append) plus room for `num_lookahead` speculative
    /// slots.
    pub fn append_with_lookahead(
        &self,
        seq: SeqId,
        tokens: &[i32],
        num_lookahead: u32,
    ) -> Result<()> {
        // SAFETY: tokens is valid for its length.
        check(unsafe {
            sys::pkv_seq_append(
                self.ptr(),
                seq.0,
                tokens.as_ptr(),
                to_u64(tokens.len()),
                num_lookahead,
            )
        })
    }

    /// Blocks an append of `num_tokens` (+ `num_lookahead`) would take from
    /// the free queue.
    pub fn blocks_needed(&self, seq: SeqId, num_tokens: u64, num_lookahead: u32) -> Result<u64> {
        let mut n = 0u64;
        // SAFETY: valid handle and out-parameter.
        check(unsafe {
            sys::pkv_seq_blocks_needed(self.ptr(), seq.0, num_tokens, num_lookahead, &mut n)
        })?;
        Ok(n)
    }

    /// A child sharing every block of `parent` (parallel sampling, beam
    /// search); a shared partial block is copied when either side writes
    /// into it.
    pub fn fork(&self, parent: SeqId) -> Result<SeqId> {
        let mut id = 0;
        // SAFETY: valid handle and out-parameter.
        check(unsafe { sys::pkv_seq_fork(self.ptr(), parent.0, &mut id) })?;
        Ok(SeqId(id))
    }

    /// Drops tokens from the tail so `num_tokens` remain, releasing blocks
    /// that become empty (speculative-decoding rollback).
    pub fn truncate(&self, seq: SeqId, num_tokens: u64) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { sys::pkv_seq_truncate(self.ptr(), seq.0, num_tokens) })
    }

    /// Capacity hint: makes room in the sequence's host memory (token ids,
    /// block table, block hashes) for `num_tokens` tokens in all, so that
    /// appends up to that length never reallocate them. Call it at
    /// admission with the prompt plus the most tokens the request may
    /// generate: its decode steps then grow no vectors. Takes no blocks and
    /// changes nothing [`seq_info`](Pool::seq_info) or
    /// [`stats`](Pool::stats) show; at or below the current room it does
    /// nothing. [`ErrorKind::InvalidArgument`](crate::ErrorKind) above
    /// 2^31 - 1 tokens.
    pub fn reserve(&self, seq: SeqId, num_tokens: u64) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { sys::pkv_seq_reserve(self.ptr(), seq.0, num_tokens) })
    }

    /// Releases the sequence and its blocks; the id becomes stale.
    ///
    /// On a CPU pool, do not free or truncate a sequence on one thread
    /// while another thread runs a kernel of a plan that reads it.
    pub fn free_seq(&self, seq: SeqId) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { sys::pkv_seq_free(self.ptr(), seq.0) })
    }

    /// Decode append in one call: `tokens[i]` (one token) to `seqs[i]`, for
    /// distinct sequences. All or nothing: a stale or repeated id, or too
    /// few free blocks, fails naming `seqs[i]` and changes nothing.
    pub fn append_batch(&self, seqs: &[SeqId], tokens: &[i32]) -> Result<()> {
        if seqs.len() != tokens.len() {
            return Err(Error::invalid(format!(
                "seqs and tokens differ in length ({} vs {})",
                seqs.len(),
                tokens.len()
            )));
        }
        // SAFETY: SeqId is repr(transparent) over pkv_seq_id; both slices
        // are valid for their (equal) length.
        check(unsafe {
            sys::pkv_seq_append_batch(
                self.ptr(),
                seqs.as_ptr().cast::<sys::pkv_seq_id>(),
                tokens.as_ptr(),
                to_u64(seqs.len()),
            )
        })
    }

    /// Frees distinct sequences in one call; all or nothing (a stale or
    /// repeated id frees none).
    pub fn free_batch(&self, seqs: &[SeqId]) -> Result<()> {
        // SAFETY: SeqId is repr(transparent) over pkv_seq_id.
        check(unsafe {
            sys::pkv_seq_free_batch(
                self.ptr(),
                seqs.as_ptr().cast::<sys::pkv_seq_id>(),
                to_u64(seqs.len()),
            )
        })
    }

    /// Admission in one call: creates a sequence, attaches the cached prefix
    /// of `tokens`, appends the rest plus `num_lookahead` slots. All or
    /// nothing ([`ErrorKind::OutOfBlocks`] creates no sequence and takes no
    /// hit). Returns the bare id (freed by the caller, as
    /// [`create_seq`](Pool::create_seq)) and the tokens found cached.
    pub fn admit(
        &self,
        opts: &SeqOptions,
        tokens: &[i32],
        num_lookahead: u32,
    ) -> Result<(SeqId, u64)> {
        self.admit_inner(opts, tokens, None, num_lookahead)
    }

    /// [`admit`](Pool::admit) with the prompt's block hashes computed
    /// beforehand ([`hash_prefix`](crate::hash_prefix) with this pool's
    /// algorithm, seed and key-domain mode and the request's keys), so the
    /// lookup does not hash the prompt again. The first block's hash and
    /// the last link used are checked ([`ErrorKind::InvalidArgument`]
    /// naming `hashes[i]`).
    pub fn admit_hashes(
        &self,
        opts: &SeqOptions,
        tokens: &[i32],
        hashes: &[BlockHash],
        num_lookahead: u32,
    ) -> Result<(SeqId, u64)> {
        self.admit_inner(opts, tokens, Some(hashes), num_lookahead)
    }

    fn admit_inner(
        &self,
        opts: &SeqOptions,
        tokens: &[i32],
        hashes: Option<&[BlockHash]>,
        num_lookahead: u32,
    ) -> Result<(SeqId, u64)> {
        let raw_hashes: Vec<sys::pkv_block_hash> = hashes
            .unwrap_or(&[])
            .iter()
            .map(|h| sys::pkv_block_hash { bytes: h.0 })
            .collect();
        with_raw_seq_options(opts, |raw| {
            let (mut id, mut cached) = (0, 0u64);
            // SAFETY: raw's pointers, tokens and raw_hashes outlive the call.
            check(unsafe {
                match hashes {
                    None => sys::pkv_seq_admit(
                        self.ptr(),
                        raw,
                        tokens.as_ptr(),
                        to_u64(tokens.len()),
                        num_lookahead,
                        &mut id,
                        &mut cached,
                    ),
                    Some(_) => sys::pkv_seq_admit_hashes(
                        self.ptr(),
                        raw,
                        tokens.as_ptr(),
                        to_u64(tokens.len()),
                        raw_hashes.as_ptr(),
                        to_u64(raw_hashes.len()),
                        num_lookahead,
                        &mut id,
                        &mut cached,
                    ),
                }
            })?;
            Ok((SeqId(id), cached))
        })
    }

    /// [`match_prefix`](Pool::match_prefix) with the block hashes of
    /// `tokens` computed beforehand (see [`admit_hashes`](Pool::admit_hashes)).
    pub fn match_prefix_hashes(
        &self,
        seq: SeqId,
        tokens: &[i32],
        hashes: &[BlockHash],
    ) -> Result<u64> {
        let raw: Vec<sys::pkv_block_hash> = hashes
            .iter()
            .map(|h| sys::pkv_block_hash { bytes: h.0 })
            .collect();
        let mut cached = 0u64;
        // SAFETY: tokens and raw are valid for their lengths.
        check(unsafe {
            sys::pkv_seq_match_prefix_hashes(
                self.ptr(),
                seq.0,
                tokens.as_ptr(),
                to_u64(tokens.len()),
                raw.as_ptr(),
                to_u64(raw.len()),
                &mut cached,
            )
        })?;
        Ok(cached)
    }

    /// State of a sequence.
    pub fn seq_info(&self, seq: SeqId) -> Result<SeqInfo> {
        let mut raw = init_sized!(sys::pkv_seq_info_init_sized, sys::pkv_seq_info)?;
        // SAFETY: valid out-parameter, struct_size set by _init_sized.
        check(unsafe { sys::pkv_seq_get_info(self.ptr(), seq.0, &mut raw) })?;
        Ok(SeqInfo {
            priority: raw.priority,
            num_tokens: raw.num_tokens,
            num_cached_tokens: raw.num_cached_tokens,
            num_blocks: raw.num_blocks,
            num_slots: raw.num_slots,
            lora_id: raw.lora_id,
            num_computed_tokens: raw.num_computed_tokens,
        })
    }

    /// The block table (`PKV_NULL_BLOCK` = 0 where a sliding window released
    /// a block).
    pub fn block_table(&self, seq: SeqId) -> Result<Vec<i32>> {
        read_vec(0i32, 16, |out, cap, len| {
            // SAFETY: out is valid for cap entries (or NULL with cap 0).
            unsafe { sys::pkv_seq_get_block_table(self.ptr(), seq.0, out, cap, len) }
        })
    }

    /// Hashes of the sequence's full blocks, in order.
    pub fn block_hashes(&self, seq: SeqId) -> Result<Vec<BlockHash>> {
        let raw = read_vec(sys::pkv_block_hash::default(), 16, |out, cap, len| {
            // SAFETY: out is valid for cap entries (or NULL with cap 0).
            unsafe { sys::pkv_seq_get_block_hashes(self.ptr(), seq.0, out, cap, len) }
        })?;
        Ok(raw.iter().map(BlockHash::from_raw).collect())
    }

    // -------------------------------------------------------- stats, events

    /// Pool-wide counters.
    pub fn stats(&self) -> Result<PoolStats> {
        let mut s = init_sized!(sys::pkv_pool_stats_init_sized, sys::pkv_pool_stats)?;
        // SAFETY: valid out-parameter, struct_size set by _init_sized.
        check(unsafe { sys::pkv_pool_get_stats(self.ptr(), &mut s) })?;
        Ok(PoolStats {
            block_size: s.block_size,
            num_blocks: s.num_blocks,
            num_free_blocks: s.num_free_blocks,
            num_used_blocks: s.num_used_blocks,
            num_cached_blocks: s.num_cached_blocks,
            num_seqs: s.num_seqs,
            num_tokens: s.num_tokens,
            usage: s.usage,
            prefix_query_tokens: s.prefix_query_tokens,
            prefix_hit_tokens: s.prefix_hit_tokens,
            num_evictions: s.num_evictions,
            num_cow_copies: s.num_cow_copies,
            num_events_dropped: s.num_events_dropped,
            kv_bytes_per_block: s.kv_bytes_per_block,
            kv_bytes_allocated: s.kv_bytes_allocated,
            kv_bytes_used: s.kv_bytes_used,
            kv_bytes_wasted: s.kv_bytes_wasted,
            num_partial_hits: s.num_partial_hits,
            partial_hit_tokens: s.partial_hit_tokens,
            num_pinned_blocks: s.num_pinned_blocks,
            num_pins_degraded: s.num_pins_degraded,
        })
    }

    /// Cached blocks per retention priority (index = priority, 0..=100).
    pub fn priority_counts(&self) -> Result<Vec<u64>> {
        read_vec(
            0u64,
            (RetentionRange::PRIORITY_MAX + 1) as usize,
            |out, cap, len| {
                // SAFETY: out is valid for cap entries (or NULL with cap 0).
                unsafe { sys::pkv_pool_get_priority_counts(self.ptr(), out, cap, len) }
            },
        )
    }

    /// From now on the pool's clock for retention durations reads `now_ns`
    /// (tests, simulations; it never runs back).
    pub fn set_clock(&self, now_ns: u64) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { sys::pkv_pool_set_clock(self.ptr(), now_ns) })
    }

    /// Removes and returns up to `max` oldest events (at most
    /// [`Pool::MAX_DRAIN`] per call), in order.
    pub fn drain_events(&self, max: usize) -> Result<Vec<Event>> {
        // The buffer is allocated up front: a huge max would overflow its
        // capacity (a panic) or abort on a failed allocation.
        let max = max.min(Self::MAX_DRAIN);
        let mut raw = vec![sys::pkv_event::default(); max];
        let mut n = 0u64;
        let out = if max == 0 {
            ptr::null_mut()
        } else {
            raw.as_mut_ptr()
        };
        // SAFETY: out is valid for max events.
        check(unsafe { sys::pkv_pool_drain_events(self.ptr(), out, to_u64(max), &mut n) })?;
        raw.truncate(n as usize);
        Ok(raw.iter().map(Event::from_raw).collect())
    }

    /// Drains every pending event, in order. A pool created without
    /// `enable_events` records none: the iterator is empty, not an error.
    pub fn events(&self) -> Events<'_> {
        Events {
            pool: self,
            buf: Vec::new().into_iter(),
            done: false,
        }
    }

    /// Forgets every cached hash (blocks in use stay allocated but are no
    /// longer shareable) and records an [`EventKind::AllCleared`] event.
    pub fn reset_prefix_cache(&self) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { sys::pkv_pool_reset_prefix_cache(self.ptr()) })
    }

    /// Checks every invariant of the block manager;
    /// [`ErrorKind::Invariant`] names the broken one.
    pub fn validate(&self) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { sys::pkv_pool_validate(self.ptr()) })
    }

    // ------------------------------------------------------------- storage

    /// Descriptor of one layer's K or V storage,
    /// `[num_blocks, num_kv_heads, block_size, head_dim]`, for interop with
    /// other kernels. Valid while the pool lives.
    pub fn kv_tensor(&self, layer: u32, which: Kv) -> Result<RawTensor> {
        let mut t = sys::pkv_tensor::default();
        // SAFETY: valid out-parameter.
        check(unsafe { sys::pkv_pool_kv_tensor(self.ptr(), layer, which.raw(), &mut t) })?;
        Ok(RawTensor::new(t))
    }

    /// Copies the K or V data of one block of a CPU pool,
    /// `[num_kv_heads, block_size, head_dim]` elements. `T` must be the
    /// pool's dtype.
    ///
    /// The copy is made by the library under the pool's KV lock (a
    /// swap-out of the block), so it never races a cache write running on
    /// another thread: it sees the block before or after that write, never
    /// a mix.
    ///
    /// `block` is a block id in `[1, num_blocks)`: the null block (0) holds
    /// no K/V (no kernel, copy or swap writes it, so its memory was never
    /// initialised) and is [`ErrorKind::InvalidArgument`], as it is for
    /// [`swap_out`](Pool::swap_out) and [`copy_blocks`](Pool::copy_blocks).
    pub fn read_kv_block<T: Element>(&self, layer: u32, which: Kv, block: i32) -> Result<Vec<T>> {
        if self.device != Device::Cpu {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "read_kv_block: only CPU pools; use kv_tensor for device memory",
            ));
        }
        if !self.has_storage {
            return Err(Error::new(
                ErrorKind::InvalidState,
                "read_kv_block: the pool has no KV storage (num_layers 0, or a multi-group pool)",
            ));
        }
        if T::DTYPE != self.dtype {
            return Err(Error::invalid(format!(
                "read_kv_block: T is {:?} but the pool stores {:?}",
                T::DTYPE,
                self.dtype
            )));
        }
        // pkv_pool_kv_tensor's errors (a layer out of range, V of an MLA
        // pool) name this method, the one the caller called.
        let mut raw = sys::pkv_tensor::default();
        // SAFETY: valid out-parameter.
        check_as(
            unsafe { sys::pkv_pool_kv_tensor(self.ptr(), layer, which.raw(), &mut raw) },
            "Pool::read_kv_block",
            &[],
        )?;
        let t = RawTensor::new(raw);
        let shape = t.shape();
        // [num_blocks, num_kv_heads, block_size, head_dim]; an MLA pool's
        // one latent tensor per layer is [num_blocks, block_size, width].
        if !(shape.len() == 4 || shape.len() == 3) || !t.is_dense() || t.dtype() != Some(T::DTYPE) {
            return Err(Error::new(
                ErrorKind::Internal,
                format!("unexpected KV storage layout: shape {shape:?}"),
            ));
        }
        if block == NULL_BLOCK {
            return Err(Error::invalid(
                "block: 0 is the null block, which holds no K/V (its memory is never written)",
            ));
        }
        if block < 0 || i64::from(block) >= shape[0] {
            return Err(Error::invalid(format!(
                "block: {block} outside [1, {})",
                shape[0]
            )));
        }
        let per_block = shape[1..].iter().product::<i64>() as usize;
        // Planes of one layer in the swap layout: K and V, or the latent.
        let planes_per_layer = if shape.len() == 3 { 1 } else { 2 };
        let plane = per_block * std::mem::size_of::<T>();
        let mut out: Vec<T> = Vec::with_capacity(per_block);
        // Host layout of a swapped-out block: [layer][K, V][kv_head][slot][dim]
        // (MLA: [layer][slot][width]).
        let mut host = vec![0u8; self.bytes_per_block()? as usize];
        self.swap_out(&[block], &mut host)?;
        let off = (layer as usize * planes_per_layer + which.raw() as usize) * plane;
        if off + plane > host.len() {
            return Err(Error::new(ErrorKind::Internal, "unexpected swap layout"));
        }
        // SAFETY: out has room for per_block elements (plane bytes), the
        // source range is inside host, and T (f32, f16, bf16, the FP8 code
        // newtypes) has no invalid bit patterns.
        unsafe {
            std::ptr::copy_nonoverlapping(
                host.as_ptr().add(off),
                out.as_mut_ptr() as *mut u8,
                plane,
            );
            out.set_len(per_block);
        }
        Ok(out)
    }

    /// Copies blocks `src[i] -> dst[i]` in every layer, K and V. The pairs
    /// are copied at once: a destination may not be another pair's source or
    /// destination (an invalid-argument error, nothing copied).
    pub fn copy_blocks(&self, src: &[i32], dst: &[i32]) -> Result<()> {
        self.copy_blocks_on(src, dst, Stream::DEFAULT)
    }

    /// [`copy_blocks`](Pool::copy_blocks) queued on a CUDA stream.
    pub fn copy_blocks_on(&self, src: &[i32], dst: &[i32], stream: Stream) -> Result<()> {
        if src.len() != dst.len() {
            return Err(Error::invalid(format!(
                "src and dst: {} and {} block ids, must be equal",
                src.len(),
                dst.len()
            )));
        }
        // SAFETY: src and dst are valid for their common length; the stream
        // is valid by Stream's contract.
        check(unsafe {
            sys::pkv_pool_copy_blocks(
                self.ptr(),
                src.as_ptr(),
                dst.as_ptr(),
                to_u64(src.len()),
                stream.as_raw(),
            )
        })
    }

    fn check_host_pool(&self, what: &str) -> Result<()> {
        if self.device != Device::Cpu {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{what}: the safe form is for CPU pools; use swap_blocks_raw"),
            ));
        }
        Ok(())
    }

    /// Copies the contents of `blocks` (every layer, K and V) into `host`,
    /// laid out `[block][layer][K,V][kv_head][slot][head_dim]`; `host` needs
    /// `blocks.len() * bytes_per_block()` bytes. CPU pools.
    pub fn swap_out(&self, blocks: &[i32], host: &mut [u8]) -> Result<()> {
        self.check_host_pool("swap_out")?;
        // SAFETY: host is valid for its length; the CPU copy is complete
        // when the call returns.
        unsafe {
            self.swap_blocks_as(
                blocks,
                host.as_mut_ptr() as *mut c_void,
                to_u64(host.len()),
                SwapDirection::Out,
                Stream::DEFAULT,
                "Pool::swap_out",
                SAFE_SWAP_NAMES,
            )
        }
    }

    /// Copies `host` (as written by [`swap_out`](Pool::swap_out)) back into
    /// `blocks`. CPU pools.
    pub fn swap_in(&self, blocks: &[i32], host: &[u8]) -> Result<()> {
        self.check_host_pool("swap_in")?;
        // SAFETY: with SWAP_IN the library only reads host, for its length,
        // within the call.
        unsafe {
            self.swap_blocks_as(
                blocks,
                host.as_ptr() as *mut c_void,
                to_u64(host.len()),
                SwapDirection::In,
                Stream::DEFAULT,
                "Pool::swap_in",
                SAFE_SWAP_NAMES,
            )
        }
    }

    /// Moves block contents between the pool and a host buffer of
    /// `host_bytes` bytes, on any pool.
    ///
    /// # Safety
    /// `host` must be valid for `host_bytes` bytes (writable for
    /// [`SwapDirection::Out`]) until the copy has finished: for a CUDA pool,
    /// until `stream` has passed it (use pinned memory).
    pub unsafe fn swap_blocks_raw(
        &self,
        blocks: &[i32],
        host: *mut c_void,
        host_bytes: u64,
        direction: SwapDirection,
        stream: Stream,
    ) -> Result<()> {
        // SAFETY: by the caller's contract.
        unsafe {
            self.swap_blocks_as(
                blocks,
                host,
                host_bytes,
                direction,
                stream,
                "Pool::swap_blocks_raw",
                &[],
            )
        }
    }

    /// [`swap_blocks_raw`](Pool::swap_blocks_raw), its errors reported as
    /// `op` with `names` rewritten.
    ///
    /// # Safety
    /// As [`swap_blocks_raw`](Pool::swap_blocks_raw).
    #[allow(clippy::too_many_arguments)]
    unsafe fn swap_blocks_as(
        &self,
        blocks: &[i32],
        host: *mut c_void,
        host_bytes: u64,
        direction: SwapDirection,
        stream: Stream,
        op: &str,
        names: Renames,
    ) -> Result<()> {
        let dir = match direction {
            SwapDirection::Out => sys::PKV_SWAP_OUT,
            SwapDirection::In => sys::PKV_SWAP_IN,
        };
        // SAFETY: blocks is valid for its length; host by the caller's
        // contract.
        check_as(
            unsafe {
                sys::pkv_pool_swap_blocks(
                    self.ptr(),
                    blocks.as_ptr(),
                    to_u64(blocks.len()),
                    host,
                    host_bytes,
                    dir,
                    stream.as_raw(),
                )
            },
            op,
            names,
        )
    }

    // --------------------------------------------------------- step plans

    /// Builds the step plan for `seqs[i]` with `query_counts[i]` new tokens
    /// each (1 for decode, the chunk length for prefill); pending
    /// copy-on-write copies run here. Nothing counts as computed until the
    /// step is committed (see [`Batch`]); a plan whose context holds tokens
    /// nobody wrote fails with [`ErrorKind::InvalidState`]: compute from
    /// [`SeqInfo::num_computed_tokens`] on.
    pub fn prepare(&self, seqs: &[SeqId], query_counts: &[u32]) -> Result<Batch> {
        self.prepare_on(seqs, query_counts, Stream::DEFAULT)
    }

    /// [`prepare`](Pool::prepare) on a CUDA stream; the batch keeps using
    /// that stream for its kernels.
    pub fn prepare_on(
        &self,
        seqs: &[SeqId],
        query_counts: &[u32],
        stream: Stream,
    ) -> Result<Batch> {
        self.prepare_flags(seqs, query_counts, 0, stream)
    }

    /// [`prepare_on`](Pool::prepare_on) with a persistent page table
    /// (`pkv_batch_prepare_ex` with `PKV_PREPARE_PERSISTENT_TABLE`): the
    /// page table is a block table of padded rows that the pool keeps
    /// across steps, rewriting only the rows whose sequence or block table
    /// changed. Row `i` holds `seqs[i]`'s pages at
    /// `PAGE_INDICES[i * stride + j]`, 0 (the null block) past them, and
    /// `PAGE_INDPTR[i] == i * stride`. Keep each sequence at the same index
    /// from step to step. On a multi-group pool every group has its own
    /// kept table and stride (read with `Batch::plan_group_i32`; a recurrent
    /// group's rows are one page).
    pub fn prepare_persistent_on(
        &self,
        seqs: &[SeqId],
        query_counts: &[u32],
        stream: Stream,
    ) -> Result<Batch> {
        self.prepare_flags(
            seqs,
            query_counts,
            sys::PKV_PREPARE_PERSISTENT_TABLE,
            stream,
        )
    }

    fn prepare_flags(
        &self,
        seqs: &[SeqId],
        query_counts: &[u32],
        flags: u32,
        stream: Stream,
    ) -> Result<Batch> {
        if seqs.len() != query_counts.len() {
            return Err(Error::invalid(format!(
                "seqs and query_counts: {} and {} entries, must be equal",
                seqs.len(),
                query_counts.len()
            )));
        }
        let n = u32::try_from(seqs.len()).map_err(|_| Error::invalid("seqs: too many"))?;
        let mut out = ptr::null_mut();
        // SAFETY: SeqId is repr(transparent) over pkv_seq_id, so seqs is a
        // valid pkv_seq_id array; both arrays hold n entries.
        check(unsafe {
            if flags == 0 {
                sys::pkv_batch_prepare(
                    self.ptr(),
                    seqs.as_ptr() as *const sys::pkv_seq_id,
                    query_counts.as_ptr(),
                    n,
                    stream.as_raw(),
                    &mut out,
                )
            } else {
                sys::pkv_batch_prepare_ex(
                    self.ptr(),
                    seqs.as_ptr() as *const sys::pkv_seq_id,
                    query_counts.as_ptr(),
                    n,
                    flags,
                    stream.as_raw(),
                    &mut out,
                )
            }
        })?;
        let raw = NonNull::new(out)
            .ok_or_else(|| Error::new(ErrorKind::Internal, "pkv_batch_prepare returned no plan"))?;
        Ok(Batch::new(raw, self.device, stream))
    }

    /// One decode step in one call (`pkv_batch_prepare_decode`): appends
    /// `tokens[i]` (one token) to `seqs[i]` and builds the plan whose
    /// queries are those tokens, as [`append_batch`](Pool::append_batch)
    /// then [`prepare`](Pool::prepare) with every query count 1 would. The
    /// plan commits and aborts as `prepare`'s.
    ///
    /// All or nothing: when the plan cannot be built (a stale or repeated
    /// id, too few free blocks, a context no committed step wrote:
    /// [`ErrorKind::InvalidState`]) nothing is appended. Device errors on a
    /// CUDA pool (pending copy-on-write copies, the plan's upload) come
    /// after the appends, which then stay, uncomputed.
    /// [`ErrorKind::Unsupported`] on a multi-group pool (append, then
    /// prepare); [`ErrorKind::InvalidArgument`] when `seqs` and `tokens`
    /// differ in length.
    pub fn prepare_decode(&self, seqs: &[SeqId], tokens: &[i32]) -> Result<Batch> {
        self.prepare_decode_flags(seqs, tokens, 0, Stream::DEFAULT)
    }

    /// [`prepare_decode`](Pool::prepare_decode) on a CUDA stream; the batch
    /// keeps using that stream for its kernels.
    pub fn prepare_decode_on(
        &self,
        seqs: &[SeqId],
        tokens: &[i32],
        stream: Stream,
    ) -> Result<Batch> {
        self.prepare_decode_flags(seqs, tokens, 0, stream)
    }

    /// [`prepare_decode_on`](Pool::prepare_decode_on) with a persistent page
    /// table, as [`prepare_persistent_on`](Pool::prepare_persistent_on)
    /// lays it out. Keep each sequence at the same index from step to step.
    pub fn prepare_decode_persistent_on(
        &self,
        seqs: &[SeqId],
        tokens: &[i32],
        stream: Stream,
    ) -> Result<Batch> {
        self.prepare_decode_flags(seqs, tokens, sys::PKV_PREPARE_PERSISTENT_TABLE, stream)
    }

    fn prepare_decode_flags(
        &self,
        seqs: &[SeqId],
        tokens: &[i32],
        flags: u32,
        stream: Stream,
    ) -> Result<Batch> {
        if seqs.len() != tokens.len() {
            return Err(Error::invalid(format!(
                "seqs and tokens differ in length ({} vs {})",
                seqs.len(),
                tokens.len()
            )));
        }
        let n = u32::try_from(seqs.len()).map_err(|_| Error::invalid("seqs: too many"))?;
        let mut out = ptr::null_mut();
        // SAFETY: SeqId is repr(transparent) over pkv_seq_id, so seqs is a
        // valid pkv_seq_id array; both arrays hold n entries.
        check(unsafe {
            sys::pkv_batch_prepare_decode(
                self.ptr(),
                seqs.as_ptr().cast::<sys::pkv_seq_id>(),
                tokens.as_ptr(),
                n,
                flags,
                stream.as_raw(),
                &mut out,
            )
        })?;
        let raw = NonNull::new(out).ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                "pkv_batch_prepare_decode returned no plan",
            )
        })?;
        Ok(Batch::new(raw, self.device, stream))
    }

    /// Whether the pool has KV storage (`num_layers > 0`).
    pub fn has_storage(&self) -> bool {
        self.has_storage
    }

    /// The device the storage lives on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The storage dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

/// `strict_key_domains` and `vllm_tagged_keys` as one `PKV_KEY_DOMAINS_*`
/// value; both set is an error (the library takes one mode).
pub(crate) fn key_domains(strict: bool, tagged: bool) -> Result<u32> {
    match (strict, tagged) {
        (false, false) => Ok(sys::PKV_KEY_DOMAINS_VLLM),
        (true, false) => Ok(sys::PKV_KEY_DOMAINS_STRICT),
        (false, true) => Ok(sys::PKV_KEY_DOMAINS_VLLM_TAGGED),
        (true, true) => Err(Error::invalid(
            "strict_key_domains and vllm_tagged_keys: set at most one",
        )),
    }
}

/// Runs f with opts as a pkv_seq_options whose strings and items live for
/// the call.
pub(crate) fn with_raw_seq_options<T>(
    opts: &SeqOptions,
    f: impl FnOnce(&sys::pkv_seq_options) -> Result<T>,
) -> Result<T> {
    let salt = opt_c_string(&opts.cache_salt, "SeqOptions::cache_salt")?;
    let lora_name = opt_c_string(&opts.lora_name, "SeqOptions::lora_name")?;
    let lora_path = opt_c_string(&opts.lora_path, "SeqOptions::lora_path")?;
    let mm = RawMmItems::new(&opts.mm_items, "SeqOptions::mm_items")?;
    let mut raw = init_sized!(sys::pkv_seq_options_init_sized, sys::pkv_seq_options)?;
    raw.priority = opts.priority;
    raw.lora_id = opts.lora_id;
    raw.lora_name = opt_ptr(&lora_name);
    raw.lora_path = opt_ptr(&lora_path);
    raw.cache_salt = opt_ptr(&salt);
    raw.mm_items = mm.ptr();
    raw.num_mm_items = mm.len()?;
    f(&raw)
}
