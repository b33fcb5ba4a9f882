//! Safe Rust interface to **pagedkv**, a paged KV cache for LLM inference:
//! a block pool with prefix caching, per-sequence block tables, step plans,
//! and the kernels that write keys/values into the pool and attend over it
//! (CPU, and CUDA where built).
//!
//! One engine step: [`Pool::append`] the scheduled sequences' new tokens,
//! [`Pool::prepare`] a [`Batch`], then per layer [`Batch::cache_write`] and
//! [`Batch::attention_forward`].
//!
//! ```
//! use pagedkv::{AttentionParams, DType, Pool, PoolOptions, TensorView, TensorViewMut};
//!
//! let (heads, dim) = (2usize, 64usize);
//! let pool = Pool::new(&PoolOptions {
//!     block_size: 16,
//!     num_blocks: 64,
//!     num_layers: 1,
//!     num_kv_heads: heads as u32,
//!     head_dim: dim as u32,
//!     dtype: DType::F32,
//!     num_threads: 1,
//!     ..PoolOptions::default()
//! })?;
//!
//! // Prefill a 5-token prompt.
//! let seq = pool.create_seq()?;
//! pool.append(seq, &[11, 12, 13, 14, 15])?;
//! let mut batch = pool.prepare(&[seq], &[5])?;
//! let n = heads * dim;
//! let k: Vec<f32> = (0..5 * n).map(|i| (i as f32 * 0.37).sin()).collect();
//! let v: Vec<f32> = (0..5 * n).map(|i| (i as f32 * 0.11).cos()).collect();
//! batch.cache_write(0, &TensorView::new(&k, &[5, heads, dim])?, &TensorView::new(&v, &[5, heads, dim])?)?;
//! let mut out = vec![0f32; 5 * n];
//! batch.attention_forward(
//!     0,
//!     &TensorView::new(&k, &[5, heads, dim])?, // use the keys as queries
//!     &mut TensorViewMut::new(&mut out, &[5, heads, dim])?,
//!     None,
//!     &AttentionParams::default(),
//! )?;
//! // The first query sees only itself: its output is its own value row.
//! assert!((out[0] - v[0]).abs() < 1e-5);
//! # Ok::<(), pagedkv::Error>(())
//! ```
//!
//! Threads: [`Pool`] is `Send + Sync` (the C pool serialises every call);
//! share it with `&Pool` or `Arc<Pool>`. A [`Batch`] is `Send` but used by
//! one thread at a time. Do not free or truncate a sequence while another
//! thread runs a kernel of a plan that reads it (on a CPU pool: until that
//! call returns) — the library cannot see that.
//!
//! Errors are [`Error`] values with an [`ErrorKind`] per C status code and
//! the library's message in this crate's names: the Rust method and the
//! argument or field to change (`Pool::prepare: seqs.len() is 0`,
//! `Pool::new: PoolOptions::block_size 2000 is outside [1, 1024]`, a dtype
//! as `DType::F32`), not the C ABI's (`pkv_batch_prepare: num_seqs is 0`,
//! `opts->block_size`, `dtype 1`), which [`Error::c_message`] keeps. [`Pool`] is `Send + Sync`. CPU tensors are plain
//! slices (`f32`, [`half::f16`], [`half::bf16`]); GPU memory enters through
//! the `unsafe` [`TensorView::from_raw_parts`].

#![deny(unsafe_op_in_unsafe_fn)]

/// A `Result<T>` of a C ABI struct `T` initialised by its
/// `pkv_X_init_sized` with this crate's `size_of::<T>()`
/// (docs/conventions.md, "Versioned structs"): the library's defaults for
/// the fields it knows, zeros for the fields of this crate's header it does
/// not, so a build against a newer header than the library reaches every
/// field it knows. Every struct this crate hands the library starts here,
/// never at the plain `_init`, which stops at the size it was frozen at.
macro_rules! init_sized {
    ($init_sized:path, $t:ty) => {{
        let mut s = <$t>::default();
        // SAFETY: s is a valid, writable $t of size_of::<$t>() bytes.
        $crate::error::check(unsafe { $init_sized(&mut s, ::std::mem::size_of::<$t>() as _) })
            .map(|()| s)
    }};
}

