"""Batched and fused calls: append_batch, free_batch, admit, lookups by
precomputed block hashes, token ids from any buffer."""

from __future__ import annotations

import array

import numpy as np
import pytest

import pagedkv
from conftest import pool_reusing_the_tag_of


def computed(pool, seqs, counts):
    """Commits one step computing the last counts[i] tokens of seqs[i]."""
    with pool.prepare(seqs, counts) as b:
        b.commit()


def state(pool, seqs):
    return [(len(s), s.block_table()) for s in seqs], pool.stats().num_free_blocks


def test_append_batch_equals_one_append_per_sequence():
    rng = np.random.default_rng(0)
    pools = [pagedkv.Pool(num_blocks=256, block_size=16) for _ in range(2)]
    groups = []
    for pool in pools:
        seqs = []
        for i in range(12):
            s = pool.create_sequence()
            s.append(list(range(i * 7, i * 7 + 5 + 3 * i)))
            seqs.append(s)
        computed(pool, seqs, [len(s) for s in seqs])
        seqs.append(seqs[3].fork())  # a shared tail: copy-on-write inside the batch
        groups.append(seqs)
    a, b = groups
    for _step in range(40):
        toks = rng.integers(0, 50000, size=len(a), dtype=np.int64)  # int64: converted
        pools[0].append_batch(np.array([s.id for s in a], dtype=np.uint64), toks)
        for s, t in zip(b, toks.tolist()):
            s.append([t])
        assert state(pools[0], a)[0] == state(pools[1], b)[0]
        assert pools[0].stats().num_free_blocks == pools[1].stats().num_free_blocks
        assert pools[0].stats().num_tokens == pools[1].stats().num_tokens
        computed(pools[0], a, 1)
        computed(pools[1], b, 1)
    for pool in pools:
        pool.validate()
    assert [s.block_hashes() for s in a] == [s.block_hashes() for s in b]


@pytest.mark.parametrize(
    "make",
    [
        lambda v: v,
        lambda v: np.array(v, dtype=np.int32),
        lambda v: np.array(v, dtype=np.int64),
        lambda v: np.array(v, dtype=np.uint16),
        lambda v: array.array("i", v),
        lambda v: array.array("q", v),
        lambda v: memoryview(array.array("i", v)),
        lambda v: tuple(v),
    ],
)
def test_token_ids_from_any_buffer(make):
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    s = pool.create_sequence()
    s.append(make([5, 6, 7, 8, 9]))
    t = pool.create_sequence()
    t.append([5, 6, 7, 8, 9])
    assert s.block_hashes() == t.block_hashes()
    u = pool.create_sequence()
    u.append([1])
    pool.append_batch([u], make([42]))
    assert len(u) == 2


def test_token_ids_from_torch_tensor():
    torch = pytest.importorskip("torch")
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    s = pool.create_sequence()
    s.append(torch.arange(9, dtype=torch.int64))
    t = pool.create_sequence()
    t.append(list(range(9)))
    assert s.block_hashes() == t.block_hashes()


def test_token_ids_of_a_meta_tensor_are_a_type_error_naming_the_argument():
    """A meta torch tensor has no values: numpy() fails, and each element's
    __index__ raised torch's RuntimeError "Tensor.item() cannot be called on
    meta tensors" out of every call taking token ids, naming neither the
    argument nor the element."""
    torch = pytest.importorskip("torch")
    meta = torch.empty(2, dtype=torch.int32, device="meta")
    pool = pagedkv.Pool(num_blocks=16, block_size=4, enable_events=True)
    s, t = pool.create_sequence(), pool.create_sequence()
    before = (pool.stats(), len(s), len(t))
    calls = [
        lambda: s.append(meta),
        lambda: pool.admit(meta),
        lambda: pool.append_batch([s, t], meta),
        lambda: pool.prepare_decode([s, t], meta),
        lambda: s.match_prefix(meta),
        lambda: pool.hash_prefix(meta),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=r"tokens\[0\]: expected an int, got Tensor \(.*meta"):
            call()
    assert (pool.stats(), len(s), len(t)) == before and not list(pool.events())
    pool.validate()


