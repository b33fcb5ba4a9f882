//! Offload tiers for the prefix cache (`pagedkv/tiers.h`): blocks evicted
//! from a CPU pool's prefix cache are copied to host memory (and a file
//! below it) and found again by [`Pool::match_prefix_tiered`]; the next
//! [`Pool::prepare`] loads them back, checksum verified. A corrupt or
//! unreadable block is a miss, never served.

use pagedkv_sys as sys;

use crate::error::{check, Result};
use crate::hash::{opt_c_string, opt_ptr};
use crate::pool::{to_u64, with_raw_seq_options, Pool, SeqId, SeqOptions};
use crate::types::BlockHash;

/// Which tier ([`Pool::tier_stats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Medium {
    Host,
    File,
}

impl Medium {
    fn raw(self) -> u32 {
        match self {
            Medium::Host => sys::PKV_MEDIUM_HOST,
            Medium::File => sys::PKV_MEDIUM_FILE,
        }
    }
}

/// The tiers of a pool: a host tier of `host_bytes` and, with `file_dir`,
/// a file tier of `file_bytes` below it. `host_bytes` 0 with a `file_dir`:
/// a file tier alone, each evicted block hashed and written straight from
/// the pool (one pass).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierOptions {
    pub host_bytes: u64,
    pub file_dir: Option<String>,
    pub file_bytes: u64,
}

/// What [`Pool::match_prefix_tiered`] attached, in tokens per medium.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierMatch {
    pub num_cached: u64,
    pub device_tokens: u64,
    pub host_tokens: u64,
    pub file_tokens: u64,
}

impl TierMatch {
    fn from_raw(raw: &sys::pkv_tier_match) -> TierMatch {
        TierMatch {
            num_cached: raw.num_cached,
            device_tokens: raw.device_tokens,
            host_tokens: raw.host_tokens,
            file_tokens: raw.file_tokens,
        }
    }
}

fn new_match() -> Result<sys::pkv_tier_match> {
    init_sized!(sys::pkv_tier_match_init_sized, sys::pkv_tier_match)
}

fn raw_hashes(hashes: &[BlockHash]) -> Vec<sys::pkv_block_hash> {
    hashes
        .iter()
        .map(|h| sys::pkv_block_hash { bytes: h.0 })
        .collect()
}

/// Counters of one tier; `bytes_loaded / load_ns` is the load bandwidth.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    pub capacity_blocks: u64,
    pub num_blocks: u64,
    pub bytes: u64,
    pub num_stored: u64,
    pub num_removed: u64,
    pub num_hits: u64,
    pub num_loaded: u64,
    pub bytes_stored: u64,
    pub bytes_loaded: u64,
    pub load_ns: u64,
    pub num_checksum_failures: u64,
    pub num_io_errors: u64,
    pub num_dropped: u64,
}

impl Pool {
    /// Attaches offload tiers (once; a CPU or CUDA pool with storage and
    /// prefix caching; a CUDA pool's host tier is page-locked memory).
    pub fn attach_tiers(&self, o: &TierOptions) -> Result<()> {
        let dir = opt_c_string(&o.file_dir, "TierOptions::file_dir")?;
        let mut raw = init_sized!(sys::pkv_tier_options_init_sized, sys::pkv_tier_options)?;
        raw.host_bytes = o.host_bytes;
        raw.file_bytes = o.file_bytes;
        raw.file_dir = opt_ptr(&dir);
        // SAFETY: valid struct; dir outlives the call, which copies it.
        check(unsafe { sys::pkv_pool_attach_tiers(self.ptr(), &raw) })
    }

    /// [`match_prefix`](Pool::match_prefix), continued with the blocks found
    /// in the tiers; the next plan loads those before anything reads them.
    pub fn match_prefix_tiered(&self, seq: SeqId, tokens: &[i32]) -> Result<TierMatch> {
        let mut raw = new_match()?;
        // SAFETY: valid out-parameter; tokens is valid for its length.
        check(unsafe {
            sys::pkv_seq_match_prefix_tiered(
                self.ptr(),
                seq.raw(),
                tokens.as_ptr(),
                to_u64(tokens.len()),
                &mut raw,
            )
        })?;
        Ok(TierMatch::from_raw(&raw))
    }

