#!/usr/bin/env python3
"""Random-call fuzzer of the pagedkv Python package's public API.

Each program is a random sequence of calls on pools, sequences, plans,
views, tiers, event publishers and transfer engines, with arguments drawn
from valid objects (live, closed, freed, of another pool) and nasty values
(huge/negative ints, NaN, strings with NUL or lone surrogates, numpy arrays
of every dtype and layout, torch tensors, objects whose __index__ /
__len__ / __iter__ / __array__ / __dlpack__ raise or lie). A program runs in
a forked child so that a crash is observed; the contract checked:

* the child neither dies (segfault, abort) nor hangs (--timeout);
* nothing is printed on stdout or stderr (warnings included);
* a failing call raises a PagedKVError, TypeError, ValueError or
  OverflowError (KeyError from HybridPool.group_of_layer, TimeoutError from
  Transfer.wait), not a SWIG message naming a C parameter, and changes
  nothing: every live pool validates and its stats and sequences read as
  before the call;
* a failing call keeps no reference to its arguments (sampled).

Usage::

    python fuzz_api.py --seconds 60            # random seeds, summary at the end
    python fuzz_api.py --seed 123 --calls 300  # one program, trace on stdout

Not collected by pytest (test_fuzz_api_smoke.py runs it for a few seconds).
Exit status 1 when a program failed the contract.
"""

from __future__ import annotations

import argparse
import copy
import gc
import itertools
import os
import pickle
import random
import resource
import signal
import sys
import tempfile
import time
import traceback
import warnings

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

import pagedkv
from pagedkv import events as pkv_events
from pagedkv import mla as pkv_mla
from pagedkv import tiers as pkv_tiers
from pagedkv import transfer as pkv_transfer

try:
    import torch
except Exception:  # pragma: no cover
    torch = None

ALLOWED = (pagedkv.PagedKVError, TypeError, ValueError, OverflowError)
# SWIG's own messages name C parameters and types ("in method 'pkv_x',
# argument 2 of type 'int32_t'"): not a clear error for a Python caller.
SWIG_WORDS = ("in method '", "argument 1 of type", "argument 2 of type", "argument 3 of type", "SwigPy")


OWN_ERRORS = ("boom", "iface")

# ---------------------------------------------------------------- nasty values


class _Raise:
    def __init__(self, exc):
        self.exc = exc

    def __call__(self, *a, **k):
        raise self.exc


def _cls(name, **methods):
    return type(name, (), methods)


BadIndex = _cls("BadIndex", __index__=lambda self: (_ for _ in ()).throw(RuntimeError("index boom")))
BadIndexNonInt = _cls("BadIndexNonInt", __index__=lambda self: 1.5)
HugeIndex = _cls("HugeIndex", __index__=lambda self: 2**70)
BadLen = _cls(
    "BadLen",
    __len__=lambda self: (_ for _ in ()).throw(RuntimeError("len boom")),
    __iter__=lambda self: iter([1, 2]),
)
NegLen = _cls("NegLen", __len__=lambda self: -1, __iter__=lambda self: iter([1, 2]))
HugeLen = _cls("HugeLen", __len__=lambda self: 2**70, __iter__=lambda self: iter([1, 2]))
LyingLen = _cls("LyingLen", __len__=lambda self: 1, __iter__=lambda self: iter(range(40)))
LyingLenBig = _cls("LyingLenBig", __len__=lambda self: 40, __iter__=lambda self: iter(range(3)))


def _iter_raise(self):
    yield 1
    yield 2
    raise RuntimeError("iter boom")


BadIter = _cls("BadIter", __len__=lambda self: 3, __iter__=_iter_raise)
BadGetitem = _cls(
    "BadGetitem",
    __len__=lambda self: 3,
    __getitem__=lambda self, i: (_ for _ in ()).throw(RuntimeError("getitem boom")),
)
BadArray = _cls("BadArray", __array__=lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("array boom")))
ArrayNotArray = _cls("ArrayNotArray", __array__=lambda self, *a, **k: [1, 2, 3])
ArrayObj = _cls("ArrayObj", __array__=lambda self, *a, **k: np.array([object(), 1], dtype=object))
BadIface = _cls("BadIface", __array_interface__=property(lambda self: {"shape": (3,), "typestr": "<zz", "version": 3}))
BadIface2 = _cls("BadIface2", __array_interface__=property(lambda self: (_ for _ in ()).throw(RuntimeError("iface"))))
BadIface3 = _cls("BadIface3", __array_interface__=property(lambda self: {"shape": "abc", "typestr": "<i4"}))
BadDlpack = _cls(
    "BadDlpack",
    __dlpack__=lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("dlpack boom")),
    __dlpack_device__=lambda self: (1, 0),
)
DlpackNotCapsule = _cls("DlpackNotCapsule", __dlpack__=lambda self, *a, **k: 42, __dlpack_device__=lambda self: (1, 0))
DlpackBadDevice = _cls(
    "DlpackBadDevice",
    __dlpack__=lambda self, *a, **k: np.zeros(3, np.int32).__dlpack__(),
    __dlpack_device__=lambda self: ("x", None),
)
DlpackDev99 = _cls(
    "DlpackDev99",
    __dlpack__=lambda self, *a, **k: np.zeros(3, np.int32).__dlpack__(),
    __dlpack_device__=lambda self: (99, -5),
)
NumpyMethodBad = _cls("NumpyMethodBad", numpy=lambda self: (_ for _ in ()).throw(RuntimeError("numpy boom")))
NumpyMethodSelf = _cls("NumpyMethodSelf", numpy=lambda self: self, __len__=lambda self: 2)
BadFloat = _cls("BadFloat", __float__=lambda self: (_ for _ in ()).throw(RuntimeError("float boom")))
BadStr = _cls("BadStr", __str__=lambda self: (_ for _ in ()).throw(RuntimeError("str boom")))
BadBool = _cls("BadBool", __bool__=lambda self: (_ for _ in ()).throw(RuntimeError("bool boom")))
BadEq = _cls(
    "BadEq",
    __eq__=lambda self, o: (_ for _ in ()).throw(RuntimeError("eq boom")),
    __hash__=lambda self: 1,
)


class IntSub(int):
    pass


class ListLenLies(list):
    def __len__(self):
        return 1


class StrSub(str):
    pass


def _gen(n):
    yield from range(n)


NP_DTYPES = [
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.bool_,
    object,
    "U3",
    "S3",
    ">i4",
    ">f4",
    "datetime64[s]",
    [("a", np.int32), ("b", np.int32)],
]
try:
    import ml_dtypes

    NP_DTYPES.append(ml_dtypes.bfloat16)
    NP_DTYPES.append(ml_dtypes.float8_e4m3fn)
