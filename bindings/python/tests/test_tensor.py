"""Zero-copy tensor descriptors: DLPack, array interfaces, checks, streams."""

import subprocess
import sys

import numpy as np
import pytest

import pagedkv
from conftest import np_dtype, random_tensor, reference_attention
from pagedkv import _tensor


class DLPackOnly:
    """Exposes an array through DLPack alone (as a torch/jax tensor would)."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, stream=None):
        return self._arr.__dlpack__()

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


class DLPackVersioned:
    """A DLPack 1.0 producer (``max_version``, as numpy >= 2.1, torch and the
    array-API libraries wrapping them): it can say read-only."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, stream=None, max_version=None):
        return self._arr.__dlpack__() if max_version is None else self._arr.__dlpack__(max_version=max_version)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


class InterfaceOnly:
    def __init__(self, arr, typestr=None):
        self._arr = arr
        ai = dict(arr.__array_interface__)
        if typestr:
            ai["typestr"] = typestr
        self.__array_interface__ = ai
        self.shape = arr.shape


class FakeCuda:
    """Claims to be CUDA memory (never dereferenced: the checks refuse it)."""

    def __init__(self, shape):
        self.shape = shape
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": "<f4",
            "data": (0x1000, False),
            "version": 3,
            "strides": None,
        }


def test_describe_numpy_is_zero_copy():
    a = np.zeros((3, 4, 8), np.float32)
    d = _tensor.describe(a, "a")
    assert d.data == a.ctypes.data and d.shape == (3, 4, 8) and d.strides == (32, 8, 1)
    assert d.dtype == pagedkv.DType.F32 and d.device == pagedkv.Device.parse("cpu")
    s = a[:, 1:3, ::2]
    d = _tensor.describe(s, "s")
    assert d.data == s.ctypes.data and d.strides == (32, 8, 2)
    bf = np.zeros((2, 2), np_dtype("bf16"))
    assert _tensor.describe(bf, "bf").dtype == pagedkv.DType.BF16
    with pytest.raises(pagedkv.InvalidArgumentError, match="float64"):
        _tensor.describe(np.zeros(3), "x")


def test_describe_dlpack_and_interfaces():
    a = np.arange(24, dtype=np.float16).reshape(2, 3, 4)[:, ::2]
    d = _tensor.describe(DLPackOnly(a), "a")
    assert d.data + d.byte_offset == a.ctypes.data
    assert d.shape == (2, 2, 4) and d.strides == (12, 8, 1) and d.dtype == pagedkv.DType.F16
    d = _tensor.describe(InterfaceOnly(a), "a")
    assert d.data == a.ctypes.data and d.strides == (12, 8, 1)
    raw16 = np.zeros((2, 2), np.uint16)
    d = _tensor.describe(InterfaceOnly(raw16, "<V2"), "r", expect=pagedkv.DType.BF16)
    assert d.dtype == pagedkv.DType.BF16
    with pytest.raises(pagedkv.InvalidArgumentError):
        _tensor.describe(InterfaceOnly(raw16, "<V2"), "r")
    with pytest.raises(TypeError, match="x: expected a tensor"):
        _tensor.describe(object(), "x")


def test_checks_name_the_argument():
    d = _tensor.describe(np.zeros((2, 3), np.float32), "t")
    cpu = pagedkv.Device.parse("cpu")
    _tensor.check(d, "t", dtype=pagedkv.DType.F32, device=cpu, shape=(2, None))
    for kwargs, words in (
        ({"dtype": pagedkv.DType.F16, "device": cpu, "shape": (2, 3)}, "dtype float16"),
        ({"dtype": None, "device": pagedkv.Device.parse("cuda:0"), "shape": (2, 3)}, "cuda:0"),
        ({"dtype": None, "device": cpu, "shape": (2, 4)}, "shape [2, 4]"),
        ({"dtype": None, "device": cpu, "shape": (2, 3, 1)}, "shape"),
    ):
        with pytest.raises(pagedkv.InvalidArgumentError, match="t: ") as info:
            _tensor.check(d, "t", **kwargs)
        assert words in str(info.value)
    b = _tensor.describe(np.broadcast_to(np.float32(1), (2, 3)), "b")
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"broadcast|stride"):
        _tensor.check(b, "b", dtype=None, device=cpu, shape=(2, 3))


def test_kernels_accept_dlpack_and_interface_objects(rng):
    with pagedkv.Pool(num_blocks=8, block_size=16, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32") as pool:
        s = pool.create_sequence()
        s.append(list(range(6)))
        with pool.prepare([s], 6) as step:
            k = random_tensor(rng, (6, 1, 64), np.float32)
            v = random_tensor(rng, (6, 1, 64), np.float32)
            step.cache_write(0, DLPackOnly(k), InterfaceOnly(v))
            q = random_tensor(rng, (6, 2, 64), np.float32)
            out = np.empty_like(q)
            step.attention(0, DLPackOnly(q), InterfaceOnly(out))
            ref, _ = reference_attention(q, k, v)
            np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)
            with pytest.raises(pagedkv.InvalidArgumentError, match="q: expected a tensor on cpu"):
                step.attention(0, FakeCuda((6, 2, 64)), out)


