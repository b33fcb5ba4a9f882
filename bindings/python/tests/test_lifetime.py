"""Lifetimes across the FFI boundary: nothing dangles, nothing leaks."""

import gc
import weakref

import numpy as np
import pytest

import pagedkv


def make_pool(**kw):
    kw.setdefault("num_blocks", 16)
    kw.setdefault("block_size", 4)
    return pagedkv.Pool(**kw)


def test_dropped_pool_lives_while_sequences_do():
    pool = make_pool()
    seqs = [pool.create_sequence() for _ in range(3)]
    for seq in seqs:
        seq.append([1, 2, 3, 4, 5])
    del seq
    ref = weakref.ref(pool)
    del pool
    gc.collect()
    assert ref() is not None  # sequences hold it
    child = seqs[0].fork()
    child.append([6])
    assert child.num_tokens == 6
    assert ref().stats().num_seqs == 4
    ref().validate()
    del seqs, child
    gc.collect()
    assert ref() is None  # and it went with them


def test_garbage_collected_sequences_are_freed():
    pool = make_pool()
    s = pool.create_sequence()
    s.append(list(range(10)))
    assert pool.stats().num_seqs == 1
    del s
    gc.collect()
    st = pool.stats()
    assert st.num_seqs == 0 and st.num_used_blocks == 0
    pool.validate()


def test_sequences_outliving_a_closed_pool():
    pool = make_pool()
    s = pool.create_sequence()
    s.append([1])
    pool.close()
    gc.collect()
    with pytest.raises(pagedkv.InvalidStateError):
        s.info()
    del s  # finalizer on a closed pool: silent
    gc.collect()


def test_views_keep_storage_past_close():
    pool = make_pool(num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32")
    arr = pool.kv_tensor(0, "v").numpy()
    arr[...] = 3.0
    pool.close()
    del pool
    gc.collect()
    # The storage is still there: the view pins it.
    assert float(arr.sum()) == 3.0 * arr.size
    arr[1, 0, 0, 0] = 4.0
    del arr
    gc.collect()


def test_batches_keep_their_sequences_and_pool():
    pool = make_pool()
    s = pool.create_sequence()
    s.append([1, 2, 3])
    b = pool.prepare([s], 3)
    sref, pref = weakref.ref(s), weakref.ref(pool)
    del s, pool
    gc.collect()
    assert sref() is not None and pref() is not None
    assert b.plan(pagedkv.PlanArray.CONTEXT_LENS).numpy().tolist() == [3]
    del b
    gc.collect()
    assert sref() is None and pref() is None


def test_many_pools_and_batches_do_not_accumulate():
    # Repeated create/destroy with gc in between: every handle is released
    # (the sanitizer builds check the library; here the Python side).
    refs = []
    for i in range(20):
        pool = make_pool(num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32")
        s = pool.create_sequence()
        s.append(list(range(7)))
        with pool.prepare([s], 7) as b:
            kv = np.ones((7, 1, 64), np.float32)
            b.cache_write(0, kv, kv)
            b.attention(0, np.ones((7, 1, 64), np.float32))
        refs.append(weakref.ref(pool))
        del pool, s, b
        if i % 5 == 0:
            gc.collect()
    gc.collect()
    assert all(r() is None for r in refs)


def test_exceptions_do_not_pin_objects():
    pool = make_pool()
    s = pool.create_sequence()
    try:
        s.append(list(range(1000)))
    except pagedkv.OutOfBlocksError as e:
        err = e.with_traceback(None)  # the traceback's frames would hold them
    pref = weakref.ref(pool)
    del pool, s
    gc.collect()
    assert pref() is None
    assert err.status == pagedkv.OutOfBlocksError.status
