//! Tensor views passed to the kernels, and raw descriptors the library
//! hands out. Views never own or copy data: they borrow it for the call.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;

use pagedkv_sys as sys;

use crate::error::{check, Error, Result};
use crate::types::{DType, Device, Element};

fn descriptor(
    data: *mut c_void,
    dtype: DType,
    device: Device,
    shape: &[usize],
) -> Result<sys::pkv_tensor> {
    if shape.is_empty() || shape.len() > sys::PKV_TENSOR_MAX_DIMS {
        return Err(Error::invalid(format!(
            "shape: {} dimensions, must be 1..={}",
            shape.len(),
            sys::PKV_TENSOR_MAX_DIMS
        )));
    }
    let mut dims = [0i64; sys::PKV_TENSOR_MAX_DIMS];
    for (d, &s) in dims.iter_mut().zip(shape) {
        *d = i64::try_from(s).map_err(|_| Error::invalid("shape: extent too large"))?;
    }
    let (device_type, device_id) = device.raw();
    let mut raw = sys::pkv_tensor::default();
    // SAFETY: dims holds shape.len() extents; raw is a valid out-parameter.
    check(unsafe {
        sys::pkv_tensor_init(
            data,
            dtype.raw(),
            device_type,
            device_id,
            shape.len() as i32,
            dims.as_ptr(),
            &mut raw,
        )
    })?;
    Ok(raw)
}

fn check_len(len: usize, shape: &[usize]) -> Result<()> {
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &s| acc.checked_mul(s))
        .ok_or_else(|| Error::invalid("shape: element count overflows"))?;
    if count != len {
        return Err(Error::invalid(format!(
            "shape {shape:?} holds {count} elements but the slice has {len}"
        )));
    }
    Ok(())
}

fn apply_strides(raw: &mut sys::pkv_tensor, strides: Option<&[i64]>) -> Result<()> {
    if let Some(st) = strides {
        if st.len() != raw.ndim as usize {
            return Err(Error::invalid(format!(
                "strides: {} given for {} dimensions",
                st.len(),
                raw.ndim
            )));
        }
        raw.strides[..st.len()].copy_from_slice(st);
    }
    Ok(())
}

/// A read-only view of tensor data for one call (`q`, `k`, `v`).
///
/// ```
/// use pagedkv::TensorView;
/// let q = vec![0.5f32; 2 * 4 * 64];
/// let view = TensorView::new(&q, &[2, 4, 64]).unwrap();
/// assert_eq!(view.shape(), &[2, 4, 64]);
/// assert!(TensorView::new(&q, &[3, 4, 64]).is_err()); // wrong element count
/// ```
///
/// A view borrows its data, which therefore outlives it:
///
/// ```compile_fail
/// # fn main() -> pagedkv::Result<()> {
/// let view = {
///     let q = vec![0.5f32; 4];
///     pagedkv::TensorView::new(&q, &[4])? // error[E0597]: `q` does not live long enough
/// };
/// assert_eq!(view.shape(), &[4]);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    raw: sys::pkv_tensor,
    _data: PhantomData<&'a ()>,
}

impl<'a> TensorView<'a> {
    /// A dense row-major CPU view of `data` with `shape` (whose product must
    /// equal `data.len()`).
    pub fn new<T: Element>(data: &'a [T], shape: &[usize]) -> Result<TensorView<'a>> {
        check_len(data.len(), shape)?;
        let raw = descriptor(data.as_ptr() as *mut c_void, T::DTYPE, Device::Cpu, shape)?;
        Ok(TensorView {
            raw,
            _data: PhantomData,
        })
    }

    /// A view of memory the caller manages, typically a CUDA device
    /// pointer. `strides` are in elements (DLPack); `None` means dense
    /// row-major.
    ///
    /// # Safety
    /// `data` must point to memory on `device` that holds a tensor of
    /// `dtype` with this shape and these strides, and must stay valid and
    /// unchanged by others for `'a` and until every kernel that reads it
    /// (on the CUDA stream it was queued on) has finished.
    pub unsafe fn from_raw_parts(
        data: *const c_void,
        dtype: DType,
        device: Device,
        shape: &[usize],
        strides: Option<&[i64]>,
    ) -> Result<TensorView<'a>> {
        let mut raw = descriptor(data as *mut c_void, dtype, device, shape)?;
        apply_strides(&mut raw, strides)?;
        Ok(TensorView {
            raw,
            _data: PhantomData,
        })
    }

    /// Extents.
    pub fn shape(&self) -> &[i64] {
        &self.raw.shape[..self.raw.ndim as usize]
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        DType::from_raw(self.raw.dtype).expect("dtype set by a constructor")
    }

    /// The C descriptor.
    pub fn as_raw(&self) -> &sys::pkv_tensor {
        &self.raw
    }
}

/// A writable view of tensor data for one call (`out`, `lse`). It borrows
/// its data exclusively: no other view (or read) of that data while it
/// lives, so a kernel's output never aliases its inputs.
///
/// ```compile_fail
/// # fn main() -> pagedkv::Result<()> {
/// use pagedkv::{TensorView, TensorViewMut};
/// let mut buf = vec![0f32; 4];
/// let out = TensorViewMut::new(&mut buf, &[4])?;
/// let q = TensorView::new(&buf, &[4])?; // error[E0502]: `buf` is also borrowed as mutable
/// assert_eq!(q.shape(), out.shape());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TensorViewMut<'a> {
    raw: sys::pkv_tensor,
    _data: PhantomData<&'a mut ()>,
}

