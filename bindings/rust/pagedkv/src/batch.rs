//! Step plans: one per engine step, then per layer a cache write and an
//! attention call.

use std::fmt;
use std::ptr::{self, NonNull};

use pagedkv_sys as sys;

use crate::error::{check, Error, ErrorKind, Result};
use crate::tensor::{RawTensor, Stream, TensorView, TensorViewMut};
use crate::types::{Device, Element};

/// Sizes of a step plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchInfo {
    pub num_seqs: u32,
    /// Total queries: rows of q, k, v and out.
    pub num_tokens: u64,
    /// Entries of the CSR page table.
    pub num_pages: u64,
    /// Longest sequence in the plan.
    pub max_context: u64,
    /// Largest query count.
    pub max_query: u32,
    pub block_size: u32,
}

/// The arrays of a step plan, for engines bringing their own kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlanArray {
    /// i64 `[num_tokens]`: `block_id * block_size + offset` of each new token.
    SlotMapping,
    /// i32 `[num_seqs + 1]`: query row offsets.
    QueryIndptr,
    /// i32 `[num_seqs + 1]`: offsets into the page indices.
    PageIndptr,
    /// i32 `[num_pages]`: block ids in order.
    PageIndices,
    /// i32 `[num_seqs]`: tokens in each sequence's last page.
    LastPageLen,
    /// i32 `[num_seqs]`: tokens of each sequence.
    ContextLens,
}

/// A recurrent group's state-snapshot arrays of a step plan (groups with
/// [`GroupSpec::snapshot_every_block`]); apart from [`PlanArray`] so that
/// code matching every `PlanArray` keeps compiling.
///
/// [`GroupSpec::snapshot_every_block`]: crate::GroupSpec::snapshot_every_block
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SnapshotArray {
    /// i32 `[num_seqs + 1]`: CSR offsets of each sequence's snapshots.
    Indptr,
    /// i64 `[num_snapshots]`: the query row after which each state is saved.
    Rows,
    /// i32 `[num_snapshots]`: the state slot (block id) to save it in.
    Blocks,
}

impl SnapshotArray {
    fn raw(self) -> u32 {
        match self {
            SnapshotArray::Indptr => sys::PKV_PLAN_SNAPSHOT_INDPTR,
            SnapshotArray::Rows => sys::PKV_PLAN_SNAPSHOT_ROWS,
            SnapshotArray::Blocks => sys::PKV_PLAN_SNAPSHOT_BLOCKS,
        }
    }
}

impl PlanArray {
    fn raw(self) -> u32 {
        match self {
            PlanArray::SlotMapping => sys::PKV_PLAN_SLOT_MAPPING,
            PlanArray::QueryIndptr => sys::PKV_PLAN_QUERY_INDPTR,
            PlanArray::PageIndptr => sys::PKV_PLAN_PAGE_INDPTR,
            PlanArray::PageIndices => sys::PKV_PLAN_PAGE_INDICES,
            PlanArray::LastPageLen => sys::PKV_PLAN_LAST_PAGE_LEN,
            PlanArray::ContextLens => sys::PKV_PLAN_CONTEXT_LENS,
        }
    }
}

/// Attention parameters; `Default` gives the library's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// 0 = `1/sqrt(head_dim)`.
    pub softmax_scale: f32,
    /// Tokens; 0 = none. A query at position p sees keys k with
    /// `p - sliding_window < k <= p`.
    pub sliding_window: u32,
    /// 0 = none; else `logits = c * tanh(logits / c)`.
    pub logit_softcap: f32,
}

impl Default for AttentionParams {
    fn default() -> AttentionParams {
        let raw = init_sized!(
            sys::pkv_attention_params_init_sized,
            sys::pkv_attention_params
        )
        .expect("the sized init of a struct of its own size");
        AttentionParams {
            softmax_scale: raw.softmax_scale,
            sliding_window: raw.sliding_window,
            logit_softcap: raw.logit_softcap,
        }
    }
}

