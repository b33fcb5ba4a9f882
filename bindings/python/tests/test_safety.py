"""Issue 14: plan arrays are read-only and never trusted, descriptors are
checked for overflow, alignment and aliasing, and sequence handles follow the
documented ownership rule."""

import gc

import numpy as np
import pytest

import pagedkv


def storage_pool():
    return pagedkv.Pool(num_blocks=24, block_size=8, num_layers=1, num_kv_heads=2, head_dim=16, dtype="f32")


def step(pool, rng, seqs, counts, tamper=None):
    """Writes random K/V for one plan and returns its attention output."""
    with pool.prepare(seqs, counts) as b:
        if tamper:
            tamper(b)
        n = b.num_tokens
        k = rng.standard_normal((n, 2, 16)).astype(np.float32)
        v = rng.standard_normal((n, 2, 16)).astype(np.float32)
        q = rng.standard_normal((n, 4, 16)).astype(np.float32)
        b.cache_write(0, k, v)
        return b.attention(0, q)


def test_plan_arrays_are_read_only():
    with storage_pool() as pool:
        s = pool.create_sequence()
        s.append(list(range(11)))
        with pool.prepare([s], 11) as b:  # all of it: a plan needs its context written
            for name, view in b.plan_arrays().items():
                arr = view.numpy()
                assert not arr.flags.writeable, name
                with pytest.raises(ValueError):
                    arr[0] = 1000
            assert b.plan(pagedkv.PlanArray.QUERY_INDPTR).numpy().tolist() == [0, 11]


def test_plan_torch_view_is_a_copy():
    """torch has no read-only tensors: torch() of a plan array is a copy,
    so writing it leaves the plan alone."""
    torch = pytest.importorskip("torch")
    with storage_pool() as pool:
        s = pool.create_sequence()
        s.append(list(range(11)))
        with pool.prepare([s], 11) as b:
            t = b.plan(pagedkv.PlanArray.QUERY_INDPTR).torch()
            assert isinstance(t, torch.Tensor)
            t[1] = 1000
            assert b.plan(pagedkv.PlanArray.QUERY_INDPTR).numpy().tolist() == [0, 11]


def test_forced_writes_into_plan_arrays_do_not_reach_the_kernels():
    """The issue's repro, with numpy's read-only flag forced off: the library
    keeps its own copy, so attention is unchanged (and, under ASan, in
    bounds)."""

    def force(b):
        for p in (pagedkv.PlanArray.QUERY_INDPTR, pagedkv.PlanArray.PAGE_INDPTR, pagedkv.PlanArray.PAGE_INDICES):
            arr = b.plan(p).numpy()
            mem = (np.ctypeslib.as_ctypes_type(arr.dtype) * arr.size).from_address(arr.ctypes.data)
            raw = np.ndarray(arr.shape, arr.dtype, buffer=mem)
            raw[1:] = 1000
            assert b.plan(p).numpy()[1] == 1000  # the callers' copy took the write

    outs = []
    for tamper in (None, force):
        with storage_pool() as pool:
            a, c = pool.create_sequence(), pool.create_sequence()
            a.append(list(range(21)))
            c.append(list(range(100, 113)))
            outs.append(step(pool, np.random.default_rng(5), [a, c], [21, 13], tamper))
    assert np.isfinite(outs[0]).all()
    np.testing.assert_array_equal(outs[0], outs[1])


def test_descriptor_checks_name_the_argument():
    rng = np.random.default_rng(1)
    with storage_pool() as pool:
        s = pool.create_sequence()
        s.append(list(range(10)))
        with pool.prepare([s], 10) as b:
            k = rng.standard_normal((10, 2, 16)).astype(np.float32)
            b.cache_write(0, k, k)
            q = rng.standard_normal((10, 4, 16)).astype(np.float32)
            # Every row of out at one address.
            out = np.lib.stride_tricks.as_strided(np.empty((4, 16), np.float32), (10, 4, 16), (0, 64, 4))
            with pytest.raises(pagedkv.InvalidArgumentError, match="out"):
                b.attention(0, q, out)
            # In place: out is q.
            with pytest.raises(pagedkv.InvalidArgumentError, match="out overlaps q"):
                b.attention(0, q, q)
            # An f32 lse two bytes into its buffer.
            raw = np.zeros(10 * 4 * 4 + 4, np.uint8)
            buf = np.frombuffer(raw.data, dtype=np.uint8, offset=2, count=160)
            lse = np.ndarray((10, 4), np.float32, buffer=buf)
            with pytest.raises(pagedkv.InvalidArgumentError, match=r"lse.*aligned"):
                b.attention(0, q, lse=lse)


