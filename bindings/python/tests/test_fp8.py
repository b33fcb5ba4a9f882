"""FP8 KV pools: options and scales, the quantising cache write (codes
checked against ml_dtypes' float8 types) and attention over FP8 pages
against a float64 reference over the decoded codes."""

import numpy as np
import pytest

import pagedkv
from conftest import random_tensor, reference_attention

ml_dtypes = pytest.importorskip("ml_dtypes")

FORMATS = {
    "fp8_e4m3": (ml_dtypes.float8_e4m3fn, 448.0),
    "fp8_e5m2": (ml_dtypes.float8_e5m2, 57344.0),
}


def make_pool(dtype, **kw):
    return pagedkv.Pool(num_blocks=24, block_size=8, num_layers=2, num_kv_heads=2, head_dim=64, dtype=dtype, **kw)


def encode(x, scale, dtype):
    """The library's encoding of x / scale: round to nearest even (as
    ml_dtypes casts), saturating at the format's maximum."""
    f8, fmax = FORMATS[dtype]
    y = np.clip(x.astype(np.float32) / np.float32(scale), -fmax, fmax)
    return y.astype(f8).view(np.uint8)


def decode(codes, dtype):
    return codes.view(FORMATS[dtype][0]).astype(np.float64)


@pytest.mark.parametrize("dtype", list(FORMATS))
def test_options_and_scales(dtype):
    with make_pool(dtype, k_scales=[0.5, 0.25], v_scales=[2.0, 4.0]) as pool:
        o = pool.options
        assert o.dtype is pagedkv.DType.parse(dtype)
        assert o.kv_scale_granularity == "tensor" and o.num_kv_scales == 2
        assert pool.kv_scales() == ([0.5, 0.25], [2.0, 4.0])
        with make_pool("bf16") as b:
            assert pool.bytes_per_block * 2 == b.bytes_per_block
            with pytest.raises(pagedkv.InvalidStateError, match="not fp8"):
                b.kv_scales()
        pool.set_kv_scales(np.array([3.0, 5.0]), [7.0, 9.0])
        assert pool.kv_scales() == ([3.0, 5.0], [7.0, 9.0])
        for bad in (0.0, -1.0, float("nan"), float("inf")):
            with pytest.raises(pagedkv.InvalidArgumentError, match=r"v_scales\[1\]"):
                pool.set_kv_scales([1.0, 1.0], [1.0, bad])
        with pytest.raises(pagedkv.InvalidArgumentError, match="num_scales"):
            pool.set_kv_scales([1.0], [1.0])
        with pytest.raises(ValueError, match="differ in length"):
            pool.set_kv_scales([1.0, 1.0], [1.0])
        assert pool.kv_scales() == ([3.0, 5.0], [7.0, 9.0])  # failures changed nothing
        assert pool.kv_tensor(0, "k").dtype is pagedkv.DType.parse(dtype)
    with make_pool(dtype, kv_scale_granularity="head") as pool:
        assert pool.options.num_kv_scales == 4 and pool.kv_scales() == ([1.0] * 4, [1.0] * 4)
    with pytest.raises(pagedkv.InvalidArgumentError, match="num_kv_scales"):
        make_pool(dtype, k_scales=[1.0, 1.0, 1.0], v_scales=[1.0, 1.0, 1.0])
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"k_scales\[0\]"):
        make_pool(dtype, k_scales=[0.0, 1.0], v_scales=[1.0, 1.0])
    with pytest.raises(pagedkv.InvalidArgumentError, match="fp8 pools only"):
        make_pool("bf16", k_scales=[1.0, 1.0], v_scales=[1.0, 1.0])


@pytest.mark.parametrize("dtype", list(FORMATS))
@pytest.mark.parametrize("act", ["f32", "bf16"])
def test_write_and_attention(rng, dtype, act):
    act_dt = np.float32 if act == "f32" else ml_dtypes.bfloat16
    fmax = FORMATS[dtype][1]
    heads_q = 4
    # Per-head scales; magnitudes chosen so that some values saturate.
    ks = (np.abs(rng.standard_normal(4)) + 0.5) * 2.0 / fmax
    vs = (np.abs(rng.standard_normal(4)) + 0.5) * 2.0 / fmax
    with make_pool(dtype, kv_scale_granularity="head", k_scales=ks, v_scales=vs) as pool:
        ks32, vs32 = np.float32(ks).reshape(2, 2), np.float32(vs).reshape(2, 2)
        seqs = [pool.create_sequence() for _ in range(2)]
        lens = [19, 11]
        for s, n in zip(seqs, lens):
            s.append(rng.integers(0, 1000, n).tolist())
        stored = {}
        with pool.prepare(seqs, lens) as step:
            plan = {name: view.numpy() for name, view in step.plan_arrays().items()}
            slots = plan["slot_mapping"]
            for layer in range(2):
                k = (random_tensor(rng, (sum(lens), 2, 64), np.float32) * 2).astype(act_dt)
                v = (random_tensor(rng, (sum(lens), 2, 64), np.float32) * 2).astype(act_dt)
                step.cache_write(layer, k, v)
                kc = pool.kv_tensor(layer, "k").codes()
                vc = pool.kv_tensor(layer, "v").codes()
                got_k = kc[slots // 8, :, slots % 8]
                got_v = vc[slots // 8, :, slots % 8]
                for h in range(2):
                    np.testing.assert_array_equal(
                        got_k[:, h], encode(k[:, h].astype(np.float32), ks32[layer, h], dtype)
                    )
                    np.testing.assert_array_equal(
                        got_v[:, h], encode(v[:, h].astype(np.float32), vs32[layer, h], dtype)
                    )
                stored[layer] = (
                    decode(got_k, dtype) * ks32[layer][None, :, None],
                    decode(got_v, dtype) * vs32[layer][None, :, None],
                )
                q = random_tensor(rng, (sum(lens), heads_q, 64), np.float32).astype(act_dt)
                out = step.attention(layer, q)
                assert out.dtype == q.dtype
                qptr = plan["query_indptr"]
                for i in range(2):
                    rows = slice(qptr[i], qptr[i + 1])
                    ref, _ = reference_attention(
                        q[rows].astype(np.float64), stored[layer][0][rows], stored[layer][1][rows]
                    )
                    tol = 2e-5 if act == "f32" else 2e-2
                    np.testing.assert_allclose(out[rows].astype(np.float64), ref, atol=tol, rtol=tol)
        assert pool.stats().num_used_blocks > 0
        pool.validate()
