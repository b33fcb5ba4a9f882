"""Pool.prepare_decode (``pkv_batch_prepare_decode``): one decode step in one
call. Twin pools get the same random prompts and steps; each step runs as
prepare_decode on one and as append_batch then prepare(1) on the other, and
every plan array element and block table must agree. A failing step appends
nothing."""

from __future__ import annotations

import array

import numpy as np
import pytest

import pagedkv
from pagedkv.hybrid import HybridPool, KVGroupSpec


def arrays(b):
    return {k: np.array(v) for k, v in b.plan_arrays().items()}


def twins(rng, n, *, block_size=4, num_blocks=4000):
    """Two manager-only pools with the same n random prompts, prefilled and
    committed."""
    prompts = [rng.integers(0, 64, size=int(rng.integers(1, 40)), dtype=np.int32) for _ in range(n)]
    out = []
    for _ in range(2):
        pool = pagedkv.Pool(num_blocks=num_blocks, block_size=block_size)
        seqs = [pool.admit(p)[0] for p in prompts]  # a small vocabulary: prefix hits
        with pool.prepare(seqs, [len(s) - s.num_computed_tokens for s in seqs]) as b:
            b.commit()
        out.append((pool, seqs))
    return out


def counts(seqs):
    return [(len(s), s.num_computed_tokens) for s in seqs]


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("as_ids", [False, True])
def test_prepare_decode_equals_append_batch_then_prepare(rng, persistent, as_ids):
    (pa, sa), (pb, sb) = twins(rng, 9)
    assert [s.block_table() for s in sa] == [s.block_table() for s in sb]
    for step in range(30):
        if step % 7 == 3:  # reorder, drop or fork: plans over a changing batch
            perm = rng.permutation(len(sa))
            sa, sb = [sa[i] for i in perm], [sb[i] for i in perm]
            if len(sa) > 3:
                sa.pop().free()
                sb.pop().free()
            k = int(rng.integers(len(sa)))
            sa.append(sa[k].fork())
            sb.append(sb[k].fork())
        toks = rng.integers(0, 64, size=len(sa), dtype=np.int32)
        ids_a = np.array([s.id for s in sa], dtype=np.uint64) if as_ids else sa
        da = pa.prepare_decode(ids_a, toks, persistent_table=persistent)
        pb.append_batch(np.array([s.id for s in sb], dtype=np.uint64), toks)
        db = pb.prepare(sb, 1, persistent_table=persistent)
        assert da.num_seqs == db.num_seqs == len(sa)
        assert da.num_tokens == db.num_tokens == len(sa)
        x, y = arrays(da), arrays(db)
        assert set(x) == {
            "slot_mapping",
            "query_indptr",
            "page_indptr",
            "page_indices",
            "last_page_len",
            "context_lens",
        }
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=f"step {step}: {k}")
        np.testing.assert_array_equal(x["query_indptr"], np.arange(len(sa) + 1))
        assert [s.block_table() for s in sa] == [s.block_table() for s in sb]
        assert counts(sa) == counts(sb)
        if as_ids:
            assert [s.id for s in da.sequences] == [s.id for s in sa]
        else:
            assert da.sequences == sa
        if step % 5 == 4:  # an aborted step: the tokens stay, uncomputed
            da.abort()
            db.abort()
            assert counts(sa) == counts(sb)
            with pa.prepare(sa, [len(s) - s.num_computed_tokens for s in sa]) as b:
                b.commit()
            with pb.prepare(sb, [len(s) - s.num_computed_tokens for s in sb]) as b:
                b.commit()
        else:
            da.commit()
            db.commit()
        da.close()
        db.close()
        pa.validate()
        pb.validate()
    s_a, s_b = pa.stats(), pb.stats()
    assert (s_a.num_free_blocks, s_a.num_tokens, s_a.num_cow_copies) == (
        s_b.num_free_blocks,
        s_b.num_tokens,
        s_b.num_cow_copies,
    )
    assert [s.block_hashes() for s in sa] == [s.block_hashes() for s in sb]


