"""Shared helpers of the pagedkv Python tests."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import pagedkv

settings.register_profile(
    "pagedkv",
    database=None,  # no .hypothesis/ directory in the tree
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile("pagedkv")

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
    BF16 = None

NP_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": BF16}


def np_dtype(name: str) -> np.dtype:
    dt = NP_DTYPES[name]
    if dt is None:
        pytest.skip("ml_dtypes is not installed")
    return dt


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded per test (override with PAGEDKV_TEST_SEED)."""
    seed = int(os.environ.get("PAGEDKV_TEST_SEED", "0")) + sum(map(ord, request.node.name))
    return np.random.default_rng(seed)


def random_tensor(rng: np.random.Generator, shape, dtype: np.dtype) -> np.ndarray:
    """Random normal data rounded to dtype (never zeros)."""
    x = rng.standard_normal(shape).astype(np.float32)
    x[x == 0] = 0.5
    return x.astype(dtype)


def reference_attention(q, k, v, scale=None, window=0, softcap=0.0):
    """float64 causal attention of q [Lq, H, D] over k, v [L, Hkv, D], the
    queries being the last Lq positions. Returns (out [Lq, H, D], lse [Lq, H])."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    lq, heads, dim = q.shape
    length, kv_heads = k.shape[0], k.shape[1]
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(dim) if not scale else scale
    kk = np.repeat(k, group, axis=1)  # [L, H, D]
    vv = np.repeat(v, group, axis=1)
    logits = np.einsum("qhd,lhd->hql", q, kk) * scale
    if softcap:
        logits = softcap * np.tanh(logits / softcap)
    pos_q = np.arange(length - lq, length)[:, None]
    pos_k = np.arange(length)[None, :]
    mask = pos_k <= pos_q
    if window:
        mask &= pos_k > pos_q - window
    logits = np.where(mask[None], logits, -np.inf)
    m = logits.max(axis=-1, keepdims=True)
    w = np.exp(logits - m)
    s = w.sum(axis=-1, keepdims=True)
    out = np.einsum("hql,lhd->qhd", w / s, vv)
    lse = (np.log(s) + m)[..., 0].T  # [Lq, H]
    return out, lse


TOLERANCE = {"f32": 2e-5, "f16": 4e-3, "bf16": 3e-2}


@pytest.fixture
def manager_pool():
    with pagedkv.Pool(num_blocks=16, block_size=4, enable_events=True) as pool:
        yield pool


def pool_reusing_the_tag_of(seq_id, make):
    """make() once the round-robin pool tags (pool_tag.h) come back to the
    tag of seq_id's closed pool: its sequences then share seq_id's tag
    (their generations start above the closed pool's). The
    caller closed a pool made just before that one, so the tag before it is
    free and comes round first (other tests' live pools are skipped)."""
    tag = seq_id >> 48
    before = tag - 1 if tag > 1 else 65535
    for _ in range(1 << 17):
        p = pagedkv.Pool(num_blocks=2, block_size=4)
        t = p.create_sequence(owned=False).id >> 48
        p.close()
        if t == before:
            break
    return make()
