"""Differential check of the CPU cache-write and attention kernels (MHA/GQA/MQA,
FP8 caches, MLA) against a float64 reference written from the documented
semantics (pagedkv/batch.h, pool.h), independent of the library's own test
references: random data (never zeros), random page permutations, mixed
decode + chunked prefill plans, every output element checked against an
error bound derived from the dtypes (not a fitted tolerance).

Error bound of one output element (f32 accumulation, u = 2^-24):
  logits: |dx_j| <= gamma(D + 3) * scale * sum_d |q_d k_jd| (a dot product of
  D terms, the scale and an FP8 K scale folded in: D + 3 roundings), plus
  4u * cap for the soft-cap's tanh, plus 2^-20 for the vector exp (a
  polynomial; a relative error of its result acts as a logit error);
  output: the softmax is a convex combination, so a logit error dx moves
  it by at most 2 max|dx| * max|v| over the visible keys; P V and the
  normaliser add gamma(L + 2) * max|v| (L keys, L/64 rescales); then the
  output is rounded to its dtype: u_out * |ref| (u_out = 2^-24 f32, 2^-11
  f16, 2^-8 bf16), plus f16's subnormal spacing.
The reference takes the values actually stored (the dtype-rounded inputs;
for FP8 the codes times their scale, the codes themselves checked bit for
bit), so input rounding is not part of the bound.

PAGEDKV_DIFF_LONG=1 runs a wider random matrix (minutes).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import List, Tuple

import numpy as np
import pytest

import pagedkv
from pagedkv import PlanArray

ml_dtypes = pytest.importorskip("ml_dtypes")

LONG = os.environ.get("PAGEDKV_DIFF_LONG", "") not in ("", "0")
U32 = 2.0**-24
U_OUT = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8}
NP = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}
FP8 = {"fp8_e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "fp8_e5m2": (ml_dtypes.float8_e5m2, 57344.0)}
EXP_REL = 2.0**-20

# Worst error / bound ratio seen per family, printed at the end (pytest -s).
STATS: dict = {}


def ein(spec: str, *ops) -> np.ndarray:
    return np.einsum(spec, *ops, optimize=True)  # BLAS where it can: the long contexts


def gamma(n: int) -> float:
    return n * U32 / (1 - n * U32)


def note(key: str, ratio: float, err: float) -> None:
    r, e, n = STATS.get(key, (0.0, 0.0, 0))
    STATS[key] = (max(r, ratio), max(e, err), n + 1)


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if STATS:
        print("\nkernel differential: worst |err| / bound and |err| per family")
        for k in sorted(STATS):
            r, e, n = STATS[k]
            print(f"  {k:40s} ratio {r:.3g}  max|err| {e:.3g}  ({n} checks)")


def rnd(rng: np.random.Generator, shape, dtype: np.dtype, scale: float = 1.0) -> np.ndarray:
    """Random normal values rounded to dtype, none of them zero."""
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    x[x == 0] = 0.25
    return x.astype(dtype)


def fp8_encode(x: np.ndarray, scale: float, fmt: str) -> np.ndarray:
    """pool.h / batch.h: x / scale in f32, rounded to nearest even, saturated
    to the finite maximum (infinities too), NaN -> 0x7f (sign kept)."""
    y = x.astype(np.float32) / np.float32(scale)
    nt, mx = FP8[fmt]
    nan = np.isnan(y)
    neg = np.signbit(y)
    codes = np.clip(np.where(nan, 0, y), -mx, mx).astype(nt).view(np.uint8).copy()
    codes[nan] = np.where(neg[nan], 0xFF, 0x7F)
    return codes


def fp8_decode(codes: np.ndarray, fmt: str) -> np.ndarray:
    return codes.view(FP8[fmt][0]).astype(np.float64)


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(UINT[a.dtype.itemsize])


# ----------------------------------------------------------------- reference


def ref_attention(q, k, v, positions, *, scale, window, softcap):
    """float64 paged-attention semantics of batch.h for one sequence.

    q [nq, H, D] float64; k, v [L, Hkv, D] float64 (the values stored);
    positions [nq]: a query at p sees keys j with p - window < j <= p
    (window 0: j <= p). Returns out [nq, H, D], lse [nq, H], and the
    per-element error bound in f32 arithmetic before the output rounding."""
    nq, heads, dim = q.shape
    hkv = k.shape[1]
    g = heads // hkv
    kk = np.repeat(k, g, axis=1)  # head h reads KV head h // g
    vv = np.repeat(v, g, axis=1)
    raw = ein("ihd,jhd->hij", q, kk) * scale
    absdot = ein("ihd,jhd->hij", np.abs(q), np.abs(kk)) * scale
    x = softcap * np.tanh(raw / softcap) if softcap else raw
    j = np.arange(k.shape[0])[None, :]
    p = np.asarray(positions)[:, None]
    vis = j <= p
    if window:
        vis &= j > p - window
    assert vis.any(axis=1).all()
    xm = np.where(vis[None], x, -np.inf)
    m = xm.max(axis=2, keepdims=True)
    with np.errstate(invalid="ignore"):  # rows with a non-finite q (misuse tests)
        w = np.exp(xm - m)
    s = w.sum(axis=2, keepdims=True)
    out = ein("hij,jhd->ihd", w / s, vv)
    lse = (m + np.log(s))[..., 0].T
    # Error bound (module docstring).
    dx = gamma(dim + 3) * absdot + (4 * U32 * softcap if softcap else 0.0) + EXP_REL
    dxmax = np.where(vis[None], dx, 0).max(axis=2).T  # [nq, H]
    length = int(np.asarray(positions).max()) + 1
    # The largest |v| each row sees, per output element: [nq, H, D].
    av = np.abs(vv)
    vmax = np.stack([av[vis[i]].max(axis=0) for i in range(nq)])
    ebound = (2 * dxmax[..., None] + 2 * gamma(length + 2)) * vmax
    lbound = dxmax + 2 * gamma(length + 2) + 4 * U32 * (1 + np.abs(lse))
    return out, lse, ebound, lbound


def check_out(key, got, ref, ebound, out_dt):
    got = np.asarray(got).astype(np.float64)
    u = U_OUT[out_dt]
    sub = 2.0**-25 if out_dt == "f16" else 0.0
    bound = ebound * (1 + 2 * u) + u * np.abs(ref) + sub
    err = np.abs(got - ref)
    assert np.isfinite(got).all(), f"{key}: non-finite output"
    bad = err > bound
    if bad.any():
        idx = np.argwhere(bad)[0]
        raise AssertionError(
            f"{key}: {int(bad.sum())} of {bad.size} elements out of bound; first {tuple(idx)}: "
            f"got {got[tuple(idx)]!r} ref {ref[tuple(idx)]!r} bound {bound[tuple(idx)]!r}"
        )
    note(key, float((err / bound).max()), float(err.max()))


# ----------------------------------------------------------------- harness


@dataclass
class Case:
    dim: int = 64
    bs: int = 16
    hkv: int = 2
    group: int = 1
    dtype: str = "f32"  # cache dtype: f32, f16, bf16, fp8_e4m3, fp8_e5m2
    act: str = ""  # q/k/v/out dtype; "" = the cache's (FP8: f32)
    per_head: bool = False
    layers: int = 2
    threads: int = 1
    isa: str = ""  # PAGEDKV_CPU_ISA
    seqs: List[Tuple[int, int]] = field(default_factory=lambda: [(0, 5), (17, 1), (33, 4)])
    window: int = 0  # attention's sliding_window
    pool_window: int = 0
    softcap: float = 0.0
    scale: float = 0.0
    lse: bool = True
    strided: bool = False
    attend_each_round: bool = True
    persistent: bool = False  # PKV_PREPARE_PERSISTENT_TABLE plans

    @property
    def act_dt(self) -> str:
        return self.act or ("f32" if self.dtype.startswith("fp8") else self.dtype)

    def key(self) -> str:
        k = f"{self.dtype}/{self.act_dt}"
        return k + (" per-head" if self.per_head else "")


class Model:
    """One pool, its sequences and the float64 K/V history of each."""

    def __init__(self, rng, c: Case, monkeypatch):
        self.rng, self.c = rng, c
        if c.isa:
            monkeypatch.setenv("PAGEDKV_CPU_ISA", c.isa)
        else:
            monkeypatch.delenv("PAGEDKV_CPU_ISA", raising=False)
        bs = c.bs
        need = sum(-(-(a + b) // bs) for a, b in c.seqs) + len(c.seqs)
        self.num_blocks = 2 * need + 3
        kw = {}
        self.fp8 = c.dtype.startswith("fp8")
        if self.fp8:
            n = c.layers * (c.hkv if c.per_head else 1)
            # Scales around amax / format max of N(0,1) data with headroom,
            # different per layer and head (a wrong one shows).
            fmax = FP8[c.dtype][1]
            self.ks = [float(4.5 / fmax * (0.75 + 0.5 * rng.random())) for _ in range(n)]
            self.vs = [float(4.5 / fmax * (0.75 + 0.5 * rng.random())) for _ in range(n)]
            kw = dict(kv_scale_granularity="head" if c.per_head else "tensor", k_scales=self.ks, v_scales=self.vs)
        self.pool = pagedkv.Pool(
            num_blocks=self.num_blocks,
            block_size=bs,
            num_layers=c.layers,
            num_kv_heads=c.hkv,
            head_dim=c.dim,
            dtype=c.dtype,
            num_threads=c.threads,
            enable_prefix_caching=False,
            sliding_window=c.pool_window or None,
            **kw,
        )
        # Random page permutation: take every block as one-block sequences,
        # give them back in random order.
        tmp = []
        for _ in range(self.num_blocks - 1):
            s = self.pool.create_sequence()
            s.append([7] * bs)
            tmp.append(s)
        for i in rng.permutation(len(tmp)):
            tmp[i].free()
        self.seqs = [self.pool.create_sequence() for _ in c.seqs]
        self.hist_k = [[np.zeros((0, c.hkv, c.dim)) for _ in range(c.layers)] for _ in c.seqs]
        self.hist_v = [[np.zeros((0, c.hkv, c.dim)) for _ in range(c.layers)] for _ in c.seqs]

    def scale_of(self, which: int, layer: int, head: int) -> float:
        sc = self.ks if which == 0 else self.vs
        return sc[layer * self.c.hkv + head] if self.c.per_head else sc[layer]

    def step(self, chunks: List[int], check_attention: bool, decode_call: bool = False) -> None:
        """Appends chunks[i] tokens to sequence i (0 = not in the plan),
        writes every layer (checked slot by slot) and checks attention.
        decode_call: one token each through pkv_batch_prepare_decode."""
        c, rng = self.c, self.rng
        idx = [i for i, n in enumerate(chunks) if n > 0]
        plan_seqs = [self.seqs[i] for i in idx]
        if decode_call:
            assert all(chunks[i] == 1 for i in idx)
            tokens = rng.integers(1, 30000, len(idx)).astype(np.int32)
            plan = self.pool.prepare_decode(plan_seqs, tokens, persistent_table=c.persistent)
        else:
            for i in idx:
                self.seqs[i].append(rng.integers(1, 30000, chunks[i]).tolist())
            plan = self.pool.prepare(plan_seqs, [chunks[i] for i in idx], persistent_table=c.persistent)
        with plan as b:
            n = b.num_tokens
            assert n == sum(chunks[i] for i in idx)
            slots = b.plan(PlanArray.SLOT_MAPPING).numpy().copy()
            qptr = b.plan(PlanArray.QUERY_INDPTR).numpy().copy()
            pptr = b.plan(PlanArray.PAGE_INDPTR).numpy().copy()
            pidx = b.plan(PlanArray.PAGE_INDICES).numpy().copy()
            ctx = b.plan(PlanArray.CONTEXT_LENS).numpy().copy()
            pos = b.token_positions().numpy().copy()
            for r, i in enumerate(idx):
                assert ctx[r] == len(self.seqs[i])
                assert qptr[r + 1] - qptr[r] == chunks[i]
                for t in range(qptr[r], qptr[r + 1]):
                    p = pos[t]
                    assert p == ctx[r] - (qptr[r + 1] - t)
                    blk = pidx[pptr[r] + p // c.bs]
                    assert slots[t] == blk * c.bs + p % c.bs, "slot mapping disagrees with the page table"
            act = NP[c.act_dt]
            for layer in range(c.layers):
                if c.strided:  # views with padded rows and heads (innermost stride 1)
                    k = rnd(rng, (n, c.hkv + 1, c.dim + 3), act)[:, 1:, 2 : 2 + c.dim]
                    v = rnd(rng, (2 * n, c.hkv, c.dim), act)[::2]
                else:
                    k = rnd(rng, (n, c.hkv, c.dim), act)
                    v = rnd(rng, (n, c.hkv, c.dim), act)
                self.write_and_check(b, layer, k, v, slots)
                for r, i in enumerate(idx):
                    rows = slice(qptr[r], qptr[r + 1])
                    self.hist_k[i][layer] = np.concatenate([self.hist_k[i][layer], self.stored(0, layer, k[rows])])
                    self.hist_v[i][layer] = np.concatenate([self.hist_v[i][layer], self.stored(1, layer, v[rows])])
            if check_attention:
                for layer in range(c.layers):
                    self.attend_and_check(b, layer, idx, qptr, pos)

    def stored(self, which, layer, x):
        """The float64 value the cache holds for rows x of the activation dtype."""
        if not self.fp8:
            return x.astype(np.float64)
        out = np.empty(x.shape)
        for h in range(self.c.hkv):
            sc = self.scale_of(which, layer, h)
            out[:, h] = fp8_decode(fp8_encode(x[:, h], sc, self.c.dtype), self.c.dtype) * sc
        return out

    def expected_codes(self, which, layer, x):
        if not self.fp8:
            return bits(x)
        return np.stack(
            [fp8_encode(x[:, h], self.scale_of(which, layer, h), self.c.dtype) for h in range(self.c.hkv)], axis=1
        )

    def plane(self, layer, which):
        view = self.pool.kv_tensor(layer, which)
        return view.codes() if self.fp8 else bits(view.numpy())

    def write_and_check(self, b, layer, k, v, slots):
        c = self.c
        before = [[self.plane(ly, w).copy() for w in (0, 1)] for ly in range(c.layers)]
        b.cache_write(layer, k, v)
        blk, off = slots // c.bs, slots % c.bs
        for ly in range(c.layers):
            for w, x in ((0, k), (1, v)):
                after = self.plane(ly, w)
                exp = before[ly][w].copy()
                if ly == layer:
                    exp[blk, :, off, :] = self.expected_codes(w, layer, x)
                diff = np.argwhere(after != exp)
                assert diff.size == 0, (
                    f"cache_write layer {layer}: plane (layer {ly}, {'KV'[w]}) differs at "
                    f"{[tuple(d) for d in diff[:4]]} ({len(diff)} elements)"
                )
        note(f"cache_write {c.key()}", 0.0, 0.0)

    def attend_and_check(self, b, layer, idx, qptr, pos):
        c, rng = self.c, self.rng
        n = b.num_tokens
        heads = c.hkv * c.group
        act = NP[c.act_dt]
        if c.strided:
            # q, out and lse as views with padded rows (innermost stride 1).
            qb = rnd(rng, (n, heads + 1, c.dim + 8), act)
            q = qb[:, 1:, 3 : 3 + c.dim]
            ob = np.full((2 * n, heads, c.dim + 5), 1232.0, dtype=act)  # exact in every dtype
            out = ob[::2, :, 2 : 2 + c.dim]
            lb = np.full((n, heads + 3), 777.0, dtype=np.float32)
            lse = lb[:, :heads] if c.lse else None
        else:
            q = rnd(rng, (n, heads, c.dim), act)
            out, lse = None, (True if c.lse else None)
        qcopy = q.copy()
        res = b.attention(
            layer, q, out, lse=lse, softmax_scale=c.scale, sliding_window=c.window, logit_softcap=c.softcap
        )
        got, got_lse = res if c.lse else (res, None)
        assert np.array_equal(bits(q), bits(qcopy)), "attention changed q"
        if c.strided:
            assert got is out
            mask = np.ones(ob.shape, bool)
            mask[::2, :, 2 : 2 + c.dim] = False
            assert (ob[mask].astype(np.float32) == 1232.0).all(), "attention wrote outside out's view"
            if c.lse:
                assert (lb[:, heads:] == 777.0).all(), "attention wrote outside lse's view"
        scale = c.scale or 1.0 / math.sqrt(c.dim)
        fam = f"attention {c.key()}"
        for r, i in enumerate(idx):
            rows = slice(qptr[r], qptr[r + 1])
            ro, rl, eb, lb_ = ref_attention(
                q[rows].astype(np.float64),
                self.hist_k[i][layer],
                self.hist_v[i][layer],
                pos[rows],
                scale=scale,
                window=c.window,
                softcap=c.softcap,
            )
            check_out(fam, got[rows], ro, eb, c.act_dt)
            if c.lse:
                gl = np.asarray(got_lse[rows], dtype=np.float64)
                err = np.abs(gl - rl)
                assert (err <= lb_).all(), f"{fam}: lse off by {err.max()} (bound {lb_[err > lb_].min()})"
                note("lse", float((err / lb_).max()), float(err.max()))


def run_case(rng, c: Case, monkeypatch) -> None:
    m = Model(rng, c, monkeypatch)
    try:
        # Context: chunked prefill rounds, sequences interleaved (their pages
        # mix), each round a mixed plan checked like the last.
        left = [a for a, _ in c.seqs]
        while any(left):
            chunks = []
            for a in left:
                take = 0 if a == 0 or rng.random() < 0.25 else int(rng.integers(1, a + 1))
                chunks.append(take)
            if not any(chunks):
                j = int(np.argmax(left))
                chunks[j] = left[j]
            left = [a - t for a, t in zip(left, chunks)]
            m.step(chunks, c.attend_each_round)
        m.step([b for _, b in c.seqs], True)
        m.pool.validate()
    finally:
        m.pool.close()


# ----------------------------------------------------------------- the matrix

MIX = [(0, 7), (37, 1), (16, 3), (5, 1), (50, 12)]  # contexts ending mid-block, decode + chunks


def base_cases() -> List[Case]:
    cs: List[Case] = []
    # Head dims, odd ones included (scalar fallback when not a vector multiple).
    # (The bf16 dot-product path needs D % 32 == 0, the paired loads D % 16.)
    for d in (64, 80, 96, 112, 128, 192, 256, 72, 40, 7):
        for dt, act in (("f32", ""), ("bf16", ""), ("fp8_e4m3", "bf16")):
            cs.append(Case(dim=d, bs=16, hkv=2, group=2, dtype=dt, act=act, seqs=MIX, layers=1))
    # Block sizes.
    for bs in (1, 2, 3, 8, 32, 64):
        for dt, act in (("bf16", ""), ("f32", ""), ("fp8_e5m2", "f16")):
            cs.append(Case(dim=64, bs=bs, hkv=2, group=2, dtype=dt, act=act, seqs=MIX, layers=1))
    # GQA ratios, MQA.
    for hkv, g in ((4, 1), (2, 2), (2, 4), (1, 8), (1, 16), (1, 5)):
        cs.append(Case(dim=64, bs=8, hkv=hkv, group=g, dtype="f16", seqs=MIX, layers=1))
    # Dtypes x ISA.
    for dt in ("f32", "f16", "bf16"):
        for isa in ("scalar", "avx2"):
            cs.append(Case(dim=128, bs=16, hkv=2, group=4, dtype=dt, isa=isa, seqs=MIX))
    # FP8: formats x activation dtype x granularity x ISA.
    for fmt in ("fp8_e4m3", "fp8_e5m2"):
        for act in ("f32", "f16", "bf16"):
            for isa in ("scalar", "avx2"):
                cs.append(
                    Case(dim=64, bs=16, hkv=2, group=2, dtype=fmt, act=act, per_head=act != "f16", isa=isa, seqs=MIX)
                )
    # Options: window smaller than a block, equal, larger than the context; soft-cap; scale.
    for w in (3, 16, 1000):
        cs.append(Case(dim=64, bs=16, hkv=2, group=2, dtype="bf16", window=w, seqs=MIX, layers=1))
    cs.append(Case(dim=96, bs=8, hkv=2, group=3, dtype="f32", softcap=5.0, scale=0.3, seqs=MIX, layers=1))
    cs.append(Case(dim=128, bs=16, hkv=1, group=4, dtype="bf16", softcap=30.0, window=20, seqs=MIX, layers=1))
    cs.append(Case(dim=64, bs=16, hkv=2, group=2, dtype="fp8_e4m3", act="bf16", softcap=8.0, window=9, seqs=MIX))
    # A pool with a window (released blocks become the null block).
    cs.append(Case(dim=64, bs=4, hkv=2, group=2, dtype="f16", pool_window=10, window=10, seqs=[(60, 1), (45, 6)]))
    cs.append(Case(dim=64, bs=4, hkv=2, group=2, dtype="f32", pool_window=12, window=5, seqs=[(60, 3), (0, 20)]))
    # Threads, and long contexts that split across threads (merge path).
    for isa in ("scalar", "avx2"):
        for dt in ("bf16", "f32"):
            cs.append(
                Case(
                    dim=128,
                    bs=16,
                    hkv=1,
                    group=2,
                    dtype=dt,
                    threads=2,
                    isa=isa,
                    layers=1,
                    seqs=[(1500, 1), (1100, 3)],
                    attend_each_round=False,
                )
            )
    cs.append(
        Case(
            dim=64,
            bs=16,
            hkv=2,
            group=2,
            dtype="fp8_e5m2",
            threads=2,
            layers=1,
            seqs=[(1300, 1)],
            attend_each_round=False,
            window=700,
        )
    )
    cs.append(Case(dim=64, bs=16, hkv=2, group=2, dtype="f16", threads=2, seqs=MIX))
    for isa in ("scalar", "avx2"):  # a windowed prefill tile split along its context
        cs.append(
            Case(
                dim=64,
                bs=16,
                hkv=1,
                group=2,
                dtype="bf16",
                threads=2,
                isa=isa,
                layers=1,
                window=1100,
                softcap=10.0,
                seqs=[(2100, 6)],
                attend_each_round=False,
            )
        )
    # Strided q / out / lse views.
    for dt in ("f32", "bf16", "fp8_e5m2"):
        cs.append(Case(dim=64, bs=8, hkv=2, group=2, dtype=dt, strided=True, seqs=MIX, layers=1))
    cs.append(Case(dim=64, bs=8, hkv=2, group=2, dtype="f16", lse=False, seqs=MIX, layers=1))
    # Extremes of the documented ranges (head_dim 1..4096, block_size 1..1024),
    # a tiny soft-cap, a window of one token, many query heads per KV head.
    cs.append(Case(dim=4096, bs=2, hkv=1, group=2, dtype="bf16", seqs=[(5, 1), (0, 3)]))
    cs.append(Case(dim=1, bs=1024, hkv=2, group=1, dtype="f32", seqs=[(1030, 2), (3, 1)], layers=1))
    cs.append(
        Case(
            dim=16,
            bs=1024,
            hkv=1,
            group=3,
            dtype="fp8_e4m3",
            act="f16",
            seqs=[(1100, 5)],
            layers=1,
            threads=2,
            attend_each_round=False,
        )
    )
    cs.append(Case(dim=64, bs=16, hkv=2, group=2, dtype="f32", softcap=1e-3, window=1, seqs=MIX, layers=1))
    cs.append(Case(dim=32, bs=8, hkv=1, group=64, dtype="bf16", seqs=MIX, layers=1))
    # Persistent (padded-row) page tables.
    for dt in ("bf16", "fp8_e4m3"):
        cs.append(Case(dim=64, bs=4, hkv=2, group=2, dtype=dt, persistent=True, seqs=MIX))
    return cs


def random_case(rng) -> Case:
    dt = str(rng.choice(["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"]))
    hkv = int(rng.choice([1, 2, 3, 4]))
    seqs = [(int(rng.integers(0, 120)), int(rng.integers(1, 20))) for _ in range(int(rng.integers(1, 6)))]
    return Case(
        dim=int(rng.choice([8, 16, 24, 40, 64, 72, 80, 96, 112, 128, 160, 192, 256, 3, 33])),
        bs=int(rng.choice([1, 2, 3, 5, 8, 16, 32, 64])),
        hkv=hkv,
        group=int(rng.choice([1, 2, 3, 4, 8])),
        dtype=dt,
        act=str(rng.choice(["f32", "f16", "bf16"])) if dt.startswith("fp8") else "",
        per_head=bool(rng.random() < 0.5),
        layers=int(rng.integers(1, 3)),
        threads=int(rng.integers(1, 3)),
        isa=str(rng.choice(["scalar", "avx2", ""])),
        seqs=seqs,
        window=int(rng.choice([0, 0, 1, 5, 17, 64])),
        softcap=float(rng.choice([0.0, 0.0, 2.0, 20.0])),
        scale=float(rng.choice([0.0, 0.0, 0.05, 0.5])),
        lse=bool(rng.random() < 0.7),
        strided=bool(rng.random() < 0.3),
        persistent=bool(rng.random() < 0.3),
    )


CASES = base_cases()


@pytest.mark.parametrize("ci", range(len(CASES)), ids=lambda i: f"c{i}")
def test_differential(ci, monkeypatch):
    rng = np.random.default_rng(1000 + ci + int(os.environ.get("PAGEDKV_TEST_SEED", "0")))
    run_case(rng, CASES[ci], monkeypatch)


@pytest.mark.parametrize("si", range(60 if LONG else 4))
def test_differential_random(si, monkeypatch):
    rng = np.random.default_rng(5000 + si + int(os.environ.get("PAGEDKV_TEST_SEED", "0")))
    c = random_case(rng)
    if c.window and rng.random() < 0.3:  # a windowed pool: released blocks become the null block
        c.pool_window = c.window + int(rng.integers(0, 3))
    print(c)
    run_case(rng, c, monkeypatch)


# ----------------------------------------------------------------- misuse

from pagedkv import _pagedkv as _c  # noqa: E402

DT_CODE = {"f32": 1, "f16": 2, "bf16": 3}


def ctuple(a: np.ndarray, **over):
    """A raw pkv_tensor tuple over numpy array a (strides in elements),
    fields overridable: the library's own checks, past the package's."""
    t = dict(
        data=a.__array_interface__["data"][0],
        byte_offset=0,
        dtype=DT_CODE[{np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", NP["bf16"]: "bf16"}[a.dtype]],
        device_type=1,
        device_id=0,
        shape=tuple(a.shape),
        strides=tuple(s // a.itemsize for s in a.strides),
    )
    t.update(over)
    return (t["data"], t["byte_offset"], t["dtype"], t["device_type"], t["device_id"], t["shape"], t["strides"])


def raw_attention(b, layer, q, out, lse=None, params=None):
    p = {"softmax_scale": 0.0, "sliding_window": 0, "logit_softcap": 0.0}
    p.update(params or {})
    return b._call(_c.pkv_attention_forward, layer, q, out, lse, p, 0)


def raw_write(b, layer, k, v):
    return b._call(_c.pkv_cache_write, layer, k, v, 0)


class Fixture:
    """A bf16 pool (GQA 2) with two sequences: one committed step of
    context, then a plan with a prefill chunk and a decode."""

    def __init__(self, monkeypatch, dtype="bf16", pool_window=0):
        self.rng = np.random.default_rng(77)
        self.c = Case(
            dim=64,
            bs=8,
            hkv=2,
            group=2,
            dtype=dtype,
            layers=2,
            seqs=[(13, 5), (20, 1)],
            pool_window=pool_window,
            window=pool_window,
        )
        self.m = Model(self.rng, self.c, monkeypatch)
        self.m.step([13, 20], False)
        for i, n in enumerate((5, 1)):
            self.m.seqs[i].append(list(range(1, n + 1)))
        self.b = self.m.pool.prepare(self.m.seqs, [5, 1])
        self.n = self.b.num_tokens
        act = NP[self.c.act_dt]
        self.k = rnd(self.rng, (self.n, 2, 64), act)
        self.v = rnd(self.rng, (self.n, 2, 64), act)
        self.q = rnd(self.rng, (self.n, 4, 64), act)

    def write_all(self):
        slots = self.b.plan(PlanArray.SLOT_MAPPING).numpy().copy()
        qptr = self.b.plan(PlanArray.QUERY_INDPTR).numpy().copy()
        for layer in range(2):
            self.m.write_and_check(self.b, layer, self.k, self.v, slots)
            for r, i in enumerate((0, 1)):
                rows = slice(qptr[r], qptr[r + 1])
                self.m.hist_k[i][layer] = np.concatenate(
                    [self.m.hist_k[i][layer], self.m.stored(0, layer, self.k[rows])]
                )
                self.m.hist_v[i][layer] = np.concatenate(
                    [self.m.hist_v[i][layer], self.m.stored(1, layer, self.v[rows])]
                )

    def check_good(self, layer=0):
        qptr = self.b.plan(PlanArray.QUERY_INDPTR).numpy().copy()
        pos = self.b.token_positions().numpy().copy()
        self.m.attend_and_check(self.b, layer, [0, 1], qptr, pos)

    def snapshot(self):
        return [[self.m.plane(ly, w).copy() for w in (0, 1)] for ly in range(2)]


def expect_error(exc, fn, *args, what=None):
    with pytest.raises(exc) as ei:
        fn(*args)
    msg = str(ei.value)
    assert len(msg) > 12, f"unclear message: {msg!r}"
    if what:
        assert what in msg, f"message {msg!r} does not name {what!r}"
    return msg


def test_misuse_attention_descriptors(monkeypatch):
    f = Fixture(monkeypatch)
    f.write_all()
    b, q = f.b, f.q
    n = f.n
    out = np.full((n, 4, 64), 3.0, dtype=q.dtype)
    sentinel = out.copy()
    storage = f.snapshot()
    q16 = q.astype(np.float16)
    o16 = np.zeros((n, 4, 64), np.float16)
    bad = [
        ("q dtype", ctuple(q16), ctuple(o16), None, {}, "q"),
        ("out dtype", ctuple(q), ctuple(o16), None, {}, "out"),
        ("q head_dim", ctuple(q[:, :, :32]), ctuple(out[:, :, :32]), None, {}, "q"),
        ("q heads", ctuple(q[:, :3]), ctuple(out[:, :3]), None, {}, "q"),
        ("q rows short", ctuple(q[: n - 1]), ctuple(out[: n - 1]), None, {}, "q"),
        ("out shape", ctuple(q), ctuple(out[:, :2]), None, {}, "out"),
        ("q inner stride", ctuple(q, shape=(n, 4, 32), strides=(256, 64, 2)), ctuple(out[:, :, :32]), None, {}, "q"),
        ("q negative stride", ctuple(q, strides=(-256, 64, 1)), ctuple(out), None, {}, "q"),
        ("out broadcast rows", ctuple(q), ctuple(out, strides=(0, 64, 1)), None, {}, "out"),
        ("out aliases q", ctuple(q), ctuple(q), None, {}, "out"),
        ("out overlaps q", ctuple(q), ctuple(q, byte_offset=128), None, {}, "out"),
        ("misaligned q", ctuple(q, byte_offset=1), ctuple(out), None, {}, "q"),
        ("q huge extent", ctuple(q, shape=(n, 4, 64), strides=(2**60, 64, 1)), ctuple(out), None, {}, "q"),
        ("lse dtype", ctuple(q), ctuple(out), ctuple(np.zeros((n, 4), np.float16)), {}, "lse"),
        ("lse shape", ctuple(q), ctuple(out), ctuple(np.zeros((n, 3), np.float32)), {}, "lse"),
        (
            "lse overlaps out",
            ctuple(q),
            ctuple(out),
            ctuple(out.view(np.uint16)[:, :, :8].view(np.float32)[:, :, 0]),
            {},
            "lse",
        ),
        ("scale NaN", ctuple(q), ctuple(out), None, {"softmax_scale": float("nan")}, None),
        ("scale negative", ctuple(q), ctuple(out), None, {"softmax_scale": -1.0}, None),
        ("scale inf", ctuple(q), ctuple(out), None, {"softmax_scale": float("inf")}, None),
        ("softcap negative", ctuple(q), ctuple(out), None, {"logit_softcap": -1.0}, None),
        ("softcap NaN", ctuple(q), ctuple(out), None, {"logit_softcap": float("nan")}, None),
        ("softcap inf", ctuple(q), ctuple(out), None, {"logit_softcap": float("inf")}, None),
        ("window absurd", ctuple(q), ctuple(out), None, {"sliding_window": 2**32 - 1}, None),
    ]
    msgs = {}
    for name, qt, ot, lt, params, what in bad:
        with pytest.raises(pagedkv.InvalidArgumentError) as ei:
            raw_attention(b, 0, qt, ot, lt, params)
        msgs[name] = str(ei.value)
        assert len(msgs[name]) > 12, (name, msgs[name])
        if what:
            assert what in msgs[name], (name, msgs[name])
        assert np.array_equal(bits(out), bits(sentinel)), f"{name}: out changed"
    # The pool's storage as out: refused, storage unchanged.
    kview = f.m.pool.kv_tensor(0, "k").numpy()
    with pytest.raises(pagedkv.InvalidArgumentError):
        raw_attention(b, 0, ctuple(q), ctuple(kview.reshape(-1)[: n * 256].reshape(n, 4, 64)))
    with pytest.raises(pagedkv.InvalidArgumentError):
        raw_attention(b, 2, ctuple(q), ctuple(out))
    with pytest.raises(pagedkv.InvalidArgumentError):
        raw_attention(b, 2**32 - 1, ctuple(q), ctuple(out))
    after = f.snapshot()
    for ly in range(2):
        for w in range(2):
            assert np.array_equal(after[ly][w], storage[ly][w])
    f.m.pool.validate()
    f.check_good(0)
    f.check_good(1)
    b.close()
    f.m.pool.close()


def test_scale_that_rounds_to_zero_is_refused(monkeypatch):
    # A Python float below the smallest C float would reach the library as 0,
    # which means "the default 1/sqrt(head_dim)": the binding refuses it.
    f = Fixture(monkeypatch)
    f.write_all()
    out = np.full((f.n, 4, 64), 3.0, dtype=f.q.dtype)
    sentinel = out.copy()
    for kw in ({"softmax_scale": 1e-50}, {"logit_softcap": -1e-60}):
        with pytest.raises(pagedkv.InvalidArgumentError, match=next(iter(kw))):
            f.b.attention(0, f.q, out, **kw)
        assert np.array_equal(bits(out), bits(sentinel))
    f.b.attention(0, f.q, out, softmax_scale=1e-30)  # tiny but a C float: accepted
    f.b.close()
    f.m.pool.close()


def test_scale_beyond_the_largest_c_float_is_refused_naming_it(monkeypatch):
    # A finite Python float above FLT_MAX never reached the library's check:
    # SWIG's setter refused it as "in method
    # 'pkv_attention_params_softmax_scale_set', argument 2 of type 'float'".
    f = Fixture(monkeypatch)
    f.write_all()
    out = np.full((f.n, 4, 64), 3.0, dtype=f.q.dtype)
    sentinel = out.copy()
    for kw in ({"softmax_scale": 1e40}, {"logit_softcap": 3.5e38}, {"logit_softcap": -1e300}):
        name = next(iter(kw))
        with pytest.raises(pagedkv.InvalidArgumentError, match=f"^{name} = .* largest C float") as ei:
            f.b.attention(0, f.q, out, **kw)
        assert "pkv_attention_params" not in str(ei.value)
        assert np.array_equal(bits(out), bits(sentinel))
    f.b.attention(0, f.q, out, softmax_scale=3.4028234663852886e38)  # FLT_MAX itself: a C float
    f.b.close()
    f.m.pool.close()
    with pagedkv.Pool(
        num_blocks=8, block_size=4, num_layers=1, dtype="f32", kv_layout="mla", kv_lora_rank=16, qk_rope_head_dim=8
    ) as pool:
        seq = pool.create_sequence()
        seq.append([1, 2, 3])
        with pool.prepare([seq], 3) as b:
            b.mla_cache_write(0, np.ones((3, 16), np.float32), np.ones((3, 8), np.float32))
            q, q_pe = np.ones((3, 2, 16), np.float32), np.ones((3, 2, 8), np.float32)
            with pytest.raises(pagedkv.InvalidArgumentError, match=r"^softmax_scale = 1e\+40 .*largest C float"):
                pagedkv.mla.attention(b, 0, q, q_pe, softmax_scale=1e40)


def test_misuse_cache_write(monkeypatch):
    f = Fixture(monkeypatch)
    b, k, v, n = f.b, f.k, f.v, f.n
    storage = f.snapshot()
    kview = f.m.pool.kv_tensor(0, "k").numpy()
    bad = [
        ("k dtype", ctuple(k.astype(np.float16)), ctuple(v), "k"),
        ("v dtype", ctuple(k), ctuple(v.astype(np.float32)), "v"),
        ("k shape", ctuple(k[:, :1]), ctuple(v), "k"),
        ("v rows", ctuple(k), ctuple(v[:-1]), "v"),
        ("k inner stride", ctuple(k, shape=(n, 2, 32), strides=(128, 64, 2)), ctuple(v), "k"),
        ("misaligned v", ctuple(k), ctuple(v, byte_offset=1), "v"),
        ("k in layer storage", ctuple(kview.reshape(-1)[: n * 128].reshape(n, 2, 64)), ctuple(v), "k"),
    ]
    for name, kt, vt, what in bad:
        with pytest.raises(pagedkv.InvalidArgumentError) as ei:
            raw_write(b, 0, kt, vt)
        msg = str(ei.value)
        assert what in msg and len(msg) > 12, (name, msg)
        after = f.snapshot()
        for ly in range(2):
            for w in range(2):
                assert np.array_equal(after[ly][w], storage[ly][w]), f"{name}: storage changed"
    with pytest.raises(pagedkv.InvalidArgumentError):
        raw_write(b, 2, ctuple(k), ctuple(v))
    # Nothing was committed by the failures: the context past 13 / 20 is unwritten.
    assert f.m.seqs[0].num_computed_tokens == 13 and f.m.seqs[1].num_computed_tokens == 20
    f.write_all()
    assert f.m.seqs[0].num_computed_tokens == 18 and f.m.seqs[1].num_computed_tokens == 21
    f.check_good(0)
    f.check_good(1)
    b.close()
    f.m.pool.close()


@pytest.mark.parametrize("dtype", ["bf16", "f32", "fp8_e4m3"])
def test_nonfinite_q_stays_in_its_row(dtype, monkeypatch):
    f = Fixture(monkeypatch, dtype=dtype)
    f.write_all()
    qptr = f.b.plan(PlanArray.QUERY_INDPTR).numpy().copy()
    pos = f.b.token_positions().numpy().copy()
    for bad in (np.nan, np.inf, -np.inf):
        q = f.q.copy()
        q[2, 1, 5] = bad  # token 2 (sequence 0's third query), head 1
        out, lse = f.b.attention(0, q, lse=True)
        for r, i in enumerate((0, 1)):
            rows = slice(qptr[r], qptr[r + 1])
            ro, _, eb, _ = ref_attention(
                q[rows].astype(np.float64),
                f.m.hist_k[i][0],
                f.m.hist_v[i][0],
                pos[rows],
                scale=1 / 8,
                window=0,
                softcap=0.0,
            )
            got = np.asarray(out[rows], np.float64)
            ok = np.ones(got.shape, bool)
            if r == 0:
                ok[2, 1] = False  # the row with the non-finite q
            u = U_OUT[f.c.act_dt]
            bound = eb * (1 + 2 * u) + u * np.abs(ro)
            assert np.isfinite(got[ok]).all(), f"{bad}: a non-finite q leaked into other rows"
            assert (np.abs(got - ro)[ok] <= bound[ok]).all(), f"{bad}: other rows wrong"
        lse = np.asarray(lse)
        assert np.isfinite(np.delete(lse.reshape(-1), 2 * 4 + 1)).all(), f"{bad}: a non-finite q leaked into other LSEs"
        if np.isnan(bad):
            # IEEE (and the reference): NaN, not the zeros and -inf LSE of a row that saw no key.
            assert np.isnan(np.asarray(out[2, 1], np.float64)).all() and np.isnan(lse[2, 1])
    f.b.close()
    f.m.pool.close()


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32", "fp8_e5m2"])
@pytest.mark.parametrize("isa", ["scalar", "avx2"])
def test_nonfinite_kv_seen_only_by_rows_that_see_it(dtype, isa, monkeypatch):
    """A NaN or Inf K/V at position p reaches only queries whose window
    holds p: causal rows before p, and rows whose window ended, stay exact."""
    rng = np.random.default_rng(3)
    c = Case(dim=64, bs=4, hkv=1, group=2, dtype=dtype, layers=1, isa=isa, seqs=[(0, 23)])
    m = Model(rng, c, monkeypatch)
    try:
        m.seqs[0].append(list(range(1, 24)))
        with m.pool.prepare(m.seqs, [23]) as b:
            act = NP[c.act_dt]
            k = rnd(rng, (23, 1, 64), act)
            v = rnd(rng, (23, 1, 64), act)
            k[9, 0, 3] = np.nan
            v[14, 0, 7] = np.inf
            b.cache_write(0, k, v)
            hk, hv = m.stored(0, 0, k), m.stored(1, 0, v)
            q = rnd(rng, (23, 2, 64), act)
            for window in (0, 4):
                out = np.asarray(b.attention(0, q, sliding_window=window), np.float64)
                ro, _, eb, _ = ref_attention(
                    q.astype(np.float64),
                    np.nan_to_num(hk),
                    np.nan_to_num(hv, posinf=0),
                    np.arange(23),
                    scale=1 / 8,
                    window=window,
                    softcap=0.0,
                )
                clean = np.array([p < 9 or (window and p >= 9 + window) for p in range(23)])
                clean_v = np.array([p < 14 or (window and p >= 14 + window) for p in range(23)])
                rows = clean & clean_v
                u = U_OUT[c.act_dt]
                bound = eb * (1 + 2 * u) + u * np.abs(ro)
                assert np.isfinite(out[rows]).all(), f"window {window}: NaN/Inf leaked to rows that cannot see it"
                assert (np.abs(out[rows] - ro[rows]) <= bound[rows]).all()
                # A visible NaN key makes its rows NaN (attention.cpp finish_row: NaN l stays NaN).
                assert np.isnan(out[~clean]).all(), f"window {window}: rows seeing a NaN key are not NaN"
    finally:
        m.pool.close()


def test_stale_plan_and_destroyed_pool(monkeypatch):
    f = Fixture(monkeypatch)
    f.write_all()
    out = np.full((f.n, 4, 64), 5.0, dtype=f.q.dtype)
    f.check_good(0)
    # A sequence appended to after prepare: the plan is stale.
    f.m.seqs[1].append([9])
    storage = f.snapshot()
    expect_error(pagedkv.InvalidStateError, f.b.attention, 0, f.q, out)
    expect_error(pagedkv.InvalidStateError, f.b.cache_write, 0, f.k, f.v)
    assert (np.asarray(out, np.float32) == 5.0).all()
    after = f.snapshot()
    assert all(np.array_equal(after[ly][w], storage[ly][w]) for ly in range(2) for w in range(2))
    f.b.close()
    # A plan over a truncated / freed sequence is stale too.
    with f.m.pool.prepare([f.m.seqs[0]], [1]) as b2:
        f.m.seqs[0].truncate(len(f.m.seqs[0]) - 1)
        expect_error(pagedkv.InvalidStateError, b2.attention, 0, f.q[:1])
    # A destroyed pool: the plan fails cleanly.
    f.m.seqs[0].append([4])
    b3 = f.m.pool.prepare([f.m.seqs[0]], [1])
    f.m.pool.close()
    q1 = f.q[:1].copy()
    o1 = np.full((1, 4, 64), 6.0, dtype=q1.dtype)
    expect_error(pagedkv.InvalidStateError, b3.attention, 0, q1, o1)
    expect_error(pagedkv.InvalidStateError, b3.cache_write, 0, f.k[:1], f.v[:1])
    assert (np.asarray(o1, np.float32) == 6.0).all()
    b3.close()


def test_window_params_on_windowed_pool(monkeypatch):
    f = Fixture(monkeypatch, pool_window=16)
    f.write_all()
    for w in (0, 17, 2**31):
        with pytest.raises(pagedkv.InvalidArgumentError) as ei:
            f.b.attention(0, f.q, sliding_window=w)
        assert "window" in str(ei.value), str(ei.value)
    f.c.window = 16
    f.check_good(0)
    f.c.window = 3
    f.check_good(1)
    f.b.close()
    f.m.pool.close()


# ----------------------------------------------------------------- MLA


def ref_mla(ql, qp, c_lat, pe, positions, scale):
    x = scale * (ein("ihr,jr->hij", ql, c_lat) + ein("ihr,jr->hij", qp, pe))
    absdot = scale * (ein("ihr,jr->hij", np.abs(ql), np.abs(c_lat)) + ein("ihr,jr->hij", np.abs(qp), np.abs(pe)))
    vis = np.arange(c_lat.shape[0])[None, :] <= np.asarray(positions)[:, None]
    xm = np.where(vis[None], x, -np.inf)
    mx = xm.max(axis=2, keepdims=True)
    w = np.exp(xm - mx)
    s = w.sum(axis=2, keepdims=True)
    out = ein("hij,jr->ihr", w / s, c_lat)
    lse = (mx + np.log(s))[..., 0].T
    dim = ql.shape[2] + qp.shape[2]
    dx = np.where(vis[None], gamma(dim + 3) * absdot + EXP_REL, 0).max(axis=2)  # [H, nq]
    length = int(np.max(positions)) + 1
    vmax = np.array([np.abs(c_lat[: p + 1]).max(axis=0) for p in positions])  # [nq, R]
    eb = (2 * dx.T[..., None] + 2 * gamma(length + 2)) * vmax[:, None, :]
    lb = dx.T + 2 * gamma(length + 2) + 4 * U32 * (1 + np.abs(lse))
    return out, lse, eb, lb


MLA_CASES = [
    # (dtype, rank, rope, bs, heads, threads, isa, seqs)
    ("f32", 64, 16, 16, 4, 1, "", [(0, 9), (37, 1), (20, 4)]),
    ("bf16", 128, 32, 8, 3, 2, "avx2", [(0, 9), (37, 1), (20, 4)]),
    ("f16", 96, 8, 3, 16, 1, "scalar", [(11, 2), (5, 1)]),
    ("bf16", 512, 64, 64, 2, 2, "", [(1200, 1), (70, 5)]),
    ("f32", 40, 0, 1, 1, 1, "avx2", [(9, 3)]),
    ("bf16", 72, 24, 16, 8, 1, "scalar", [(30, 1), (0, 6)]),
]


@pytest.mark.parametrize("mi", range(len(MLA_CASES)))
def test_mla_differential(mi, monkeypatch):
    dt, rank, rope, bs, heads, threads, isa, seqs = MLA_CASES[mi]
    if isa:
        monkeypatch.setenv("PAGEDKV_CPU_ISA", isa)
    else:
        monkeypatch.delenv("PAGEDKV_CPU_ISA", raising=False)
    rng = np.random.default_rng(900 + mi)
    act = NP[dt]
    need = sum(-(-(a + b) // bs) for a, b in seqs) + len(seqs)
    nb = 2 * need + 3
    pool = pagedkv.Pool(
        num_blocks=nb,
        block_size=bs,
        num_layers=2,
        dtype=dt,
        kv_layout="mla",
        kv_lora_rank=rank,
        qk_rope_head_dim=rope,
        num_threads=threads,
        enable_prefix_caching=False,
    )
    try:
        tmp = []
        for _ in range(nb - 1):
            s = pool.create_sequence()
            s.append([7] * bs)
            tmp.append(s)
        for i in rng.permutation(len(tmp)):
            tmp[i].free()
        ss = [pool.create_sequence() for _ in seqs]
        hist = [[np.zeros((0, rank + rope)) for _ in range(2)] for _ in seqs]
        scale = float(0.5 / math.sqrt(rank + rope) * (1 + rng.random()))
        for counts in ([a for a, _ in seqs], [b for _, b in seqs]):
            idx = [i for i, n in enumerate(counts) if n > 0]
            if not idx:
                continue
            for i in idx:
                ss[i].append(rng.integers(1, 999, counts[i]).tolist())
            with pool.prepare([ss[i] for i in idx], [counts[i] for i in idx]) as b:
                n = b.num_tokens
                slots = b.plan(PlanArray.SLOT_MAPPING).numpy().copy()
                qptr = b.plan(PlanArray.QUERY_INDPTR).numpy().copy()
                pos = b.token_positions().numpy().copy()
                for layer in range(2):
                    before = [bits(pool.kv_tensor(ly, "k").numpy()).copy() for ly in range(2)]
                    kvc = rnd(rng, (n, rank), act)
                    kpe = rnd(rng, (n, rope), act)
                    b.mla_cache_write(layer, kvc, kpe)
                    for ly in range(2):
                        exp = before[ly].copy()
                        if ly == layer:
                            exp[slots // bs, slots % bs] = bits(np.concatenate([kvc, kpe], axis=1))
                        assert np.array_equal(bits(pool.kv_tensor(ly, "k").numpy()), exp), "mla cache write"
                    full = np.concatenate([kvc, kpe], axis=1).astype(np.float64)
                    for r, i in enumerate(idx):
                        hist[i][layer] = np.concatenate([hist[i][layer], full[qptr[r] : qptr[r + 1]]])
                for layer in range(2):
                    ql = rnd(rng, (n, heads, rank), act)
                    qp = rnd(rng, (n, heads, rope), act)
                    out, lse = b.mla_attention(layer, ql, qp, softmax_scale=scale, lse=True)
                    for r, i in enumerate(idx):
                        rows = slice(qptr[r], qptr[r + 1])
                        h = hist[i][layer]
                        ro, rl, eb, lb = ref_mla(
                            ql[rows].astype(np.float64),
                            qp[rows].astype(np.float64),
                            h[:, :rank],
                            h[:, rank:],
                            pos[rows],
                            scale,
                        )
                        check_out(f"mla {dt}", out[rows], ro, eb, dt)
                        err = np.abs(np.asarray(lse[rows], np.float64) - rl)
                        assert (err <= lb).all(), f"mla lse off by {err.max()}"
                        note("mla lse", float((err / lb).max()), float(err.max()))
        pool.validate()
    finally:
        pool.close()


@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("isa", ["scalar", "avx2"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_mla_nonfinite_latent_seen_only_by_later_rows(dt, isa, bad, monkeypatch):
    """Causality (batch.h: each query attends over tokens up to itself): a
    NaN or Inf latent at position p may not reach the outputs of queries
    before p in the same prefill, as for pkv_attention_forward."""
    monkeypatch.setenv("PAGEDKV_CPU_ISA", isa)
    rng = np.random.default_rng(11)
    act = NP[dt]
    rank, rope, n = 32, 16, 12
    with pagedkv.Pool(
        num_blocks=8,
        block_size=16,
        num_layers=1,
        dtype=dt,
        kv_layout="mla",
        kv_lora_rank=rank,
        qk_rope_head_dim=rope,
        num_threads=1,
    ) as pool:
        s = pool.create_sequence()
        s.append(list(range(1, n + 1)))
        with pool.prepare([s], [n]) as b:
            kvc = rnd(rng, (n, rank), act)
            kpe = rnd(rng, (n, rope), act)
            kvc[7, 3] = bad
            b.mla_cache_write(0, kvc, kpe)
            ql = rnd(rng, (n, 2, rank), act)
            qp = rnd(rng, (n, 2, rope), act)
            out = np.asarray(b.mla_attention(0, ql, qp, softmax_scale=0.1), np.float64)
            ro, _, eb, _ = ref_mla(
                ql[:7].astype(np.float64),
                qp[:7].astype(np.float64),
                kvc[:7].astype(np.float64),
                kpe[:7].astype(np.float64),
                np.arange(7),
                0.1,
            )
            assert np.isfinite(out[:7]).all(), (
                f"a non-finite latent at position 7 reached rows {sorted(set(np.argwhere(~np.isfinite(out[:7]))[:, 0]))}"
            )
            check_out(f"mla {dt}", out[:7], ro, eb, dt)


@pytest.mark.parametrize("isa", ["scalar", "avx2"])
def test_nonfinite_q_split_context(isa, monkeypatch):
    """Two threads split a long decode along its context and merge the
    parts (attention.cpp merge): a NaN query row stays NaN there too, the
    other head exact."""
    rng = np.random.default_rng(5)
    c = Case(
        dim=64,
        bs=16,
        hkv=1,
        group=2,
        dtype="f32",
        layers=1,
        threads=2,
        isa=isa,
        seqs=[(1400, 1)],
        attend_each_round=False,
    )
    m = Model(rng, c, monkeypatch)
    try:
        m.step([1400], False)
        m.step([1], False)
        m.seqs[0].append([3])
        with m.pool.prepare(m.seqs, [1]) as b:
            k = rnd(rng, (1, 1, 64), np.float32)
            b.cache_write(0, k, k.copy())
            hk = np.concatenate([m.hist_k[0][0], k.astype(np.float64)])
            hv = np.concatenate([m.hist_v[0][0], k.astype(np.float64)])
            q = rnd(rng, (1, 2, 64), np.float32)
            q[0, 0, 9] = np.nan
            out, lse = b.attention(0, q, lse=True)
            assert np.isnan(out[0, 0]).all() and np.isnan(lse[0, 0]), "a NaN query gave a finite row"
            ro, _, eb, _ = ref_attention(
                q[:, 1:].astype(np.float64), hk, hv, [1401], scale=1 / 8, window=0, softcap=0.0
            )
            check_out("attention split f32", out[:, 1:], ro, eb, "f32")
    finally:
        m.pool.close()


@pytest.mark.parametrize("isa", ["scalar", "avx2"])
def test_visible_nan_key_anywhere_in_the_first_step_gives_nan(isa, monkeypatch):
    """A NaN key a decode query sees makes its row NaN wherever the key sits
    in the online softmax's first step (the vector max may or may not carry
    the NaN), never a finite output that silently dropped keys."""
    rng = np.random.default_rng(8)
    c = Case(dim=64, bs=16, hkv=1, group=1, dtype="f32", layers=1, isa=isa, seqs=[(200, 1)])
    m = Model(rng, c, monkeypatch)
    try:
        m.step([200], False)
        m.seqs[0].append([5])
        table = m.seqs[0].block_table()
        with m.pool.prepare(m.seqs, [1]) as b:
            k = rnd(rng, (1, 1, 64), np.float32)
            b.cache_write(0, k, k.copy())
            kplane = m.pool.kv_tensor(0, "k").numpy()
            q = rnd(rng, (1, 1, 64), np.float32)
            finite = []
            for j in range(80):
                blk, off = table[j // 16], j % 16
                keep = kplane[blk, 0, off, 3]
                kplane[blk, 0, off, 3] = np.nan
                out, lse = b.attention(0, q, lse=True)
                kplane[blk, 0, off, 3] = keep
                if not (np.isnan(out).all() and np.isnan(lse).all()):
                    finite.append(j)
            assert not finite, f"a visible NaN key at positions {finite} gave a non-NaN row"
    finally:
        m.pool.close()


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_new_scales_read_stored_codes(fmt, monkeypatch):
    """pool.h, pkv_pool_set_kv_scales: stored codes stay, attention reads them
    times the new scales from then on."""
    rng = np.random.default_rng(21)
    c = Case(dim=64, bs=8, hkv=2, group=2, dtype=fmt, act="f16", per_head=True, layers=2, seqs=[(30, 4)])
    m = Model(rng, c, monkeypatch)
    try:
        m.step([30], False)
        codes = [[m.plane(ly, w).copy() for w in (0, 1)] for ly in range(2)]
        new_k = [s * float(1.5 + rng.random()) for s in m.ks]
        new_v = [s * float(0.25 + rng.random()) for s in m.vs]
        m.pool.set_kv_scales(new_k, new_v)
        assert all(np.array_equal(m.plane(ly, w), codes[ly][w]) for ly in range(2) for w in (0, 1))
        # The history rescaled: value = code * scale, so new = old * new / old per (layer, head).
        for ly in range(2):
            for h in range(2):
                i = ly * 2 + h
                m.hist_k[0][ly][:, h] *= new_k[i] / m.ks[i]
                m.hist_v[0][ly][:, h] *= new_v[i] / m.vs[i]
        m.ks, m.vs = new_k, new_v
        m.step([4], True)  # writes with the new scales, attends over both
    finally:
        m.pool.close()


@pytest.mark.parametrize("persistent", [False, True])
def test_decode_steps_through_prepare_decode(persistent, monkeypatch):
    """Several decode steps of pkv_batch_prepare_decode (persistent table or
    CSR), crossing block boundaries, with a sequence leaving and a new one
    joining in between."""
    rng = np.random.default_rng(31)
    c = Case(dim=64, bs=4, hkv=2, group=2, dtype="bf16", persistent=persistent, seqs=[(9, 1), (14, 1), (3, 1), (0, 6)])
    m = Model(rng, c, monkeypatch)
    try:
        m.step([9, 14, 3, 0], False)
        for _ in range(6):
            m.step([1, 1, 1, 0], True, decode_call=True)
        m.step([1, 0, 1, 6], True)  # sequence 1 pauses, 3 joins with a prefill
        for _ in range(5):
            m.step([1, 0, 1, 1], True, decode_call=True)
        m.pool.validate()
    finally:
        m.pool.close()


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e5m2"])
def test_forks_share_pages_and_copy_on_write(dtype, monkeypatch):
    """Forks mid-block: the shared full pages are read by both branches, the
    shared partial page is copied on write at prepare, and each branch then
    sees the common prefix and only its own new tokens."""
    rng = np.random.default_rng(41)
    c = Case(dim=64, bs=8, hkv=2, group=2, dtype=dtype, seqs=[(21, 3)])
    m = Model(rng, c, monkeypatch)
    try:
        m.step([21], True)
        for _ in range(2):
            m.seqs.append(m.seqs[0].fork())
            m.hist_k.append([h.copy() for h in m.hist_k[0]])
            m.hist_v.append([h.copy() for h in m.hist_v[0]])
        assert m.seqs[1].block_table()[:2] == m.seqs[0].block_table()[:2]
        m.step([3, 2, 1], True)
        tables = [s.block_table() for s in m.seqs]
        assert tables[0][:2] == tables[1][:2] == tables[2][:2]
        assert len({t[2] for t in tables}) == 3, "the partial block was not copied on write"
        m.step([1, 1, 1], True)
        m.pool.validate()
    finally:
        m.pool.close()


def test_mla_misuse(monkeypatch):
    monkeypatch.delenv("PAGEDKV_CPU_ISA", raising=False)
    rng = np.random.default_rng(13)
    rank, rope = 32, 16
    with pagedkv.Pool(
        num_blocks=8,
        block_size=4,
        num_layers=1,
        dtype="bf16",
        kv_layout="mla",
        kv_lora_rank=rank,
        qk_rope_head_dim=rope,
    ) as pool:
        s = pool.create_sequence()
        s.append([1, 2, 3, 4, 5])
        with pool.prepare([s], [5]) as b:
            act = NP["bf16"]
            kvc, kpe = rnd(rng, (5, rank), act), rnd(rng, (5, rope), act)
            b.mla_cache_write(0, kvc, kpe)
            before = bits(pool.kv_tensor(0, "k").numpy()).copy()
            ql, qp = rnd(rng, (5, 2, rank), act), rnd(rng, (5, 2, rope), act)
            out = np.full((5, 2, rank), 2.0, act)
            good = {"softmax_scale": 0.1, "sliding_window": 0, "logit_softcap": 0.0}

            def call(q1, q2, o, lse=None, **p):
                return b._call(_c.pkv_mla_attention, 0, q1, q2, o, lse, {**good, **p}, 0)

            cases = [
                (pagedkv.UnsupportedError, (ctuple(ql), ctuple(qp), ctuple(out)), {"sliding_window": 3}),
                (pagedkv.UnsupportedError, (ctuple(ql), ctuple(qp), ctuple(out)), {"logit_softcap": 5.0}),
                (pagedkv.InvalidArgumentError, (ctuple(ql), ctuple(qp), ctuple(out)), {"softmax_scale": 0.0}),
                (pagedkv.InvalidArgumentError, (ctuple(ql), ctuple(qp), ctuple(out)), {"softmax_scale": float("nan")}),
                (pagedkv.InvalidArgumentError, (ctuple(ql), None, ctuple(out)), {}),
                (pagedkv.InvalidArgumentError, (ctuple(ql[:, :, :16]), ctuple(qp), ctuple(out[:, :, :16])), {}),
                (pagedkv.InvalidArgumentError, (ctuple(ql), ctuple(qp[:, :1]), ctuple(out)), {}),
                (pagedkv.InvalidArgumentError, (ctuple(ql), ctuple(qp), ctuple(ql)), {}),
                (pagedkv.InvalidArgumentError, (ctuple(ql.astype(np.float32)), ctuple(qp), ctuple(out)), {}),
                (pagedkv.InvalidArgumentError, (ctuple(ql), ctuple(qp), ctuple(out, strides=(0, 32, 1))), {}),
                (
                    pagedkv.InvalidArgumentError,
                    (ctuple(ql), ctuple(qp), ctuple(out), ctuple(np.zeros((5, 3), np.float32))),
                    {},
                ),
            ]
            for exc, args, params in cases:
                with pytest.raises(exc) as ei:
                    call(*args, **params)
                assert len(str(ei.value)) > 12, str(ei.value)
                assert (out.astype(np.float32) == 2.0).all(), f"{ei.value}: out changed"
            with pytest.raises(pagedkv.InvalidArgumentError):
                b._call(_c.pkv_mla_cache_write, 0, ctuple(kvc.astype(np.float32)), ctuple(kpe), 0)
            with pytest.raises(pagedkv.InvalidArgumentError):
                b._call(_c.pkv_mla_cache_write, 0, ctuple(kvc), ctuple(kpe[:, :8]), 0)
            with pytest.raises(pagedkv.InvalidStateError):
                q48 = rnd(rng, (5, 1, rank + rope), act)  # an MHA call on an MLA pool
                raw_attention(b, 0, ctuple(q48), ctuple(np.zeros_like(q48)))
            assert np.array_equal(bits(pool.kv_tensor(0, "k").numpy()), before)
            pool.validate()
