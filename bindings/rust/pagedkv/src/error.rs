//! Errors: one [`ErrorKind`] per `PKV_E_*` status code, with the library's
//! message captured on the thread and right after the call that failed.

use std::fmt;
use std::os::raw::c_char;

use pagedkv_sys as sys;

use crate::names::{rust_message, Renames};

/// What went wrong, one variant per `PKV_E_*` status code of the C ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An argument is out of range or malformed (`PKV_E_INVALID_ARGUMENT`).
    InvalidArgument,
    /// Unknown or stale sequence id, unknown block (`PKV_E_NOT_FOUND`).
    NotFound,
    /// Not enough free KV blocks; nothing changed (`PKV_E_OUT_OF_BLOCKS`).
    /// The usual answer is to preempt a sequence and retry.
    OutOfBlocks,
    /// A host or device allocation failed (`PKV_E_OUT_OF_MEMORY`).
    OutOfMemory,
    /// A valid request this build or device cannot do (`PKV_E_UNSUPPORTED`).
    Unsupported,
    /// A CUDA runtime call failed (`PKV_E_CUDA`).
    Cuda,
    /// An output buffer was too small (`PKV_E_BUFFER_TOO_SMALL`); the safe
    /// API sizes its buffers itself, so this is rarely seen.
    BufferTooSmall,
    /// The call is not valid now, e.g. a stale step plan
    /// (`PKV_E_INVALID_STATE`).
    InvalidState,
    /// [`Pool::validate`](crate::Pool::validate) found a broken invariant
    /// (`PKV_E_INVARIANT`).
    Invariant,
    /// A bug in pagedkv (`PKV_E_INTERNAL`).
    Internal,
    /// A status code this version of the crate does not know (from a newer
    /// library); [`Error::code`] has it.
    Other,
}

impl ErrorKind {
    /// The kind of a `pkv_status` error code.
    pub fn from_code(code: i32) -> ErrorKind {
        match code {
            sys::PKV_E_INVALID_ARGUMENT => ErrorKind::InvalidArgument,
            sys::PKV_E_NOT_FOUND => ErrorKind::NotFound,
            sys::PKV_E_OUT_OF_BLOCKS => ErrorKind::OutOfBlocks,
            sys::PKV_E_OUT_OF_MEMORY => ErrorKind::OutOfMemory,
            sys::PKV_E_UNSUPPORTED => ErrorKind::Unsupported,
            sys::PKV_E_CUDA => ErrorKind::Cuda,
            sys::PKV_E_BUFFER_TOO_SMALL => ErrorKind::BufferTooSmall,
            sys::PKV_E_INVALID_STATE => ErrorKind::InvalidState,
            sys::PKV_E_INVARIANT => ErrorKind::Invariant,
            sys::PKV_E_INTERNAL => ErrorKind::Internal,
            _ => ErrorKind::Other,
        }
    }

    /// The `pkv_status` code of this kind (`None` for [`ErrorKind::Other`]).
    pub fn code(self) -> Option<i32> {
        Some(match self {
            ErrorKind::InvalidArgument => sys::PKV_E_INVALID_ARGUMENT,
            ErrorKind::NotFound => sys::PKV_E_NOT_FOUND,
            ErrorKind::OutOfBlocks => sys::PKV_E_OUT_OF_BLOCKS,
            ErrorKind::OutOfMemory => sys::PKV_E_OUT_OF_MEMORY,
            ErrorKind::Unsupported => sys::PKV_E_UNSUPPORTED,
            ErrorKind::Cuda => sys::PKV_E_CUDA,
            ErrorKind::BufferTooSmall => sys::PKV_E_BUFFER_TOO_SMALL,
            ErrorKind::InvalidState => sys::PKV_E_INVALID_STATE,
            ErrorKind::Invariant => sys::PKV_E_INVARIANT,
            ErrorKind::Internal => sys::PKV_E_INTERNAL,
            ErrorKind::Other => return None,
        })
    }