impl<'a> TensorViewMut<'a> {
    /// A dense row-major CPU view of `data` with `shape`.
    pub fn new<T: Element>(data: &'a mut [T], shape: &[usize]) -> Result<TensorViewMut<'a>> {
        check_len(data.len(), shape)?;
        let raw = descriptor(
            data.as_mut_ptr() as *mut c_void,
            T::DTYPE,
            Device::Cpu,
            shape,
        )?;
        Ok(TensorViewMut {
            raw,
            _data: PhantomData,
        })
    }

    /// A writable view of memory the caller manages (a CUDA device pointer).
    ///
    /// # Safety
    /// As [`TensorView::from_raw_parts`], and nothing else may read or write
    /// the memory while a kernel writing it runs.
    pub unsafe fn from_raw_parts(
        data: *mut c_void,
        dtype: DType,
        device: Device,
        shape: &[usize],
        strides: Option<&[i64]>,
    ) -> Result<TensorViewMut<'a>> {
        let mut raw = descriptor(data, dtype, device, shape)?;
        apply_strides(&mut raw, strides)?;
        Ok(TensorViewMut {
            raw,
            _data: PhantomData,
        })
    }

    /// Extents.
    pub fn shape(&self) -> &[i64] {
        &self.raw.shape[..self.raw.ndim as usize]
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        DType::from_raw(self.raw.dtype).expect("dtype set by a constructor")
    }

    /// The C descriptor.
    pub fn as_raw(&self) -> &sys::pkv_tensor {
        &self.raw
    }
}

/// A descriptor the library handed out (KV storage, plan arrays): where the
/// data is, not a borrow of it. Reading through the pointer is the caller's
/// `unsafe` business; the safe accessors copy or borrow for you instead.
#[derive(Clone, Copy, Debug)]
pub struct RawTensor {
    raw: sys::pkv_tensor,
}

// SAFETY: a descriptor is plain data; dereferencing its pointer is unsafe.
unsafe impl Send for RawTensor {}
unsafe impl Sync for RawTensor {}

impl RawTensor {
    pub(crate) fn new(raw: sys::pkv_tensor) -> RawTensor {
        RawTensor { raw }
    }

    /// Address of element 0 (`data + byte_offset`).
    pub fn data_ptr(&self) -> *mut c_void {
        (self.raw.data as *mut u8).wrapping_add(self.raw.byte_offset as usize) as *mut c_void
    }

    /// Extents.
    pub fn shape(&self) -> &[i64] {
        &self.raw.shape[..self.raw.ndim.clamp(0, sys::PKV_TENSOR_MAX_DIMS as i32) as usize]
    }

    /// Strides in elements (all zero: dense row-major).
    pub fn strides(&self) -> &[i64] {
        &self.raw.strides[..self.raw.ndim.clamp(0, sys::PKV_TENSOR_MAX_DIMS as i32) as usize]
    }

    /// Element type, `None` if the library reported one this crate does
    /// not know.
    pub fn dtype(&self) -> Option<DType> {
        DType::from_raw(self.raw.dtype)
    }

    /// Device the data is on.
    pub fn device(&self) -> Result<Device> {
        Device::from_raw(self.raw.device_type, self.raw.device_id)
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape().iter().map(|&s| s.max(0) as usize).product()
    }

    /// The C descriptor.
    pub fn as_raw(&self) -> &sys::pkv_tensor {
        &self.raw
    }

    /// Whether the layout is dense row-major (all strides zero, or equal to
    /// the row-major strides).
    pub(crate) fn is_dense(&self) -> bool {
        let st = self.strides();
        if st.iter().all(|&s| s == 0) {
            return true;
        }
        let mut expect = 1i64;
        for (s, n) in st.iter().rev().zip(self.shape().iter().rev()) {
            if *s != expect {
                return false;
            }
            expect *= *n;
        }
        true
    }
}

/// A CUDA stream (`cudaStream_t`) for GPU calls. [`Stream::DEFAULT`] (NULL)
/// is the legacy default stream and what CPU pools take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream(*mut c_void);

// SAFETY: a CUDA stream handle may be used from any host thread.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    /// The NULL stream.
    pub const DEFAULT: Stream = Stream(ptr::null_mut());

    /// Wraps a `cudaStream_t`.
    ///
    /// # Safety
    /// `stream` must be NULL or a valid CUDA stream of the pool's device
    /// that outlives every call it is passed to and the work queued on it,
    /// and also everything that uses it after those calls returned:
    /// - a [`Batch`](crate::Batch) prepared on it (even after
    ///   [`Batch::set_stream`](crate::Batch::set_stream) chose another)
    ///   releases its device arrays on it when dropped, and builds its
    ///   token positions and last-token indices on it the first time they
    ///   are asked for;
    /// - on a pool with offload tiers, the stream the pool last planned on
    ///   is used by the pool's later calls (an eviction during `append`
    ///   records an event on it) until the pool's next call that takes a
    ///   stream has returned, or the pool is dropped.
    pub unsafe fn from_raw(stream: *mut c_void) -> Stream {
        Stream(stream)
    }

    /// The `cudaStream_t`.
    pub fn as_raw(self) -> *mut c_void {
        self.0
    }
}

impl Default for Stream {
    fn default() -> Stream {
        Stream::DEFAULT
    }
}
