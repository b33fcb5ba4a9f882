"""Versions, features and constants."""

import re

import pagedkv
from pagedkv import _pagedkv as raw


def test_versions_agree():
    assert re.fullmatch(r"\d+\.\d+\.\d+", pagedkv.version())
    assert pagedkv.version() == pagedkv.__version__
    major, minor, patch = (int(x) for x in pagedkv.version().split("."))
    assert pagedkv.version_number() == major * 10000 + minor * 100 + patch
    assert pagedkv.abi_version() == pagedkv.ABI_VERSION == raw.PKV_ABI_VERSION


def test_features():
    f = pagedkv.features()
    assert f.bits == raw.pkv_features()
    assert f.sha256 and f.xxhash
    assert f.cuda == bool(f.bits & raw.PKV_FEATURE_CUDA)
    count = pagedkv.cuda_device_count()
    assert count >= 0
    if not f.cuda:
        assert count == 0


def test_status_strings():
    for code in range(-10, 1):
        text = pagedkv.status_string(code)
        assert text
    assert pagedkv.status_string(raw.PKV_E_OUT_OF_BLOCKS).startswith("PKV_E_OUT_OF_BLOCKS")


def test_dtype_and_hash_sizes():
    assert [pagedkv.DType.parse(n).itemsize for n in ("f32", "f16", "bf16", "i32", "i64")] == [4, 2, 2, 4, 8]
    assert raw.pkv_dtype_size(99) == 0
    assert pagedkv.hash_size("sha256_cbor") == 32
    assert pagedkv.hash_size("xxh3_128") == 16
    assert raw.pkv_hash_size(99) == 0


def test_parsers():
    D = pagedkv.DType
    assert D.parse("bfloat16") is D.BF16 and D.parse("float16") is D.F16 and D.parse(3) is D.BF16
    import numpy as np

    assert D.parse(np.dtype(np.float32)) is D.F32
    assert str(pagedkv.Device.parse("cuda:3")) == "cuda:3"
    assert pagedkv.Device.parse("cpu").type == pagedkv.DeviceType.CPU
    assert pagedkv.KV.parse("v") is pagedkv.KV.VALUE
    assert pagedkv.HashAlgo.parse("xxh3") is pagedkv.HashAlgo.XXH3_128
    for bad in (lambda: D.parse("int8"), lambda: pagedkv.Device.parse("tpu"), lambda: pagedkv.KV.parse("q")):
        try:
            bad()
        except ValueError:
            pass
        else:
            raise AssertionError("accepted a bad name")