/// A step plan made by [`Pool::prepare`](crate::Pool::prepare): slot
/// mapping, CSR page table, context lengths and query offsets for the
/// scheduled sequences.
///
/// It keeps the pool's internals alive, so it may outlive the [`Pool`]
/// (its calls that need the pool, commit and the kernels, then fail with
/// [`ErrorKind::InvalidState`]; its arrays and info stay readable). Appending to,
/// truncating or freeing one of its sequences makes it stale (same error):
/// prepare a new plan each step. `Batch` is `Send` but not `Sync`: one
/// thread at a time.
///
/// The step's tokens count as computed (prefix hits, sliding window) only
/// when it is committed: on a pool with storage by a successful
/// [`cache_write`](Batch::cache_write) of every layer, otherwise by
/// [`commit`](Batch::commit) (the engine wrote K/V elsewhere). Dropping a
/// batch that was not committed aborts it, so an early return or a panic
/// between prepare and the writes never caches K/V nobody wrote.
///
/// Its host arrays ([`slot_mapping`](Batch::slot_mapping) and the others)
/// are slices borrowed from it: they cannot outlive it or a commit
/// (compile errors), and `Batch` is not `Sync`:
///
/// ```compile_fail
/// # fn main() -> pagedkv::Result<()> {
/// let pool = pagedkv::Pool::new(&pagedkv::PoolOptions { block_size: 4, num_blocks: 8, ..Default::default() })?;
/// let seq = pool.create_seq()?;
/// pool.append(seq, &[1, 2])?;
/// let slots = {
///     let batch = pool.prepare(&[seq], &[2])?;
///     batch.slot_mapping()? // error[E0597]: `batch` does not live long enough
/// };
/// assert_eq!(slots.len(), 2);
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # fn main() -> pagedkv::Result<()> {
/// let pool = pagedkv::Pool::new(&pagedkv::PoolOptions { block_size: 4, num_blocks: 8, ..Default::default() })?;
/// let seq = pool.create_seq()?;
/// pool.append(seq, &[1, 2])?;
/// let batch = pool.prepare(&[seq], &[2])?;
/// let slots = batch.slot_mapping()?;
/// batch.commit()?; // error[E0505]: cannot move out of `batch` because it is borrowed
/// assert_eq!(slots.len(), 2);
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # fn main() -> pagedkv::Result<()> {
/// fn shared<T: Sync>(_: &T) {}
/// let pool = pagedkv::Pool::new(&pagedkv::PoolOptions { block_size: 4, num_blocks: 8, ..Default::default() })?;
/// let seq = pool.create_seq()?;
/// pool.append(seq, &[1, 2])?;
/// let batch = pool.prepare(&[seq], &[2])?;
/// shared(&batch); // error[E0277]: `NonNull<pkv_batch>` cannot be shared between threads safely
/// # Ok(()) }
/// ```
///
/// [`Pool`]: crate::Pool
pub struct Batch {
    raw: NonNull<sys::pkv_batch>,
    device: Device,
    stream: Stream,
    committed: bool,
}

// SAFETY: a plan may move between threads; it is not for two threads at
// once (docs/threading.md), hence no Sync and &mut self on kernel calls.
unsafe impl Send for Batch {}

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: we own the plan. Aborting a step that committed itself
        // (every layer written) is refused and changes nothing.
        unsafe {
            if !self.committed {
                sys::pkv_batch_abort(self.raw.as_ptr());
            }
            sys::pkv_batch_destroy(self.raw.as_ptr())
        }
    }
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("device", &self.device)
            .field("info", &self.info().ok())
            .finish()
    }
}

impl Batch {
    pub(crate) fn new(raw: NonNull<sys::pkv_batch>, device: Device, stream: Stream) -> Batch {
        Batch {
            raw,
            device,
            stream,
            committed: false,
        }
    }

    /// The step's writes happened: its tokens count as computed. Consumes
    /// the plan (a committed step has nothing left to do).
    pub fn commit(mut self) -> Result<()> {
        // SAFETY: we own the plan.
        check(unsafe { sys::pkv_batch_commit(self.raw.as_ptr()) })?;
        self.committed = true;
        Ok(())
    }

    /// The step failed before its writes: nothing of it counts (what
    /// dropping an uncommitted batch does, with the status).
    /// [`ErrorKind::InvalidState`] if the step already committed itself by
    /// writing every layer.
    pub fn abort(self) -> Result<()> {
        // SAFETY: we own the plan.
        check(unsafe { sys::pkv_batch_abort(self.raw.as_ptr()) })
    }