except ImportError:  # pragma: no cover
    pass


def nasty_array(rng):
    dt = rng.choice(NP_DTYPES)
    shape = rng.choice([(), (0,), (1,), (3,), (5,), (2, 3), (0, 4), (4, 1, 8), (2, 2, 2, 2), (17,)])
    try:
        a = np.zeros(shape, dtype=dt)
        if a.dtype.kind in "iuf":
            a[...] = np.arange(a.size).reshape(shape) if a.size else 0
    except Exception:
        a = np.zeros(shape, dtype=np.int32)
    r = rng.random()
    if r < 0.1 and a.ndim:
        a = a[::-1]
    elif r < 0.2 and a.ndim and a.shape[0] > 1:
        a = a[::2]
    elif r < 0.3:
        a.setflags(write=False)
    elif r < 0.4 and a.ndim >= 2:
        a = np.asfortranarray(a)
    elif r < 0.45:
        a = np.broadcast_to(np.int32(1), (rng.choice([4, 1 << 20, 1 << 31]),))
    elif r < 0.5:
        buf = np.zeros(4 * 8 + 1, np.uint8)
        a = buf[1:].view(np.int32) if rng.random() < 0.5 else np.frombuffer(buf.tobytes(), np.int32, 4, 1)
    elif r < 0.55:
        a = np.lib.stride_tricks.as_strided(np.zeros(4, np.int32), shape=(8,), strides=(0,))
    return a


def nasty_torch(rng):
    if torch is None:
        return None
    r = rng.randrange(12)
    if r == 0:
        return torch.tensor(1.5)
    if r == 1:
        return torch.tensor(True)
    if r == 2:
        return torch.arange(10)[::2]
    if r == 3:
        return torch.empty(3, device="meta")
    if r == 4:
        return torch.zeros(3, requires_grad=True)
    if r == 5:
        return torch.zeros(0, dtype=torch.int32)
    if r == 6:
        return torch.arange(8, dtype=torch.int32)
    if r == 7:
        return torch.zeros(2, 3, dtype=torch.bfloat16)
    if r == 8:
        return torch.zeros(4, 2, dtype=torch.complex64)
    if r == 9:
        with warnings.catch_warnings():  # torch's own "sparse invariant checks" UserWarning
            warnings.simplefilter("ignore")
            return torch.sparse_coo_tensor([[0]], [1.0], (3,))
    if r == 10:
        return torch.tensor(7, dtype=torch.int64)
    return torch.zeros(2, 2, 16, dtype=torch.float32).transpose(0, 2)


SCALARS = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2,
    3,
    7,
    2**31 - 1,
    2**31,
    2**32,
    2**32 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**63),
    -(2**64),
    10**30,
    0.0,
    -0.0,
    1.5,
    float("nan"),
    float("inf"),
    -float("inf"),
    5e-324,
    1e-40,
    1e308,
    1j,
    complex("nan"),
    "",
    "a",
    "\x00",
    "a\x00b",
    "\ud800",
    "cpu",
    "cuda",
    "cuda:99",
    "f32",
    "bf16",
    "fp8_e4m3",
    "k",
    "v",
    "mla",
    "head",
    "tensor",
    "x" * 5000,
    b"",
    b"\x00" * 8,
    b"\xff" * 64,
    Ellipsis,
    NotImplemented,
    object,
    int,
]


def nasty(rng, fz):
    r = rng.random()
    if r < 0.35:
        return rng.choice(SCALARS)
    if r < 0.5:
        return nasty_array(rng)
    if r < 0.58 and torch is not None:
        return nasty_torch(rng)
    if r < 0.75:
        k = rng.randrange(24)
        return [
            BadIndex,
            BadIndexNonInt,
            HugeIndex,
            BadLen,
            NegLen,
            HugeLen,
            LyingLen,
            LyingLenBig,
            BadIter,
            BadGetitem,
            BadArray,
            ArrayNotArray,
            ArrayObj,
            BadIface,
            BadIface2,
            BadIface3,
            BadDlpack,
            DlpackNotCapsule,
            DlpackBadDevice,
            DlpackDev99,
            NumpyMethodBad,
            NumpyMethodSelf,
            BadFloat,
            BadStr,
        ][k]()
    if r < 0.85:
        k = rng.randrange(18)
        if k == 0:
            return [rng.choice(SCALARS) for _ in range(rng.randrange(4))]
        if k == 1:
            return (0, 4, 1, 0)
        if k == 2:
            return [BadIndex()]
        if k == 3:
            return [(0, 4, 100, 0), (BadIndex(), 1, 1, 1)]
        if k == 4:
            return range(2**40)
        if k == 5:
            return iter([1, 2, 3])
        if k == 6:
            return _gen(5)
        if k == 7:
            return {}
        if k == 8:
            return {1: 2}
        if k == 9:
            return set([1, 2])
        if k == 10:
            return bytearray(32)
        if k == 11:
            return memoryview(b"abcdefgh").cast("i")
        if k == 12:
            return ListLenLies(range(40))
        if k == 13:
            return IntSub(3)
        if k == 14:
            return StrSub("k")
        if k == 15:
            return [[1, 2], [3]]
        if k == 16:
            return np.int32(5)
        return np.uint64(2**64 - 1)
    return fz.any_object()


# ---------------------------------------------------------------- the program


class Violation(Exception):
    pass


