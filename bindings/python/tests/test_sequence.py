"""Sequence operations and prefix hashing."""

import array
import subprocess
import sys

import numpy as np
import pytest

import pagedkv


def test_append_info_and_tables(manager_pool):
    s = manager_pool.create_sequence(priority=7, lora_id=0)
    assert len(s) == 0 and s.block_table() == []
    s.append(np.arange(6, dtype=np.int32))  # zero-copy int32 buffer
    s.append(array.array("i", [6, 7]))
    s.append([8])
    info = s.info()
    assert isinstance(info, pagedkv.SequenceInfo)
    assert (info.priority, info.num_tokens, info.num_blocks, info.num_slots) == (7, 9, 3, 12)
    assert s.num_tokens == 9 == len(s)
    table = s.block_table()
    assert len(table) == 3 and len(set(table)) == 3 and pagedkv.NULL_BLOCK not in table
    assert s.block_hashes() == pagedkv.hash_prefix(list(range(9)), block_size=4)
    assert s.block_hashes() == manager_pool.hash_prefix(list(range(9)))
    assert s.blocks_needed(3) == 0 and s.blocks_needed(4) == 1 and s.blocks_needed(4, lookahead=4) == 2


def test_lookahead_reserves_slots(manager_pool):
    s = manager_pool.create_sequence()
    s.append([1, 2, 3], lookahead=6)
    info = s.info()
    assert info.num_tokens == 3 and info.num_slots >= 9 and info.num_blocks == 3


def test_append_every_argument_form(manager_pool):
    # append runs in C for (tokens) and (tokens, int); keywords and other
    # lookahead types take the Python method: every form must do the same.
    s = manager_pool.create_sequence()
    s.append([1])
    s.append([2], 3)
    s.append(tokens=[3])
    s.append([4], lookahead=np.int64(2))
    s.append(np.array([5], dtype=np.int32), lookahead=True)
    assert len(s) == 5 and s.block_hashes() == manager_pool.hash_prefix([1, 2, 3, 4, 5])
    assert s.info().num_slots >= 5 + 2
    with pytest.raises(TypeError):
        s.append()
    with pytest.raises(TypeError):
        s.append([6], 0, 0)
    with pytest.raises(TypeError):
        s.append([6], spare=1)
    with pytest.raises(TypeError, match="lookahead"):
        s.append([6], 1.5)
    with pytest.raises(OverflowError, match="num_lookahead"):
        s.append([6], -1)
    assert len(s) == 5
    s.free()
    with pytest.raises(pagedkv.NotFoundError):
        s.append([6])
    with pytest.raises(TypeError, match="not initialised"):
        pagedkv.Sequence.__new__(pagedkv.Sequence).append([1])


def test_append_argument_errors_name_append(manager_pool):
    """Arguments the C append does not take are handed to the Python method
    Sequence._append_py, whose own name was in their errors ("Sequence.
    _append_py() missing 1 required positional argument: 'tokens'"): a
    method the caller never called. They name append(), as before it ran
    in C, and change nothing."""
    s = manager_pool.create_sequence()
    for args, kw in (
        ((), {}),
        (([1], 0, 0), {}),
        (([1],), {"tokens": [2]}),
        (([1],), {"spare": 1}),
        ((), {"lookahead": 1}),
        (([1],), {"lookahead": 1, "lookahead_": 2}),
    ):
        with pytest.raises(TypeError, match=r"(^|\.)append\(\)") as e:
            s.append(*args, **kw)
        assert "_append_py" not in str(e.value)
    assert len(s) == 0


def test_create_sequence_defaults_given_explicitly(manager_pool):
    # create_sequence() takes a fast path when every option is at its
    # default; the same defaults given (or given as other falsy values)
    # make the same kind of sequence.
    for kw in (
        {},
        {"priority": 0, "lora_id": 0, "mm_items": ()},
        {"mm_items": []},
        {"priority": False},
        {"mm_items": np.zeros(0)},
        {"owned": True},
    ):
        s = manager_pool.create_sequence(**kw)
        assert s.owned and s.info().priority == 0 and s.info().lora_id == 0
        s.append(list(range(9)))
        assert s.block_hashes() == manager_pool.hash_prefix(list(range(9)))
        s.free()
    s = manager_pool.create_sequence(owned=False)
    assert not s.owned
    manager_pool.free_batch([s.id])


