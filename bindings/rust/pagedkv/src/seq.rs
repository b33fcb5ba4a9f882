//! Owned sequences: [`Seq`] frees its sequence when dropped, so a `?` after
//! [`Pool::sequence`] cannot leak it.

use std::fmt;
use std::mem;

use crate::error::Result;
use crate::pool::{Pool, SeqId, SeqInfo, SeqOptions};
use crate::types::BlockHash;

/// A sequence owned by this handle, freed when it is dropped (git2-style:
/// it borrows its [`Pool`], so the pool outlives it).
///
/// Engines that keep bare ids call [`detach`](Seq::detach) (the pool then
/// owns the sequence until [`Pool::free_seq`]) and take ownership back with
/// [`Pool::attach_seq`]. Every [`Pool`] method that takes a [`SeqId`] works
/// on `seq.id()` too, so borrowing by id needs no handle.
///
/// ```
/// # fn main() -> pagedkv::Result<()> {
/// let pool = pagedkv::Pool::new(&pagedkv::PoolOptions { block_size: 4, num_blocks: 2, ..Default::default() })?;
/// {
///     let s = pool.sequence()?;
///     assert!(s.append(&[0; 100]).is_err()); // out of blocks...
/// } // ...and s is freed here, not leaked
/// assert_eq!(pool.stats()?.num_seqs, 0);
/// # Ok(()) }
/// ```
///
/// The pool cannot go away under a live `Seq` (a compile error, not a
/// freed pool at the `Seq`'s drop):
///
/// ```compile_fail
/// # fn main() -> pagedkv::Result<()> {
/// let pool = pagedkv::Pool::new(&pagedkv::PoolOptions { block_size: 4, num_blocks: 8, ..Default::default() })?;
/// let s = pool.sequence()?;
/// drop(pool); // error[E0505]: cannot move out of `pool` because it is borrowed
/// s.append(&[1])?;
/// # Ok(()) }
/// ```
pub struct Seq<'pool> {
    pool: &'pool Pool,
    id: SeqId,
}

impl<'pool> Seq<'pool> {
    pub(crate) fn new(pool: &'pool Pool, id: SeqId) -> Seq<'pool> {
        Seq { pool, id }
    }

    /// The id, for the [`Pool`] methods and for plans.
    pub fn id(&self) -> SeqId {
        self.id
    }

    /// The pool the sequence lives in.
    pub fn pool(&self) -> &'pool Pool {
        self.pool
    }

    /// Gives the sequence to the pool: it is no longer freed on drop, and
    /// stays until [`Pool::free_seq`] (or [`Pool::attach_seq`] and a drop).
    pub fn detach(self) -> SeqId {
        let id = self.id;
        mem::forget(self);
        id
    }

    /// Same as [`detach`](Seq::detach).
    pub fn into_id(self) -> SeqId {
        self.detach()
    }

    /// Frees the sequence now, reporting an error that a drop would ignore.
    pub fn free(self) -> Result<()> {
        let (pool, id) = (self.pool, self.detach());
        pool.free_seq(id)
    }

    /// [`Pool::append`].
    pub fn append(&self, tokens: &[i32]) -> Result<()> {
        self.pool.append(self.id, tokens)
    }

    /// [`Pool::append_with_lookahead`].
    pub fn append_with_lookahead(&self, tokens: &[i32], num_lookahead: u32) -> Result<()> {
        self.pool
            .append_with_lookahead(self.id, tokens, num_lookahead)
    }

    /// [`Pool::match_prefix`].
    pub fn match_prefix(&self, tokens: &[i32]) -> Result<u64> {
        self.pool.match_prefix(self.id, tokens)
    }

    /// [`Pool::match_prefix_partial`].
    pub fn match_prefix_partial(&self, tokens: &[i32]) -> Result<crate::PrefixMatch> {
        self.pool.match_prefix_partial(self.id, tokens)
    }

    /// [`Pool::match_prefix_tiered`].
    pub fn match_prefix_tiered(&self, tokens: &[i32]) -> Result<crate::TierMatch> {
        self.pool.match_prefix_tiered(self.id, tokens)
    }

    /// [`Pool::match_prefix_hashes_tiered`].
    pub fn match_prefix_hashes_tiered(
        &self,
        tokens: &[i32],
        hashes: &[crate::BlockHash],
    ) -> Result<crate::TierMatch> {
        self.pool
            .match_prefix_hashes_tiered(self.id, tokens, hashes)
    }

    /// [`Pool::set_retention`].
    pub fn set_retention(&self, ranges: &[crate::RetentionRange]) -> Result<()> {
        self.pool.set_retention(self.id, ranges)
    }

    /// [`Pool::fork`], owned like this one.
    pub fn fork(&self) -> Result<Seq<'pool>> {
        Ok(Seq::new(self.pool, self.pool.fork(self.id)?))
    }

    /// [`Pool::truncate`].
    pub fn truncate(&self, num_tokens: u64) -> Result<()> {
        self.pool.truncate(self.id, num_tokens)
    }

    /// [`Pool::reserve`].
    pub fn reserve(&self, num_tokens: u64) -> Result<()> {
        self.pool.reserve(self.id, num_tokens)
    }

    /// [`Pool::seq_info`].
    pub fn info(&self) -> Result<SeqInfo> {
        self.pool.seq_info(self.id)
    }

    /// [`Pool::block_table`].
    pub fn block_table(&self) -> Result<Vec<i32>> {
        self.pool.block_table(self.id)
    }

    /// [`Pool::block_hashes`].
    pub fn block_hashes(&self) -> Result<Vec<BlockHash>> {
        self.pool.block_hashes(self.id)
    }
}

impl Drop for Seq<'_> {
    fn drop(&mut self) {
        // Already freed (Pool::free_seq on the id) is fine: NotFound.
        let _ = self.pool.free_seq(self.id);
    }
}

impl fmt::Debug for Seq<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Seq").field(&self.id).finish()
    }
}

impl Pool {
    /// A new empty sequence, freed when the returned [`Seq`] is dropped.
    pub fn sequence(&self) -> Result<Seq<'_>> {
        Ok(Seq::new(self, self.create_seq()?))
    }

    /// [`sequence`](Pool::sequence) with options.
    pub fn sequence_with(&self, opts: &SeqOptions) -> Result<Seq<'_>> {
        Ok(Seq::new(self, self.create_seq_with(opts)?))
    }

    /// Takes ownership of an existing sequence (one [`Seq::detach`]ed, or
    /// made by [`create_seq`](Pool::create_seq)): it is freed when the
    /// returned [`Seq`] is dropped. [`ErrorKind::NotFound`] for a stale or
    /// unknown id.
    ///
    /// [`ErrorKind::NotFound`]: crate::ErrorKind::NotFound
    pub fn attach_seq(&self, id: SeqId) -> Result<Seq<'_>> {
        let mut raw = init_sized!(
            crate::sys::pkv_seq_info_init_sized,
            crate::sys::pkv_seq_info
        )?;
        // SAFETY: valid out-parameter, struct_size set by _init_sized.
        crate::error::check_as(
            unsafe { crate::sys::pkv_seq_get_info(self.as_raw(), id.raw(), &mut raw) },
            "Pool::attach_seq",
            &[("seq", "id")],
        )?;
        Ok(Seq::new(self, id))
    }
}
