"""Zero-copy tensor descriptors from numpy, torch, cupy and friends.

Any object with ``__dlpack__``, ``__cuda_array_interface__`` or
``__array_interface__`` becomes a ``pkv_tensor`` describing the caller's own
memory: nothing is copied, and the producer object (or its DLPack capsule)
is kept alive until the C call returns. Shapes, dtypes, devices and strides
are checked here first so that mistakes raise clear Python errors.
"""

from __future__ import annotations

import ctypes
import math
import sys
from typing import Any, Optional, Sequence, Tuple

from . import _pagedkv as _c
from ._handle import NoCopy
from ._types import CPU, Device, DeviceType, DType

InvalidArgumentError = _c.InvalidArgumentError

# ------------------------------------------------------------------ DLPack

_kDLCPU, _kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged = 1, 2, 3, 13


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]

_DL_DTYPES = {
    (2, 32): DType.F32,
    (2, 16): DType.F16,
    (4, 16): DType.BF16,
    (0, 32): DType.I32,
    (0, 64): DType.I64,
}
_TYPESTR = {"f4": DType.F32, "f2": DType.F16, "i4": DType.I32, "i8": DType.I64}
# describe(raw=True), for byte buffers (swap_in / swap_out): any element type
# of these sizes stands as a DType of the same size; only addresses and byte
# counts are used then.
_RAW_BY_SIZE = {1: DType.FP8_E4M3, 2: DType.F16, 4: DType.I32, 8: DType.I64}
_DLPACK_READ_ONLY = 1


class TensorDesc:
    """A checked description of caller memory, ready for the C ABI."""

    __slots__ = ("byte_offset", "data", "device", "dtype", "keep", "readonly", "shape", "strides")

    def __init__(
        self,
        data: int,
        byte_offset: int,
        dtype: DType,
        device: Optional[Device],
        shape: Tuple[int, ...],
        strides: Tuple[int, ...],
        readonly: bool,
        keep: Any,
    ) -> None:
        self.data = data
        self.byte_offset = byte_offset
        self.dtype = dtype
        self.device = device  # None: a CUDA pointer whose ordinal is unknown
        self.shape = shape
        self.strides = strides
        self.readonly = readonly
        self.keep = keep

    def as_c(self, device: Device) -> tuple:
        dev = self.device or device
        return (self.data, self.byte_offset, int(self.dtype), int(dev.type), dev.index, self.shape, self.strides)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def _dense_strides(shape: Sequence[int]) -> Tuple[int, ...]:
    out = []
    acc = 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(out))


#: numpy's most dimensions (NPY_MAXDIMS): an interface claiming more is not an array.
_MAX_NDIM = 64


def _dims(value: Any, name: str, what: str) -> Any:
    """An array interface's shape or strides, refused before they are read
    when they claim more dimensions than any array has: a shape of
    range(2**40) was read into a tuple of 2^40 ints (a hang, then the
    process was killed for memory)."""
    try:
        n = len(value)
    except TypeError:  # an int, a generator: "object of type 'int' has no len()"
        raise TypeError(f"{name}: array interface {what} is not a sequence, got {type(value).__name__}") from None
    except OverflowError:  # a __len__ of 2**64 or more
        n = _MAX_NDIM + 1
    if n > _MAX_NDIM:
        raise InvalidArgumentError(f"{name}: array interface {what} has {n} dimensions, more than {_MAX_NDIM}")
    return value