def test_tensor_like_object_converting_to_itself_is_a_type_error():
    """An object named Tensor is read through its numpy(); one whose
    numpy() gave another such object (or itself) was converted again without
    end, overflowing the C stack (a segfault)."""

    class Tensor:
        def numpy(self):
            return Tensor()

    class ListTensor:  # numpy() giving a plain sequence still works
        def numpy(self):
            return [7]

    ListTensor.__name__ = "Tensor"
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    s = pool.create_sequence()
    with pytest.raises(TypeError, match="tokens"):
        s.append(Tensor())
    with pytest.raises(TypeError, match="tokens"):
        pool.append_batch([s], Tensor())
    with pytest.raises(TypeError, match="tokens"):
        pool.prepare_decode([s], Tensor())
    assert len(s) == 0
    pool.append_batch([s], ListTensor())
    assert len(s) == 1
    pool.validate()


def test_out_of_range_token_ids_are_rejected():
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    s = pool.create_sequence()
    with pytest.raises(OverflowError, match=r"tokens\[1\]"):
        s.append(np.array([1, 2**40], dtype=np.int64))
    assert len(s) == 0


def test_append_batch_is_all_or_nothing():
    pool = pagedkv.Pool(num_blocks=5, block_size=4)
    seqs = [pool.create_sequence() for _ in range(3)]
    for s in seqs:
        s.append([1, 2, 3])
    gone = pool.create_sequence()
    gone_id = gone.id
    gone.free()
    before = state(pool, seqs)
    with pytest.raises(pagedkv.NotFoundError, match=r"seqs\[2\]"):
        pool.append_batch([seqs[0].id, seqs[1].id, gone_id], [7, 7, 7])
    assert state(pool, seqs) == before
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"seqs\[2\].*twice"):
        pool.append_batch([seqs[0], seqs[1], seqs[0]], [7, 7, 7])
    assert state(pool, seqs) == before
    for s in seqs:
        s.append([4])  # every block full: each next token takes a new block
    before = state(pool, seqs)
    assert pool.stats().num_free_blocks == 1
    with pytest.raises(pagedkv.OutOfBlocksError, match=r"seqs\[1\]"):
        pool.append_batch(seqs, [7, 7, 7])
    assert state(pool, seqs) == before
    with pytest.raises(ValueError, match="differ in length"):
        pool.append_batch(seqs, [7, 7])
    pool.append_batch(seqs[:1], [7])
    assert len(seqs[0]) == 5
    pool.validate()


def test_free_batch_is_all_or_nothing():
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    seqs = [pool.create_sequence() for _ in range(3)]
    for s in seqs:
        s.append([1, 2, 3, 4, 5])
    free0 = pool.stats().num_free_blocks
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"seqs\[1\].*twice"):
        pool.free_batch([seqs[0].id, seqs[0].id])
    with pytest.raises(pagedkv.NotFoundError, match=r"seqs\[3\]"):
        pool.free_batch([s.id for s in seqs] + [12345])
    assert pool.stats().num_seqs == 3 and pool.stats().num_free_blocks == free0
    pool.free_batch(seqs)
    assert all(s.freed for s in seqs)
    assert pool.stats().num_seqs == 0 and pool.stats().num_free_blocks == 15
    pool.validate()