def test_match_prefix_shares_blocks(manager_pool):
    prompt = list(range(50, 61))  # 11 tokens: 2 full blocks + 3
    a = manager_pool.create_sequence()
    assert a.match_prefix(prompt) == 0
    a.append(prompt)
    b = manager_pool.create_sequence()
    assert b.match_prefix(prompt) == 0  # nothing computed yet: never shared
    b.free()
    with manager_pool.prepare([a], len(a)):
        pass  # a's step: committed when the block ends
    b = manager_pool.create_sequence()
    assert b.match_prefix(prompt) == 8
    assert b.info().num_cached_tokens == 8 and b.num_tokens == 8
    assert b.block_table() == a.block_table()[:2]
    b.append(prompt[8:])
    assert b.block_table()[:2] == a.block_table()[:2] and b.block_table()[2] != a.block_table()[2]
    # At least one token is always left to compute.
    c = manager_pool.create_sequence()
    assert c.match_prefix(prompt[:8]) == 4
    manager_pool.validate()


def test_salt_and_lora_separate_caches(manager_pool):
    prompt = list(range(9))
    a = manager_pool.create_sequence(cache_salt="tenant-a")
    a.append(prompt)
    with manager_pool.prepare([a], len(a)):
        pass
    assert manager_pool.create_sequence(cache_salt="tenant-b").match_prefix(prompt) == 0
    assert manager_pool.create_sequence().match_prefix(prompt) == 0
    assert manager_pool.create_sequence(cache_salt="tenant-a").match_prefix(prompt) == 8
    lo = manager_pool.create_sequence(lora_id=3)
    lo.append(prompt)
    with manager_pool.prepare([lo], len(lo)):
        pass
    assert manager_pool.create_sequence(lora_id=4).match_prefix(prompt) == 0
    assert manager_pool.create_sequence(lora_id=3).match_prefix(prompt) == 8
    assert lo.info().lora_id == 3
    assert a.block_hashes() == pagedkv.hash_prefix(prompt, block_size=4, cache_salt="tenant-a")
    assert lo.block_hashes() == pagedkv.hash_prefix(prompt, block_size=4, lora_id=3)


def test_multimodal_items_change_hashes(manager_pool):
    prompt = list(range(12))
    items = [pagedkv.MMItem(offset=2, length=3, hash="img-1")]
    s = manager_pool.create_sequence(mm_items=items)
    s.append(prompt)
    mm = pagedkv.hash_prefix(prompt, block_size=4, mm_items=[(2, 3, "img-1")])
    plain = pagedkv.hash_prefix(prompt, block_size=4)
    assert s.block_hashes() == mm
    assert mm[0] != plain[0]
    other = pagedkv.hash_prefix(prompt, block_size=4, mm_items=[(2, 3, "img-2")])
    assert other[0] != mm[0]


def test_fork_shares_then_copies_on_write(manager_pool):
    parent = manager_pool.create_sequence()
    parent.append(list(range(6)))  # one full block + 2 tokens
    with manager_pool.prepare([parent], 6):
        pass  # fork after the step that computed the parent
    child = parent.fork()
    assert child.block_table() == parent.block_table()
    assert child.num_tokens == 6
    used = manager_pool.stats().num_used_blocks
    child.append([100])  # writes into the shared partial block: copy-on-write
    assert child.block_table()[0] == parent.block_table()[0]
    assert child.block_table()[1] != parent.block_table()[1]
    assert manager_pool.stats().num_used_blocks == used + 1
    with manager_pool.prepare([child], 1):
        pass  # executes the pending copy
    assert manager_pool.stats().num_cow_copies >= 1
    manager_pool.validate()


def test_truncate_releases_blocks(manager_pool):
    s = manager_pool.create_sequence()
    s.append(list(range(10)))
    free = manager_pool.stats().num_free_blocks
    s.truncate(5)
    assert s.num_tokens == 5 and len(s.block_table()) == 2
    assert manager_pool.stats().num_free_blocks == free + 1
    with pytest.raises(pagedkv.InvalidArgumentError):
        s.truncate(6)
    s.truncate(0)
    assert s.block_table() == []
    manager_pool.validate()


def test_free_is_idempotent_and_returns_blocks(manager_pool):
    s = manager_pool.create_sequence()
    s.append(list(range(7)))
    s.free()
    s.free()
    assert s.freed
    st = manager_pool.stats()
    assert st.num_seqs == 0 and st.num_free_blocks == 15
    with manager_pool.create_sequence() as t:
        t.append([1])
    assert t.freed and manager_pool.stats().num_seqs == 0