def test_stream_conversion():
    class TorchLike:
        cuda_stream = 1234

    class CupyLike:
        ptr = 99

    class Proto:
        def __cuda_stream__(self):
            return (0, 77)

    assert _tensor.stream_ptr(None) == 0
    assert _tensor.stream_ptr(5) == 5
    assert _tensor.stream_ptr(TorchLike()) == 1234
    assert _tensor.stream_ptr(CupyLike()) == 99
    assert _tensor.stream_ptr(Proto()) == 77
    for bad in (True, "s", object()):
        with pytest.raises(TypeError):
            _tensor.stream_ptr(bad)
    with pytest.raises(ValueError):
        _tensor.stream_ptr(-1)


def test_views_expose_array_interfaces():
    with pagedkv.Pool(num_blocks=4, block_size=8, num_layers=1, num_kv_heads=2, head_dim=64, dtype="bf16") as pool:
        view = pool.kv_tensor(0, pagedkv.KV.KEY)
        assert view.shape == (4, 2, 8, 64) and view.dtype == pagedkv.DType.BF16
        assert view.nbytes == 4 * 2 * 8 * 64 * 2
        raw16 = np.asarray(view)
        assert raw16.dtype == np.int16 and raw16.shape == view.shape
        arr = view.numpy()
        assert arr.dtype == np_dtype("bf16")
        arr[1, 0, 0, 0] = 1.5
        assert float(pool.kv_tensor(0, "k").numpy()[1, 0, 0, 0]) == 1.5  # same memory
        with pytest.raises(AttributeError):
            _ = view.__cuda_array_interface__
        assert "bfloat16" in repr(view)


def _torch():
    return pytest.importorskip("torch")


def test_torch_tensors_without_copies(rng):
    torch = _torch()
    with pagedkv.Pool(num_blocks=8, block_size=16, num_layers=1, num_kv_heads=1, head_dim=64, dtype="bf16") as pool:
        s = pool.create_sequence()
        s.append(list(range(4)))
        with pool.prepare([s], 4) as step:
            k = torch.randn(4, 1, 64, dtype=torch.bfloat16)
            v = torch.randn(4, 1, 64, dtype=torch.bfloat16)
            step.cache_write(0, k, v)
            q = torch.randn(4, 2, 64, dtype=torch.bfloat16)
            out = step.attention(0, q)
            assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
            ref, _ = reference_attention(q.float().numpy(), k.float().numpy(), v.float().numpy())
            np.testing.assert_allclose(out.float().numpy(), ref, atol=3e-2, rtol=3e-2)
            kt = pool.kv_tensor(0, "k").torch()
            assert kt.dtype == torch.bfloat16 and torch.equal(kt[s.block_table()[0], :, :4], k.transpose(0, 1))


def test_raw_tensor_tuple_fields_out_of_range_are_refused_not_wrapped():
    """The raw module took a tensor tuple's dtype, device_type and device_id
    with PyLong_AsLong and a cast to 32 bits: dtype 2^32 + 1 was f32, device
    id 2^32 device 0, and the call went ahead on the wrong description.
    pkv_pool_drain_events_v2's (capacity, token_capacity) wrapped modulo
    2^64 the same way. Each is an OverflowError naming the field now, and
    nothing is written."""
    raw = pagedkv._pagedkv
    with pagedkv.Pool(num_blocks=8, block_size=4, num_layers=1, num_kv_heads=1, head_dim=8, dtype="f32") as pool:
        s = pool.create_sequence()
        s.append([1, 2, 3])
        x = np.ones((3, 1, 8), np.float32)

        def tup(**over):
            t = dict(
                data=x.ctypes.data, byte_offset=0, dtype=1, device_type=1, device_id=0, shape=x.shape, strides=None
            )
            t.update(over)
            return tuple(t.values())

        with pool.prepare([s], 3) as b:
            for field, value in (
                ("dtype", 2**32 + 1),
                ("dtype", -(2**32) + 1),
                ("device_type", 2**32 + 1),
                ("device_id", 2**32),
                ("device_id", -(2**31) - 1),
            ):
                with pytest.raises(OverflowError, match=f"k: {field}"):
                    b._call(raw.pkv_cache_write, 0, tup(**{field: value}), tup(), 0)
            assert s.num_computed_tokens == 0
            b._call(raw.pkv_cache_write, 0, tup(), tup(), 0)  # in range: written
        assert s.num_computed_tokens == 3
        for caps in ((2**64 + 3, 12), (3, 2**64 + 12), (-1, 12)):
            with pytest.raises(OverflowError, match="capacity"):
                raw.pkv_pool_drain_events_v2(pool._h, caps)