def test_free_batch_and_append_batch_take_id_arrays_and_generators():
    """free_batch tested `seqs and ...`: a numpy id array of two or more ids
    (the fast form the batched calls document) raised ValueError "truth
    value of an array ... is ambiguous", and so did an empty one; a
    generator raised "not subscriptable"."""
    pool = pagedkv.Pool(num_blocks=32, block_size=4)
    seqs = [pool.create_sequence() for _ in range(6)]
    pool.append_batch((s for s in seqs), [1] * 6)
    assert [len(s) for s in seqs] == [1] * 6
    ids = np.array([s.detach() for s in seqs], dtype=np.uint64)
    pool.free_batch(np.array([], dtype=np.uint64))
    pool.free_batch(ids[:3])
    assert pool.stats().num_seqs == 3
    pool.free_batch(iter(ids[3:5].tolist()))
    assert pool.stats().num_seqs == 1
    keep = pool.sequence(int(ids[5]), own=False)
    with pytest.raises(TypeError, match=r"seqs\[1\]: expected a pagedkv.Sequence"):
        pool.free_batch([keep, int(ids[5])])
    # append_batch raised AttributeError ("'int' object has no attribute '_id'")
    with pytest.raises(TypeError, match=r"seqs\[1\]: expected a pagedkv.Sequence"):
        pool.append_batch([keep, int(ids[5])], [1, 2])
    assert len(keep) == 1
    pool.free_batch(s for s in [keep])
    assert keep.freed and pool.stats().num_seqs == 0
    pool.validate()


def test_batched_calls_refuse_a_sequence_of_another_pool():
    """append_batch and free_batch passed Sequence objects' ids on as they
    were, leaving it to the library to find them unknown: a sequence of a
    closed pool whose tag a later pool reuses (65535 pool creations later)
    has the id of that pool's first sequence, which was appended to or
    freed. Refused as prepare() refuses it, naming the index. (The library
    now starts a reused tag's ids above the old pool's, so the raw id is
    unknown there too.)"""
    pagedkv.Pool(num_blocks=2, block_size=4).close()
    old = pagedkv.Pool(num_blocks=8, block_size=4)
    stale = old.create_sequence()
    stale.append([1, 2, 3])
    old.close()
    pool = pool_reusing_the_tag_of(stale.id, lambda: pagedkv.Pool(num_blocks=8, block_size=4))
    mine = pool.create_sequence()
    mine.append([9, 9])
    assert mine.id >> 48 == stale.id >> 48 and mine.id != stale.id  # the tag came back, the id did not
    with pytest.raises(pagedkv.NotFoundError):
        pool.sequence(stale.id)
    live_other = pagedkv.Pool(num_blocks=8, block_size=4).create_sequence()
    for other in (stale, live_other):
        with pytest.raises(pagedkv.InvalidArgumentError, match=r"seqs\[1\]: the sequence belongs to another pool"):
            pool.append_batch([mine, other], [7, 7])
        with pytest.raises(pagedkv.InvalidArgumentError, match=r"seqs\[0\]: the sequence belongs to another pool"):
            pool.append_batch([other], [7])
        with pytest.raises(pagedkv.InvalidArgumentError, match=r"seqs\[0\]: the sequence belongs to another pool"):
            pool.free_batch([other])
        with pytest.raises(pagedkv.InvalidArgumentError, match=r"seqs\[1\]: the sequence belongs to another pool"):
            pool.free_batch([mine, other])
    assert len(mine) == 2 and not mine.freed and pool.stats().num_seqs == 1
    assert not live_other.freed and len(live_other) == 0
    pool.append_batch([mine], [7])
    pool.free_batch([mine])
    assert mine.freed and pool.stats().num_seqs == 0
    pool.validate()


def test_admit_errors_name_admit():
    """pkv_seq_admit ran pkv_seq_admit_hashes, whose name its messages carried."""
    pool = pagedkv.Pool(num_blocks=4, block_size=4)
    with pytest.raises(pagedkv.OutOfBlocksError, match=r"^pkv_seq_admit: "):
        pool.admit(list(range(100)))
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"^pkv_seq_admit_hashes: num_hashes 2 exceeds"):
        pool.admit(list(range(5)), hashes=[b"\0" * 32] * 2)
    assert pool.stats().num_seqs == 0