mod batch;
mod error;
mod events;
mod groups;
mod hash;
mod names;
mod pool;
mod seq;
mod tensor;
mod tiers;
mod transfer;
mod types;

pub use batch::{AttentionParams, Batch, BatchInfo, PlanArray, SnapshotArray};
pub use error::{status_string, Error, ErrorKind, Result};
pub use events::{
    drain_events_v2, EventEncoding, EventMedium, EventPublisher, EventV2, HashEncoding,
    PublisherOptions, PublisherStats,
};
pub use groups::{GroupKind, GroupSpec, GroupStats};
pub use hash::{hash_prefix, hash_root, HashOptions, MmItem};
pub use pool::{
    Event, EventKind, Events, Kv, Pool, PoolOptions, PoolStats, PrefixMatch, RetentionRange, SeqId,
    SeqInfo, SeqOptions, SwapDirection, NULL_BLOCK,
};
pub use seq::Seq;
pub use tensor::{RawTensor, Stream, TensorView, TensorViewMut};
pub use tiers::{Medium, TierMatch, TierOptions, TierStats};
pub use transfer::{transfer_available, Transfer, TransferEngine, TransferOptions, TransferState};
pub use types::{
    abi_version, cuda_device_count, features, version_number, version_string, BlockHash, DType,
    Device, Element, Features, Fp8E4m3, Fp8E5m2, HashAlgo, KvLayout, KvScaleGranularity,
    HEADER_ABI_VERSION, HEADER_VERSION_NUMBER,
};

/// The f16 and bf16 element types, re-exported so callers need not depend
/// on `half` themselves.
pub use half;
/// The raw bindings.
pub use pagedkv_sys as sys;

/// Copies a C string the library owns; NULL gives "".
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string valid for the call.
pub(crate) unsafe fn cstr_to_string(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: by the caller's contract.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }
}

#[cfg(test)]
mod init_sized_tests {
    use super::sys;
    use std::mem::size_of;

    #[test]
    fn structs_are_initialised_at_the_crate_s_own_size() {
        let o = init_sized!(sys::pkv_pool_options_init_sized, sys::pkv_pool_options).unwrap();
        assert_eq!(o.struct_size as usize, size_of::<sys::pkv_pool_options>());
        // The defaults are those of the plain _init.
        let mut plain = sys::pkv_pool_options::default();
        // SAFETY: a valid out-parameter.
        unsafe { sys::pkv_pool_options_init(&mut plain) };
        plain.struct_size = o.struct_size;
        assert_eq!(format!("{o:?}"), format!("{plain:?}"));
        let s = init_sized!(sys::pkv_pool_stats_init_sized, sys::pkv_pool_stats).unwrap();
        assert_eq!(s.struct_size as usize, size_of::<sys::pkv_pool_stats>());
        let t = init_sized!(
            sys::pkv_transfer_options_init_sized,
            sys::pkv_transfer_options
        )
        .unwrap();
        assert_eq!(
            t.struct_size as usize,
            size_of::<sys::pkv_transfer_options>()
        );
        assert_eq!(t.timeout_ms, 30000);
    }

    #[test]
    fn no_struct_of_the_crate_starts_at_the_plain_init() {
        // Every pkv_X_init call in the crate's sources would stop at the size
        // the library froze; they go through init_sized! instead.
        let needle = ["_init", "(&mut"].concat();
        for (name, text) in [
            ("batch.rs", include_str!("batch.rs")),
            ("events.rs", include_str!("events.rs")),
            ("groups.rs", include_str!("groups.rs")),
            ("hash.rs", include_str!("hash.rs")),
            ("pool.rs", include_str!("pool.rs")),
            ("seq.rs", include_str!("seq.rs")),
            ("tensor.rs", include_str!("tensor.rs")),
            ("tiers.rs", include_str!("tiers.rs")),
            ("transfer.rs", include_str!("transfer.rs")),
            ("types.rs", include_str!("types.rs")),
            ("error.rs", include_str!("error.rs")),
        ] {
            assert!(!text.contains(&needle), "{name} calls a plain pkv_X_init");
        }
    }
}