    /// The raw handle; it stays owned by this `Batch`.
    pub fn as_raw(&self) -> *mut sys::pkv_batch {
        self.raw.as_ptr()
    }

    /// Sets the CUDA stream later kernel calls of this plan are queued on.
    /// The stream the plan was prepared on stays in use: dropping the plan
    /// releases its device arrays on it (see [`Stream::from_raw`]).
    pub fn set_stream(&mut self, stream: Stream) {
        self.stream = stream;
    }

    /// The stream kernel calls are queued on.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// Sizes of the plan.
    pub fn info(&self) -> Result<BatchInfo> {
        let mut raw = init_sized!(sys::pkv_batch_info_init_sized, sys::pkv_batch_info)?;
        // SAFETY: valid out-parameter, struct_size set by _init_sized.
        check(unsafe { sys::pkv_batch_get_info(self.raw.as_ptr(), &mut raw) })?;
        Ok(BatchInfo {
            num_seqs: raw.num_seqs,
            num_tokens: raw.num_tokens,
            num_pages: raw.num_pages,
            max_context: raw.max_context,
            max_query: raw.max_query,
            block_size: raw.block_size,
        })
    }

    /// Descriptor of one plan array, on the pool's device; valid while the
    /// plan lives.
    pub fn plan_tensor(&self, which: PlanArray) -> Result<RawTensor> {
        let mut t = sys::pkv_tensor::default();
        // SAFETY: valid out-parameter.
        check(unsafe { sys::pkv_batch_plan_tensor(self.raw.as_ptr(), which.raw(), &mut t) })?;
        Ok(RawTensor::new(t))
    }

    /// [`plan_tensor`](Batch::plan_tensor) of one KV group of a plan over a
    /// multi-group pool (`pkv_batch_plan_tensor_group`): that group's page
    /// table and slot mapping (a recurrent group: one page per sequence, its
    /// state slot); query offsets and context lengths are shared. Group 0 of
    /// a single-group plan is `plan_tensor`.
    pub fn plan_group_tensor(&self, group: u32, which: PlanArray) -> Result<RawTensor> {
        self.group_tensor(group, which.raw())
    }

    /// A state-snapshot array of a recurrent group (any device).
    pub fn group_snapshot_tensor(&self, group: u32, which: SnapshotArray) -> Result<RawTensor> {
        self.group_tensor(group, which.raw())
    }

    /// An i32 snapshot array of a recurrent group (CPU pools): `Indptr` or
    /// `Blocks` (`Rows` is i64: [`group_snapshot_rows`](Batch::group_snapshot_rows)).
    pub fn group_snapshot_i32(&self, group: u32, which: SnapshotArray) -> Result<&[i32]> {
        if which == SnapshotArray::Rows {
            return Err(Error::invalid(
                "group_snapshot_i32: the snapshot rows are i64; use group_snapshot_rows",
            ));
        }
        self.host_slice("group snapshot array", || {
            self.group_snapshot_tensor(group, which)
        })
    }

    fn group_tensor(&self, group: u32, which: u32) -> Result<RawTensor> {
        let mut t = sys::pkv_tensor::default();
        // SAFETY: valid out-parameter.
        check(unsafe {
            sys::pkv_batch_plan_tensor_group(self.raw.as_ptr(), group, which, &mut t)
        })?;
        Ok(RawTensor::new(t))
    }

    /// An i32 array of one group (CPU pools): every `PlanArray` but
    /// `SlotMapping` (see [`group_slot_mapping`](Batch::group_slot_mapping)).
    pub fn plan_group_i32(&self, group: u32, which: PlanArray) -> Result<&[i32]> {
        if which == PlanArray::SlotMapping {
            return Err(Error::invalid(
                "plan_group_i32: the slot mapping is i64; use group_slot_mapping",
            ));
        }
        self.host_slice("group plan array", || self.plan_group_tensor(group, which))
    }

    /// The query rows after which a recurrent group's state snapshots are
    /// saved ([`SnapshotArray::Rows`], CPU pools); their slots are
    /// `group_snapshot_i32(group, SnapshotArray::Blocks)`.
    pub fn group_snapshot_rows(&self, group: u32) -> Result<&[i64]> {
        self.host_slice("group snapshot rows", || {
            self.group_snapshot_tensor(group, SnapshotArray::Rows)
        })
    }

