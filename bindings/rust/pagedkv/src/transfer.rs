//! Moving a sequence's KV between pools over UCX (`pagedkv/transfer.h`):
//! a prefill pool exports a sequence (blocks pinned, an opaque descriptor),
//! a decode pool in another process or machine imports it with one-sided
//! reads and gets a sequence whose tokens count as computed.

use std::ffi::CString;
use std::ptr::{self, NonNull};

use crate::error::{check, Error, ErrorKind, Result};
use crate::pool::{with_raw_seq_options, Pool, SeqId, SeqOptions};
use crate::sys;

/// Whether this build has the UCX transport (else
/// [`TransferEngine::new`] fails with [`ErrorKind::Unsupported`]).
pub fn transfer_available() -> bool {
    // SAFETY: no arguments.
    unsafe { sys::pkv_transfer_available() != 0 }
}

/// State of a [`Transfer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferState {
    Running,
    /// The new sequence, now the caller's.
    Done(SeqId),
    Cancelled,
}

/// Options of a [`TransferEngine`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferOptions {
    /// UCX_TLS list ("shm", "tcp", ...); `None` = UCX's own choice.
    pub transports: Option<String>,
    /// An import not done by then fails; 0 = never. Default 30000.
    pub timeout_ms: u32,
    /// Exports not released by then are released; 0 (default) = never.
    pub export_ttl_ms: u32,
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions {
            transports: None,
            timeout_ms: 30000,
            export_ttl_ms: 0,
        }
    }
}

/// One UCX context and worker; exports and imports sequences.
pub struct TransferEngine {
    raw: NonNull<sys::pkv_transfer_engine>,
}

// SAFETY: every pkv_transfer_* call may come from any thread; the engine
// serialises its UCX work. Destroy needs exclusive ownership (Drop).
unsafe impl Send for TransferEngine {}
unsafe impl Sync for TransferEngine {}

impl Drop for TransferEngine {
    fn drop(&mut self) {
        // SAFETY: we own the engine.
        unsafe { sys::pkv_transfer_engine_destroy(self.raw.as_ptr()) }
    }
}

impl TransferEngine {
    /// Creates an engine.
    pub fn new(opts: &TransferOptions) -> Result<TransferEngine> {
        let tls = match &opts.transports {
            Some(s) => Some(
                CString::new(s.as_str())
                    .map_err(|_| Error::invalid("transports contains a NUL byte"))?,
            ),
            None => None,
        };
        let mut raw = init_sized!(
            sys::pkv_transfer_options_init_sized,
            sys::pkv_transfer_options
        )?;
        raw.timeout_ms = opts.timeout_ms;
        raw.export_ttl_ms = opts.export_ttl_ms;
        raw.transports = tls.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        let mut out = ptr::null_mut();
        // SAFETY: raw and the string it points to outlive the call.
        check(unsafe { sys::pkv_transfer_engine_create(&raw, &mut out) })?;
        let raw = NonNull::new(out)
            .ok_or_else(|| Error::new(ErrorKind::Internal, "no engine returned"))?;
        Ok(TransferEngine { raw })
    }

    fn ptr(&self) -> *mut sys::pkv_transfer_engine {
        self.raw.as_ptr()
    }

    /// Serves peers' reads (TCP needs the exporter's progress) and expires
    /// exports past their TTL. Never blocks.
    pub fn progress(&self) -> Result<()> {
        // SAFETY: a live engine.
        check(unsafe { sys::pkv_transfer_engine_progress(self.ptr()) })
    }

    /// Exports the computed tokens of `seq` and pins their blocks: the
    /// export's id and its descriptor (bytes for the importer).
    pub fn export(&self, pool: &Pool, seq: SeqId) -> Result<(u64, Vec<u8>)> {
        let mut id = 0u64;
        // SAFETY: live engine and pool; valid out-parameter.
        check(unsafe { sys::pkv_transfer_export(self.ptr(), pool.as_raw(), seq.raw(), &mut id) })?;
        let mut size = 0u64;
        // SAFETY: NULL buffer with capacity 0 only reports the size.
        let st = unsafe {
            sys::pkv_transfer_export_descriptor(self.ptr(), id, ptr::null_mut(), 0, &mut size)
        };
        let mut buf = vec![0u8; size as usize];
        let st = if st == sys::PKV_E_BUFFER_TOO_SMALL {
            // SAFETY: buf holds size bytes.
            unsafe {
                sys::pkv_transfer_export_descriptor(
                    self.ptr(),
                    id,
                    buf.as_mut_ptr(),
                    size,
                    &mut size,
                )
            }
        } else {
            st
        };
        if let Err(e) = check(st) {
            // SAFETY: live engine; the export just made.
            unsafe { sys::pkv_transfer_export_release(self.ptr(), id) };
            return Err(e);
        }
        Ok((id, buf))
    }