def _byte_strides_to_elems(name: str, strides: Sequence[int], itemsize: int) -> Tuple[int, ...]:
    out = []
    for s in strides:
        if s % itemsize:
            raise InvalidArgumentError(f"{name}: stride of {s} bytes is not a multiple of the element size {itemsize}")
        out.append(s // itemsize)
    return tuple(out)


_NP_DTYPES: dict = {}  # numpy dtype -> DType, filled on first use


def _numpy_dtype(dt: Any, name: str) -> DType:
    found = _NP_DTYPES.get(dt)
    if found is None:
        if dt.name == "bfloat16":
            found = DType.BF16
        elif dt.byteorder in "<=|":
            found = _TYPESTR.get(dt.str[1:])
        if found is None:
            raise InvalidArgumentError(
                f"{name}: numpy dtype {dt} is not supported (float32, float16, bfloat16 via ml_dtypes, int32, int64)"
            )
        _NP_DTYPES[dt] = found
    return found


def _from_numpy(obj: Any, name: str) -> TensorDesc:
    dtype = _numpy_dtype(obj.dtype, name)
    item = obj.itemsize
    st = obj.strides
    strides = tuple(s // item for s in st)
    if any(s % item for s in st):
        _byte_strides_to_elems(name, st, item)  # raises, naming the stride
    ptr = obj.__array_interface__["data"][0]
    return TensorDesc(ptr, 0, dtype, CPU, obj.shape, strides, not obj.flags.writeable, obj)


def _from_dlpack(obj: Any, name: str, stream: int, raw: bool = False) -> TensorDesc:
    dev_type, _dev_id = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (_kDLCPU, 0)
    dev_type = int(dev_type)
    # DLPack: None means the legacy default stream, which NULL is too.
    kw = {"stream": stream if stream else None} if dev_type in (_kDLCUDA, _kDLCUDAManaged) else {}
    try:
        # A DLPack 1.0 capsule first: only it can say read-only (numpy
        # refuses a legacy export of a read-only array, so read-only inputs
        # were refused).
        capsule = obj.__dlpack__(max_version=(1, 0), **kw)
    except TypeError:  # a producer older than DLPack 1.0: no max_version
        capsule = obj.__dlpack__(**kw)
    cname = _capsule_name(capsule)
    mt: Any
    if cname == b"dltensor_versioned":
        mt = _DLManagedTensorVersioned.from_address(_capsule_get(capsule, cname))
        readonly = bool(mt.flags & _DLPACK_READ_ONLY)
    elif cname == b"dltensor":
        mt = _DLManagedTensor.from_address(_capsule_get(capsule, cname))
        readonly = False
    else:
        raise TypeError(f"{name}: __dlpack__ returned a capsule named {cname!r} (already consumed?)")
    t = mt.dl_tensor
    key = (t.dtype.code, t.dtype.bits)
    dtype = _DL_DTYPES.get(key)
    if dtype is None and raw and t.dtype.lanes == 1 and t.dtype.bits % 8 == 0:
        dtype = _RAW_BY_SIZE.get(t.dtype.bits // 8)
    if dtype is None or t.dtype.lanes != 1:
        raise InvalidArgumentError(
            f"{name}: DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits, {t.dtype.lanes} lanes) is not supported"
        )
    ndim = t.ndim
    shape = tuple(t.shape[i] for i in range(ndim))
    strides = tuple(t.strides[i] for i in range(ndim)) if t.strides else _dense_strides(shape)
    dtype_dev = t.device.device_type
    if dtype_dev in (_kDLCPU, _kDLCUDAHost):
        device: Optional[Device] = CPU
    elif dtype_dev in (_kDLCUDA, _kDLCUDAManaged):
        device = Device(DeviceType.CUDA, t.device.device_id)
    else:
        raise InvalidArgumentError(f"{name}: DLPack device type {dtype_dev} is not supported (CPU or CUDA)")
    # The capsule (and with it the producer's buffer) lives in `keep`; when
    # it is collected after the call, its destructor returns the tensor.
    return TensorDesc(t.data or 0, int(t.byte_offset), dtype, device, shape, strides, readonly, (obj, capsule))


def _from_interface(
    obj: Any, name: str, iface: dict, device: Optional[Device], expect: Optional[DType], raw: bool = False
) -> TensorDesc:
    typestr = iface["typestr"]
    data = iface.get("data")
    if not isinstance(data, tuple):
        raise TypeError(f"{name}: array interface without a (pointer, readonly) data tuple is not supported")
    ptr, readonly = data
    kind = typestr[1:]
    if typestr[0] == ">" and typestr[2:] != "1":
        raise InvalidArgumentError(f"{name}: big-endian data ({typestr}) is not supported")
    dtype = _TYPESTR.get(kind)
    if dtype is None and kind == "V2" and expect == DType.BF16:
        dtype = DType.BF16  # raw 16-bit words standing for bfloat16
    if dtype is None and raw and kind[1:].isdigit():
        dtype = _RAW_BY_SIZE.get(int(kind[1:]))
    if dtype is None:
        raise InvalidArgumentError(f"{name}: element type {typestr!r} is not supported (f4, f2, i4, i8)")
    shape = tuple(int(n) for n in _dims(iface["shape"], name, "shape"))
    st = iface.get("strides")
    if st:
        _dims(st, name, "strides")
    strides = _byte_strides_to_elems(name, st, dtype.itemsize) if st else _dense_strides(shape)
    return TensorDesc(int(ptr or 0), 0, dtype, device, shape, strides, bool(readonly), obj)


def _cuda_ordinal(obj: Any) -> Optional[Device]:
    dev = getattr(obj, "device", None)
    for attr in ("index", "id"):
        idx = getattr(dev, attr, None)
        if isinstance(idx, int):
            return Device(DeviceType.CUDA, idx)
    return None


def describe(obj: Any, name: str, *, stream: int = 0, expect: Optional[DType] = None, raw: bool = False) -> TensorDesc:
    """Describes obj's memory without copying it. raw: a byte buffer, whose
    element type (uint8, int16, ...) only sets its size."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _from_numpy(obj, name)
    if isinstance(obj, TensorDesc):
        return obj
    errors = []
    if hasattr(obj, "__dlpack__"):
        try:
            return _from_dlpack(obj, name, stream, raw)
        except InvalidArgumentError:
            raise
        except Exception as e:  # e.g. torch refusing tensors that require grad
            errors.append(f"__dlpack__: {e}")
    for attr, device in (("__cuda_array_interface__", None), ("__array_interface__", CPU)):
        try:
            iface = getattr(obj, attr, None)
        except Exception as e:  # torch: "... requires grad; use detach()"
            errors.append(f"{attr}: {e}")
            continue
        if iface is not None:
            return _from_interface(obj, name, iface, device or _cuda_ordinal(obj), expect, raw)
    detail = f" ({'; '.join(errors)})" if errors else ""
    raise TypeError(
        f"{name}: expected a tensor (numpy/torch/cupy array or an object with __dlpack__, "
        f"__cuda_array_interface__ or __array_interface__), got {type(obj).__name__}{detail}"
    )


def check(
    desc: TensorDesc,
    name: str,
    *,
    dtype: Optional[DType],
    device: Device,
    shape: Sequence[Optional[int]],
    writable: bool = False,
) -> None:
    """Raises InvalidArgumentError naming `name` unless desc fits."""
    if dtype is not None and desc.dtype != dtype:
        raise InvalidArgumentError(f"{name}: expected dtype {dtype}, got {desc.dtype}")
    if desc.device is not None and desc.device != device:
        raise InvalidArgumentError(f"{name}: expected a tensor on {device}, got one on {desc.device}")
    if desc.device is None and device.type != DeviceType.CUDA:
        raise InvalidArgumentError(f"{name}: expected a tensor on {device}, got CUDA memory")
    if len(desc.shape) != len(shape) or any(e is not None and e != g for e, g in zip(shape, desc.shape)):
        want = "[" + ", ".join("*" if e is None else str(e) for e in shape) + "]"
        raise InvalidArgumentError(f"{name}: expected shape {want}, got {list(desc.shape)}")
    numel = math.prod(desc.shape)
    # An empty tensor describes no memory (numpy gives it all-zero strides):
    # its strides are not checked, its shape is the caller's to name.
    if numel and desc.shape and desc.shape[-1] > 1 and desc.strides[-1] != 1:
        raise InvalidArgumentError(
            f"{name}: the innermost dimension must be contiguous (stride 1), got stride {desc.strides[-1]}"
        )
    if numel > 1 and all(s == 0 for s in desc.strides):
        raise InvalidArgumentError(f"{name}: broadcast (all-zero stride) tensors are not supported")
    if writable:
        if desc.readonly:
            raise InvalidArgumentError(f"{name}: the output tensor is read-only")
        for n, s in zip(desc.shape, desc.strides):
            if n > 1 and s == 0:
                raise InvalidArgumentError(f"{name}: the output tensor has a zero (broadcast) stride")
    if numel and not desc.data:
        raise InvalidArgumentError(f"{name}: NULL data pointer")


# ------------------------------------------------------------------ streams


def stream_ptr(stream: Any) -> int:
    """A cudaStream_t address from None (0: the legacy default stream), an int,
    a torch.cuda.Stream, a cupy stream, or any object with __cuda_stream__."""
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError("stream: expected None, an int or a CUDA stream object, got bool")
    if isinstance(stream, int):
        if stream < 0:
            raise ValueError(f"stream: negative handle {stream}")
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        return int(value[1] if isinstance(value, tuple) else value)
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise TypeError(f"stream: expected None, an int or a CUDA stream object, got {type(stream).__name__}")


# ------------------------------------------------------------------ views


class TensorView(NoCopy):
    """A view of library-owned memory (KV storage, plan arrays).

    Exposes ``__array_interface__`` (CPU) or ``__cuda_array_interface__``
    (CUDA), so ``numpy.asarray(view)``, ``torch.as_tensor(view)`` and
    ``cupy.asarray(view)`` wrap it without a copy. It keeps the owning
    library object alive until the view, and every array made from it, are
    gone. bfloat16 is described as 16-bit raw words; ``numpy()`` and
    ``torch()`` return it typed (numpy needs ml_dtypes).

    A read-only view (the plan arrays) describes itself as read-only, so
    numpy arrays over it have ``flags.writeable == False``; ``torch()``
    returns a copy of it, torch having no read-only tensors. The library
    never reads a plan array back from its callers' copy anyway.
    """

    # A copy would release the one pin a second time when collected, and the
    # handle could then go while arrays over the memory are still in use.
    _pickle_why = "it pins library memory"

    # The geometry is read-only: numpy, torch and cupy build arrays over
    # (data, shape, strides, dtype) as given, so an assignment such as
    # ``view.shape = (1 << 30,)`` made the next ``np.asarray(view)`` read
    # (or write) far past the library's memory (a segmentation fault).
    __slots__ = ("__weakref__", "_data", "_device", "_dtype", "_pin", "_readonly", "_shape", "_strides")

    def __init__(self, c_tensor: Any, pin: Any, readonly: bool = False) -> None:
        # Checked before the pin is taken: a failed TensorView(None, pin)
        # released the pin it was given when collected (__del__), a reference
        # it never held, so a few such calls destroyed the pool under its
        # live views (a segmentation fault on their next access).
        if not isinstance(c_tensor, _c.pkv_tensor):
            raise TypeError(
                "c_tensor: expected the library's pkv_tensor (views come from Pool.kv_tensor and Batch.plan), "
                f"got {type(c_tensor).__name__}"
            )
        self._pin = pin  # keeps the C object alive; released with the view
        self._fill(c_tensor, readonly)

    @classmethod
    def _pinned(cls, handle: Any, fn: Any, *args: Any, readonly: bool = False) -> TensorView:
        """The view of fn(ptr, *args)'s tensor, ptr being handle's pointer
        pinned for the view. The pin and the view's _pin are made in one C
        call: a pin taken in Python (acquire()) and handed to a view made
        afterwards was lost to an interrupt raised in between, and the
        handle (a pool's storage) was never destroyed. From then on the
        view owns the pin: any failure drops the view, which releases it."""
        view = cls.__new__(cls)
        ptr = handle._pin_into(view)
        view._fill(fn(ptr, *args), readonly)
        return view

    def _fill(self, c_tensor: Any, readonly: bool) -> None:
        self._readonly = bool(readonly)
        self._data: int = int(c_tensor.data or 0) + int(c_tensor.byte_offset)
        self._dtype = DType(c_tensor.dtype)
        self._device = Device(DeviceType(c_tensor.device_type), c_tensor.device_id)
        ndim = c_tensor.ndim
        self._shape: Tuple[int, ...] = tuple(int(n) for n in c_tensor.shape[:ndim])
        strides = tuple(int(s) for s in c_tensor.strides[:ndim])
        self._strides: Tuple[int, ...] = _dense_strides(self.shape) if not any(strides) else strides

    @property
    def readonly(self) -> bool:
        """Whether arrays over the view are read-only (the plan arrays)."""
        return self._readonly

    @property
    def data(self) -> int:
        """The address of element 0."""
        return self._data

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def device(self) -> Device:
        return self._device

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._shape

    @property
    def strides(self) -> Tuple[int, ...]:
        """In elements."""
        return self._strides

    def __del__(self) -> None:
        pin, self._pin = getattr(self, "_pin", None), None
        if pin is not None:
            try:
                pin.release()
            except Exception:
                pass

    def _interface(self) -> dict:
        if getattr(self, "_pin", None) is None:  # released (an explicit __del__()): the memory may be gone
            raise ValueError("the view was released")
        item = self.dtype.itemsize
        code = {
            DType.F32: "<f4",
            DType.F16: "<f2",
            DType.BF16: "<i2",
            DType.I32: "<i4",
            DType.I64: "<i8",
            DType.FP8_E4M3: "|u1",  # raw FP8 codes (numpy has no float8)
            DType.FP8_E5M2: "|u1",
        }[self.dtype]
        return {
            "shape": self.shape,
            "typestr": code,
            "data": (self.data, self.readonly),
            "strides": tuple(s * item for s in self.strides),
            "version": 3,
        }

    @property
    def __array_interface__(self) -> dict:  # type: ignore[override]
        if self.device.type != DeviceType.CPU:
            raise AttributeError("__array_interface__: the view is on a CUDA device")
        return self._interface()

    @property
    def __cuda_array_interface__(self) -> dict:
        if self.device.type != DeviceType.CUDA:
            raise AttributeError("__cuda_array_interface__: the view is in host memory")
        d = self._interface()
        d["stream"] = None
        return d

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def numpy(self) -> Any:
        """A numpy array over the same memory (CPU views only)."""
        import numpy as np

        arr = np.asarray(self)
        if self.dtype == DType.BF16:
            try:
                import ml_dtypes
            except ImportError as e:
                raise ImportError("bfloat16 views as numpy arrays need ml_dtypes (pip install ml_dtypes)") from e
            arr = arr.view(ml_dtypes.bfloat16)
        return arr

    def codes(self) -> Any:
        """An FP8 view's raw codes as a numpy uint8 array over the same
        memory (decode with ml_dtypes' float8_e4m3fn / float8_e5m2 views,
        times the pool's kv_scales())."""
        import numpy as np

        if self.dtype not in (DType.FP8_E4M3, DType.FP8_E5M2):
            raise TypeError(f"codes(): the view is {self.dtype}, not fp8")
        return np.asarray(self)

    def torch(self) -> Any:
        """A torch tensor over the same memory (CPU or CUDA); a copy of a
        read-only CPU view."""
        import torch

        if self.device.type == DeviceType.CPU:
            arr = np_asarray(self)
            t = torch.from_numpy(arr.copy()) if self.readonly else torch.as_tensor(arr)
        else:
            t = torch.as_tensor(self, device=f"cuda:{self.device.index}")
        return t.view(torch.bfloat16) if self.dtype == DType.BF16 else t

    def __repr__(self) -> str:
        return f"TensorView(shape={list(self.shape)}, dtype={self.dtype}, device={self.device})"


def np_asarray(obj: Any) -> Any:
    import numpy as np

    return np.asarray(obj)


def empty_like(x: Any, shape: Optional[Sequence[int]] = None, float32: bool = False) -> Any:
    """A new uninitialised array of x's kind (numpy, torch, cupy)."""
    mod_name = type(x).__module__.split(".", 1)[0]
    shape = tuple(x.shape) if shape is None else tuple(shape)
    if mod_name == "torch":
        import torch

        return torch.empty(shape, dtype=torch.float32 if float32 else x.dtype, device=x.device)
    if mod_name in ("numpy", "cupy"):
        mod = sys.modules[mod_name]
        return mod.empty(shape, dtype=mod.float32 if float32 else x.dtype)
    raise TypeError(f"cannot allocate an output like a {type(x).__name__}; pass it explicitly")
