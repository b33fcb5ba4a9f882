"""Block-hash key formats of the package (hash_prefix and pools)."""

import pytest

import pagedkv as pk


def test_tagged_keys_pool_and_hash_prefix_agree_and_key_the_lora_path():
    """tagged_keys=True: vLLM 0.33's tagged extra keys (the bytes are checked
    against the Python mirror by hash.python_crosscheck, and against vLLM by
    the opt-in test_vllm_differential)."""
    toks = list(range(500, 533))
    pool = pk.Pool(num_blocks=64, block_size=16, tagged_keys=True)
    assert pool.options.tagged_keys and not pool.options.strict_key_domains
    kw = {"lora_name": "sql", "lora_path": "/adapters/sql-v1", "cache_salt": "t1", "mm_items": [(3, 4, "img")]}
    s = pool.create_sequence(**kw)
    s.append(toks)
    want = pk.hash_prefix(toks, tagged_keys=True, **kw)
    assert s.block_hashes() == want == pool.hash_prefix(toks, **kw)
    assert want != pk.hash_prefix(toks, **kw)  # untagged
    moved = dict(kw, lora_path="/adapters/sql-v2")
    assert pk.hash_prefix(toks, tagged_keys=True, **moved)[0] != want[0]
    assert pk.hash_prefix(toks, **moved) == pk.hash_prefix(toks, **kw)  # untagged: path unused
    # Without extra keys every format hashes alike.
    assert pk.hash_prefix(toks, tagged_keys=True) == pk.hash_prefix(toks)
    with pytest.raises(pk.InvalidArgumentError, match="choose one"):
        pk.hash_prefix(toks, tagged_keys=True, strict_key_domains=True)
    with pytest.raises(pk.InvalidArgumentError, match="choose one"):
        pk.Pool(num_blocks=8, tagged_keys=True, strict_key_domains=True)
    with pytest.raises(ValueError, match="lora_path"):
        pool.create_sequence(lora_name="a", lora_path="x\0y")
    pool.validate()


def test_hash_prefix_takes_an_integer_scalar_block_size():
    """block_size is converted like every other int option (numpy and torch
    integer scalars are ints); the output capacity was computed from the
    unconverted value, so a numpy block_size reached the raw call as a numpy
    integer: a bare "TypeError: an integer is required"."""
    np = pytest.importorskip("numpy")
    toks = list(range(40))
    want = pk.hash_prefix(toks, block_size=16)
    assert len(want) == 2
    for bs in (np.int64(16), np.uint32(16), np.int8(16)):
        assert pk.hash_prefix(toks, block_size=bs) == want
    with pytest.raises(TypeError, match="block_size"):
        pk.hash_prefix(toks, block_size=16.0)


def test_hash_prefix_of_a_container_whose_len_lies_reads_what_is_there():
    """A list (or tuple) subclass whose __len__ understates its items sized
    the result by len() while the conversion read the list itself: 32
    tokens claiming 1 raised BufferTooSmallError ("out_hashes holds 0
    hashes, 2 are needed"), naming a buffer the caller never passed. The
    container's own size is read now; any other object that yields more
    items than its __len__ says is a ValueError naming tokens."""

    class Short(list):
        def __len__(self):
            return 1

    class ShortTuple(tuple):
        def __len__(self):
            return 0

    class Long(list):
        def __len__(self):
            return 1000

    toks = list(range(32))
    want = pk.hash_prefix(toks)
    assert len(want) == 2
    for lying in (Short(toks), ShortTuple(toks), Long(toks)):
        assert pk.hash_prefix(lying) == want
        assert pk.Pool(num_blocks=8, block_size=16).hash_prefix(lying) == want

    class Understates:  # not a list: read by iteration, sized by len()
        def __len__(self):
            return 1

        def __iter__(self):
            return iter(toks)

    with pytest.raises(ValueError, match=r"^tokens: len\(\) gave 1, but iterating Understates gave more"):
        pk.hash_prefix(Understates())