    /// Unpins an export ([`ErrorKind::NotFound`] when unknown, released or
    /// expired).
    pub fn release_export(&self, id: u64) -> Result<()> {
        // SAFETY: a live engine.
        check(unsafe { sys::pkv_transfer_export_release(self.ptr(), id) })
    }

    /// Exports held.
    pub fn num_exports(&self) -> Result<u64> {
        let mut n = 0u64;
        // SAFETY: valid out-parameter.
        check(unsafe { sys::pkv_transfer_engine_num_exports(self.ptr(), &mut n) })?;
        Ok(n)
    }

    /// Starts pulling `descriptor`'s sequence into `pool`: the layout must
    /// match ([`ErrorKind::InvalidArgument`]) and the blocks fit
    /// ([`ErrorKind::OutOfBlocks`]); on error nothing changed.
    pub fn import<'a>(
        &'a self,
        pool: &'a Pool,
        opts: &SeqOptions,
        descriptor: &[u8],
    ) -> Result<Transfer<'a>> {
        with_raw_seq_options(opts, |raw| {
            let mut out = ptr::null_mut();
            // SAFETY: live engine and pool; descriptor and raw outlive the
            // call (the library keeps neither).
            check(unsafe {
                sys::pkv_transfer_import(
                    self.ptr(),
                    pool.as_raw(),
                    raw,
                    descriptor.as_ptr(),
                    descriptor.len() as u64,
                    &mut out,
                )
            })?;
            let raw = NonNull::new(out)
                .ok_or_else(|| Error::new(ErrorKind::Internal, "no transfer returned"))?;
            Ok(Transfer {
                raw,
                _engine: self,
                _pool: pool,
            })
        })
    }
}

/// An import in flight; dropping it cancels a running one. It borrows its
/// engine and pool, which therefore outlive it:
///
/// ```compile_fail
/// # fn main() -> pagedkv::Result<()> {
/// use pagedkv::{Pool, PoolOptions, SeqOptions, TransferEngine};
/// let engine = TransferEngine::new(&Default::default())?;
/// let pool = Pool::new(&PoolOptions { block_size: 4, num_blocks: 8, ..Default::default() })?;
/// let t = engine.import(&pool, &SeqOptions::default(), &[])?;
/// drop(pool); // error[E0505]: cannot move out of `pool` because it is borrowed
/// t.poll()?;
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # fn main() -> pagedkv::Result<()> {
/// use pagedkv::{Pool, PoolOptions, SeqOptions, TransferEngine};
/// let pool = Pool::new(&PoolOptions { block_size: 4, num_blocks: 8, ..Default::default() })?;
/// let engine = TransferEngine::new(&Default::default())?;
/// let t = engine.import(&pool, &SeqOptions::default(), &[])?;
/// drop(engine); // error[E0505]: cannot move out of `engine` because it is borrowed
/// t.poll()?;
/// # Ok(()) }
/// ```
pub struct Transfer<'a> {
    raw: NonNull<sys::pkv_transfer>,
    _engine: &'a TransferEngine,
    _pool: &'a Pool,
}

// SAFETY: as the engine's.
unsafe impl Send for Transfer<'_> {}
unsafe impl Sync for Transfer<'_> {}

impl Drop for Transfer<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the transfer.
        unsafe { sys::pkv_transfer_destroy(self.raw.as_ptr()) }
    }
}

impl Transfer<'_> {
    /// Drives the transfer without blocking; a failed transfer is its error.
    pub fn poll(&self) -> Result<TransferState> {
        let (mut state, mut seq) = (0u32, 0u64);
        // SAFETY: a live transfer; valid out-parameters.
        check(unsafe { sys::pkv_transfer_poll(self.raw.as_ptr(), &mut state, &mut seq) })?;
        Ok(match state {
            sys::PKV_TRANSFER_DONE => TransferState::Done(SeqId::from_raw(seq)),
            sys::PKV_TRANSFER_CANCELLED => TransferState::Cancelled,
            sys::PKV_TRANSFER_RUNNING => TransferState::Running,
            sys::PKV_TRANSFER_FAILED => {
                return Err(Error::new(ErrorKind::Internal, "failed without a status"))
            }
            _ => return Err(Error::new(ErrorKind::Internal, "unknown transfer state")),
        })
    }

    /// Stops the reads and frees the blocks ([`ErrorKind::InvalidState`]
    /// once done).
    pub fn cancel(&self) -> Result<()> {
        // SAFETY: a live transfer.
        check(unsafe { sys::pkv_transfer_cancel(self.raw.as_ptr()) })
    }

    /// Bytes of K/V the transfer reads.
    pub fn bytes(&self) -> Result<u64> {
        let mut n = 0u64;
        // SAFETY: valid out-parameter.
        check(unsafe { sys::pkv_transfer_bytes(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }
}
