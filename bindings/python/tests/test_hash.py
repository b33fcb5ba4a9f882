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