@pytest.mark.parametrize(
    "make_ids, make_tokens",
    [
        (lambda v: np.array(v, dtype=np.uint64), lambda v: np.array(v, dtype=np.int32)),
        (lambda v: np.array(v, dtype=np.int64), lambda v: np.array(v, dtype=np.int64)),
        (lambda v: array.array("Q", v), lambda v: array.array("i", v)),
        (lambda v: list(v), lambda v: tuple(v)),
    ],
)
def test_ids_and_tokens_from_any_buffer(make_ids, make_tokens):
    pool = pagedkv.Pool(num_blocks=64, block_size=4)
    seqs = [pool.admit([1, 2, 3, i])[0] for i in range(3)]
    with pool.prepare(seqs, 4) as b:
        b.commit()
    with pool.prepare_decode(make_ids([s.id for s in seqs]), make_tokens([7, 8, 9])) as b:
        assert b.num_tokens == 3
        assert list(np.array(b.plan(pagedkv.PlanArray.CONTEXT_LENS))) == [5, 5, 5]
    assert [len(s) for s in seqs] == [5, 5, 5]
    assert [s.num_computed_tokens for s in seqs] == [5, 5, 5]
    other = pool.create_sequence()
    other.append([1, 2, 3, 0, 7])
    assert other.block_hashes() == seqs[0].block_hashes()  # token 7 went to seqs[0]


def test_uncomputed_sequence_appends_nothing():
    pool = pagedkv.Pool(num_blocks=64, block_size=4)
    seqs = [pool.admit([5, 6, 7, i, 9])[0] for i in range(3)]
    with pool.prepare(seqs[:2], 5) as b:
        b.commit()
    late = seqs[2]  # its prompt was never computed
    before = counts(seqs), [s.block_table() for s in seqs], pool.stats().num_free_blocks
    with pytest.raises(pagedkv.InvalidStateError, match=r"seqs\[2\]"):
        pool.prepare_decode(seqs, np.array([1, 2, 3], dtype=np.int32))
    assert (counts(seqs), [s.block_table() for s in seqs], pool.stats().num_free_blocks) == before
    with pytest.raises(pagedkv.InvalidStateError):
        pool.prepare_decode(np.array([late.id, seqs[0].id], dtype=np.uint64), [1, 2], persistent_table=True)
    assert (counts(seqs), [s.block_table() for s in seqs], pool.stats().num_free_blocks) == before
    pool.validate()


def test_bad_arguments_change_nothing():
    pool = pagedkv.Pool(num_blocks=5, block_size=4)
    seqs = [pool.admit([1, 2, i])[0] for i in range(3)]
    with pool.prepare(seqs, 3) as b:
        b.commit()

    def snapshot():
        return counts(seqs), [s.block_table() for s in seqs], pool.stats().num_free_blocks

    before = snapshot()
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"seqs\[2\].*twice"):
        pool.prepare_decode([seqs[0], seqs[1], seqs[0]], [7, 7, 7])
    assert snapshot() == before
    with pytest.raises(pagedkv.InvalidArgumentError, match="differ in length"):
        pool.prepare_decode(seqs, np.array([7, 7], dtype=np.int32))
    with pytest.raises(pagedkv.InvalidArgumentError, match="differ in length"):
        pool.prepare_decode(np.array([s.id for s in seqs], dtype=np.uint64), [7, 7, 7, 7])
    assert snapshot() == before
    with pytest.raises(pagedkv.NotFoundError, match=r"seqs\[1\]"):
        pool.prepare_decode([seqs[0].id, 12345], [7, 7])
    with pytest.raises(OverflowError):
        pool.prepare_decode(seqs, np.array([1, 2, 2**40], dtype=np.int64))
    with pytest.raises(TypeError):
        pool.prepare_decode(seqs, ["a", "b", "c"])
    other = pagedkv.Pool(num_blocks=8, block_size=4)
    with pytest.raises(pagedkv.InvalidArgumentError, match="another pool"):
        other.prepare_decode(seqs[:1], [7])
    assert snapshot() == before
    with pytest.raises(pagedkv.InvalidArgumentError, match="num_seqs is 0"):
        pool.prepare_decode([], np.array([], dtype=np.int32))
    with pytest.raises(pagedkv.InvalidArgumentError, match="num_seqs is 0"):
        pool.prepare_decode(np.array([], dtype=np.uint64), [])
    assert snapshot() == before
    with pool.prepare_decode(seqs, [7, 7, 7]) as b:  # fills every block
        assert list(np.array(b.plan(pagedkv.PlanArray.CONTEXT_LENS))) == [4, 4, 4]
    assert counts(seqs) == [(4, 4)] * 3
    # three new blocks are needed, one is free
    before = snapshot()
    assert before[2] == 1
    with pytest.raises(pagedkv.OutOfBlocksError, match=r"nothing was appended"):
        pool.prepare_decode(seqs, [8, 8, 8], persistent_table=True)
    assert snapshot() == before
    with pool.prepare_decode(seqs[1:2], [8]) as b:  # one fits
        assert list(np.array(b.plan(pagedkv.PlanArray.CONTEXT_LENS))) == [5]
    assert counts(seqs) == [(4, 4), (5, 5), (4, 4)]
    pool.validate()