def test_read_only_dlpack_inputs_are_taken_and_refused_as_outputs(rng):
    """__dlpack__ was called without max_version, so every producer gave a
    legacy capsule, which cannot say read-only: numpy refuses to export a
    read-only array that way ("supported by newer DLPack version"), and a
    read-only q, k or v behind DLPack was refused where the same numpy
    array is taken. A DLPack 1.0 capsule is asked for first (legacy
    producers still work): read-only inputs are taken, read-only outputs
    refused as such."""
    try:
        np.zeros(1).__dlpack__(max_version=(1, 0))
    except TypeError:
        pytest.skip("numpy without DLPack 1.0")

    def ro(a):
        a = a.copy()
        a.flags.writeable = False
        return a

    q = ro(random_tensor(rng, (6, 2, 64), np.float32))
    d = _tensor.describe(DLPackVersioned(q), "q")
    assert d.readonly and d.data + d.byte_offset == q.ctypes.data
    assert not _tensor.describe(DLPackVersioned(q.copy()), "q").readonly
    assert not _tensor.describe(DLPackOnly(q.copy()), "q").readonly  # a legacy producer
    with pagedkv.Pool(num_blocks=8, block_size=16, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32") as pool:
        s = pool.create_sequence()
        s.append(list(range(6)))
        with pool.prepare([s], 6) as step:
            k = ro(random_tensor(rng, (6, 1, 64), np.float32))
            v = ro(random_tensor(rng, (6, 1, 64), np.float32))
            step.cache_write(0, DLPackVersioned(k), DLPackVersioned(v))
            out = ro(np.full_like(q, 7.0))
            with pytest.raises(pagedkv.InvalidArgumentError, match="out: the output tensor is read-only"):
                step.attention(0, DLPackVersioned(q), DLPackVersioned(out))
            assert (out == 7.0).all()
            out = np.empty_like(q)
            step.attention(0, DLPackVersioned(q), DLPackVersioned(out))
            ref, _ = reference_attention(q, k, v)
            np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)


def test_a_failed_tensor_view_constructor_releases_no_reference():
    """``pagedkv.TensorView(c_tensor, pin)`` took the pin before reading
    c_tensor: given anything but the library's tensor it raised
    AttributeError, and its __del__ then released the pin, a reference it
    never held. With the pool's handle as pin (or an Export: it was
    released), three such calls destroyed the pool under its live views and
    the next access to a numpy array over its storage was a segmentation
    fault (found by fuzz_api.py). Now a TypeError before the pin is taken;
    run in a child, which a regression would kill."""
    code = """
import gc
import numpy as np
import pagedkv

p = pagedkv.Pool(num_blocks=8, block_size=4, num_layers=1, num_kv_heads=1, head_dim=8, dtype="f32")
a = np.asarray(p.kv_tensor(0, "k"))
for bad in (None, 1, "x"):
    try:
        pagedkv.TensorView(bad, p._h)
    except TypeError as e:
        assert str(e).startswith("c_tensor: expected the library's pkv_tensor"), e
    else:
        raise AssertionError("no TypeError")
gc.collect()
junk = [bytearray(1 << 20) for _ in range(64)]
a[...] = 1.0
assert a.sum() == a.size
assert not p.closed and p.stats().num_blocks == 8
p.validate()
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr[-2000:])


def test_array_interface_claiming_endless_dimensions_is_refused_before_it_is_read():
    """An object whose ``__array_interface__`` gave ``shape`` (or
    ``strides``) ``range(2**40)`` was read into a tuple of 2^40 ints by the
    tensor description (cache_write, attention, the MLA calls): a hang until
    the process was killed for memory (found while extending fuzz_api.py).
    Now InvalidArgumentError past numpy's 64 dimensions, TypeError for a
    shape that is no sequence; run in a child under a cap and a timeout."""
    code = """
import resource, time
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
import pagedkv

class Iface:
    def __init__(self, shape, strides=None):
        self.__array_interface__ = {"shape": shape, "typestr": "<f4", "data": (0, False), "version": 3, "strides": strides}

pool = pagedkv.Pool(num_blocks=8, block_size=4, num_layers=1, num_kv_heads=1, head_dim=8, dtype="f32")
seq, _ = pool.admit([1, 2, 3])
step = pool.prepare([seq], 3)
for args, exc in (((range(2**40),), pagedkv.InvalidArgumentError), (((3, 1, 8), range(2**40)), pagedkv.InvalidArgumentError), ((5,), TypeError)):
    t = time.monotonic()
    for call in (lambda: step.cache_write(0, Iface(*args), Iface(*args)), lambda: step.attention(0, Iface(*args))):
        try:
            call()
        except exc as e:
            assert "array interface" in str(e), e
        else:
            raise AssertionError("accepted")
    assert time.monotonic() - t < 2.0
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr[-2000:])
