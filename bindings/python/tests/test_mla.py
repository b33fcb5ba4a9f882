"""MLA pools (pagedkv.mla): the latent page layout and its accounting, the
latent cache write and absorbed attention over prefill, chunked prefill and
decode steps, against a float64 numpy reference over the latents written
(random, never zero; blocks in the order the pool hands them out after a
shuffle of frees)."""

import numpy as np
import pytest

import pagedkv
from conftest import NP_DTYPES, np_dtype

RANK, ROPE = 64, 16


def make_pool(dtype="f32", **kw):
    opts = dict(num_blocks=48, block_size=4, num_layers=2, kv_layout="mla", kv_lora_rank=RANK, qk_rope_head_dim=ROPE)
    opts.update(kw)
    return pagedkv.Pool(dtype=dtype, num_threads=2, **opts)


def rand(rng, shape, dtype):
    x = rng.uniform(0.05, 1.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    return x.astype(NP_DTYPES[dtype])


def reference(rows, q_lat, q_pe, pos, scale):
    """rows: float64 [L, RANK + ROPE]; q_*: float64 [H, *]; keys 0..pos."""
    c = rows[: pos + 1]
    x = scale * (q_lat @ c[:, :RANK].T + q_pe @ c[:, RANK:].T)  # [H, pos + 1]
    m = x.max(axis=1, keepdims=True)
    w = np.exp(x - m)
    lse = m[:, 0] + np.log(w.sum(axis=1))
    return (w / w.sum(axis=1, keepdims=True)) @ c[:, :RANK], lse


def test_layout_and_bytes_per_token_deepseek_v3():
    with pagedkv.Pool(
        num_blocks=4, block_size=64, num_layers=61, dtype="bf16", kv_layout="mla", kv_lora_rank=512, qk_rope_head_dim=64
    ) as pool:
        o = pool.options
        assert o.kv_layout is pagedkv.KvLayout.MLA and pagedkv.mla.is_mla(pool)
        assert (o.kv_lora_rank, o.qk_rope_head_dim, o.num_kv_heads, o.head_dim) == (512, 64, 1, 576)
        assert pagedkv.mla.bytes_per_token(pool) == 61 * 576 * 2
        t = np.asarray(pool.kv_tensor(3, "k"))
        assert t.shape == (4, 64, 576)
        with pytest.raises(pagedkv.InvalidArgumentError, match="no V"):
            pool.kv_tensor(0, "v")
    with pagedkv.Pool(num_blocks=4, block_size=64, num_layers=61, num_kv_heads=128, head_dim=192, dtype="bf16") as mha:
        # DeepSeek-V3 without MLA caching: K (192) and V (128 padded to 192) per head.
        assert pagedkv.mla.bytes_per_token(mha) == 61 * 2 * 128 * 192 * 2
        assert not pagedkv.mla.is_mla(mha)


def test_bad_options():
    with pytest.raises(pagedkv.InvalidArgumentError, match="opts->kv_lora_rank"):
        make_pool(kv_lora_rank=0)
    with pytest.raises(pagedkv.InvalidArgumentError, match="opts->num_kv_heads"):
        make_pool(num_kv_heads=4)
    with pytest.raises(ValueError, match="kv_layout"):
        make_pool(kv_layout="gqa")


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("heads", [16, 128])
def test_steps_match_float64(dtype, heads):
    rng = np.random.default_rng(7 + heads)
    scale = 0.13
    tol = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.6e-2}[dtype]
    with make_pool(dtype) as pool:
        # Shuffle the free queue so that pages are not in id order.
        fill = [pool.create_sequence() for _ in range(6)]
        for s in fill:
            s.append(list(range(int(rng.integers(1, 9)))))
        for i in rng.permutation(len(fill)):
            fill[i].free()
        rows = {}  # seq -> per layer float64 [L, RANK + ROPE]
        a, b = pool.create_sequence(), pool.create_sequence()
        a.append(list(range(100, 109)))
        b.append(list(range(200, 203)))
        steps = [([a, b], [9, 3]), ([a, b], [1, 2]), ([b, a], [1, 1])]
        for i, (seqs, counts) in enumerate(steps):
            if i == 1:
                a.append([7])
                b.append([203, 204])  # b's prefill continues over its cached chunk
            if i == 2:
                a.append([8])
                b.append([9])
            with pool.prepare(seqs, counts) as batch:
                n = batch.num_tokens
                for layer in range(2):
                    kv_c = rand(rng, (n, RANK), dtype)
                    k_pe = rand(rng, (n, 1, ROPE), dtype)
                    batch.mla_cache_write(layer, kv_c, k_pe)
                    r = 0
                    for s, q in zip(seqs, counts):
                        L = s.num_tokens
                        mine = rows.setdefault((s.id, layer), np.zeros((0, RANK + ROPE)))
                        new = np.concatenate(
                            [kv_c[r : r + q].astype(np.float64), k_pe[r : r + q, 0].astype(np.float64)], 1
                        )
                        mine = np.concatenate([mine[: L - q], new])
                        rows[(s.id, layer)] = mine
                        r += q
                    q_lat = rand(rng, (n, heads, RANK), dtype)
                    q_pe = rand(rng, (n, heads, ROPE), dtype)
                    out, lse = pagedkv.mla.attention(batch, layer, q_lat, q_pe, softmax_scale=scale, lse=True)
                    assert out.shape == (n, heads, RANK) and out.dtype == q_lat.dtype
                    r = 0
                    for s, q in zip(seqs, counts):
                        L = s.num_tokens
                        for j in range(q):
                            ref, ref_lse = reference(
                                rows[(s.id, layer)],
                                q_lat[r].astype(np.float64),
                                q_pe[r].astype(np.float64),
                                L - q + j,
                                float(np.float32(scale)),
                            )
                            np.testing.assert_allclose(out[r].astype(np.float64), ref, rtol=tol, atol=tol)
                            np.testing.assert_allclose(lse[r], ref_lse, rtol=1e-5, atol=1e-4)
                            r += 1
            assert a.num_computed_tokens == a.num_tokens
        # The stored rows are the written latents, page by page.
        raw = np.asarray(pool.kv_tensor(1, "k"))
        t = raw.view(NP_DTYPES[dtype]) if raw.dtype.itemsize == 2 else raw
        table = a.block_table()
        for pos in range(a.num_tokens):
            np.testing.assert_array_equal(t[table[pos // 4], pos % 4].astype(np.float64), rows[(a.id, 1)][pos])
        pool.validate()


U = 2.0**-24


def _gamma(n):
    return n * U / (1 - n * U)


@pytest.mark.parametrize("isa", ["scalar", "avx2", ""])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_latents_near_the_largest_value_do_not_overflow(dtype, isa, monkeypatch):
    """Latents near FLT_MAX (f32, bf16): the output is a convex combination
    of them, finite; an unnormalised f32 sum of p c over a few dozen keys
    (weights up to 1 each) would overflow to inf. Checked against float64
    written from the math, with the bound of test_attention_ref64.py: logit
    error dx <= gamma(D + 4) * scale * sum |q_d c_d| + 2^-20 moves the output
    by at most 2 dx max|c|, the f32 sums over L keys add gamma(L + 4) max|c|,
    and rounding to the dtype u_out |out|."""
    if isa:
        monkeypatch.setenv("PAGEDKV_CPU_ISA", isa)
    else:
        monkeypatch.delenv("PAGEDKV_CPU_ISA", raising=False)
    dt = np_dtype(dtype)
    top = float(np.finfo(np.float32).max) if dtype == "f32" else float(ml_dtypes_finfo_max(dt))
    u_out = {"f32": 2.0**-24, "bf16": 2.0**-8}[dtype]
    rng = np.random.default_rng(11)
    scale = 1.0
    heads = 3
    with make_pool(dtype, block_size=8, num_blocks=24) as pool:
        a, b = pool.create_sequence(), pool.create_sequence()
        a.append(list(range(40)))
        b.append(list(range(20)))
        rows = {}
        for seqs, counts in (([a, b], [40, 20]), ([a], [5])):  # prefill, then a chunk over a's prefix
            if len(seqs) == 1:
                a.append(list(range(5)))
            with pool.prepare(seqs, counts) as batch:
                n = batch.num_tokens
                # Half the latent dims keep one sign over all keys (so the sum of
                # p c grows with the keys), the rest random; |c| in [top/2, top].
                sign = np.where(np.arange(RANK) % 2 == 0, 1.0, rng.choice([-1.0, 1.0], (n, RANK)))
                kv_c = (rng.uniform(0.5, 1.0, (n, RANK)) * sign * top).astype(dt)
                k_pe = rng.uniform(-1.0, 1.0, (n, 1, ROPE)).astype(dt)
                for layer in range(2):  # a step commits once every layer was written
                    batch.mla_cache_write(layer, kv_c, k_pe)
                # q_latent 2^-125 (normal) on 4 dims, 0 elsewhere: q . c stays a few units.
                q_lat = np.zeros((n, heads, RANK))
                q_lat[..., :4] = rng.uniform(0.5, 1.0, (n, heads, 4)) * rng.choice([-1.0, 1.0], (n, heads, 4))
                q_lat = (q_lat * 2.0**-125).astype(dt)
                q_pe = rng.uniform(-1.0, 1.0, (n, heads, ROPE)).astype(dt)
                out, lse = pagedkv.mla.attention(batch, 0, q_lat, q_pe, softmax_scale=scale, lse=True)
                r = 0
                for s, q in zip(seqs, counts):
                    L = s.num_tokens
                    new = np.concatenate([kv_c[r : r + q].astype(np.float64), k_pe[r : r + q, 0].astype(np.float64)], 1)
                    rows[s.id] = np.concatenate([rows.get(s.id, np.zeros((0, RANK + ROPE)))[: L - q], new])
                    for j in range(q):
                        pos = L - q + j
                        c = rows[s.id][: pos + 1]
                        ql, qp = q_lat[r].astype(np.float64), q_pe[r].astype(np.float64)
                        ref, ref_lse = reference(rows[s.id], ql, qp, pos, scale)
                        mag = scale * (np.abs(ql) @ np.abs(c[:, :RANK]).T + np.abs(qp) @ np.abs(c[:, RANK:]).T)
                        dx = _gamma(RANK + ROPE + 4) * mag.max(axis=1) + 2.0**-20  # [H]
                        vmax = np.abs(c[:, :RANK]).max(axis=0)  # [RANK]
                        bound = (2 * dx[:, None] + _gamma(pos + 5)) * vmax[None, :] + u_out * np.abs(ref)
                        got = out[r].astype(np.float64)
                        assert np.isfinite(got).all(), f"{s.id=} {pos=}: {np.isinf(got).sum()} elements inf"
                        err = np.abs(got - ref)
                        assert (err <= bound).all(), f"{pos=}: worst err/bound {(err / bound).max()}"
                        np.testing.assert_allclose(lse[r], ref_lse, rtol=0, atol=float(dx.max()) + 1e-5)
                        r += 1
        pool.validate()


def ml_dtypes_finfo_max(dt):
    import ml_dtypes

    return ml_dtypes.finfo(dt).max


def test_mha_calls_refused_and_torch():
    torch = pytest.importorskip("torch")
    with make_pool("bf16") as pool:
        s = pool.create_sequence()
        s.append([1, 2, 3])
        with pool.prepare([s], [3]) as batch:
            x = torch.ones((3, 1, RANK + ROPE), dtype=torch.bfloat16)
            with pytest.raises(pagedkv.InvalidStateError, match="pkv_mla_cache_write"):
                batch.cache_write(0, x, x)
            with pytest.raises(pagedkv.InvalidArgumentError, match="softmax_scale"):
                pagedkv.mla.attention(
                    batch,
                    0,
                    torch.ones((3, 2, RANK), dtype=torch.bfloat16),
                    torch.ones((3, 2, ROPE), dtype=torch.bfloat16),
                    softmax_scale=0.0,
                )
            kv_c = torch.rand((3, RANK), dtype=torch.bfloat16) + 0.1
            k_pe = torch.rand((3, ROPE), dtype=torch.bfloat16) + 0.1
            batch.mla_cache_write(0, kv_c, k_pe)
            batch.mla_cache_write(1, kv_c, k_pe)
            ql = torch.rand((3, 2, RANK), dtype=torch.bfloat16)
            qp = torch.rand((3, 2, ROPE), dtype=torch.bfloat16)
            out = batch.mla_attention(1, ql, qp, softmax_scale=0.1)
            # The first query sees only its own key: out is its latent.
            torch.testing.assert_close(out[0, 1], kv_c[0], rtol=0, atol=0)
        assert s.num_computed_tokens == 3
    with pagedkv.Pool(num_blocks=8, num_layers=1, num_kv_heads=1, head_dim=RANK + ROPE, dtype="f32") as mha:
        s = mha.create_sequence()
        s.append([1])
        with mha.prepare([s], [1]) as batch:
            with pytest.raises(pagedkv.InvalidStateError, match="kv_layout"):
                pagedkv.mla.cache_write(batch, 0, np.ones((1, RANK), np.float32), np.ones((1, ROPE), np.float32))


def test_kv_caches_of_an_mla_pool_names_the_call_to_use():
    """Pool.kv_caches() (a (K, V) pair per layer) on an MLA pool asked the
    library for layer 0's V and raised "pkv_pool_kv_tensor: which is
    PKV_KV_VALUE but an MLA pool stores no V", naming an argument the
    caller never passed. It is an InvalidStateError naming kv_caches and
    the call that gives the latent tensors."""
    with make_pool() as pool:
        with pytest.raises(pagedkv.InvalidStateError, match=r"kv_caches.*kv_tensor\(layer, \"k\"\)"):
            pool.kv_caches()
        assert pool.kv_tensor(1, "k").shape == (48, 4, RANK + ROPE)


def test_mha_calls_on_an_mla_pool_say_so_whatever_the_shapes():
    """Batch.cache_write / Batch.attention on an MLA pool checked the
    tensors against the MHA shape first (num_kv_heads 1, head_dim rank +
    rope): a query or latents of the MLA shapes got "q: expected shape [3,
    *, 80]", an InvalidArgumentError pointing at the tensor, and only
    tensors of that made-up shape reached the library's refusal. They are
    refused as the library does, naming the MLA calls, before any tensor
    check; nothing is written."""
    rng = np.random.default_rng(5)
    with make_pool() as pool:
        s = pool.create_sequence()
        s.append([1, 2, 3])
        with pool.prepare([s], [3]) as batch:
            kv_c = rand(rng, (3, RANK), "f32")
            q_lat = rand(rng, (3, 2, RANK), "f32")
            with pytest.raises(pagedkv.InvalidStateError, match=r"MLA pool.*mla_cache_write"):
                batch.cache_write(0, kv_c[:, None, :], kv_c[:, None, :])
            with pytest.raises(pagedkv.InvalidStateError, match=r"MLA pool.*mla_attention"):
                batch.attention(0, q_lat)
            with pytest.raises(pagedkv.InvalidStateError, match=r"MLA pool.*mla_attention"):
                batch.attention(0, q_lat, lse=True)
            batch.abort()
        assert s.num_computed_tokens == 0
        pool.validate()


def test_k_pe_with_a_head_dimension_is_taken_from_any_tensor_kind():
    """cache_write takes k_pe as [n, rope] or [n, 1, rope] (as vLLM passes
    it), but chose between them by the object's ``shape`` attribute: a 3-d
    k_pe behind DLPack or an array interface alone, which need no
    ``shape``, was refused as "expected shape [3, 16], got [3, 1, 16]"."""

    class DLPackOnly:
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, stream=None, max_version=None):
            return self._a.__dlpack__()

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    class InterfaceOnly:
        def __init__(self, a):
            self._a = a
            self.__array_interface__ = a.__array_interface__

    rng = np.random.default_rng(5)
    with make_pool(num_layers=1) as pool:
        seq = pool.create_sequence()
        seq.append([1, 2, 3])
        with pool.prepare([seq], 3) as b:
            kv_c = rand(rng, (3, RANK), "f32")
            for wrap in (DLPackOnly, InterfaceOnly):
                k_pe = rand(rng, (3, 1, ROPE), "f32")
                pagedkv.mla.cache_write(b, 0, kv_c, wrap(k_pe))
                rows = np.asarray(pool.kv_tensor(0, "k"))[seq.block_table()[0], :3]
                np.testing.assert_array_equal(rows[:, RANK:], k_pe[:, 0])
            with pytest.raises(pagedkv.InvalidArgumentError, match=r"k_pe: expected shape \[3, 1, 16\]"):
                pagedkv.mla.cache_write(b, 0, kv_c, DLPackOnly(rand(rng, (3, 2, ROPE), "f32")))


@pytest.mark.parametrize("isa", ["scalar", "avx2", ""])
def test_latents_at_the_largest_float_give_it_back(isa, monkeypatch):
    """Every latent element exactly +-FLT_MAX (one sign per dim, f32): the
    output, a convex combination of equal values, is exactly +-FLT_MAX; the
    normalisation's rounding (a few ulps either way) must not carry it to
    inf, as it did for some elements before the fix."""
    if isa:
        monkeypatch.setenv("PAGEDKV_CPU_ISA", isa)
    else:
        monkeypatch.delenv("PAGEDKV_CPU_ISA", raising=False)
    top = float(np.finfo(np.float32).max)
    rng = np.random.default_rng(5)
    heads, L = 3, 90
    with make_pool("f32", block_size=8, num_blocks=16) as pool:
        s = pool.create_sequence()
        s.append(list(range(L)))
        with pool.prepare([s], [L]) as batch:
            sign = rng.choice([-1.0, 1.0], RANK)
            kv_c = np.ascontiguousarray(np.broadcast_to(sign * top, (L, RANK)), dtype=np.float32)
            k_pe = rng.uniform(-1.0, 1.0, (L, 1, ROPE)).astype(np.float32)
            for layer in range(2):
                batch.mla_cache_write(layer, kv_c, k_pe)
            q_lat = np.zeros((L, heads, RANK), np.float32)
            q_pe = (4 * rng.standard_normal((L, heads, ROPE))).astype(np.float32)
            out, _ = pagedkv.mla.attention(batch, 0, q_lat, q_pe, softmax_scale=1.0, lse=True)
    inf = ~np.isfinite(out)
    assert not inf.any(), f"{int(inf.sum())}/{inf.size} elements not finite"
    err = np.abs(out.astype(np.float64) - sign * top)  # within rounding of +-FLT_MAX
    assert (err <= _gamma(L + 4) * top).all(), f"worst error {err.max()!r}"
