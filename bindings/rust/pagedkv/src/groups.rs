//! Several KV groups in one pool (`pagedkv/groups.h`): hybrid models whose
//! layers mix full attention, sliding windows and MLA latents. The groups
//! share one block budget; every `Pool` call on sequences acts on all of
//! them, all or nothing; these calls read each group.

use std::ptr::{self, NonNull};

use crate::error::{check, Error, ErrorKind, Result};
use crate::pool::{read_vec, Pool, SeqId};
use crate::sys;
use crate::DType;

/// What a group's layers cache (`PKV_GROUP_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupKind {
    /// Full attention: K and V pages, every block kept.
    Full,
    /// Attention over the last `window` tokens: blocks wholly outside the
    /// window of each append's first token are released.
    SlidingWindow { window: u32 },
    /// Full attention over one latent of `kv_lora_rank + rope_dim` per token.
    Mla { kv_lora_rank: u32, rope_dim: u32 },
    /// Fixed-size recurrent state (Mamba) of `state_bytes` per layer: one
    /// slot per sequence, snapshots at block boundaries for prefix hits.
    Recurrent { state_bytes: u64 },
}

/// One group of layers (`pkv_kv_group_spec`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSpec {
    pub kind: GroupKind,
    pub num_layers: u32,
    /// Full / sliding window only.
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub dtype: DType,
    /// The model layers of this group (`num_layers` of them), e.g. the odd
    /// layers of a sliding-window/full interleave. Give them for every group
    /// or for none; without them layers are numbered through the groups in
    /// order. [`Pool::group_of_layer`] maps them back.
    pub layer_ids: Option<Vec<u32>>,
    /// Recurrent groups: every step plan gives a state snapshot slot at each
    /// block boundary inside each query chunk
    /// (`PKV_GROUP_SNAPSHOT_EVERY_BLOCK`; the arrays of
    /// [`SnapshotArray`]), so a prompt prefilled in one chunk can be hit
    /// at any of its block boundaries.
    ///
    /// [`SnapshotArray`]: crate::SnapshotArray
    pub snapshot_every_block: bool,
}

impl GroupSpec {
    pub fn full(num_layers: u32, num_kv_heads: u32, head_dim: u32) -> GroupSpec {
        GroupSpec {
            kind: GroupKind::Full,
            num_layers,
            num_kv_heads,
            head_dim,
            dtype: DType::BF16,
            layer_ids: None,
            snapshot_every_block: false,
        }
    }

    /// This spec with snapshots at every block boundary of a plan's query
    /// chunks (recurrent groups; see [`snapshot_every_block`](GroupSpec::snapshot_every_block)).
    pub fn with_snapshot_every_block(mut self) -> GroupSpec {
        self.snapshot_every_block = true;
        self
    }

    /// This spec with its model layer ids.
    pub fn with_layer_ids(mut self, ids: impl Into<Vec<u32>>) -> GroupSpec {
        self.layer_ids = Some(ids.into());
        self
    }
    pub fn window(window: u32, num_layers: u32, num_kv_heads: u32, head_dim: u32) -> GroupSpec {
        GroupSpec {
            kind: GroupKind::SlidingWindow { window },
            ..GroupSpec::full(num_layers, num_kv_heads, head_dim)
        }
    }
    pub fn mla(num_layers: u32, kv_lora_rank: u32, rope_dim: u32) -> GroupSpec {
        GroupSpec {
            kind: GroupKind::Mla {
                kv_lora_rank,
                rope_dim,
            },
            ..GroupSpec::full(num_layers, 0, 0)
        }
    }

    pub fn recurrent(num_layers: u32, state_bytes: u64) -> GroupSpec {
        GroupSpec {
            kind: GroupKind::Recurrent { state_bytes },
            ..GroupSpec::full(num_layers, 0, 0)
        }
    }

    /// The C spec; its layer_ids points into self, which must outlive it.
    fn raw(&self, i: usize) -> Result<sys::pkv_kv_group_spec> {
        let mut g = init_sized!(sys::pkv_kv_group_spec_init_sized, sys::pkv_kv_group_spec)?;
        g.num_layers = self.num_layers;
        g.num_kv_heads = self.num_kv_heads;
        g.head_dim = self.head_dim;
        g.dtype = self.dtype.raw();
        if self.snapshot_every_block {
            g.flags = sys::PKV_GROUP_SNAPSHOT_EVERY_BLOCK;
        }
        match self.kind {
            GroupKind::Full => g.kind = sys::PKV_GROUP_FULL,
            GroupKind::SlidingWindow { window } => {
                g.kind = sys::PKV_GROUP_SLIDING_WINDOW;
                g.sliding_window = window;
            }
            GroupKind::Mla {
                kv_lora_rank,
                rope_dim,
            } => {
                g.kind = sys::PKV_GROUP_MLA;
                g.kv_lora_rank = kv_lora_rank;
                g.rope_dim = rope_dim;
            }
            GroupKind::Recurrent { state_bytes } => {
                g.kind = sys::PKV_GROUP_RECURRENT;
                g.state_bytes = state_bytes;
            }
        }
        if let Some(ids) = &self.layer_ids {
            // The library reads num_layers entries: a shorter list must not reach it.
            if ids.len() != self.num_layers as usize {
                return Err(Error::invalid(format!(
                    "groups[{i}].layer_ids holds {} entries, not num_layers {}",
                    ids.len(),
                    self.num_layers
                )));
            }
            g.layer_ids = ids.as_ptr();
        }
        Ok(g)
    }
}

