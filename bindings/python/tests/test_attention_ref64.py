"""A second, independent float64 check of the CPU cache write and paged
attention (batch.h: pkv_cache_write, pkv_attention_forward), written from the
contract in batch.h / attention.h only (not from test_kernels_differential.py
or the kernels): random configurations drawn from a fixed seed set, every
output, LSE and written element checked, outputs poisoned (NaN) before each
call.

Drawn per case: the cache dtype (f32, f16, bf16, FP8 E4M3 / E5M2 with per-
tensor or per-head scales and f32/f16/bf16 activations), head dims the CPU
pool accepts (1..4096: the vector multiples and odd ones), GQA groups 1..16,
block sizes 1..512, 1..9 threads (split-KV and multi-head tiles), every ISA
this CPU can run (PAGEDKV_CPU_ISA), ragged plans mixing decode and prefill
chunks over interleaved sequences (so their pages mix) after a random block
permutation, sliding windows (1, small, at least the context), soft-cap,
custom softmax scales, and three data modes:
  normal  N(0, 1) data;
  exact   small-integer q and k with a power-of-two scale: q.k is exact in
          f32, logits reach +-1e4 and the bound below is tight (no dot-
          product term), so a wrong max, rescale or merge shows;
  vmax    V near the dtype's largest finite value (FP8: codes at the
          format's maximum, some saturating).

Error bound of an output element (f32 arithmetic, u = 2^-24):
  logit error dx <= gamma(D + 4) * |scale| * sum_d |q_d k_d|   (the dot
      product, the scale and an FP8 K scale; 0 in exact mode)
      + 8u * cap (soft-cap: x / cap, tanh to a few ulp, times cap)
      + 2^-20 (a vector exp's relative error, carried as a logit error);
  the softmax is a convex combination: a logit error dx moves the output by
      at most 2 dx * max|v_d| over the visible keys; the f32 sums over L keys
      add gamma(L + 4) * max|v_d|;
  the result is rounded to out's dtype: u_out * |out| (2^-24 f32, 2^-11 f16,
      2^-8 bf16) plus half of f16's subnormal spacing (2^-25).
LSE: dx + gamma(L + 4) + 4u * (1 + |lse|).
The reference takes the values the cache holds (activation-dtype values;
FP8: the stored codes times their scale), so input rounding is no error.
FP8 codes themselves are checked against x / scale to half an FP8 ulp.

PAGEDKV_REF64_LONG=1 draws 200 cases instead of 24 (minutes);
PAGEDKV_REF64_SEED=n moves the seed set.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np
import pytest

import pagedkv
from pagedkv import PlanArray

ml_dtypes = pytest.importorskip("ml_dtypes")

LONG = os.environ.get("PAGEDKV_REF64_LONG", "") not in ("", "0")
SEED0 = int(os.environ.get("PAGEDKV_REF64_SEED", "0"))
U = 2.0**-24
EXP_REL = 2.0**-20
U_OUT = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8}
NPT = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
FINMAX = {
    "f32": float(np.finfo(np.float32).max),
    "f16": 65504.0,
    "bf16": float(ml_dtypes.finfo(ml_dtypes.bfloat16).max),
}
# format: (ml_dtypes type, finite max, mantissa bits, min normal exponent)
FP8 = {
    "fp8_e4m3": (ml_dtypes.float8_e4m3fn, 448.0, 3, -6),
    "fp8_e5m2": (ml_dtypes.float8_e5m2, 57344.0, 2, -14),
}

WORST: Dict[str, Tuple[float, float, int]] = {}  # family -> (max err/bound, max |err|, checks)


def _isas() -> List[str]:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        flags = ""
    out = ["scalar"]
    if " avx2" in flags and " fma" in flags and " f16c" in flags:
        out.append("avx2")
    if " avx512f" in flags and " avx512bw" in flags and " avx512vl" in flags:
        out.append("avx512")
    out.append("")  # the dispatcher's own choice
    return out


ISAS = _isas()


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


def record(fam: str, ratio: float, err: float) -> None:
    r, e, n = WORST.get(fam, (0.0, 0.0, 0))
    WORST[fam] = (max(r, ratio), max(e, err), n + 1)


@pytest.fixture(scope="module", autouse=True)
def _print_worst():
    yield
    if WORST:
        print("\nattention ref64: worst |err|/bound, worst |err| per family")
        for k in sorted(WORST):
            r, e, n = WORST[k]
            print(f"  {k:34s} {r:8.3g} {e:10.3g}  ({n})")


@dataclass
class Cfg:
    dtype: str
    act: str
    dim: int
    hkv: int
    group: int
    bs: int
    threads: int
    isa: str
    per_head: bool
    window: int
    softcap: float
    scale: float  # 0: the default 1/sqrt(D)
    mode: str  # normal, exact, vmax
    seqs: List[Tuple[int, int]]  # (tokens before the last step, queries of the last step)
    layers: int = 2

    def fam(self) -> str:
        f = self.dtype if self.act == self.dtype else f"{self.dtype}/{self.act}"
        return f"{f} {self.mode}"


def draw_cfg(rng: np.random.Generator) -> Cfg:
    dtype = str(rng.choice(["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"]))
    act = str(rng.choice(["f32", "f16", "bf16"])) if dtype.startswith("fp8") else dtype
    dim = int(rng.choice([64, 80, 96, 112, 128, 192, 256, 1, 3, 8, 16, 24, 33, 48, 72, 100, 160, 320, 512]))
    group = int(rng.integers(1, 17))
    hkv = int(rng.choice([1, 1, 2, 3, 4, 9, 12])) if group <= 4 else int(rng.choice([1, 2]))
    bs = int(rng.choice([1, 2, 3, 8, 16, 16, 32, 128, 256, 512]))
    threads = int(rng.choice([1, 2, 3, 4, 9]))
    isa = str(rng.choice(ISAS))
    mode = str(rng.choice(["normal", "normal", "exact", "vmax"]))
    nseq = int(rng.integers(1, 6))
    seqs = []
    for _ in range(nseq):
        kind = rng.random()
        if kind < 0.35:
            seqs.append((int(rng.integers(0, 3 * bs + 40)), 1))  # decode
        elif kind < 0.6:
            seqs.append((0, int(rng.integers(1, 2 * bs + 30))))  # whole prefill
        else:
            seqs.append((int(rng.integers(1, 2 * bs + 40)), int(rng.integers(2, 40))))  # chunk
    # Keep the reference cheap: the total query rows times context.
    while sum((a + b) * b for a, b in seqs) * hkv * group * dim > 6e6 and len(seqs) > 1:
        seqs.pop()
    a, b = seqs[0]
    if (a + b) * b * hkv * group * dim > 6e6:
        seqs[0] = (min(a, 64), min(b, 16))
    ctx_max = max(a + b for a, b in seqs)
    w = rng.random()
    window = (
        0
        if w < 0.45
        else 1
        if w < 0.55
        else int(rng.integers(2, 40))
        if w < 0.85
        else ctx_max + int(rng.integers(0, 5))
    )
    softcap = 0.0 if rng.random() < 0.6 else float(rng.choice([1.0, 5.0, 30.0, 50.0]))
    if mode == "exact":
        scale = 2.0 ** int(rng.integers(2, 8))  # logits up to ~1e4
    else:
        scale = 0.0 if rng.random() < 0.5 else float(rng.uniform(0.01, 2.0))
    per_head = bool(rng.integers(0, 2)) and dtype.startswith("fp8")
    return Cfg(dtype, act, dim, hkv, group, bs, threads, isa, per_head, window, softcap, scale, mode, seqs)


def nonzero(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    x[x == 0] = 0.375
    return x


def draw(rng, shape, c: Cfg, what: str) -> np.ndarray:
    """Activation values (float64, representable in c.act) for q, k or v."""
    if c.mode == "exact" and what in ("q", "k"):
        x = rng.integers(1, 9, shape) * rng.choice([-1.0, 1.0], shape)
    elif c.mode == "vmax" and what == "v":
        top = FINMAX[c.act] if not c.dtype.startswith("fp8") else None
        if top is None:  # FP8: x / scale around the format's maximum, a few beyond it
            top = FP8[c.dtype][1] * 1.06
            x = rng.uniform(0.5, 1.0, shape) * rng.choice([-1.0, 1.0], shape)
            return np.clip(x * top, -FINMAX[c.act], FINMAX[c.act]) * 1.0  # scaled by the caller
        x = rng.uniform(0.25, 1.0, shape) * rng.choice([-1.0, 1.0], shape) * top
    else:
        x = rng.standard_normal(shape)
    return nonzero(x.astype(np.float32).astype(NPT[c.act]).astype(np.float64))


def fp8_value(codes: np.ndarray, fmt: str) -> np.ndarray:
    return codes.view(FP8[fmt][0]).astype(np.float64)


def fp8_half_ulp(y: np.ndarray, fmt: str) -> np.ndarray:
    _, _fmax, mbits, emin = FP8[fmt]
    e = np.floor(np.log2(np.maximum(np.abs(y), 2.0**emin)))
    return 2.0 ** (e - mbits) / 2


class Case:
    def __init__(self, c: Cfg, rng: np.random.Generator, monkeypatch):
        self.c, self.rng = c, rng
        monkeypatch.setenv("PAGEDKV_CPU_ISA", c.isa) if c.isa else monkeypatch.delenv("PAGEDKV_CPU_ISA", raising=False)
        self.fp8 = c.dtype.startswith("fp8")
        need = sum(-(-(a + b) // c.bs) for a, b in c.seqs)
        self.nblocks = need + len(c.seqs) + int(rng.integers(2, 9))
        kw = {}
        if self.fp8:
            n = c.layers * (c.hkv if c.per_head else 1)
            fmax = FP8[c.dtype][1]
            # Scales that put N(0, 1) data well inside the format, different per layer and head.
            base = 4.0 / fmax
            if c.mode == "exact":  # powers of two keep q.k exact
                self.ks = [float(2.0 ** rng.integers(-6, -2)) for _ in range(n)]
            else:
                self.ks = [float(base * rng.uniform(0.5, 2.0)) for _ in range(n)]
            self.vs = [float(base * rng.uniform(0.5, 2.0)) for _ in range(n)]
            kw = dict(kv_scale_granularity="head" if c.per_head else "tensor", k_scales=self.ks, v_scales=self.vs)
        self.pool = pagedkv.Pool(
            num_blocks=self.nblocks,
            block_size=c.bs,
            num_layers=c.layers,
            num_kv_heads=c.hkv,
            head_dim=c.dim,
            dtype=c.dtype,
            num_threads=c.threads,
            enable_prefix_caching=False,
            **kw,
        )
        # A random block order: every block taken, then given back shuffled.
        hold = []
        for _ in range(self.nblocks - 1):
            s = self.pool.create_sequence()
            s.append([1] * c.bs)
            hold.append(s)
        for i in rng.permutation(len(hold)):
            hold[i].free()
        self.seqs = [self.pool.create_sequence() for _ in c.seqs]
        # float64 values the cache holds, per sequence and layer: [L, Hkv, D]
        self.K = [[np.zeros((0, c.hkv, c.dim)) for _ in range(c.layers)] for _ in c.seqs]
        self.V = [[np.zeros((0, c.hkv, c.dim)) for _ in range(c.layers)] for _ in c.seqs]

    def scale_of(self, which: int, layer: int, h: int) -> float:
        sc = self.ks if which == 0 else self.vs
        return sc[layer * self.c.hkv + h] if self.c.per_head else sc[layer]

    def planes(self):
        out = []
        for ly in range(self.c.layers):
            for w in (0, 1):
                view = self.pool.kv_tensor(ly, w)
                a = view.codes() if self.fp8 else np.asarray(view.numpy())
                out.append(np.array(a, copy=True))
        return out

    def activations(self, n: int, what: str, layer: int) -> Tuple[np.ndarray, np.ndarray]:
        """(array passed to the library, float64 values it holds) [n, Hkv, D]."""
        c = self.c
        x = draw(self.rng, (n, c.hkv, c.dim), c, what)
        if self.fp8 and c.mode == "vmax" and what == "v":
            for h in range(c.hkv):
                x[:, h] *= self.scale_of(1, layer, h)
            x = np.clip(x, -FINMAX[c.act], FINMAX[c.act])
            x = nonzero(x.astype(np.float32).astype(NPT[c.act]).astype(np.float64))
        if self.fp8 and c.mode == "exact" and what == "k":
            for h in range(c.hkv):  # integer codes: x = code * scale, exactly
                x[:, h] *= self.scale_of(0, layer, h)
        return x.astype(NPT[c.act]), x

    def step(self, chunks: List[int]) -> None:
        c, rng = self.c, self.rng
        idx = [i for i, n in enumerate(chunks) if n > 0]
        for i in idx:
            self.seqs[i].append(rng.integers(2, 50000, chunks[i]).tolist())
        plan = self.pool.prepare([self.seqs[i] for i in idx], [chunks[i] for i in idx])
        with plan as b:
            n = b.num_tokens
            slots = b.plan(PlanArray.SLOT_MAPPING).numpy().copy()
            qptr = b.plan(PlanArray.QUERY_INDPTR).numpy().copy()
            ctx = b.plan(PlanArray.CONTEXT_LENS).numpy().copy()
            for layer in range(c.layers):
                k, kval = self.activations(n, "k", layer)
                v, vval = self.activations(n, "v", layer)
                before = self.planes()
                b.cache_write(layer, k, v)
                kval, vval = self.check_write(before, layer, slots, kval, vval)
                for r, i in enumerate(idx):
                    rows = slice(qptr[r], qptr[r + 1])
                    self.K[i][layer] = np.concatenate([self.K[i][layer], kval[rows]])
                    self.V[i][layer] = np.concatenate([self.V[i][layer], vval[rows]])
                    assert ctx[r] == self.K[i][layer].shape[0]
            for layer in range(c.layers):
                self.attend(b, layer, idx, qptr, ctx)

    def check_write(self, before, layer, slots, kval, vval):
        """Only the step's slots of layer changed, to the values given (FP8:
        x / scale to half an FP8 ulp, saturated). Returns the values held."""
        c = self.c
        after = self.planes()
        blk, off = slots // c.bs, slots % c.bs
        held = []
        for pi, (a, bf) in enumerate(zip(after, before)):
            ly, w = divmod(pi, 2)
            mask = np.zeros(a.shape, bool)
            if ly == layer:
                mask[blk, :, off, :] = True
            changed = a != bf
            if a.dtype.kind == "f" or a.dtype == NPT["bf16"]:
                changed = changed & ~(np.isnan(a.astype(np.float32)) & np.isnan(bf.astype(np.float32)))
            stray = changed & ~mask
            assert not stray.any(), (
                f"cache_write layer {layer} changed {int(stray.sum())} elements outside its slots (plane {ly},{'KV'[w]})"
            )
            if ly != layer:
                continue
            x = (kval, vval)[w]
            got = a[blk, :, off, :]
            if not self.fp8:
                assert np.array_equal(got.astype(np.float64), x), f"cache_write layer {layer} {'KV'[w]}: wrong values"
                held.append(x)
                continue
            sc = np.array([self.scale_of(w, layer, h) for h in range(c.hkv)])[None, :, None]
            val = fp8_value(np.ascontiguousarray(got), c.dtype)
            y = x.astype(np.float32) / sc.astype(np.float32)  # x / scale (f32 division, one rounding)
            fmax = FP8[c.dtype][1]
            exp = np.clip(y, -fmax, fmax)
            err = np.abs(val - exp)
            tol = fp8_half_ulp(exp, c.dtype) * (1 + 2**-20) + np.abs(y) * 2**-23
            assert (err <= tol).all(), (
                f"cache_write {c.dtype} layer {layer} {'KV'[w]}: code {val[err > tol][0]} for x/scale {y[err > tol][0]}"
            )
            held.append(val * sc)
        return held[0], held[1]

    def attend(self, b, layer, idx, qptr, ctx):
        c, rng = self.c, self.rng
        n = b.num_tokens
        hq = c.hkv * c.group
        q = draw(rng, (n, hq, c.dim), c, "q")
        qa = q.astype(NPT[c.act])
        out = np.full((n, hq, c.dim), np.nan, dtype=NPT[c.act])
        lse = np.full((n, hq), np.nan, dtype=np.float32)
        b.attention(layer, qa, out, lse=lse, softmax_scale=c.scale, sliding_window=c.window, logit_softcap=c.softcap)
        scale = c.scale or 1.0 / math.sqrt(c.dim)
        for r, i in enumerate(idx):
            rows = slice(qptr[r], qptr[r + 1])
            nq = qptr[r + 1] - qptr[r]
            pos = ctx[r] - nq + np.arange(nq)
            ro, rl, ob, lb = reference(q[rows], self.K[i][layer], self.V[i][layer], pos, scale, c)
            got = out[rows].astype(np.float64)
            gl = lse[rows].astype(np.float64)
            where = f"{c} layer {layer} seq {r} (context {ctx[r]}, {nq} queries)"
            uo = U_OUT[c.act]
            bound = ob * (1 + 2 * uo) + uo * np.abs(ro) + (2.0**-25 if c.act == "f16" else 0.0)
            err = np.abs(got - ro)
            bad = ~(err <= bound)  # NaN (the poison, or a NaN result) is bad
            if bad.any():
                e = tuple(np.argwhere(bad)[0])
                raise AssertionError(
                    f"out: {int(bad.sum())}/{bad.size} elements off; first {e}: got {got[e]!r}, "
                    f"ref {ro[e]!r}, bound {bound[e]!r}; {where}"
                )
            lerr = np.abs(gl - rl)
            lbad = ~(lerr <= lb)
            if lbad.any():
                e = tuple(np.argwhere(lbad)[0])
                raise AssertionError(
                    f"lse: {int(lbad.sum())} off; first {e}: got {gl[e]!r} ref {rl[e]!r} bound {lb[e]!r}; {where}"
                )
            record(
                c.fam(),
                float(np.max(err / np.maximum(bound, 1e-300))),
                float(np.max(err / np.maximum(np.abs(ro).max(), 1e-300))),
            )
            record("lse", float(np.max(lerr / lb)), float(lerr.max()))


def reference(q, K, V, pos, scale, c: Cfg):
    """float64 attention of queries q [nq, Hq, D] at positions pos over K, V
    [L, Hkv, D]; with the error bounds of the module docstring."""
    nq, hq, d = q.shape
    L = K.shape[0]
    g = hq // K.shape[1]
    Kr = np.repeat(K, g, axis=1)  # query head h reads KV head h // g
    Vr = np.repeat(V, g, axis=1)
    raw = np.einsum("ihd,jhd->ihj", q, Kr) * scale
    mag = np.einsum("ihd,jhd->ihj", np.abs(q), np.abs(Kr)) * abs(scale)
    x = c.softcap * np.tanh(raw / c.softcap) if c.softcap else raw
    j = np.arange(L)
    vis = j[None, :] <= pos[:, None]
    if c.window:
        vis &= j[None, :] > pos[:, None] - c.window
    vis = vis[:, None, :]
    xm = np.where(vis, x, -np.inf)
    m = xm.max(axis=2, keepdims=True)
    w = np.exp(xm - m)
    s = w.sum(axis=2, keepdims=True)
    out = np.einsum("ihj,jhd->ihd", w / s, Vr)
    lse = (m + np.log(s))[..., 0]
    dot_err = 0.0 if c.mode == "exact" else gamma(d + 4) * mag
    fold = 4 * U * np.abs(raw) if c.dtype.startswith("fp8") else 0.0  # an FP8 K scale folded into q's
    dx = dot_err + fold + (8 * U * c.softcap if c.softcap else 0.0) + EXP_REL
    dxm = np.where(vis, dx, 0.0).max(axis=2)  # [nq, Hq]
    vmax = np.stack([np.abs(Vr[vis[i, 0]]).max(axis=0) for i in range(nq)])  # [nq, Hq, D]
    ob = (2 * dxm[..., None] + gamma(L + 4)) * vmax
    lb = dxm + gamma(L + 4) + 4 * U * (1 + np.abs(lse))
    return out, lse, ob, lb


def run_cfg(c: Cfg, rng, monkeypatch) -> None:
    case = Case(c, rng, monkeypatch)
    try:
        # Prefix rounds: random chunks, sequences interleaved; every round
        # is a mixed plan checked in full. Then the last step: decode and chunks.
        left = [a for a, _ in c.seqs]
        while any(left):
            chunks = [0 if a == 0 or rng.random() < 0.3 else int(rng.integers(1, a + 1)) for a in left]
            if not any(chunks):
                j = int(np.argmax(left))
                chunks[j] = left[j]
            left = [a - t for a, t in zip(left, chunks)]
            case.step(chunks)
        case.step([b for _, b in c.seqs])
        case.pool.validate()
    finally:
        case.pool.close()


NCASES = 200 if LONG else 24


@pytest.mark.parametrize("ci", range(NCASES))
def test_attention_matches_float64(ci, monkeypatch):
    rng = np.random.default_rng([SEED0, ci, 0x5EED])
    c = draw_cfg(rng)
    run_cfg(c, rng, monkeypatch)


# Fixed edge configurations, each with every ISA.
EDGES = [
    dict(dtype="f32", dim=128, bs=16, hkv=2, group=8, window=1, seqs=[(40, 1), (0, 33), (17, 9)]),
    dict(dtype="bf16", dim=80, bs=1, hkv=3, group=5, window=0, seqs=[(20, 1), (5, 12)]),
    dict(dtype="f16", dim=256, bs=256, hkv=1, group=16, window=300, seqs=[(260, 1), (0, 40)], softcap=30.0),
    dict(dtype="bf16", dim=64, bs=8, hkv=12, group=1, window=0, threads=3, seqs=[(30, 1)] * 5),
    dict(dtype="f16", dim=112, bs=32, hkv=2, group=4, threads=9, mode="exact", scale=64.0, seqs=[(300, 1), (100, 3)]),
    dict(
        dtype="fp8_e4m3", act="bf16", dim=96, bs=16, hkv=4, group=2, per_head=True, mode="vmax", seqs=[(50, 1), (0, 20)]
    ),
    dict(dtype="f32", dim=64, bs=16, hkv=2, group=2, mode="vmax", threads=4, seqs=[(70, 1), (3, 30), (0, 5)]),
    dict(dtype="bf16", dim=128, bs=8, hkv=1, group=3, mode="vmax", window=9, seqs=[(40, 2), (0, 17)]),
    dict(dtype="fp8_e5m2", act="f16", dim=7, bs=8, hkv=2, group=3, window=5, seqs=[(45, 1), (9, 7)]),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("ei", range(len(EDGES)))
def test_attention_edges(ei, isa, monkeypatch):
    e = dict(EDGES[ei])
    dt = e.pop("dtype")
    c = Cfg(
        dtype=dt,
        act=e.pop("act", dt),
        dim=e.pop("dim"),
        hkv=e.pop("hkv"),
        group=e.pop("group"),
        bs=e.pop("bs"),
        threads=e.pop("threads", 2),
        isa=isa,
        per_head=e.pop("per_head", False),
        window=e.pop("window", 0),
        softcap=e.pop("softcap", 0.0),
        scale=e.pop("scale", 0.0),
        mode=e.pop("mode", "normal"),
        seqs=e.pop("seqs"),
    )
    assert not e
    run_cfg(c, np.random.default_rng([SEED0, ei, 0xED6E]), monkeypatch)


def test_misuse_is_refused_and_writes_nothing(monkeypatch):
    """Each bad argument: a library error naming it, out and lse untouched
    (NaN poison, bit for bit), no KV element changed, the pool still valid."""
    monkeypatch.delenv("PAGEDKV_CPU_ISA", raising=False)
    rng = np.random.default_rng([SEED0, 0xBAD])
    bf = NPT["bf16"]
    pool = pagedkv.Pool(
        num_blocks=12, block_size=4, num_layers=2, num_kv_heads=2, head_dim=16, dtype="bf16", num_threads=2
    )
    try:
        a, b_ = pool.create_sequence(), pool.create_sequence()
        a.append([3] * 6)
        b_.append([4] * 1)
        with pool.prepare([a, b_], [6, 1]) as b:
            for ly in range(2):
                b.cache_write(
                    ly, rng.standard_normal((7, 2, 16)).astype(bf), rng.standard_normal((7, 2, 16)).astype(bf)
                )
        # Committed: a second plan (decode + chunk) to misuse.
        a.append([5])
        b_.append([6] * 3)
        with pool.prepare([a, b_], [1, 3]) as b:
            n = b.num_tokens
            good_k = rng.standard_normal((n, 2, 16)).astype(bf)
            q = rng.standard_normal((n, 4, 16)).astype(bf)

            def planes():
                return [
                    np.asarray(pool.kv_tensor(ly, w).numpy()).view(np.uint16).copy() for ly in range(2) for w in (0, 1)
                ]

            before = planes()
            wide = rng.standard_normal((n, 4, 32)).astype(bf)
            bad_attention = [
                ("q", dict(q=rng.standard_normal((n, 4, 8)).astype(bf))),  # head_dim
                ("q", dict(q=rng.standard_normal((n, 3, 16)).astype(bf))),  # heads not a multiple of 2
                ("q", dict(q=rng.standard_normal((n - 1, 4, 16)).astype(bf))),  # rows
                ("q", dict(q=wide[:, :, ::2])),  # innermost stride 2
                ("q", dict(q=rng.standard_normal((n, 4, 16)).astype(np.float32))),  # dtype
                ("out", dict(out=np.full((n, 4, 8), np.nan, bf))),
                ("out", dict(out=np.full((n, 4, 16), np.nan, np.float16))),
                ("out", dict(out=np.full((n, 4, 32), np.nan, bf)[:, :, ::2])),
                ("lse", dict(lse=np.full((n, 3), np.nan, np.float32))),
                ("lse", dict(lse=np.full((n, 4), np.nan, np.float16))),
                ("softmax_scale", dict(softmax_scale=-1.0)),
                ("softmax_scale", dict(softmax_scale=float("nan"))),
                ("softmax_scale", dict(softmax_scale=float("inf"))),
                ("logit_softcap", dict(logit_softcap=-2.0)),
                ("logit_softcap", dict(logit_softcap=float("nan"))),
                ("sliding_window", dict(sliding_window=2**31)),
                ("layer", dict(layer=2)),
            ]
            for name, kw in bad_attention:
                kw = dict(kw)
                qq = kw.pop("q", q)
                out = kw.pop("out", np.full((n, 4, 16), np.nan, bf))
                lse = kw.pop("lse", np.full((n, 4), np.nan, np.float32))
                layer = kw.pop("layer", 0)
                out0, lse0 = out.copy(), lse.copy()
                with pytest.raises((pagedkv.PagedKVError, ValueError, TypeError, OverflowError)) as ei:
                    b.attention(layer, qq, out, lse=lse, **kw)
                assert name.split("_")[0] in str(ei.value).lower().replace("_", " ").replace("  ", " ") or name in str(
                    ei.value
                ), (name, str(ei.value))
                assert np.array_equal(
                    np.ascontiguousarray(out).view(np.uint8), np.ascontiguousarray(out0).view(np.uint8)
                ), f"{name}: out written"
                assert np.array_equal(lse.view(np.uint8), lse0.view(np.uint8)), f"{name}: lse written"
            # out over q's memory.
            with pytest.raises(pagedkv.PagedKVError):
                b.attention(0, q, q)
            bad_write = [
                ("k", dict(k=rng.standard_normal((n, 2, 8)).astype(bf))),
                ("k", dict(k=rng.standard_normal((n + 1, 2, 16)).astype(bf))),
                ("v", dict(v=rng.standard_normal((n, 2, 32)).astype(bf)[:, :, ::2])),
                ("v", dict(v=rng.standard_normal((n, 2, 16)).astype(np.float16))),
                ("layer", dict(layer=5)),
            ]
            for name, kw in bad_write:
                with pytest.raises((pagedkv.PagedKVError, ValueError, TypeError)) as ei:
                    b.cache_write(kw.get("layer", 0), kw.get("k", good_k), kw.get("v", good_k))
                assert name in str(ei.value).lower(), (name, str(ei.value))
            after = planes()
            for x, y in zip(before, after):
                assert np.array_equal(x, y), "a refused call changed the KV cache"
        # A query count beyond the tokens a sequence has is refused at prepare.
        with pytest.raises(pagedkv.PagedKVError):
            pool.prepare([a], [len(a) + 1])
        pool.validate()
    finally:
        pool.close()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, 4])
def test_values_at_the_largest_float_give_it_back(isa, threads, monkeypatch):
    """Every visible V element exactly +-FLT_MAX (one sign per dim, f32
    cache): each output is a convex combination of equal values, exactly
    +-FLT_MAX (the reference). The 2^-c factor keeps the accumulator finite,
    but acc * (1/l) rounds a few ulps either side of the largest float, and
    above it is inf: 256 of 1088 elements at 17 keys, 28032 of 64000 at
    1000, before the fix."""
    monkeypatch.setenv("PAGEDKV_CPU_ISA", isa)
    top = FINMAX["f32"]
    rng = np.random.default_rng(3)
    hkv, group, dim, bs = 2, 2, 64, 16
    for L in (17, 300):
        with pagedkv.Pool(
            num_blocks=L // bs + 4,
            block_size=bs,
            num_layers=1,
            num_kv_heads=hkv,
            head_dim=dim,
            dtype="f32",
            num_threads=threads,
            enable_prefix_caching=False,
        ) as pool:
            s = pool.create_sequence()
            s.append(rng.integers(2, 50000, L).tolist())
            with pool.prepare([s], [L]) as b:
                sign = rng.choice([-1.0, 1.0], (1, hkv, dim))
                k = rng.standard_normal((L, hkv, dim)).astype(np.float32)
                v = np.ascontiguousarray(np.broadcast_to(sign * top, (L, hkv, dim)), dtype=np.float32)
                b.cache_write(0, k, v)
                q = (3 * rng.standard_normal((L, hkv * group, dim))).astype(np.float32)
                out = np.full((L, hkv * group, dim), np.nan, dtype=np.float32)
                b.attention(0, q, out)
        want = np.repeat(sign * top, group, axis=1)  # float64
        inf = ~np.isfinite(out)
        assert not inf.any(), f"{L} keys: {int(inf.sum())}/{inf.size} elements not finite, e.g. {out[inf][0]!r}"
        err = np.abs(out.astype(np.float64) - want)  # the bound of the module docstring, dx aside
        assert (err <= (gamma(L + 4) + U) * top).all(), f"{L} keys: worst error {err.max()!r}"