def test_admit_equals_match_then_append():
    pool = pagedkv.Pool(num_blocks=64, block_size=4)
    prompt = list(range(100, 118))
    first = pool.create_sequence()
    first.append(prompt)
    computed(pool, [first], len(prompt))
    s, cached = pool.admit(np.array([*prompt, 1, 2], dtype=np.int32), lookahead=3)
    t = pool.create_sequence()
    assert t.match_prefix([*prompt, 1, 2]) == cached == 16
    t.append(([*prompt, 1, 2])[16:], lookahead=3)
    assert len(s) == len(t) == 20
    assert s.block_table()[:4] == t.block_table()[:4] == first.block_table()[:4]
    assert s.info().num_slots == t.info().num_slots
    assert s.num_computed_tokens == 16
    pool.validate()


def test_admit_out_of_blocks_creates_nothing():
    pool = pagedkv.Pool(num_blocks=8, block_size=4)
    cached = pool.create_sequence()
    cached.append(list(range(13)))
    computed(pool, [cached], 13)
    cached.free()  # 3 written full blocks, cached in the free queue
    before = pool.stats()
    with pytest.raises(pagedkv.OutOfBlocksError, match="cached"):
        pool.admit(list(range(13)) + [0] * 20)  # 3 hits leave the queue; 6 more needed, 4 left
    after = pool.stats()
    assert (after.num_seqs, after.num_free_blocks, after.num_cached_blocks) == (
        0,
        before.num_free_blocks,
        before.num_cached_blocks,
    )
    assert after.prefix_query_tokens == before.prefix_query_tokens
    s, hit = pool.admit(list(range(13)) + [0] * 15)
    assert hit == 12 and len(s) == 28
    pool.validate()


def test_lookup_by_precomputed_hashes():
    pool = pagedkv.Pool(num_blocks=64, block_size=4)
    prompt = list(range(40))
    a = pool.create_sequence(cache_salt="tenant-a")
    a.append(prompt)
    hashes = pool.hash_prefix(prompt, cache_salt="tenant-a")
    # Appended but not written: no hit by hashes either (written-block rule).
    assert pool.create_sequence(cache_salt="tenant-a").match_prefix(prompt, hashes=hashes) == 0
    computed(pool, [a], len(prompt))
    b = pool.create_sequence(cache_salt="tenant-a")
    assert b.match_prefix([*prompt, 1], hashes=hashes) == 40
    assert b.block_table() == a.block_table()
    assert pool.create_sequence(cache_salt="tenant-a").match_prefix([*prompt, 1], hashes=hashes[:3]) == 12
    # A bytes buffer of 32-byte hashes works as well.
    packed = b"".join(h.ljust(32, b"\0") for h in hashes)
    _s, hit = pool.admit([*prompt, 1], hashes=packed, cache_salt="tenant-a")
    assert hit == 40
    # Hashes of another domain never hit: rejected before any lookup.
    other = pool.hash_prefix(prompt, cache_salt="tenant-b")
    c = pool.create_sequence(cache_salt="tenant-a")
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"hashes\[0\]"):
        c.match_prefix([*prompt, 1], hashes=other)
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"hashes\[0\]"):
        pool.create_sequence().match_prefix([*prompt, 1], hashes=hashes)  # unsalted sequence
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"hashes\[9\]"):
        c.match_prefix([*prompt[:36], 0, 0, 0, 0, 1], hashes=hashes)  # other tokens in the last block
    with pytest.raises(pagedkv.InvalidArgumentError, match="num_hashes"):
        c.match_prefix(prompt[:8], hashes=hashes)
    assert len(c) == 0
    n_seqs = pool.stats().num_seqs
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"hashes\[0\]"):
        pool.admit([*prompt, 1], hashes=other, cache_salt="tenant-a")
    assert pool.stats().num_seqs == n_seqs
    pool.validate()


def test_closed_pool_rejects_batched_calls():
    pool = pagedkv.Pool(num_blocks=8, block_size=4)
    s = pool.create_sequence()
    pool.close()
    with pytest.raises(pagedkv.InvalidStateError, match="closed"):
        pool.append_batch([s.id], [1])
    with pytest.raises(pagedkv.InvalidStateError, match="closed"):
        pool.admit([1, 2])