    fn describe(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::NotFound => "not found",
            ErrorKind::OutOfBlocks => "out of KV blocks",
            ErrorKind::OutOfMemory => "out of memory",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Cuda => "CUDA error",
            ErrorKind::BufferTooSmall => "buffer too small",
            ErrorKind::InvalidState => "invalid state",
            ErrorKind::Invariant => "invariant violated",
            ErrorKind::Internal => "internal error",
            ErrorKind::Other => "unknown error",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// An error from pagedkv: its kind, the raw status code and the message
/// naming what was wrong with which argument.
///
/// The message names the argument as this crate calls it: the library's
/// text (`pkv_pool_create: opts->block_size 2000 is outside [1, 1024]`)
/// is rewritten into the Rust method and names
/// (`Pool::new: PoolOptions::block_size 2000 is outside [1, 1024]`): an
/// option field is `Struct::field`, a slice's count `arg.len()`
/// (`seqs.len()` for the C `num_seqs`), a dtype number its [`DType`]
/// variant (`DType::F32`). [`Error::c_message`] keeps the library's text.
///
/// [`DType`]: crate::DType
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    code: i32,
    message: String,
    c_message: String,
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error raised by the Rust side (argument checks before any C call).
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            code: kind.code().unwrap_or(sys::PKV_E_INTERNAL),
            message: message.into(),
            c_message: String::new(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// Builds the error for a failed status, taking this thread's last error
    /// message. Must run right after the failing call, before any other
    /// pagedkv call on this thread.
    pub(crate) fn from_status(code: i32) -> Error {
        Error::from_status_as(code, None, &[])
    }

    /// [`from_status`](Error::from_status) reported as the Rust method `op`
    /// (instead of the C function's default one), with `args` rewritten
    /// before the C function's own table.
    pub(crate) fn from_status_as(code: i32, op: Option<&str>, args: Renames) -> Error {
        let mut c_message = last_error_message();
        if c_message.is_empty() {
            c_message = status_string(code);
        }
        Error {
            kind: ErrorKind::from_code(code),
            code,
            message: rust_message(&c_message, op, args),
            c_message,
        }
    }

    /// The kind of error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The raw `pkv_status` code (negative).
    pub fn code(&self) -> i32 {
        self.code
    }

    /// What was wrong, naming the Rust method and arguments (see
    /// [`Error`]).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The library's own message, with its C names
    /// (`pkv_batch_prepare: num_seqs is 0`); empty for an error the Rust
    /// side raised before calling the library.
    pub fn c_message(&self) -> &str {
        &self.c_message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pagedkv: {}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

/// Ok for `PKV_OK`, else the error with its message.
pub(crate) fn check(status: sys::pkv_status) -> Result<()> {
    if status == sys::PKV_OK {
        Ok(())
    } else {
        Err(Error::from_status(status))
    }
}

/// [`check`] for a call whose error is reported as the Rust method `op`,
/// with `args` (C name, Rust name) rewritten first: for a C function that
/// several methods call with differently named arguments.
pub(crate) fn check_as(status: sys::pkv_status, op: &str, args: Renames) -> Result<()> {
    if status == sys::PKV_OK {
        Ok(())
    } else {
        Err(Error::from_status_as(status, Some(op), args))
    }
}

/// The static text the library has for a status code
/// (`"PKV_E_OUT_OF_BLOCKS: ..."`).
pub fn status_string(code: i32) -> String {
    // SAFETY: pkv_status_string returns static, NUL-terminated text for any
    // code, never NULL.
    unsafe { crate::cstr_to_string(sys::pkv_status_string(code)) }
}

fn last_error_message() -> String {
    let mut buf = [0u8; 512];
    // SAFETY: buf is writable for its length; the callee NUL-terminates
    // within capacity.
    let full =
        unsafe { sys::pkv_last_error_copy(buf.as_mut_ptr() as *mut c_char, buf.len() as u64) }
            as usize;
    if full < buf.len() {
        return String::from_utf8_lossy(&buf[..full]).into_owned();
    }
    let mut big = vec![0u8; full + 1];
    // SAFETY: as above; copying does not clear the thread's message.
    let again =
        unsafe { sys::pkv_last_error_copy(big.as_mut_ptr() as *mut c_char, big.len() as u64) }
            as usize;
    if again == full {
        String::from_utf8_lossy(&big[..full]).into_owned()
    } else {
        String::from_utf8_lossy(&buf[..buf.len() - 1]).into_owned()
    }
}