    /// [`match_prefix_hashes`](Pool::match_prefix_hashes) continued into the
    /// tiers as [`match_prefix_tiered`](Pool::match_prefix_tiered): the
    /// engine's block hashes of `tokens` are checked as there and followed
    /// through the tiers too. All or nothing.
    pub fn match_prefix_hashes_tiered(
        &self,
        seq: SeqId,
        tokens: &[i32],
        hashes: &[BlockHash],
    ) -> Result<TierMatch> {
        let raw_hashes = raw_hashes(hashes);
        let mut raw = new_match()?;
        // SAFETY: valid out-parameter; tokens and raw_hashes are valid for
        // their lengths.
        check(unsafe {
            sys::pkv_seq_match_prefix_hashes_tiered(
                self.ptr(),
                seq.raw(),
                tokens.as_ptr(),
                to_u64(tokens.len()),
                raw_hashes.as_ptr(),
                to_u64(raw_hashes.len()),
                &mut raw,
            )
        })?;
        Ok(TierMatch::from_raw(&raw))
    }

    /// [`admit`](Pool::admit) (`hashes` None) or
    /// [`admit_hashes`](Pool::admit_hashes) whose lookup goes on into the
    /// tiers after the device hits. The prompt fits exactly when it fits
    /// `admit` (tier hits take blocks the prompt needs anyway), and then
    /// every tier hit is taken; all or nothing. Returns the bare id (freed by
    /// the caller) and the tokens found per medium: `num_cached` need no
    /// prefill, and the next plan loads the host and file ones.
    pub fn admit_tiered(
        &self,
        opts: &SeqOptions,
        tokens: &[i32],
        hashes: Option<&[BlockHash]>,
        num_lookahead: u32,
    ) -> Result<(SeqId, TierMatch)> {
        let raw_hashes = raw_hashes(hashes.unwrap_or(&[]));
        with_raw_seq_options(opts, |opts| {
            let mut id = 0;
            let mut raw = new_match()?;
            // SAFETY: opts' pointers, tokens and raw_hashes outlive the call;
            // a null hashes pointer selects the hashing path.
            check(unsafe {
                sys::pkv_seq_admit_tiered(
                    self.ptr(),
                    opts,
                    tokens.as_ptr(),
                    to_u64(tokens.len()),
                    if hashes.is_some() {
                        raw_hashes.as_ptr()
                    } else {
                        std::ptr::null()
                    },
                    to_u64(raw_hashes.len()),
                    num_lookahead,
                    &mut id,
                    &mut raw,
                )
            })?;
            Ok((SeqId::from_raw(id), TierMatch::from_raw(&raw)))
        })
    }

    /// The counters of one tier.
    pub fn tier_stats(&self, medium: Medium) -> Result<TierStats> {
        let mut s = init_sized!(sys::pkv_tier_stats_init_sized, sys::pkv_tier_stats)?;
        // SAFETY: valid out-parameter, struct_size set by _init_sized.
        check(unsafe { sys::pkv_pool_get_tier_stats(self.ptr(), medium.raw(), &mut s) })?;
        Ok(TierStats {
            capacity_blocks: s.capacity_blocks,
            num_blocks: s.num_blocks,
            bytes: s.bytes,
            num_stored: s.num_stored,
            num_removed: s.num_removed,
            num_hits: s.num_hits,
            num_loaded: s.num_loaded,
            bytes_stored: s.bytes_stored,
            bytes_loaded: s.bytes_loaded,
            load_ns: s.load_ns,
            num_checksum_failures: s.num_checksum_failures,
            num_io_errors: s.num_io_errors,
            num_dropped: s.num_dropped,
        })
    }

    /// Waits until queued offloads are in their tier and pending loads ran.
    pub fn flush_tiers(&self) -> Result<()> {
        check(unsafe { sys::pkv_pool_flush_tiers(self.ptr()) })
    }
}