class Fuzzer:
    def __init__(self, seed, ncalls, trace, tmpdir):
        self.rng = random.Random(seed)
        self.ncalls = ncalls
        self.trace = trace
        self.tmpdir = tmpdir
        self.objs = {k: [] for k in ("pool", "seq", "batch", "view", "arr", "pub", "eng", "export", "xfer", "spec")}
        self.violations = []
        self.calls = 0
        self.names = {}
        self.counter = itertools.count()

    # ---------------------------------------------------------- bookkeeping

    def name(self, o):
        n = self.names.get(id(o))
        if n is None:
            return _short(o)
        return n

    def add(self, kind, o):
        if len(self.objs[kind]) > (6 if kind == "pool" else 30):
            self.objs[kind].pop(self.rng.randrange(len(self.objs[kind])))
        self.objs[kind].append(o)
        self.names[id(o)] = f"{kind}{next(self.counter)}"
        return o

    def pick(self, kind):
        lst = self.objs[kind]
        if lst and kind in ("batch", "pool") and self.rng.random() < 0.5:
            return lst[-1]  # the newest: deeper states (a plan written, then attention)
        return self.rng.choice(lst) if lst else None

    def any_object(self):
        kinds = [k for k, v in self.objs.items() if v]
        if not kinds:
            return None
        return self.pick(self.rng.choice(kinds))

    def live_pools(self):
        return [p for p in self.objs["pool"] if not p.closed]

    def pool_state(self, p):
        st = p.stats()
        seqs = []
        for s in self.objs["seq"]:
            if s._pool is p and not s.freed:
                try:
                    i = s.info()
                    seqs.append((s.id, i, tuple(s.block_table())))
                except pagedkv.NotFoundError:
                    seqs.append((s.id, None))
        return st, seqs

    # ---------------------------------------------------------- one call

    def invoke(self, desc, fn, *args, **kw):
        self.calls += 1
        line = f"{self.calls}: {desc}(" + ", ".join(
            [self.name(a) for a in args] + [f"{k}={self.name(v)}" for k, v in kw.items()]
        )
        self.trace.write(line + ")\n")
        self.trace.flush()
        pools = self.live_pools()
        before = {}
        for p in pools:
            try:
                before[id(p)] = self.pool_state(p)
            except Exception as e:  # pragma: no cover
                self.violate(f"pool_state before failed: {e!r}")
        err_before = os.fstat(2).st_size
        out_before = os.fstat(1).st_size
        check_refs = self.rng.random() < 0.1
        refs = [(a, sys.getrefcount(a)) for a in list(args) + list(kw.values()) if _trackable(a)] if check_refs else []
        result = exc = None
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                result = fn(*args, **kw)
            except BaseException as e:
                exc = e
        if w:
            self.violate(f"{line}): warning {w[0].category.__name__}: {w[0].message}")
        if os.fstat(2).st_size != err_before or os.fstat(1).st_size != out_before:
            self.violate(f"{line}): printed on stdout/stderr")
        if exc is None:
            self.trace.write(f"   -> {_short(result)}\n")
            return result
        msg = f"{type(exc).__name__}: {str(exc)[:300]}"
        self.trace.write(f"   !! {msg}\n")
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise exc
        allowed = isinstance(exc, ALLOWED) or (isinstance(exc, KeyError) and "group_of_layer" in desc)
        allowed = allowed or (isinstance(exc, TimeoutError) and "wait" in desc)
        # The caller's own exception (an __index__ / __len__ / __iter__ of ours
        # that raises) propagates as it is; a TensorView's geometry is read-only.
        allowed = allowed or any(w in str(exc) for w in OWN_ERRORS)
        allowed = allowed or (isinstance(exc, AttributeError) and desc == "setattr(view)")
        if not allowed:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
            self.violate(f"{line}): unexpected {msg}\n{tb}")
        elif any(wd in str(exc) for wd in SWIG_WORDS):
            self.violate(f"{line}): SWIG message {msg}")
        del exc
        for p in pools:
            if p.closed:
                continue
            try:
                p.validate()
            except pagedkv.InvariantError as e:
                self.violate(f"{line}): validate after failure: {e}")
                continue
            after = self.pool_state(p)
            if id(p) in before and after != before[id(p)] and not _excused(desc, p):
                self.violate(f"{line}): failure changed {self.name(p)}:\n  before {before[id(p)]}\n  after  {after}")
        if refs:
            gc.collect(0)  # the young generation holds the call's frames and traceback
            for a, n in refs:
                m = sys.getrefcount(a)
                if m > n:
                    self.violate(f"{line}): a failing call kept {m - n} reference(s) to {_short(a)}")
        return None

    def violate(self, text):
        self.violations.append(text)
        self.trace.write("VIOLATION: " + text + "\n")
        self.trace.flush()

    # ---------------------------------------------------------- values

    def arg(self, good, nasty_p=0.15):
        if self.rng.random() < nasty_p:
            return nasty(self.rng, self)
        try:
            return good()
        except Exception:  # a good value built from a nasty one (hashes of odd tokens)
            return nasty(self.rng, self)

    def tokens(self, n=None):
        rng = self.rng
        n = rng.choice([0, 1, 3, 4, 5, 8, 16, 17, 33, 64]) if n is None else n
        base = rng.choice([0, 100, 1000])
        toks = [base + (i % rng.choice([5, 50, 1000])) for i in range(n)]
        r = rng.random()
        if r < 0.5:
            return toks
        if r < 0.7:
            return np.array(toks, dtype=np.int32)
        if r < 0.8:
            return np.array(toks, dtype=rng.choice([np.int64, np.uint32, np.int16]))
        if r < 0.9 and torch is not None:
            return torch.tensor(toks, dtype=torch.int32)
        return tuple(toks)

    def seq_of(self, pool):
        cands = [s for s in self.objs["seq"] if s._pool is pool]
        r = self.rng.random()
        if cands and r < 0.9:
            return self.rng.choice(cands)
        return self.pick("seq")

    def seqs_of(self, pool):
        cands = [s for s in self.objs["seq"] if s._pool is pool and not s.freed]
        self.rng.shuffle(cands)
        lo = 0 if self.rng.random() < 0.1 else 1
        k = self.rng.randrange(min(lo, len(cands)), min(len(cands), 4) + 1)
        out = cands[:k]
        r = self.rng.random()
        if r < 0.1:
            return np.array([s.id for s in out], dtype=np.uint64)
        if r < 0.15:
            return [s.id for s in out]
        if r < 0.2 and out:
            return [*out, out[0]]
        return out

    def small(self, hi=4):
        return self.rng.randrange(hi)

    def tensor_for(self, batch, name):
        pool = batch._pool
        n = batch._info.num_tokens
        rng = self.rng
        dt = {
            pagedkv.DType.F32: np.float32,
            pagedkv.DType.F16: np.float16,
        }.get(pool.dtype, np.float32)
        if pool.dtype == pagedkv.DType.BF16:
            import ml_dtypes

            dt = ml_dtypes.bfloat16
        h, d = pool.num_kv_heads, pool.head_dim
        if name in ("q", "out"):
            h = h * rng.choice([1, 2])
        shape = (n, h, d)
        if name == "lse":
            shape, dt = (n, h), np.float32
        if pool.options.kv_layout == pagedkv.KvLayout.MLA:
            o = pool.options
            shape = {
                "kv_c": (n, o.kv_lora_rank),
                "k_pe": (n, o.qk_rope_head_dim),
                "q_latent": (n, 2, o.kv_lora_rank),
                "q_pe": (n, 2, o.qk_rope_head_dim),
                "out": (n, 2, o.kv_lora_rank),
            }.get(name, shape)
        if rng.random() < 0.1 and torch is not None and dt is np.float32:
            return torch.randn(*shape)
        a = (np.random.default_rng(rng.randrange(1 << 30)).standard_normal(shape)).astype(dt)
        if rng.random() < 0.05:
            a = a.astype(np.float64)
        return a

    # ---------------------------------------------------------- actions

    def new_pool(self):
        rng = self.rng
        kw = {"num_blocks": rng.choice([4, 8, 16, 32, 64]), "block_size": rng.choice([1, 2, 4, 16])}
        kind = rng.random()
        if kind < 0.45:
            kw.update(num_layers=rng.choice([1, 2]), num_kv_heads=rng.choice([1, 2]), head_dim=rng.choice([8, 16]))
            kw["dtype"] = rng.choice(["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"])
        elif kind < 0.55:
            kw.update(
                num_layers=rng.choice([1, 2]),
                kv_layout="mla",
                kv_lora_rank=rng.choice([16, 32]),
                qk_rope_head_dim=rng.choice([8, 16]),
                dtype=rng.choice(["f32", "bf16", "f16"]),
            )
        elif kind < 0.65:
            groups = [
                pagedkv.KVGroupSpec.full(1, 1, 8),
                rng.choice(
                    [
                        pagedkv.KVGroupSpec.window(rng.choice([4, 8]), 1, 1, 8),
                        pagedkv.KVGroupSpec.recurrent(1, 64, snapshot_every_block=rng.random() < 0.5),
                        pagedkv.KVGroupSpec.mla(1, 16, 8),
                    ]
                ),
            ]
            return self.invoke(
                "HybridPool", pagedkv.HybridPool, groups, num_blocks=kw["num_blocks"], block_size=kw["block_size"]
            )
        for opt, vals in (
            ("enable_events", [True, True, True]),
            ("enable_retention", [True]),
            ("enable_partial_reuse", [True]),
            ("sliding_window", [4, 8, 2**31 - 1]),
            ("enable_prefix_caching", [False]),
            ("hash_algo", ["xxhash", "sha256"]),
            ("hash_seed", ["s", ""]),
            ("tagged_keys", [True]),
            ("strict_key_domains", [True]),
            ("max_pinned_blocks", [1, 4]),
            ("num_threads", [1, 2]),
            ("max_events", [4, 1000]),
        ):
            if rng.random() < (0.4 if opt == "enable_events" else 0.15):
                kw[opt] = rng.choice(vals)
        if rng.random() < 0.2:
            k = rng.choice(list(kw))
            kw[k] = nasty(rng, self)
        if rng.random() < 0.05:
            kw[rng.choice(["k_scales", "v_scales", "kv_scale_granularity", "memory_budget_bytes", "device"])] = nasty(
                rng, self
            )
        return self.invoke("Pool", pagedkv.Pool, **kw)

    def act_pool(self):
        p = self.new_pool()
        if p is not None:
            self.add("pool", p)

    def act_seq(self):
        pool = self.pick("pool")
        if pool is None:
            return
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            kw = {}
            if rng.random() < 0.3:
                kw[rng.choice(["priority", "lora_id", "cache_salt", "mm_items", "lora_name", "owned", "lora_path"])] = (
                    self.arg(lambda: rng.choice([1, "salt", [(0, 4, "h")], False]), 0.5)
                )
            s = self.invoke("pool.create_sequence", pool.create_sequence, **kw)
        elif r < 0.7:
            kw = {}
            if rng.random() < 0.3:
                kw["lookahead"] = self.arg(lambda: rng.choice([0, 1, 4]))
            if rng.random() < 0.2:
                kw["hashes"] = self.arg(lambda: pool.hash_prefix(self.tokens()))
            if rng.random() < 0.2:
                kw[rng.choice(["priority", "lora_id", "cache_salt", "mm_items", "lora_name", "owned", "lora_path"])] = (
                    self.arg(lambda: rng.choice([1, "salt", [(0, 4, "h")], False, "lora"]), 0.5)
                )
            res = self.invoke("pool.admit", pool.admit, self.arg(self.tokens), **kw)
            s = res[0] if res else None
        elif r < 0.85:
            src = self.seq_of(pool)
            if src is None:
                return
            s = self.invoke("seq.fork", src.fork)
        elif r < 0.95:
            src = self.seq_of(pool)
            sid = self.arg(lambda: src.id if src is not None else 0, 0.3)
            s = self.invoke("pool.sequence", pool.sequence, sid, own=self.arg(lambda: rng.random() < 0.2, 0.1))
        else:
            res = self.invoke(
                "tiers.admit_tiered",
                pkv_tiers.admit_tiered,
                self.arg(lambda: pool),
                self.arg(self.tokens),
                lookahead=self.arg(lambda: 0, 0.2),
            )
            s = res[0] if res else None
        if s is not None:
            self.add("seq", s)

    def act_seq_method(self):
        s = self.pick("seq")
        if s is None:
            return
        rng = self.rng
        pool = s._pool
        m = rng.choice(
            [
                "append",
                "append",
                "append",
                "truncate",
                "match_prefix",
                "match_prefix_partial",
                "set_retention",
                "blocks_needed",
                "reserve",
                "info",
                "block_table",
                "block_hashes",
                "free",
                "detach",
                "len",
                "repr",
                "copy",
                "eq",
                "tiered",
            ]
        )
        if m == "append":
            self.invoke("seq.append", s.append, self.arg(self.tokens), self.arg(lambda: rng.choice([0, 0, 1, 3])))
        elif m == "truncate":
            self.invoke("seq.truncate", s.truncate, self.arg(lambda: rng.randrange(0, 40)))
        elif m == "match_prefix":
            toks = self.arg(self.tokens)
            hashes = None
            if rng.random() < 0.3:
                hashes = self.arg(lambda: pool.hash_prefix(toks if isinstance(toks, list) else []))
            self.invoke("seq.match_prefix", s.match_prefix, toks, hashes)
        elif m == "match_prefix_partial":
            self.invoke("seq.match_prefix_partial", s.match_prefix_partial, self.arg(self.tokens))
        elif m == "set_retention":

            def ranges():
                return [
                    (rng.randrange(0, 20), rng.choice([rng.randrange(0, 40), 2**64 - 1]), rng.randrange(0, 101), 0)
                    for _ in range(rng.randrange(0, 3))
                ]

            self.invoke("seq.set_retention", s.set_retention, self.arg(ranges))
        elif m == "blocks_needed":
            self.invoke(
                "seq.blocks_needed", s.blocks_needed, self.arg(lambda: rng.randrange(0, 50)), self.arg(lambda: 0)
            )
        elif m == "reserve":
            self.invoke("seq.reserve", s.reserve, self.arg(lambda: rng.randrange(0, 100)))
        elif m in ("info", "block_table", "block_hashes", "free", "detach"):
            self.invoke("seq." + m, getattr(s, m))
        elif m == "len":
            self.invoke("len", len, s)
        elif m == "repr":
            self.invoke("repr", repr, s)
        elif m == "copy":
            self.invoke("copy.copy", rng.choice([copy.copy, copy.deepcopy, pickle.dumps]), s)
        elif m == "eq":
            self.invoke("eq", lambda a, b: (a == b, hash(a)), s, self.arg(lambda: self.pick("seq"), 0.5))
        else:
            toks = self.arg(self.tokens)
            self.invoke("tiers.match_prefix_tiered", pkv_tiers.match_prefix_tiered, self.arg(lambda: s, 0.1), toks)

    def act_pool_method(self):
        pool = self.pick("pool")
        if pool is None:
            return
        rng = self.rng
        m = rng.choice(
            [
                "stats",
                "events",
                "validate",
                "set_clock",
                "priority_counts",
                "reset_prefix_cache",
                "kv_tensor",
                "kv_caches",
                "copy_blocks",
                "swap_out",
                "swap_in",
                "kv_scales",
                "set_kv_scales",
                "append_batch",
                "free_batch",
                "hash_prefix",
                "close",
                "repr",
                "tiers",
                "publisher",
                "hybrid",
                "mla",
                "drain",
            ]
        )
        nb = pool.num_blocks if not pool.closed else 4

        def blocks():
            return [rng.randrange(0, nb + 1) for _ in range(rng.randrange(0, 4))]

        if m == "events":
            self.invoke("list(pool.events)", lambda *a: list(pool.events(*a)), self.arg(lambda: rng.choice([1, 10])))
        elif m == "set_clock":
            self.invoke("pool.set_clock", pool.set_clock, self.arg(lambda: rng.randrange(0, 10**12)))
        elif m == "kv_tensor":
            v = self.invoke(
                "pool.kv_tensor", pool.kv_tensor, self.arg(lambda: rng.randrange(3)), self.arg(lambda: rng.choice("kv"))
            )
            if v is not None:
                self.add("view", v)
        elif m == "kv_caches":
            r = self.invoke("pool.kv_caches", pool.kv_caches)
            for kv in r or ():
                self.add("view", kv[0])
        elif m == "copy_blocks":
            src = blocks()
            dst = [rng.randrange(0, nb + 1) for _ in src]
            self.invoke("pool.copy_blocks", pool.copy_blocks, self.arg(lambda: src), self.arg(lambda: dst))
        elif m == "swap_out":
            b = self.invoke("pool.swap_out", pool.swap_out, self.arg(blocks), self.arg(lambda: None, 0.3))
            if b is not None:
                self.add("arr", b)
        elif m == "swap_in":
            buf = self.arg(lambda: self.pick("arr") if self.objs["arr"] else bytes(64))
            self.invoke("pool.swap_in", pool.swap_in, self.arg(blocks), buf)
        elif m == "set_kv_scales":
            n = max(1, pool.options.num_kv_scales)
            self.invoke(
                "pool.set_kv_scales",
                pool.set_kv_scales,
                self.arg(lambda: [rng.choice([0.5, 1.0, 2.0])] * n),
                self.arg(lambda: [1.0] * n),
            )
        elif m == "append_batch":
            seqs = self.seqs_of(pool)
            n = len(seqs)
            self.invoke("pool.append_batch", pool.append_batch, seqs, self.arg(lambda: self.tokens(n)))
        elif m == "free_batch":
            self.invoke("pool.free_batch", pool.free_batch, self.arg(lambda: self.seqs_of(pool)))
        elif m == "hash_prefix":
            kw = {}
            if rng.random() < 0.3:
                kw[rng.choice(["lora_id", "cache_salt", "mm_items", "lora_name", "lora_path"])] = nasty(rng, self)
            self.invoke("pool.hash_prefix", pool.hash_prefix, self.arg(self.tokens), **kw)
        elif m == "close":
            if rng.random() < 0.3:
                self.invoke("pool.close", pool.close)
        elif m == "repr":
            self.invoke("repr", repr, pool)
        elif m == "tiers":
            t = rng.randrange(4)
            if t == 0:
                self.invoke(
                    "tiers.attach",
                    pkv_tiers.attach,
                    pool,
                    host_bytes=self.arg(lambda: rng.choice([0, 4096, 1 << 16, 1 << 20])),
                    file_dir=self.arg(lambda: rng.choice([None, self.tmpdir])),
                    file_bytes=self.arg(lambda: rng.choice([0, 1 << 16])),
                )
            elif t == 1:
                self.invoke("tiers.stats", pkv_tiers.stats, pool, self.arg(lambda: rng.choice([1, 2])))
            else:
                self.invoke("tiers.flush", pkv_tiers.flush, self.arg(lambda: pool, 0.1))
        elif m == "publisher":
            ep = self.arg(lambda: f"inproc://fz{next(self.counter)}", 0.2)
            kw = {}
            if rng.random() < 0.4:
                kw[
                    rng.choice(
                        [
                            "topic",
                            "data_parallel_rank",
                            "buffer_steps",
                            "hwm",
                            "event_encoding",
                            "hash_encoding",
                            "device_medium",
                        ]
                    )
                ] = nasty(rng, self)
            pub = self.invoke("EventPublisher", pkv_events.EventPublisher, pool, ep, **kw)
            if pub is not None:
                self.add("pub", pub)
        elif m == "hybrid":
            if isinstance(pool, pagedkv.HybridPool):
                h = rng.randrange(5)
                g = self.arg(lambda: rng.randrange(3))
                if h == 0:
                    self.invoke("group_of_layer", pool.group_of_layer, self.arg(lambda: rng.randrange(3)))
                elif h == 1:
                    self.invoke("group_block_table", pool.group_block_table, self.arg(lambda: self.seq_of(pool)), g)
                elif h == 2:
                    self.invoke("block_tables", pool.block_tables, self.arg(lambda: self.seq_of(pool)))
                elif h == 3:
                    self.invoke("group_stats", pool.group_stats, g)
                else:
                    self.invoke("take_copies", pool.take_copies, g)
        elif m == "mla":
            self.invoke("mla.bytes_per_token", rng.choice([pkv_mla.bytes_per_token, pkv_mla.is_mla]), pool)
        elif m == "drain":
            self.invoke("events.drain_events", pkv_events.drain_events, pool, self.arg(lambda: rng.choice([1, 100])))
        else:
            self.invoke("pool." + m, getattr(pool, m))

    def act_prepare(self):
        pool = self.pick("pool")
        if pool is None:
            return
        rng = self.rng
        seqs = self.seqs_of(pool)
        r = rng.random()
        if r < 0.3 and seqs is not None:
            b = self.invoke(
                "pool.prepare_decode",
                pool.prepare_decode,
                self.arg(lambda: seqs),
                self.arg(lambda: self.tokens(len(seqs))),
                persistent_table=self.arg(lambda: rng.random() < 0.3, 0.1),
            )
        else:

            def counts():
                out = []
                for s in seqs:
                    if isinstance(s, pagedkv.Sequence):
                        try:
                            i = s.info()
                            out.append(max(1, i.num_tokens - i.num_computed_tokens))
                            continue
                        except pagedkv.PagedKVError:
                            pass
                    out.append(1)
                return out if rng.random() < 0.9 else 1

            fn = pool.prepare if r < 0.9 else (lambda *a, **k: pagedkv.Batch(pool, *a, **k))
            b = self.invoke(
                "pool.prepare",
                fn,
                self.arg(lambda: seqs, 0.1),
                self.arg(counts, 0.1),
                persistent_table=self.arg(lambda: rng.random() < 0.3, 0.1),
            )
        if b is not None:
            self.add("batch", b)

    def act_batch(self):
        b = self.pick("batch")
        if b is None:
            return
        rng = self.rng
        m = rng.choice(
            [
                "write_all",
                "write_all",
                "write_all",
                "write_all",
                "attention",
                "attention",
                "mla_attention",
                "cache_write",
                "attention",
                "attention",
                "commit",
                "abort",
                "close",
                "info",
                "sequences",
                "plan",
                "plan_group",
                "token_positions",
                "last_token_indices",
                "plan_arrays",
                "mla_cache_write",
                "mla_attention",
                "repr",
                "with",
            ]
        )
        layer = lambda: rng.randrange(b._pool.num_layers or 1)  # noqa: E731
        if m == "write_all":
            mla = b._pool.options.kv_layout == pagedkv.KvLayout.MLA
            for li in range(b._pool.num_layers):
                if mla:
                    self.invoke(
                        "batch.mla_cache_write",
                        b.mla_cache_write,
                        li,
                        self.tensor_for(b, "kv_c"),
                        self.tensor_for(b, "k_pe"),
                    )
                else:
                    self.invoke(
                        "batch.cache_write", b.cache_write, li, self.tensor_for(b, "k"), self.tensor_for(b, "v")
                    )
        elif m == "cache_write":
            self.invoke(
                "batch.cache_write",
                b.cache_write,
                self.arg(layer),
                self.arg(lambda: self.tensor_for(b, "k")),
                self.arg(lambda: self.tensor_for(b, "v")),
            )
        elif m == "attention":
            q = self.arg(lambda: self.tensor_for(b, "q"))
            kw = {}
            for k, good in (
                ("lse", lambda: rng.choice([None, True, False])),
                ("softmax_scale", lambda: rng.choice([0.0, 0.1, 1.0])),
                ("sliding_window", lambda: rng.choice([0, 4])),
                ("logit_softcap", lambda: rng.choice([0.0, 30.0])),
                ("stream", lambda: None),
            ):
                if rng.random() < 0.3:
                    kw[k] = self.arg(good, 0.4)
            self.invoke("batch.attention", b.attention, self.arg(layer), q, **kw)
        elif m == "mla_cache_write":
            self.invoke(
                "batch.mla_cache_write",
                b.mla_cache_write,
                self.arg(layer),
                self.arg(lambda: self.tensor_for(b, "kv_c")),
                self.arg(lambda: self.tensor_for(b, "k_pe")),
            )
        elif m == "mla_attention":
            self.invoke(
                "batch.mla_attention",
                b.mla_attention,
                self.arg(layer),
                self.arg(lambda: self.tensor_for(b, "q_latent")),
                self.arg(lambda: self.tensor_for(b, "q_pe")),
                softmax_scale=self.arg(lambda: 0.1, 0.3),
                lse=self.arg(lambda: None, 0.2),
            )
        elif m == "plan":
            v = self.invoke("batch.plan", b.plan, self.arg(lambda: rng.randrange(7)))
            if v is not None:
                self.add("view", v)
        elif m == "plan_group":
            v = self.invoke(
                "batch.plan_group", b.plan_group, self.arg(lambda: rng.randrange(3)), self.arg(lambda: rng.randrange(9))
            )
            if v is not None:
                self.add("view", v)
        elif m in ("token_positions", "last_token_indices"):
            v = self.invoke("batch." + m, getattr(b, m))
            if v is not None:
                self.add("view", v)
        elif m == "plan_arrays":
            d = self.invoke("batch.plan_arrays", b.plan_arrays)
            for v in (d or {}).values():
                self.add("view", v)
        elif m == "repr":
            self.invoke("repr", repr, b)
        elif m == "with":

            def with_block(batch):
                with batch:
                    pass

            self.invoke("with batch", with_block, b)
        elif m == "sequences":
            self.invoke("batch.sequences", lambda: b.sequences)
        else:
            self.invoke("batch." + m, getattr(b, m))

    def act_view(self):
        v = self.pick("view")
        if v is None:
            return
        rng = self.rng
        m = rng.randrange(10)
        if m == 9:  # the public constructors taking library objects, given other things
            ctor = rng.choice([pagedkv.TensorView, pagedkv.Transfer, pkv_transfer.Export])
            self.invoke(ctor.__name__, ctor, nasty(rng, self), self.any_object(), nasty(rng, self))
        elif m == 0:
            a = self.invoke("view.numpy", v.numpy)
            if a is not None:
                self.add("arr", a)
        elif m == 1:
            self.invoke("view.codes", v.codes)
        elif m == 2 and torch is not None:
            self.invoke("view.torch", v.torch)
        elif m == 3:
            self.invoke("np.asarray(view).sum", lambda: _sum(v))
        elif m == 4:
            self.invoke("view.__del__", v.__del__)
        elif m == 5:
            self.invoke(
                "setattr(view)", setattr, v, rng.choice(["shape", "strides", "data", "dtype", "device"]), (1 << 30,)
            )
        elif m == 6:
            self.invoke("repr", repr, v)
        elif m == 7:
            self.invoke("view.nbytes", lambda: (v.nbytes, v.shape, v.strides, v.data, v.readonly))
        else:
            self.invoke("copy.copy", rng.choice([copy.copy, pickle.dumps]), v)

    def act_arr(self):
        a = self.pick("arr")
        if a is None:
            return
        if np.asarray(a).size < 1 << 20:
            self.invoke("arr.sum", lambda: _sum(a))

    def act_module(self):
        rng = self.rng
        m = rng.randrange(16)
        if m == 0:
            kw = {}
            for k in (
                "block_size",
                "algo",
                "seed",
                "lora_id",
                "cache_salt",
                "mm_items",
                "lora_name",
                "strict_key_domains",
                "tagged_keys",
                "lora_path",
            ):
                if rng.random() < 0.15:
                    kw[k] = nasty(rng, self)
            self.invoke("pagedkv.hash_prefix", pagedkv.hash_prefix, self.arg(self.tokens), **kw)
        elif m == 1:
            self.invoke(
                "pagedkv.hash_root", pagedkv.hash_root, self.arg(lambda: "xxhash", 0.5), self.arg(lambda: "s", 0.5)
            )
        elif m == 2:
            self.invoke("pagedkv.hash_size", pagedkv.hash_size, nasty(rng, self))
        elif m == 3:
            self.invoke("pagedkv.status_string", pagedkv.status_string, nasty(rng, self))
        elif m == 4:
            fn = rng.choice(
                [
                    pagedkv.DType.parse,
                    pagedkv.Device.parse,
                    pagedkv.KV.parse,
                    pagedkv.HashAlgo.parse,
                    pagedkv.KvLayout.parse,
                ]
            )
            self.invoke("parse", fn, nasty(rng, self))
        elif m == 5:
            ctor = rng.choice(
                [
                    pagedkv.KVGroupSpec.full,
                    pagedkv.KVGroupSpec.window,
                    pagedkv.KVGroupSpec.mla,
                    pagedkv.KVGroupSpec.recurrent,
                ]
            )
            args = [self.arg(lambda: rng.choice([1, 2, 8, 16]), 0.3) for _ in range(rng.randrange(1, 5))]
            sp = self.invoke("KVGroupSpec", ctor, *args)
            if sp is not None:
                self.add("spec", sp)
        elif m == 6:
            specs = [self.pick("spec") or pagedkv.KVGroupSpec.full(1, 1, 8) for _ in range(rng.randrange(0, 3))]
            if rng.random() < 0.3:
                specs.append(nasty(rng, self))
            p = self.invoke(
                "HybridPool",
                pagedkv.HybridPool,
                specs,
                num_blocks=self.arg(lambda: 16, 0.2),
                block_size=self.arg(lambda: 4, 0.2),
            )
            if p is not None:
                self.add("pool", p)
        elif m == 7:
            self.invoke(
                "pagedkv.Sequence",
                pagedkv.Sequence,
                self.arg(lambda: self.pick("pool"), 0.3),
                self.arg(lambda: rng.choice([0, 1, 2**64 - 1]), 0.5),
                self.arg(lambda: False, 0.5),
            )
        elif m == 8:
            self.invoke(
                "RetentionRange",
                lambda *a: pagedkv.RetentionRange(*a)._as_tuple(),
                *[nasty(rng, self) for _ in range(rng.randrange(4))],
            )
        elif m == 9:
            self.invoke(
                "version",
                lambda: (pagedkv.version(), pagedkv.features(), pagedkv.abi_version(), pagedkv.cuda_device_count()),
            )
        elif m == 10 and rng.random() < 0.3:
            eng = self.invoke(
                "TransferEngine",
                pkv_transfer.TransferEngine,
                transports=self.arg(lambda: "tcp", 0.3),
                timeout_ms=self.arg(lambda: 2000, 0.2),
                export_ttl_ms=self.arg(lambda: 0, 0.2),
            )
            if eng is not None:
                self.add("eng", eng)
        elif m == 11:
            self.act_engine()
        elif m == 12:
            pub = self.pick("pub")
            if pub is not None:
                f = rng.choice(["publish", "endpoint", "replay_endpoint", "stats", "close"])
                self.invoke(
                    "pub." + f, lambda: getattr(pub, f)() if callable(getattr(type(pub), f, None)) else getattr(pub, f)
                )
        elif m == 13:
            b = self.pick("batch")
            fn = rng.choice([pkv_mla.cache_write, pkv_mla.attention])
            self.invoke(
                "mla." + fn.__name__, fn, self.arg(lambda: b, 0.2), *[nasty(rng, self) for _ in range(rng.randrange(5))]
            )
        elif m == 14:
            o = self.any_object()
            self.invoke("gc", lambda: (repr(o), gc.collect(1)))
        else:
            o = self.any_object()
            self.invoke("del-one", self._drop_one)

    def _drop_one(self):
        kinds = [k for k, v in self.objs.items() if v]
        if kinds:
            k = self.rng.choice(kinds)
            self.objs[k].pop(self.rng.randrange(len(self.objs[k])))
        gc.collect(1)

    def act_engine(self):
        rng = self.rng
        eng = self.pick("eng")
        if eng is None:
            return
        m = rng.randrange(7)
        if m == 0:
            pool = self.pick("pool")
            s = self.seq_of(pool) if pool is not None else None
            ex = self.invoke("eng.export", eng.export, self.arg(lambda: pool, 0.1), self.arg(lambda: s, 0.2))
            if ex is not None:
                self.add("export", ex)
        elif m == 1:
            self.invoke("eng.progress", eng.progress)
        elif m == 2:
            ex = self.pick("export")
            pool = self.pick("pool")
            desc = self.arg(lambda: ex.descriptor if ex is not None else b"", 0.3)
            t = self.invoke("eng.import_sequence", eng.import_sequence, self.arg(lambda: pool, 0.1), desc)
            if t is not None:
                self.add("xfer", t)
        elif m == 3:
            ex = self.pick("export")
            if ex is not None:
                self.invoke("export.release", ex.release)
        elif m == 4:
            t = self.pick("xfer")
            if t is not None:
                f = rng.choice(["poll", "cancel", "close", "nbytes", "wait"])
                if f == "wait":
                    self.invoke("xfer.wait", t.wait, self.arg(lambda: 0.05, 0.3))
                elif f == "nbytes":
                    self.invoke("xfer.nbytes", lambda: t.nbytes)
                else:
                    self.invoke("xfer." + f, getattr(t, f))
        elif m == 5:
            self.invoke("eng.num_exports", lambda: eng.num_exports)
        else:
            if rng.random() < 0.3:
                self.invoke("eng.close", eng.close)

    # ---------------------------------------------------------- the loop

    def run(self):
        rng = self.rng
        self.act_pool()
        acts = [
            (self.act_pool, 3),
            (self.act_seq, 14),
            (self.act_seq_method, 25),
            (self.act_pool_method, 18),
            (self.act_prepare, 12),
            (self.act_batch, 14),
            (self.act_view, 5),
            (self.act_arr, 1),
            (self.act_module, 8),
        ]
        fns = [a for a, _ in acts]
        weights = [w for _, w in acts]
        while self.calls < self.ncalls:
            rng.choices(fns, weights)[0]()
        # Teardown: everything closed, then collected.
        for p in self.live_pools():
            self.invoke("pool.validate", p.validate)
        for kind in ("xfer", "export", "eng", "pub", "batch", "view", "seq", "pool"):
            for o in self.objs[kind]:
                c = getattr(o, "close", None) or getattr(o, "release", None)
                if c is not None:
                    self.invoke(f"{kind}.close", c)
        self.objs.clear()
        gc.collect()