def test_closed_pool_and_freed_sequence():
    pool = pagedkv.Pool(num_blocks=32, block_size=4)
    seqs = [pool.admit([1, 2, 3])[0] for _ in range(2)]
    with pool.prepare(seqs, [3, 3]) as b:
        b.commit()
    gone = seqs[1]
    gone_id = gone.id
    gone.free()
    with pytest.raises(pagedkv.NotFoundError, match=r"seqs\[1\]"):
        pool.prepare_decode([seqs[0], gone], [4, 4])
    with pytest.raises(pagedkv.NotFoundError):
        pool.prepare_decode(np.array([gone_id], dtype=np.uint64), [4])
    other = pagedkv.Pool(num_blocks=8, block_size=4)
    with pytest.raises(pagedkv.NotFoundError):  # an id names its pool
        other.prepare_decode(np.array([seqs[0].id], dtype=np.uint64), [4])
    assert len(seqs[0]) == 3
    b = pool.prepare_decode(seqs[:1], [4])
    pool.close()
    with pytest.raises(pagedkv.InvalidStateError):
        pool.prepare_decode(seqs[:1], [5])
    with pytest.raises(pagedkv.InvalidStateError):
        pool.prepare_decode(np.array([seqs[0].id], dtype=np.uint64), np.array([5], dtype=np.int32))
    # the plan made before the close outlives its pool: clean errors
    assert list(np.array(b.plan(pagedkv.PlanArray.CONTEXT_LENS))) == [4]
    with pytest.raises(pagedkv.InvalidStateError):
        b.commit()
    b.close()
    b.close()


def test_hybrid_pool_is_unsupported():
    pool = HybridPool([KVGroupSpec.full(1, 2, 8), KVGroupSpec.recurrent(7, 4096)], num_blocks=32, block_size=4)
    s = pool.create_sequence()
    s.append([1, 2, 3])
    with pool.prepare([s], 3) as b:
        b.commit()
    with pytest.raises(pagedkv.UnsupportedError):
        pool.prepare_decode([s], [4])
    with pytest.raises(pagedkv.UnsupportedError):
        pool.prepare_decode([s], [4], persistent_table=True)
    assert len(s) == 3 and s.num_computed_tokens == 3
    s.append([4])  # the way there: append, then prepare
    with pool.prepare([s], 1) as b:
        b.commit()
    assert s.num_computed_tokens == 4


def test_ids_of_the_wrong_type_and_generators():
    """Non-int ids are a TypeError (as non-int tokens are), not an
    OverflowError claiming a range; a generator of Sequences works as it does
    for prepare()."""
    pool = pagedkv.Pool(num_blocks=32, block_size=4)
    seqs = [pool.admit([1, 2, 3])[0] for _ in range(3)]
    with pool.prepare(seqs, [3, 3, 3]) as b:
        b.commit()
    ids = np.array([s.id for s in seqs], dtype=np.uint64)
    for bad in (ids.astype(np.float64), [float(ids[0]), 1.0, 2.0], [seqs[0].id, seqs[1], seqs[2].id], [None] * 3):
        with pytest.raises(TypeError, match=r"seqs\[\d\]: expected an int"):
            pool.prepare_decode(bad, [7, 7, 7])
        with pytest.raises(TypeError, match=r"seqs\[\d\]: expected an int"):
            pool.append_batch(bad, [7, 7, 7])
    with pytest.raises(OverflowError, match=r"seqs\[1\]"):  # an int out of range stays one
        pool.prepare_decode([seqs[0].id, -1, seqs[2].id], [7, 7, 7])
    assert [len(s) for s in seqs] == [3, 3, 3]
    with pool.prepare_decode((s for s in seqs), [7, 8, 9]) as b:
        assert b.num_seqs == 3
        b.commit()
    with pool.prepare_decode(iter([s.id for s in seqs]), [1, 2, 3]) as b:
        b.commit()
    assert [len(s) for s in seqs] == [5, 5, 5]
    assert [s.num_computed_tokens for s in seqs] == [5, 5, 5]