def test_sliding_window_releases_to_null_block():
    with pagedkv.Pool(num_blocks=16, block_size=4, sliding_window=8) as pool:
        s = pool.create_sequence()
        s.append(list(range(24)))  # a prefill's queries still see its start
        assert pagedkv.NULL_BLOCK not in s.block_table()
        # Each step prepares a plan over its new tokens, as an engine does:
        # the window slides only past tokens a prepared plan computed.
        with pool.prepare([s], 24):
            pass
        for t in range(24, 32):  # decode steps slide the window
            s.append([t])
            with pool.prepare([s], 1):
                pass
        table = s.block_table()
        assert table[0] == pagedkv.NULL_BLOCK
        assert table[-1] != pagedkv.NULL_BLOCK
        # Only blocks touching the last 8 tokens are held.
        assert sum(b != pagedkv.NULL_BLOCK for b in table) <= 3
        pool.validate()


def test_hash_functions():
    root = pagedkv.hash_root("sha256_cbor", "")
    assert len(root) == 32
    assert pagedkv.hash_root("sha256_cbor", "x") != root
    assert len(pagedkv.hash_root("xxh3_128")) == 16
    h = pagedkv.hash_prefix(list(range(35)), block_size=16)
    assert len(h) == 2 and all(len(x) == 32 for x in h)
    # Chained: the second block's hash depends on the first block's tokens.
    h2 = pagedkv.hash_prefix([1, *list(range(1, 35))], block_size=16)
    assert h2[0] != h[0] and h2[1] != h[1]
    assert pagedkv.hash_prefix(list(range(35)), block_size=16, seed="s") != h
    x = pagedkv.hash_prefix(np.arange(35, dtype=np.int32), block_size=16, algo="xxh3_128")
    assert len(x) == 2 and all(len(d) == 16 for d in x)
    assert pagedkv.hash_prefix([1, 2, 3], block_size=16) == []


def test_bad_token_input(manager_pool):
    s = manager_pool.create_sequence()
    with pytest.raises(OverflowError, match="tokens"):
        s.append([2**40])
    with pytest.raises(TypeError, match="tokens"):
        s.append(["a"])
    with pytest.raises(TypeError):
        s.append(3)
    s.append(np.arange(4, dtype=np.int64))  # copied and range-checked
    assert s.num_tokens == 4


# Digests from tests/hash/pyref.py (vLLM's current block hashing in Python:
# cbor2 canonical + hashlib), seed "" and block size 4.
LORA_NAME_VECTOR = [
    "57a891e4b6cb6a32257a80070b41e8c2c4be378d75682997a00ddd87bb9f150a",
    "31c575fbacde4474bd78de3f5395b099a1441ffbad28bb57d4e0a65b81463087",
]
MM_DECODE_VECTOR = [
    "f4283c434ecdbd4d07af2439f6d3cf09a926973908760be4f5e9bd4a1c64cfc5",
    "202b0131f1b2bd1c7b42bd9755db8693dd644c8fb7645086adf68a68310ff122",
]


def test_lora_name_keys_blocks_as_vllm(manager_pool):
    prompt = list(range(1, 9))
    named = manager_pool.create_sequence(lora_name="sql-lora")
    named.append([*prompt, 9])
    with manager_pool.prepare([named], len(named)):
        pass  # computed: its blocks can be hit
    assert [h.hex() for h in named.block_hashes()] == LORA_NAME_VECTOR
    assert [h.hex() for h in pagedkv.hash_prefix(prompt, block_size=4, lora_name="sql-lora")] == LORA_NAME_VECTOR
    assert manager_pool.hash_prefix(prompt, lora_name="sql-lora") == named.block_hashes()
    # Another name, no name, or an id in place of the name: no hit.
    assert manager_pool.create_sequence(lora_name="other").match_prefix([*prompt, 9]) == 0
    assert manager_pool.create_sequence().match_prefix([*prompt, 9]) == 0
    assert manager_pool.create_sequence(lora_id=1).match_prefix([*prompt, 9]) == 0
    assert manager_pool.create_sequence(lora_name="sql-lora").match_prefix([*prompt, 9]) == 8
    # "" is no name (the default).
    assert pagedkv.hash_prefix(prompt, block_size=4, lora_name="") == pagedkv.hash_prefix(prompt, block_size=4)


def test_multimodal_block_completed_by_decode_matches_vllm(manager_pool):
    # issue 13: block 1 starts where the image ends and is completed by decode.
    s = manager_pool.create_sequence(mm_items=[(0, 4, "img")])
    s.append([-1, -1, -1, -1, 5, 6])
    s.append([7])
    s.append([8])
    assert [h.hex() for h in s.block_hashes()] == MM_DECODE_VECTOR
    tokens = [-1, -1, -1, -1, 5, 6, 7, 8]
    hashes = pagedkv.hash_prefix(tokens, block_size=4, mm_items=[(0, 4, "img")])
    assert [h.hex() for h in hashes] == MM_DECODE_VECTOR