    /// The slot mapping of one group (CPU pools).
    pub fn group_slot_mapping(&self, group: u32) -> Result<&[i64]> {
        self.host_slice("group slot mapping", || {
            self.plan_group_tensor(group, PlanArray::SlotMapping)
        })
    }

    /// Descriptor of the position of each query row in its sequence (i64
    /// `[num_tokens]`, the position ids of a model's rotary embedding), on
    /// the pool's device; valid while the plan lives. Built on the first
    /// call (on a CUDA pool uploaded on the prepare stream).
    pub fn token_positions_tensor(&self) -> Result<RawTensor> {
        let mut t = sys::pkv_tensor::default();
        // SAFETY: valid out-parameter.
        check(unsafe { sys::pkv_batch_token_positions(self.raw.as_ptr(), &mut t) })?;
        Ok(RawTensor::new(t))
    }

    /// Descriptor of the query row of each sequence's last scheduled token
    /// (i64 `[num_seqs]`, the rows to compute logits for), like
    /// [`token_positions_tensor`](Batch::token_positions_tensor).
    pub fn last_token_indices_tensor(&self) -> Result<RawTensor> {
        let mut t = sys::pkv_tensor::default();
        // SAFETY: valid out-parameter.
        check(unsafe { sys::pkv_batch_last_token_indices(self.raw.as_ptr(), &mut t) })?;
        Ok(RawTensor::new(t))
    }

    /// Position of each query row in its sequence (CPU pools).
    pub fn token_positions(&self) -> Result<&[i64]> {
        self.host_slice("token positions", || self.token_positions_tensor())
    }

    /// Query row of each sequence's last scheduled token (CPU pools).
    pub fn last_token_indices(&self) -> Result<&[i64]> {
        self.host_slice("last token indices", || self.last_token_indices_tensor())
    }

    fn host_array<T: Element>(&self, which: PlanArray) -> Result<&[T]> {
        self.host_slice(&format!("plan array {which:?}"), || self.plan_tensor(which))
    }

