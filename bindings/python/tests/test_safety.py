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