def test_lora_name_bad_type_is_a_type_error(manager_pool):
    with pytest.raises(TypeError):
        manager_pool.create_sequence(lora_name=5)


def test_ids_print_as_the_library_prints_them(manager_pool):
    s = manager_pool.create_sequence()
    text = f"seq {s.id:#018x}"
    assert text in repr(s) and len(text) == len("seq 0x") + 16


def _snapshot(pool, s):
    """What a caller can see of s and its pool."""
    return s.info(), s.block_table(), s.block_hashes(), pool.stats()


def test_reserve_changes_nothing_a_caller_sees():
    # Two pools driven alike, one sequence of each reserved at admission: the
    # prefill and 40 decode steps leave infos, tables, hashes and pool stats
    # identical to the twin's (reserve is a host-memory hint, takes no block).
    pools = [pagedkv.Pool(num_blocks=32, block_size=4) for _ in range(2)]
    seqs = []
    for reserved, pool in enumerate(pools):
        s = pool.create_sequence()
        if reserved:
            seen = _snapshot(pool, s)
            s.reserve(7 + 40)
            s.reserve(3)  # below the room already made: a no-op
            s.reserve(np.uint64(100))  # numpy ints convert like truncate's
            assert _snapshot(pool, s) == seen
        s.append(list(range(7)))
        with pool.prepare([s], 7):
            pass
        seqs.append(s)
    assert _snapshot(pools[0], seqs[0]) == _snapshot(pools[1], seqs[1])
    for step in range(40):
        for pool, s in zip(pools, seqs):
            with pool.prepare_decode([s], [1000 + step]):
                pass
        assert _snapshot(pools[0], seqs[0]) == _snapshot(pools[1], seqs[1])
    assert seqs[1].num_tokens == 47 and seqs[1].num_computed_tokens == 47
    for pool in pools:
        pool.validate()


def test_reserve_bad_input(manager_pool):
    s = manager_pool.create_sequence()
    s.append(list(range(6)))
    before = _snapshot(manager_pool, s)
    # Out of the library's range (2^31 - 1 tokens at most): refused by it.
    for n in (2**31, 2**62, 2**64 - 1):
        with pytest.raises(pagedkv.InvalidArgumentError, match="num_tokens"):
            s.reserve(n)
    # Not a uint64: refused by the conversion, as truncate's argument is.
    for n in (-1, 2**64, 2**100):
        with pytest.raises(OverflowError):
            s.reserve(n)
        with pytest.raises(OverflowError):
            s.truncate(n)
    # Not an int at all (a str, a float): a TypeError, never int()'s reading.
    for bad, exc in ((None, TypeError), ([4], TypeError), ("many", TypeError), ("5", TypeError), (5.0, TypeError)):
        with pytest.raises(exc):
            s.reserve(bad)
        with pytest.raises(exc):
            s.truncate(bad)
    assert _snapshot(manager_pool, s) == before
    s.reserve(64)  # still usable afterwards
    s.append([6])
    assert s.num_tokens == 7
    manager_pool.validate()
    # A freed sequence is a stale id; a closed pool is closed.
    t = manager_pool.create_sequence()
    t.free()
    with pytest.raises(pagedkv.NotFoundError):
        t.reserve(8)
    with pytest.raises(pagedkv.NotFoundError):
        manager_pool.sequence(12345).reserve(8)
    manager_pool.close()
    with pytest.raises(pagedkv.InvalidStateError, match="closed"):
        s.reserve(8)


def test_an_int_sequence_too_large_to_convert_is_not_called_a_non_sequence(manager_pool):
    """Converting a sequence of ints too large to hold (range(2**62): the
    list of its items cannot be allocated) raised TypeError "tokens:
    expected a sequence or buffer of ints, got range": the MemoryError (or
    OverflowError) was replaced by a message saying the argument was of the
    wrong kind. It propagates now; nothing changes. Since the length is
    checked before anything is read, it is the library's InvalidArgumentError
    for too many items, naming the argument (test_huge_inputs.py)."""
    s = manager_pool.create_sequence()
    s.append([1, 2, 3])
    before = (manager_pool.stats(), s.info())
    for call in (
        lambda: s.append(range(2**62)),
        lambda: manager_pool.append_batch(range(2**62), [1]),
        lambda: manager_pool.free_batch(range(2**62)),
        lambda: manager_pool.copy_blocks(range(2**62), range(2**62)),
    ):
        with pytest.raises(pagedkv.InvalidArgumentError, match=r"^(tokens|seqs|src): \d+ items, more than"):
            call()
    assert (manager_pool.stats(), s.info()) == before
    with pytest.raises(TypeError, match="tokens: expected a sequence or buffer of ints, got object"):
        s.append(object())  # not a sequence: still named so