    /// A host view of a plan array as a slice tied to the plan's lifetime.
    fn host_slice<T: Element>(
        &self,
        what: &str,
        get: impl FnOnce() -> Result<RawTensor>,
    ) -> Result<&[T]> {
        if self.device != Device::Cpu {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "{what}: plan arrays of a CUDA pool live on the device; use the _tensor form"
                ),
            ));
        }
        let t = get()?;
        if t.dtype() != Some(T::DTYPE) || t.shape().len() != 1 || !t.is_dense() {
            return Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "{what}: unexpected dtype {:?} / shape {:?}",
                    t.dtype(),
                    t.shape()
                ),
            ));
        }
        let n = t.numel();
        if n == 0 {
            return Ok(&[]);
        }
        // SAFETY: a dense host array of n T owned by the plan, unchanged
        // until pkv_batch_destroy, which needs &mut self / ownership.
        Ok(unsafe { std::slice::from_raw_parts(t.data_ptr() as *const T, n) })
    }

    /// `block_id * block_size + offset` of each new token (CPU pools).
    pub fn slot_mapping(&self) -> Result<&[i64]> {
        self.host_array(PlanArray::SlotMapping)
    }
    /// Query row offsets, `num_seqs + 1` entries (CPU pools).
    pub fn query_indptr(&self) -> Result<&[i32]> {
        self.host_array(PlanArray::QueryIndptr)
    }
    /// Offsets into [`page_indices`](Batch::page_indices), `num_seqs + 1`
    /// entries (CPU pools).
    pub fn page_indptr(&self) -> Result<&[i32]> {
        self.host_array(PlanArray::PageIndptr)
    }
    /// Block ids of every sequence, in order (CPU pools).
    pub fn page_indices(&self) -> Result<&[i32]> {
        self.host_array(PlanArray::PageIndices)
    }
    /// Tokens in each sequence's last page (CPU pools).
    pub fn last_page_len(&self) -> Result<&[i32]> {
        self.host_array(PlanArray::LastPageLen)
    }
    /// Tokens of each sequence (CPU pools).
    pub fn context_lens(&self) -> Result<&[i32]> {
        self.host_array(PlanArray::ContextLens)
    }

    /// Scatters the step's new keys and values, `k` and `v`
    /// `[num_tokens, num_kv_heads, head_dim]` of the pool's dtype, into
    /// their slots of `layer`.
    pub fn cache_write(
        &mut self,
        layer: u32,
        k: &TensorView<'_>,
        v: &TensorView<'_>,
    ) -> Result<()> {
        // SAFETY: the views describe memory valid for the call (or, for
        // raw views, by their constructor's contract).
        check(unsafe {
            sys::pkv_cache_write(
                self.raw.as_ptr(),
                layer,
                k.as_raw(),
                v.as_raw(),
                self.stream.as_raw(),
            )
        })
    }

    /// Paged attention for every query of the plan: `q`
    /// `[num_tokens, num_q_heads, head_dim]` (num_q_heads a multiple of
    /// num_kv_heads), `out` of the same shape and dtype. Each query attends
    /// causally over its sequence's cached tokens and the new ones up to
    /// itself. `lse`, if given, gets f32 `[num_tokens, num_q_heads]`
    /// log-sum-exp of the scaled logits.
    pub fn attention_forward(
        &mut self,
        layer: u32,
        q: &TensorView<'_>,
        out: &mut TensorViewMut<'_>,
        lse: Option<&mut TensorViewMut<'_>>,
        params: &AttentionParams,
    ) -> Result<()> {
        let mut raw = init_sized!(
            sys::pkv_attention_params_init_sized,
            sys::pkv_attention_params
        )?;
        raw.softmax_scale = params.softmax_scale;
        raw.sliding_window = params.sliding_window;
        raw.logit_softcap = params.logit_softcap;
        let lse_ptr = lse.map_or(ptr::null(), |t| t.as_raw() as *const sys::pkv_tensor);
        // SAFETY: the views are valid for the call; out and lse are
        // exclusively borrowed.
        check(unsafe {
            sys::pkv_attention_forward(
                self.raw.as_ptr(),
                layer,
                q.as_raw(),
                out.as_raw(),
                lse_ptr,
                &raw,
                self.stream.as_raw(),
            )
        })
    }

    /// MLA pools: scatters the step's latents into `layer`: `kv_c`
    /// `[num_tokens, kv_lora_rank]` and `k_pe` `[num_tokens,
    /// qk_rope_head_dim]` of the pool's dtype. Like
    /// [`cache_write`](Batch::cache_write), the write of the last layer
    /// commits the step.
    pub fn mla_cache_write(
        &mut self,
        layer: u32,
        kv_c: &TensorView<'_>,
        k_pe: &TensorView<'_>,
    ) -> Result<()> {
        // SAFETY: the views describe memory valid for the call.
        check(unsafe {
            sys::pkv_mla_cache_write(
                self.raw.as_ptr(),
                layer,
                kv_c.as_raw(),
                k_pe.as_raw(),
                self.stream.as_raw(),
            )
        })
    }

    /// MLA pools: absorbed attention for every query of the plan (decode,
    /// prefill and chunked prefill, causal): `q_latent` `[num_tokens,
    /// num_heads, kv_lora_rank]` (q_nope times W_UK), `q_pe` `[num_tokens,
    /// num_heads, qk_rope_head_dim]`, `out` like `q_latent` (the latent
    /// output; the caller applies W_UV). `softmax_scale` is the model's
    /// (> 0). `lse`, if given, gets f32 `[num_tokens, num_heads]`.
    pub fn mla_attention(
        &mut self,
        layer: u32,
        q_latent: &TensorView<'_>,
        q_pe: &TensorView<'_>,
        out: &mut TensorViewMut<'_>,
        lse: Option<&mut TensorViewMut<'_>>,
        softmax_scale: f32,
    ) -> Result<()> {
        let mut raw = init_sized!(
            sys::pkv_attention_params_init_sized,
            sys::pkv_attention_params
        )?;
        raw.softmax_scale = softmax_scale;
        let lse_ptr = lse.map_or(ptr::null(), |t| t.as_raw() as *const sys::pkv_tensor);
        // SAFETY: the views are valid for the call; out and lse are
        // exclusively borrowed.
        check(unsafe {
            sys::pkv_mla_attention(
                self.raw.as_ptr(),
                layer,
                q_latent.as_raw(),
                q_pe.as_raw(),
                out.as_raw(),
                lse_ptr,
                &raw,
                self.stream.as_raw(),
            )
        })
    }
}
