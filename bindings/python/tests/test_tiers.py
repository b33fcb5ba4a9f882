"""Issue 20: offload tiers. Evicted blocks come back from the host (and
file) tier byte for byte; a corrupted or unreadable entry is a miss."""

import gc

import numpy as np
import pytest

import pagedkv
from pagedkv import tiers

BS, HEADS, DIM = 4, 2, 8


def make_pool(host_blocks, file_dir=None, file_blocks=0):
    pool = pagedkv.Pool(num_blocks=6, block_size=BS, num_layers=2, num_kv_heads=HEADS, head_dim=DIM, dtype="f32")
    block_bytes = pool.bytes_per_block
    tiers.attach(
        pool,
        host_bytes=host_blocks * block_bytes,
        file_dir=file_dir,
        file_bytes=file_blocks * block_bytes,
    )
    return pool


def write_all(pool, seq, rng):
    n = len(seq)
    with pool.prepare([seq], n) as b:
        for layer in range(2):
            k = rng.standard_normal((n, HEADS, DIM)).astype(np.float32)
            v = rng.standard_normal((n, HEADS, DIM)).astype(np.float32)
            b.cache_write(layer, k, v)


def block_bytes(pool, blocks):
    caches = pool.kv_caches()
    return [
        np.concatenate([caches[layer][w].numpy()[b].ravel() for layer in range(2) for w in range(2)]) for b in blocks
    ]


def offloaded(pool, rng):
    tokens = list(range(17))
    a = pool.create_sequence()
    a.append(tokens)
    write_all(pool, a, rng)
    saved = block_bytes(pool, a.block_table()[:4])
    a.free()
    other = pool.create_sequence()
    other.append(list(range(1000, 1020)))  # evicts every block of a
    write_all(pool, other, rng)
    other.free()
    tiers.flush(pool)
    return tokens, saved


def test_host_tier_round_trip():
    rng = np.random.default_rng(20)
    pool = make_pool(4)
    tokens, saved = offloaded(pool, rng)
    st = tiers.stats(pool, tiers.MEDIUM_HOST)
    assert st.num_stored == 4 and st.num_blocks == 4 and st.capacity_blocks == 4
    s = pool.create_sequence()
    m = tiers.match_prefix_tiered(s, tokens)
    assert (m.num_cached, m.device_tokens, m.host_tokens, m.file_tokens) == (16, 0, 16, 0)
    assert s.num_computed_tokens == 0  # loaded by the next plan
    s.append([tokens[16]])
    pool.prepare([s], 1).abort()  # the plan loads the tier hits
    assert s.num_computed_tokens == 16
    for got, want in zip(block_bytes(pool, s.block_table()[:4]), saved):
        assert np.array_equal(got, want, equal_nan=False)
    st = tiers.stats(pool)
    assert st.num_loaded == 4 and st.bytes_loaded == 4 * pool.bytes_per_block
    pool.validate()


def test_file_tier_below_host(tmp_path):
    rng = np.random.default_rng(21)
    pool = make_pool(3, str(tmp_path), 2)
    tokens, saved = offloaded(pool, rng)
    assert tiers.stats(pool, tiers.MEDIUM_FILE).num_stored == 1
    s = pool.create_sequence()
    m = tiers.match_prefix_tiered(s, tokens)
    assert (m.host_tokens, m.file_tokens) == (12, 4)
    tiers.flush(pool)
    assert s.num_computed_tokens == 16
    for got, want in zip(block_bytes(pool, s.block_table()[:4]), saved):
        assert np.array_equal(got, want)
    pool.validate()


def test_salt_keeps_tenants_apart():
    rng = np.random.default_rng(22)
    pool = make_pool(4)
    tokens, _ = offloaded(pool, rng)
    s = pool.create_sequence(cache_salt="other-tenant")
    assert tiers.match_prefix_tiered(s, tokens).num_cached == 0


def test_errors():
    manager = pagedkv.Pool(num_blocks=8, block_size=4)
    with pytest.raises(pagedkv.InvalidStateError, match="manager-only"):
        tiers.attach(manager, host_bytes=1 << 20)
    pool = pagedkv.Pool(num_blocks=8, block_size=4, num_layers=1, num_kv_heads=1, head_dim=8, dtype="f32")
    with pytest.raises(pagedkv.InvalidStateError, match="no host tier"):
        tiers.stats(pool)
    with pytest.raises(pagedkv.InvalidArgumentError, match="host_bytes"):
        tiers.attach(pool, host_bytes=1)
    with pytest.raises(pagedkv.InvalidArgumentError, match="file_dir"):
        tiers.attach(pool, host_bytes=1 << 20, file_dir="/nonexistent-pagedkv-dir", file_bytes=1 << 20)
    tiers.attach(pool, host_bytes=1 << 20)
    with pytest.raises(pagedkv.InvalidStateError, match="already"):
        tiers.attach(pool, host_bytes=1 << 20)
    with pytest.raises(pagedkv.InvalidArgumentError, match="medium"):
        tiers.stats(pool, tiers.MEDIUM_DEVICE)


def test_admit_tiered_loads_from_both_tiers(tmp_path):
    rng = np.random.default_rng(23)
    pool = make_pool(3, str(tmp_path), 2)
    tokens, saved = offloaded(pool, rng)
    s, m = tiers.admit_tiered(pool, tokens)
    assert (m.num_cached, m.device_tokens, m.host_tokens, m.file_tokens) == (16, 0, 12, 4)
    assert len(s) == 17 and s.num_computed_tokens == 0  # loaded by the next plan
    pool.prepare([s], 1).abort()  # the plan loads the tier hits
    assert s.num_computed_tokens == 16
    for got, want in zip(block_bytes(pool, s.block_table()[:4]), saved):
        assert np.array_equal(got, want)
    assert tiers.stats(pool, tiers.MEDIUM_FILE).num_loaded == 1
    pool.validate()


