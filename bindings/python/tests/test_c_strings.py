"""Strings handed to C are refused with ValueError when they hold a NUL
character: C reads them up to the first one, so "tenant\\0a" and
"tenant\\0b" would be one cache salt (two tenants sharing prefix-cache
hits), two hash seeds one seed, and a file tier's directory another
directory."""

from __future__ import annotations

import os

import pytest

import pagedkv
from pagedkv import tiers


@pytest.mark.parametrize("key", ["cache_salt", "lora_name"])
def test_seq_key_with_nul_is_refused(key):
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    s, _ = pool.admit([1, 2, 3, 4, 5], **{key: "tenant"})
    with pool.prepare([s], 5) as b:
        b.commit()
    before = pool.stats()
    with pytest.raises(ValueError, match="null character"):
        pool.admit([1, 2, 3, 4, 5], **{key: "tenant\0b"})
    with pytest.raises(ValueError, match="null character"):
        pool.create_sequence(**{key: "tenant\0b"})
    with pytest.raises(ValueError, match="null character"):
        pool.hash_prefix([1, 2, 3, 4], **{key: "tenant\0b"})
    assert pool.stats().num_seqs == before.num_seqs
    # the key without the NUL still works and hits
    _, cached = pool.admit([1, 2, 3, 4, 5], **{key: "tenant"})
    assert cached == 4


def test_mm_item_hash_with_nul_is_refused():
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    with pytest.raises(ValueError, match="null character"):
        pool.admit([1, 2, 3, 4, 5], mm_items=[(0, 2, "img\0a")])
    assert pool.stats().num_seqs == 0


def test_hash_seed_with_nul_is_refused():
    with pytest.raises(ValueError, match="null character"):
        pagedkv.Pool(num_blocks=16, block_size=4, hash_seed="a\0b")
    with pytest.raises(ValueError, match="null character"):
        pagedkv.hash_root(seed="a\0b")
    assert pagedkv.hash_root(seed="a") != pagedkv.hash_root(seed="b")


def test_tier_file_dir_with_nul_is_refused(tmp_path):
    pool = pagedkv.Pool(num_blocks=8, block_size=4, num_layers=1, num_kv_heads=1, head_dim=4)
    d = tmp_path / "tier"
    d.mkdir()
    with pytest.raises(ValueError, match="null character"):
        tiers.attach(pool, host_bytes=0, file_dir=f"{d}\0/elsewhere", file_bytes=1 << 16)
    with pytest.raises(pagedkv.InvalidStateError):  # nothing attached
        tiers.stats(pool, tiers.MEDIUM_FILE)
    tiers.attach(pool, host_bytes=0, file_dir=os.fspath(d), file_bytes=1 << 16)
    assert tiers.stats(pool, tiers.MEDIUM_FILE).capacity_blocks >= 1


def test_publisher_strings_with_nul_are_refused():
    from pagedkv.events import EventPublisher

    pool = pagedkv.Pool(num_blocks=8, block_size=4, enable_events=True)
    for args, kw in [
        (("inproc://pkv-nul\0x",), {}),
        (("inproc://pkv-nul", "inproc://r\0x"), {}),
        (("inproc://pkv-nul",), {"topic": "kv\0x"}),
    ]:
        with pytest.raises(ValueError, match="null character"):  # before the C call
            EventPublisher(pool, *args, **kw).close()


def test_raw_pool_options_keep_their_hash_seed_after_the_pool_is_destroyed():
    """pkv_pool_get_options's hash_seed points into the pool; the raw
    module's result proxy kept that pointer, so reading opts.hash_seed (or
    passing the proxy to pkv_pool_create) after the pool was destroyed read
    freed memory: other heap bytes came back as the seed. The proxy carries
    its own copy of the string now."""
    raw = pagedkv._pagedkv
    seed = "seed-" + "S" * 995
    pool = pagedkv.Pool(num_blocks=8, hash_seed=seed)
    opts = raw.pkv_pool_get_options(pool._h)
    assert opts.hash_seed == seed
    pool.close()
    del pool
    junk = [b"Z" * 1000 for _ in range(2000)]  # reuse the freed memory
    others = [pagedkv.Pool(num_blocks=4, hash_seed="Q" * 1000) for _ in range(8)]
    assert opts.hash_seed == seed
    again = raw.pkv_pool_create(opts)  # the proxy as options: the same seed
    try:
        assert raw.pkv_pool_get_options(again).hash_seed == seed
    finally:
        raw.pkv_pool_destroy(again)
    del junk, others


def test_strings_utf8_cannot_encode_are_a_value_error_naming_the_argument(tmp_path):
    """A str with a lone surrogate ("\\ud800") cannot become the UTF-8 bytes
    C reads: it raised UnicodeEncodeError "'utf-8' codec can't encode
    character '\\ud800' in position 0", naming no argument. It is a
    ValueError naming the argument now, as an embedded NUL is, and nothing
    changes."""
    from pagedkv.events import EventPublisher

    pool = pagedkv.Pool(num_blocks=16, block_size=4, enable_events=True)
    bad = "t\ud800"
    calls = {
        "cache_salt": [
            lambda: pool.create_sequence(cache_salt=bad),
            lambda: pool.admit([1, 2, 3, 4, 5], cache_salt=bad),
            lambda: pool.hash_prefix([1, 2, 3, 4], cache_salt=bad),
            lambda: pagedkv.hash_prefix([1, 2, 3, 4], cache_salt=bad),
        ],
        "lora_name": [lambda: pool.create_sequence(lora_name=bad)],
        "lora_path": [lambda: pagedkv.hash_prefix([1, 2, 3, 4], lora_path=bad, tagged_keys=True)],
        "seed": [lambda: pagedkv.hash_root(seed=bad), lambda: pagedkv.hash_prefix([1, 2, 3, 4], seed=bad)],
        "hash_seed": [lambda: pagedkv.Pool(num_blocks=16, block_size=4, hash_seed=bad)],
        r"mm_items\[1\]": [lambda: pool.admit([1, 2, 3, 4, 5], mm_items=[(0, 1, "a"), (2, 2, bad)])],
        "file_dir": [lambda: tiers.attach(pool, host_bytes=0, file_dir=f"{tmp_path}/{bad}", file_bytes=1 << 16)],
        "endpoint": [lambda: EventPublisher(pool, "inproc://pkv-" + bad).close()],
    }
    before = pool.stats()
    for name, fns in calls.items():
        for fn in fns:
            with pytest.raises(ValueError, match=rf"^(option )?{name}: not encodable as UTF-8") as e:
                fn()
            assert not isinstance(e.value, UnicodeError), e.value
    assert pool.stats() == before