def test_strided_int_arrays_are_copied_without_an_object_per_element(manager_pool):
    """A non-contiguous numpy int array (a slice, a reversed or broadcast
    array) was read as a Python sequence, one int object per element: a
    broadcast of 2^26 tokens took 2.9 GB and 16 s (2^31 of them, more memory
    than a machine has) where its contiguous copy takes 256 MB. Strided
    1-d integer buffers are copied element by element now, with the same
    values and range checks as contiguous ones."""
    base = np.arange(100, 140, dtype=np.int64)
    s = manager_pool.create_sequence()
    s.append(base[::2])
    s.append(base[::-3].astype(np.int32)[::2])
    assert s.num_tokens == 20 + 7
    ref = manager_pool.create_sequence()
    ref.append([*range(100, 140, 2), *[int(x) for x in base[::-3][::2]]])
    assert s.block_hashes() == ref.block_hashes()
    with pytest.raises(OverflowError, match=r"tokens\[1\]"):
        s.append(np.array([0, 0, 2**40, 0], dtype=np.int64)[::2])
    with pytest.raises(TypeError, match="1-d"):
        s.append(np.zeros((4, 4), dtype=np.int32)[:, ::2])
    s.free()
    ref.free()
    # Sequence ids too: every other entry of an id array.
    a, b = manager_pool.create_sequence(), manager_pool.create_sequence()
    ids = np.array([a.id, 0, b.id, 0], dtype=np.uint64)
    manager_pool.append_batch(ids[::2], np.array([7, 0, 8], dtype=np.int32)[::2])
    assert (a.num_tokens, b.num_tokens) == (1, 1)
    manager_pool.free_batch(ids[::2])
    # 2^26 tokens broadcast from one int32 (4 bytes of memory), hashed under
    # an address-space limit of 768 MB more than the process holds: the
    # copy takes 256 MB, a list of int objects more than 2 GB.
    code = (
        "import resource, numpy as np, pagedkv\n"
        "tokens = np.broadcast_to(np.int32(7), (1 << 26,))\n"
        "vm = [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmSize:')][0] << 10\n"
        "resource.setrlimit(resource.RLIMIT_AS, (vm + (768 << 20), resource.RLIM_INFINITY))\n"
        "print(len(pagedkv.hash_prefix(tokens, block_size=1 << 22, algo='xxh3_128')))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["16"], r.stderr[-2000:]
    # A broadcast describes any length in no memory: 2^62 int8 tokens are
    # 2^64 bytes as int32 (a size that wrapped to malloc(0): segfault). The
    # length is refused now before anything is allocated (it was MemoryError).
    for huge in (np.broadcast_to(np.int8(1), (1 << 62,)), np.broadcast_to(np.uint64(1), (1 << 59,))):
        with pytest.raises(pagedkv.InvalidArgumentError, match=r"tokens: .* items, more than 2"):
            manager_pool.create_sequence().append(huge)
        with pytest.raises(pagedkv.InvalidArgumentError, match=r"seqs: .* items, more than 2"):
            manager_pool.free_batch(huge)


def test_the_sequence_constructor_checks_its_arguments_as_pool_sequence_does(manager_pool):
    """pagedkv.Sequence(pool, -1) made a handle of id -1 ("seq -0x...1"),
    2**64 one past any id, Sequence(object(), 1) an AttributeError about _h,
    and owned="no" an owning handle (bool("no")). They are refused as
    pool.sequence(id) refuses them, naming the argument; nothing changes."""
    before = manager_pool.stats()
    for bad in (-1, 2**64):
        with pytest.raises(OverflowError, match=r"^seq_id must be an int in \[0, 2\^64 - 1\]"):
            pagedkv.Sequence(manager_pool, bad)
        with pytest.raises(OverflowError):
            manager_pool.sequence(bad)
    with pytest.raises(TypeError, match=r"^pool: expected a pagedkv\.Pool, got object"):
        pagedkv.Sequence(object(), 1)
    with pytest.raises(TypeError, match=r"^owned: expected a bool, got str"):
        pagedkv.Sequence(manager_pool, 1, owned="no")
    assert manager_pool.stats() == before
    s = manager_pool.create_sequence(owned=False)
    h = pagedkv.Sequence(manager_pool, s.id, owned=False)
    assert h == s and not h.owned
    s.free()