def test_prepare_from_an_id_array_equals_prepare_from_sequences():
    pool = pagedkv.Pool(num_blocks=64, block_size=4)
    seqs = [pool.create_sequence() for _ in range(3)]
    for i, s in enumerate(seqs):
        s.append(list(range(5 + i)))
    ids = np.array([s.id for s in seqs], dtype=np.uint64)
    a = pool.prepare(seqs, [5, 6, 7])
    b = pool.prepare(ids, np.array([5, 6, 7], dtype=np.uint32))
    for name, view in a.plan_arrays().items():
        assert np.array_equal(np.asarray(view), np.asarray(b.plan_arrays()[name])), name
    assert [s.id for s in b.sequences] == [s.id for s in seqs]
    b.abort()
    b.close()
    a.commit()
    a.close()
    with pytest.raises(pagedkv.NotFoundError, match=r"seqs\[1\]"):
        pool.prepare(np.array([seqs[0].id, 999], dtype=np.uint64), 1)


def test_batch_sequences_are_the_plans_after_the_id_array_is_reused():
    """A plan made from an id array kept the caller's array itself, so
    batch.sequences named whatever ids the engine wrote into it for the next
    step, not the plan's. It names the plan's sequences."""
    pool = pagedkv.Pool(num_blocks=64, block_size=4)
    seqs = [pool.create_sequence() for _ in range(4)]
    for s in seqs:
        s.append([1, 2, 3])
    ids = np.array([s.id for s in seqs[:2]], np.uint64)
    with pool.prepare(ids, 3) as b:
        ids[:] = [s.id for s in seqs[2:]]  # the engine's next step
        assert [s.id for s in b.sequences] == [s.id for s in seqs[:2]]
    ids_list = [s.id for s in seqs[:2]]
    with pool.prepare_decode(ids_list, [7, 8]) as d:
        ids_list[:] = [s.id for s in seqs[2:]]
        assert [s.id for s in d.sequences] == [s.id for s in seqs[:2]]
    ids[:] = [s.id for s in seqs[:2]]
    with pool.prepare_decode(ids, np.array([9, 9], np.int32)) as d:
        ids[:] = [s.id for s in seqs[2:]]
        assert [s.id for s in d.sequences] == [s.id for s in seqs[:2]]
    pool.validate()


class _IdsRewrittenAfterTheSnapshot(np.ndarray):
    """An id array another thread rewrites between the plan's snapshot of it
    (its copy(), taken under the GIL) and the library call reading it."""

    def copy(self, *args, **kw):
        snapshot = np.asarray(self).copy()
        self[...] = self.next_ids  # the other thread's write, right there
        return snapshot


def test_batch_sequences_and_the_plan_read_the_same_ids():
    """The plan was built from the caller's array, read again after the
    snapshot Batch.sequences reports: an engine thread rewriting the array in
    between made a plan over one sequence that named another."""
    pool = pagedkv.Pool(num_blocks=64, block_size=4)
    seqs = [pool.create_sequence() for _ in range(4)]
    for s in seqs:
        s.append([1, 2, 3])
    for make in (lambda ids: pool.prepare(ids, 3), lambda ids: pool.prepare_decode(ids, np.array([9], np.int32))):
        ids = np.array([seqs[0].id], np.uint64).view(_IdsRewrittenAfterTheSnapshot)
        ids.next_ids = seqs[1].id
        with make(ids) as b:
            (named,) = b.sequences
            pages = list(np.asarray(b.plan(pagedkv.PlanArray.PAGE_INDICES)))
            assert named.id == seqs[0].id
            assert pages == named.block_table()  # the plan's sequence is the one named
    assert len(seqs[0]) == 4 and len(seqs[1]) == 3  # the decode appended to the one named
    pool.validate()