def test_hash_lookup_tiered_and_salts(tmp_path):
    rng = np.random.default_rng(24)
    pool = make_pool(10)  # room for the blocks the salted admission evicts too
    tokens, saved = offloaded(pool, rng)
    hashes = pool.hash_prefix(tokens[:16])
    salted = pool.hash_prefix(tokens[:16], cache_salt="other-tenant")
    # Another tenant's own hashes find nothing; the unsalted ones are refused.
    _o, m = tiers.admit_tiered(pool, tokens, hashes=salted, cache_salt="other-tenant")
    assert m.num_cached == 0
    _o.free()
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"hashes\[0\]"):
        tiers.admit_tiered(pool, tokens, hashes=hashes, cache_salt="other-tenant")
    assert tiers.stats(pool).num_hits == 0
    s = pool.create_sequence()
    m = tiers.match_prefix_tiered(s, tokens, hashes=hashes)
    assert (m.num_cached, m.host_tokens) == (16, 16)
    tiers.flush(pool)
    assert s.num_computed_tokens == 16
    for got, want in zip(block_bytes(pool, s.block_table()[:4]), saved):
        assert np.array_equal(got, want)
    pool.validate()


def test_admit_tiered_all_or_nothing():
    rng = np.random.default_rng(25)
    pool = make_pool(4)
    tokens, _ = offloaded(pool, rng)
    # Out of blocks: no sequence, no tier entry taken.
    with pytest.raises(pagedkv.OutOfBlocksError):
        tiers.admit_tiered(pool, tokens, lookahead=8)
    assert tiers.stats(pool).num_hits == 0
    s, m = tiers.admit_tiered(pool, tokens, lookahead=3)
    assert m.host_tokens == 16 and len(s) == 17
    tiers.flush(pool)
    assert s.num_computed_tokens == 16 and tiers.stats(pool).num_loaded == 4
    pool.validate()


def test_admit_tiered_borrowed_sequence_is_not_freed_when_collected():
    rng = np.random.default_rng(27)
    pool = make_pool(4)
    tokens, _ = offloaded(pool, rng)
    s, m = tiers.admit_tiered(pool, tokens, owned=False)
    assert not s.owned and m.host_tokens == 16
    sid = s.id
    del s
    gc.collect()
    assert len(pool.sequence(sid)) == len(tokens)  # still there: the engine frees it
    pool.sequence(sid).free()
    assert pool.stats().num_seqs == 0
    pool.validate()


def test_tier_sizes_and_medium_are_checked_by_name():
    """Negative or non-integral sizes raised SWIG's OverflowError / TypeError
    ("argument 2 of type 'uint64_t'"), which named no field."""
    pool = pagedkv.Pool(num_blocks=6, block_size=BS, num_layers=2, num_kv_heads=HEADS, head_dim=DIM, dtype="f32")
    for kw, err, name in (
        ({"host_bytes": -1}, ValueError, "host_bytes"),
        ({"host_bytes": 1.5}, TypeError, "host_bytes"),
        ({"host_bytes": 1 << 20, "file_bytes": -4}, ValueError, "file_bytes"),
        ({"host_bytes": "4096"}, TypeError, "host_bytes"),
    ):
        with pytest.raises(err, match=name):
            tiers.attach(pool, **kw)
    tiers.attach(pool, host_bytes=4 * pool.bytes_per_block)  # nothing was attached before
    with pytest.raises(ValueError, match="medium"):
        tiers.stats(pool, -1)
    with pytest.raises(TypeError, match="medium"):
        tiers.stats(pool, 1.0)
    assert tiers.stats(pool).capacity_blocks == 4


def test_file_tier_alone(tmp_path):
    """host_bytes=0 with a file_dir: blocks go straight to the file (one pass)."""
    rng = np.random.default_rng(26)
    pool = make_pool(0, str(tmp_path), 4)
    tokens, saved = offloaded(pool, rng)
    with pytest.raises(pagedkv.InvalidStateError, match="no host tier"):
        tiers.stats(pool, tiers.MEDIUM_HOST)
    assert tiers.stats(pool, tiers.MEDIUM_FILE).num_stored == 4
    s, m = tiers.admit_tiered(pool, tokens)
    assert (m.host_tokens, m.file_tokens) == (0, 16)
    tiers.flush(pool)
    assert s.num_computed_tokens == 16
    for got, want in zip(block_bytes(pool, s.block_table()[:4]), saved):
        assert np.array_equal(got, want)
    pool.validate()


def test_match_prefix_tiered_of_a_non_sequence_is_a_type_error_naming_seq():
    """match_prefix_tiered takes a Sequence: an id (or anything else) raised
    AttributeError "'int' object has no attribute '_pool'"."""
    pool = make_pool(4)
    seq = pool.create_sequence()
    for bad in (seq.id, None):
        for hashes in (None, []):
            with pytest.raises(TypeError, match=r"^seq: expected a pagedkv.Sequence, got "):
                tiers.match_prefix_tiered(bad, list(range(9)), hashes)
    assert tiers.match_prefix_tiered(seq, list(range(9))).num_cached == 0