def _sum(a):
    # NaN / inf K/V written by the program, complex buffers it swapped into:
    # the fuzzer's own reading, not the package's.
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(np.asarray(a).astype(np.float64).sum())


def _trackable(a):
    # Immutable singletons (the empty tuple, ...) are shared by other code.
    if isinstance(a, (int, float, complex, str, bytes, bool, type(None), type, tuple, frozenset)):
        return False
    return a is not Ellipsis and a is not NotImplemented


def _excused(desc, pool):
    return False


def _short(o):
    try:
        if isinstance(o, np.ndarray):
            return f"ndarray(shape={o.shape}, dtype={o.dtype}, strides={o.strides}, writeable={o.flags.writeable})"
        if torch is not None and isinstance(o, torch.Tensor):
            return f"tensor(shape={tuple(o.shape)}, dtype={o.dtype}, device={o.device}, layout={o.layout})"
        r = repr(o)
    except Exception as e:
        r = f"<{type(o).__name__}: repr raised {type(e).__name__}>"
    return r if len(r) < 120 else r[:117] + "..."


# ---------------------------------------------------------------- driver


def run_child(seed, ncalls, trace_path, tmpdir):
    """In the forked child: stdout/stderr already redirected."""
    with open(trace_path, "w", buffering=1) as trace:
        import faulthandler

        faulthandler.enable(file=trace)
        fz = Fuzzer(seed, ncalls, trace, tmpdir)
        try:
            fz.run()
        except Exception as e:
            fz.violate("fuzzer: " + "".join(traceback.format_exception(type(e), e, e.__traceback__)))
        trace.write(f"CALLS {fz.calls}\n")
        trace.flush()
        faulthandler.disable()
        return 3 if fz.violations else 0