/// Counters of one group (`pkv_group_stats`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupStats {
    pub kind: u32,
    pub num_used_blocks: u64,
    pub num_cached_blocks: u64,
    pub num_null_entries: u64,
    pub bytes_per_block: u64,
}

impl Pool {
    /// A manager-only pool of several KV groups on one block budget. From
    /// `opts`: block_size, num_blocks or memory_budget_bytes, hash_algo,
    /// hash_seed, enable_prefix_caching, strict_key_domains (num_layers and
    /// sliding_window must be 0; enable_events, enable_partial_reuse and
    /// enable_retention are [`ErrorKind::Unsupported`]).
    pub fn with_groups(opts: &crate::PoolOptions, groups: &[GroupSpec]) -> Result<Pool> {
        let seed = std::ffi::CString::new(opts.hash_seed.as_str())
            .map_err(|_| Error::invalid("PoolOptions::hash_seed contains a NUL byte"))?;
        let mut base = init_sized!(sys::pkv_pool_options_init_sized, sys::pkv_pool_options)?;
        base.block_size = opts.block_size;
        base.num_blocks = opts.num_blocks;
        base.memory_budget_bytes = opts.memory_budget_bytes;
        base.hash_algo = opts.hash_algo.raw();
        base.enable_prefix_caching = opts.enable_prefix_caching as u32;
        base.hash_seed = seed.as_ptr();
        base.num_layers = opts.num_layers;
        base.sliding_window = opts.sliding_window;
        // Read by the library (strict_key_domains changes every block hash)
        // or refused by it (the others): never dropped here.
        base.strict_key_domains =
            crate::pool::key_domains(opts.strict_key_domains, opts.vllm_tagged_keys)?;
        base.enable_events = opts.enable_events as u32;
        base.enable_partial_reuse = opts.enable_partial_reuse as u32;
        base.enable_retention = opts.enable_retention as u32;
        let raw = groups
            .iter()
            .enumerate()
            .map(|(i, g)| g.raw(i))
            .collect::<Result<Vec<sys::pkv_kv_group_spec>>>()?;
        let n = u32::try_from(raw.len()).map_err(|_| Error::invalid("groups: too many groups"))?;
        let mut out = ptr::null_mut();
        // SAFETY: base, the seed and raw outlive the call; raw holds n specs.
        check(unsafe { sys::pkv_pool_create_groups(&base, raw.as_ptr(), n, &mut out) })?;
        let p = NonNull::new(out).ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                "pkv_pool_create_groups returned no pool",
            )
        })?;
        Ok(Pool::from_manager(p))
    }

    /// Number of KV groups (1 for a pool from `Pool::new`).
    pub fn num_groups(&self) -> Result<u32> {
        let mut n = 0u32;
        // SAFETY: valid pool and out-parameter.
        check(unsafe { sys::pkv_pool_num_groups(self.as_raw(), &mut n) })?;
        Ok(n)
    }

    /// The group holding model layer `layer` and the layer's index among
    /// that group's layers; `None` for a layer no group holds.
    pub fn group_of_layer(&self, layer: u32) -> Result<Option<(u32, u32)>> {
        let (mut g, mut k) = (0u32, 0u32);
        // SAFETY: valid pool and out-parameters.
        match check(unsafe { sys::pkv_pool_group_of_layer(self.as_raw(), layer, &mut g, &mut k) }) {
            Ok(()) => Ok(Some((g, k))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The block table of `seq` in `group` (`NULL_BLOCK` where its sliding
    /// window released a block).
    pub fn group_block_table(&self, seq: SeqId, group: u32) -> Result<Vec<i32>> {
        read_vec(0i32, 16, |out, cap, len| {
            // SAFETY: out is valid for cap entries (or NULL with cap 0).
            unsafe {
                sys::pkv_seq_group_block_table(self.as_raw(), seq.raw(), group, out, cap, len)
            }
        })
    }

    /// Counters of one group of a multi-group pool.
    pub fn group_stats(&self, group: u32) -> Result<GroupStats> {
        let mut s = init_sized!(sys::pkv_group_stats_init_sized, sys::pkv_group_stats)?;
        // SAFETY: valid out-parameter, struct_size set by _init_sized.
        check(unsafe { sys::pkv_pool_group_stats(self.as_raw(), group, &mut s) })?;
        Ok(GroupStats {
            kind: s.kind,
            num_used_blocks: s.num_used_blocks,
            num_cached_blocks: s.num_cached_blocks,
            num_null_entries: s.num_null_entries,
            bytes_per_block: s.bytes_per_block,
        })
    }

    /// Copy-on-write copies `(src, dst)` of `group` recorded since the last
    /// call; the engine copies those pages in every layer of the group
    /// before the next step writes.
    pub fn take_copies(&self, group: u32) -> Result<Vec<(i32, i32)>> {
        let mut cap = 16usize;
        loop {
            let mut src = vec![0i32; cap];
            let mut dst = vec![0i32; cap];
            let mut len = 0u64;
            // SAFETY: src and dst hold cap entries each.
            let status = unsafe {
                sys::pkv_pool_group_take_copies(
                    self.as_raw(),
                    group,
                    src.as_mut_ptr(),
                    dst.as_mut_ptr(),
                    cap as u64,
                    &mut len,
                )
            };
            if status == sys::PKV_E_BUFFER_TOO_SMALL && len as usize > cap {
                cap = len as usize;
                continue;
            }
            check(status)?;
            let n = len as usize;
            return Ok(src[..n]
                .iter()
                .copied()
                .zip(dst[..n].iter().copied())
                .collect());
        }
    }
}