def test_engine_that_keeps_only_ids():
    with pagedkv.Pool(num_blocks=16, block_size=4) as pool:
        s = pool.create_sequence()
        s.append([1, 2, 3])
        sid = s.detach()
        assert not s.owned
        del s
        gc.collect()
        h = pool.sequence(sid)  # still there: the pool owns it
        assert h.num_tokens == 3 and not h.owned
        del h
        gc.collect()
        assert pool.sequence(sid).num_tokens == 3
        # owned=False at creation, and own=True to take ownership back.
        t = pool.create_sequence(owned=False).id
        gc.collect()
        owner = pool.sequence(t, own=True)
        assert owner.owned
        del owner
        gc.collect()
        with pytest.raises(pagedkv.NotFoundError):
            pool.sequence(t)
        # Any handle's free() frees it.
        pool.sequence(sid).free()
        with pytest.raises(pagedkv.NotFoundError):
            pool.sequence(sid)
        assert pool.stats().num_seqs == 0


def test_owned_handle_still_frees_on_collection():
    with pagedkv.Pool(num_blocks=16, block_size=4) as pool:
        sid = pool.create_sequence().id  # the handle dies here
        gc.collect()
        with pytest.raises(pagedkv.NotFoundError):
            pool.sequence(sid)


_LISTS_CLEARED_BY_THEIR_ITEMS = r"""
import pagedkv
from pagedkv import _pagedkv as _c


class Clears:
    # An int (or float) whose conversion clears the list holding it.
    def __init__(self, value=1):
        self.value, self.holder = value, None

    def __index__(self):
        self.holder.clear()
        return self.value

    def __float__(self):
        self.holder.clear()
        return float(self.value)


def held(n=2000, value=1, pos=0, fill=1, wrap=None):
    c = Clears(value)
    lst = [fill] * n
    lst[pos] = c if wrap is None else wrap(c)
    c.holder = lst
    return lst


def attempt(name, fn):
    try:
        fn()
    except Exception as e:  # refusing is fine; reading freed items was not
        assert isinstance(e, (pagedkv.PagedKVError, TypeError, ValueError, OverflowError)), (name, e)


pool = pagedkv.Pool(num_blocks=4096, block_size=4, num_layers=1, num_kv_heads=1, head_dim=8,
                    dtype="fp8_e4m3", enable_retention=True)
seq = pool.create_sequence()
attempt("append", lambda: seq.append(held()))
attempt("free_batch", lambda: pool.free_batch(held(value=seq.id, fill=seq.id)))
attempt("copy_blocks", lambda: pool.copy_blocks(held(value=1, fill=2), list(range(3, 2003))))
attempt("swap_out", lambda: pool.swap_out(held(value=1, fill=2)))
attempt("kv_scales", lambda: _c.pkv_pool_set_kv_scales(pool._h, (held(value=1.0, fill=1.0), [1.0])))
attempt("retention", lambda: _c.pkv_seq_set_retention(
    pool._h, seq.id, held(fill=(0, 4, 50, 0), wrap=lambda c: (0, c, 50, 0))))
attempt("mm_items", lambda: _c.pkv_seq_create(pool._h, {"mm_items": held(fill=(0, 4, "h"), wrap=lambda c: (c, 4, "h"))}))
attempt("layer_ids", lambda: _c.pkv_pool_create_groups(
    {"num_blocks": 16}, [{"kind": 0, "num_layers": 2000, "num_kv_heads": 1, "head_dim": 8,
                          "layer_ids": held(value=0, fill=5)}]))
pool.validate()
print("done")
"""


def test_conversions_survive_items_that_clear_their_list():
    """The raw module converted a list in place, reading item i after
    converting item i - 1: an item whose __index__ (or __float__) cleared
    the list left the loop reading freed memory (a segmentation fault for
    tokens, ids, block ids, scales, retention ranges, mm_items and layer
    ids). A list is converted from a snapshot of its items now: each call
    works on what it was given, or refuses it, and the process lives."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", _LISTS_CLEARED_BY_THEIR_ITEMS], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.split() == ["done"], (r.returncode, r.stdout[-500:], r.stderr[-2000:])


def test_append_on_an_uninitialised_sequence_is_named_in_every_form():
    """Sequence.__new__ without __init__: the C append said "append: the
    sequence handle is not initialised" for (tokens) and (tokens, int), but
    the forms it hands to the Python method (keywords, a numpy lookahead)
    raised AttributeError "'Sequence' object has no attribute '_h'"."""
    u = pagedkv.Sequence.__new__(pagedkv.Sequence)
    for form in (
        lambda: u.append([1]),
        lambda: u.append([1], 1),
        lambda: u.append([1], lookahead=1),
        lambda: u.append(tokens=[1]),
        lambda: u.append([1], np.int64(1)),
        lambda: u.append([1], True),
    ):
        with pytest.raises(TypeError, match="append: the sequence handle is not initialised"):
            form()