def one_program(seed, ncalls, timeout, workdir):
    trace_path = os.path.join(workdir, f"trace-{seed}.txt")
    out_path = os.path.join(workdir, f"out-{seed}.txt")
    tier_dir = tempfile.mkdtemp(prefix=f"tiers-{seed}-", dir=workdir)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        rc = 70
        try:
            fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            os.setpgid(0, 0)
            soft = 8 << 30
            resource.setrlimit(resource.RLIMIT_DATA, (soft, soft))
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            rc = run_child(seed, ncalls, trace_path, tier_dir)
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(rc)
    deadline = time.monotonic() + timeout
    status = None
    while True:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGABRT)  # faulthandler dumps the stacks into the trace
                time.sleep(0.5)
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            status = "hang"
            break
        time.sleep(0.01)
    with open(trace_path, errors="replace") as f:
        trace = f.read()
    with open(out_path, errors="replace") as f:
        out = f.read()
    calls = 0
    for line in trace.splitlines()[::-1]:
        if line.startswith("CALLS "):
            calls = int(line.split()[1])
            break
        if line[:1].isdigit() and ":" in line:
            calls = int(line.split(":", 1)[0])
            break
    problems = []
    if status == "hang":
        problems.append(f"hang (> {timeout} s)")
    elif os.WIFSIGNALED(status):
        problems.append(f"killed by signal {os.WTERMSIG(status)}")
    elif os.WEXITSTATUS(status) not in (0, 3):
        problems.append(f"exit status {os.WEXITSTATUS(status)}")
    if out:
        problems.append("printed: " + out[:500])
    if "VIOLATION:" in trace:
        problems.append("contract violations")
    import shutil

    shutil.rmtree(tier_dir, ignore_errors=True)
    if not problems:
        os.unlink(trace_path)
        os.unlink(out_path)
    return problems, calls, trace


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="run programs for this long")
    ap.add_argument("--seed", type=int, default=None, help="run this one program and print its trace")
    ap.add_argument("--first-seed", type=int, default=None, help="first seed of the run (default: random)")
    ap.add_argument("--calls", type=int, default=200, help="calls per program")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds before a program counts as hung")
    ap.add_argument("--workdir", default=None, help="where failing traces are kept")
    ap.add_argument("--max-failures", type=int, default=20)
    args = ap.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="pagedkv-fuzz-")
    os.makedirs(workdir, exist_ok=True)
    if args.seed is not None:
        problems, calls, trace = one_program(args.seed, args.calls, args.timeout, workdir)
        print(trace)
        print(f"seed {args.seed}: {calls} calls; " + ("; ".join(problems) if problems else "ok"))
        return 1 if problems else 0
    gc.freeze()  # the children's collections skip the parent's heap (torch's is large)
    first = args.first_seed if args.first_seed is not None else random.randrange(1 << 30)
    end = time.monotonic() + args.seconds
    programs = calls = 0
    failures = []
    seed = first

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # a summary when killed (timeout(1), CI)
    try:
        while time.monotonic() < end and len(failures) < args.max_failures:
            problems, n, trace = one_program(seed, args.calls, args.timeout, workdir)
            programs += 1
            calls += n
            if problems:
                viol = [ln for ln in trace.splitlines() if ln.startswith("VIOLATION:")]
                tail = "\n".join(trace.splitlines()[-12:]) if not viol else "\n".join(viol[:5])
                failures.append(seed)
                print(f"FAIL seed {seed}: {'; '.join(problems)}\n{tail}\n", flush=True)
            seed += 1
            if programs % 100 == 0:
                print(f"fuzz_api: {programs} programs, {calls} calls so far", flush=True)
    except KeyboardInterrupt:
        print("fuzz_api: interrupted", flush=True)
    print(
        f"fuzz_api: {programs} programs, {calls} calls, seeds {first}..{seed - 1}, "
        f"{len(failures)} failed {failures} (traces in {workdir})",
        flush=True,
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
