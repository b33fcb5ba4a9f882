"""Pool: options, properties, stats, events, validation, storage views, lifetime."""

import dataclasses

import numpy as np
import pytest

import pagedkv
from pagedkv import _pagedkv as raw


def test_options_and_properties():
    with pagedkv.Pool(
        num_blocks=10,
        block_size=8,
        num_layers=3,
        num_kv_heads=2,
        head_dim=64,
        dtype="f16",
        hash_algo="xxh3_128",
        hash_seed="seed",
        sliding_window=0,
        enable_events=True,
        max_events=100,
        num_threads=1,
    ) as pool:
        o = pool.options
        assert (o.num_blocks, o.block_size, o.num_layers, o.num_kv_heads, o.head_dim) == (10, 8, 3, 2, 64)
        assert o.dtype is pagedkv.DType.F16 and pool.dtype is pagedkv.DType.F16
        assert o.hash_algo is pagedkv.HashAlgo.XXH3_128 and o.hash_seed == "seed"
        assert o.enable_events and o.max_events == 100 and o.num_threads == 1
        assert pool.device == pagedkv.Device.parse("cpu")
        assert pool.has_storage
        # K and V of every layer: 2 * layers * heads * block_size * head_dim elements.
        assert pool.bytes_per_block == 2 * 3 * 2 * 8 * 64 * 2
        with pytest.raises(dataclasses.FrozenInstanceError):
            o.num_blocks = 3  # type: ignore[misc]
        assert "10 blocks of 8" in repr(pool)


def test_defaults_are_the_library_defaults():
    c = raw.pkv_pool_options()
    raw.pkv_pool_options_init(c)
    with pagedkv.Pool(num_blocks=4) as pool:
        o = pool.options
        assert o.block_size == c.block_size
        assert int(o.hash_algo) == c.hash_algo
        assert o.enable_prefix_caching == bool(c.enable_prefix_caching)
        assert int(o.dtype) == c.dtype
        assert not pool.has_storage and pool.bytes_per_block == 0


def test_memory_budget_derives_num_blocks():
    per_block = 2 * 1 * 1 * 16 * 64 * 4
    with pagedkv.Pool(
        memory_budget_bytes=per_block * 20, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32"
    ) as pool:
        assert pool.num_blocks == 20
        assert pool.stats().kv_bytes_allocated >= 20 * per_block


def test_stats_track_usage(manager_pool):
    s0 = manager_pool.stats()
    assert isinstance(s0, pagedkv.PoolStats)
    assert s0.num_blocks == 16 and s0.num_free_blocks == 15 and s0.num_used_blocks == 0
    assert s0.usage == 0.0 and s0.num_seqs == 0 and s0.prefix_hit_rate == 0.0
    a = manager_pool.create_sequence()
    a.append(list(range(10)))  # 3 blocks of 4
    s1 = manager_pool.stats()
    assert (s1.num_seqs, s1.num_tokens, s1.num_used_blocks, s1.num_free_blocks) == (1, 10, 3, 12)
    assert s1.num_cached_blocks == 2  # the two full blocks
    assert s1.usage == pytest.approx(3 / 15)
    with manager_pool.prepare([a], 10):
        pass  # the step computed a (committed on leaving the block): its blocks can be hit
    b = manager_pool.create_sequence()
    assert b.match_prefix(list(range(10))) == 8
    s2 = manager_pool.stats()
    assert s2.prefix_query_tokens == 10 and s2.prefix_hit_tokens == 8
    assert s2.prefix_hit_rate == pytest.approx(0.8)
    assert s2.num_used_blocks == 3  # shared, not copied


def test_events_drain_in_order(manager_pool):
    a = manager_pool.create_sequence()
    a.append(list(range(8)))
    hashes = a.block_hashes()
    events = list(manager_pool.events())
    assert [e.type for e in events] == [pagedkv.EventType.BLOCK_STORED] * 2
    assert [e.block_hash for e in events] == hashes
    assert events[0].parent_hash is None and events[1].parent_hash == hashes[0]
    assert [e.block_id for e in events] == a.block_table()
    assert all(e.num_tokens == 4 for e in events)
    assert events[1].seq_no == events[0].seq_no + 1
    assert list(manager_pool.events()) == []  # drained
    manager_pool.reset_prefix_cache()
    cleared = list(manager_pool.events())
    assert [e.type for e in cleared] == [pagedkv.EventType.ALL_CLEARED]
    assert cleared[0].seq_no == events[1].seq_no + 1
    assert manager_pool.stats().num_cached_blocks == 0


def test_events_iterator_is_lazy_and_bounded(manager_pool):
    for _ in range(3):
        s = manager_pool.create_sequence()
        s.append(list(range(100, 108)))
        s.free()
        manager_pool.reset_prefix_cache()
    it = manager_pool.events(max_events=2)
    assert len(list(it)) == 2
    assert len(list(manager_pool.events())) >= 4


def test_eviction_emits_removed_events():
    with pagedkv.Pool(num_blocks=3, block_size=2, enable_events=True) as pool:
        a = pool.create_sequence()
        a.append([1, 2, 3, 4])
        # The step that computes them: only blocks a prepared plan covered
        # stay cached when their sequence is freed (pool.h, pkv_seq_free).
        with pool.prepare([a], 4):
            pass
        a.free()  # both blocks cached and free
        list(pool.events())
        b = pool.create_sequence()
        b.append([7, 8, 9, 10])  # reuses them: lazy eviction
        kinds = [e.type for e in pool.events()]
        assert kinds.count(pagedkv.EventType.BLOCK_REMOVED) == 2
        assert pool.stats().num_evictions == 2


def test_validate_and_reset(manager_pool):
    manager_pool.validate()
    s = manager_pool.create_sequence()
    s.append(list(range(12)))
    manager_pool.validate()
    manager_pool.reset_prefix_cache()
    manager_pool.validate()
    t = manager_pool.create_sequence()
    assert t.match_prefix(list(range(12))) == 0


def test_close_is_idempotent_and_final(manager_pool):
    s = manager_pool.create_sequence()
    manager_pool.close()
    manager_pool.close()
    assert manager_pool.closed
    for call in (manager_pool.stats, manager_pool.validate, manager_pool.create_sequence, lambda: s.append([1])):
        with pytest.raises(pagedkv.InvalidStateError, match="closed"):
            call()
    s.free()  # a no-op: closing released it
    assert s.freed


def test_kv_views_and_block_copy(rng):
    with pagedkv.Pool(num_blocks=6, block_size=8, num_layers=2, num_kv_heads=2, head_dim=64, dtype="f32") as pool:
        views = pool.kv_caches()
        assert len(views) == 2
        k0 = views[0][0].numpy()
        assert k0.shape == (6, 2, 8, 64) and k0.dtype == np.float32
        layers = [(k.numpy(), v.numpy()) for k, v in views]
        data = [
            (rng.standard_normal(k.shape).astype(np.float32), rng.standard_normal(v.shape).astype(np.float32))
            for k, v in layers
        ]
        for (k, v), (dk, dv) in zip(layers, data):
            k[...] = dk
            v[...] = dv
        pool.copy_blocks([1, 2], [4, 5])
        for (k, v), (dk, dv) in zip(layers, data):
            np.testing.assert_array_equal(k[[4, 5]], dk[[1, 2]])
            np.testing.assert_array_equal(v[[4, 5]], dv[[1, 2]])
            np.testing.assert_array_equal(k[[0, 1, 2, 3]], dk[[0, 1, 2, 3]])
        with pytest.raises(ValueError):
            pool.copy_blocks([1, 2], [3])
        with pytest.raises(pagedkv.InvalidArgumentError):
            pool.copy_blocks([1], [99])


def test_swap_round_trip(rng):
    with pagedkv.Pool(num_blocks=6, block_size=8, num_layers=2, num_kv_heads=1, head_dim=64, dtype="bf16") as pool:
        arrays = [v.numpy() for pair in pool.kv_caches() for v in pair]
        for a in arrays:
            a.view(np.uint16)[...] = rng.integers(0, 2**15, a.shape, dtype=np.uint16)
        before = [a.copy() for a in arrays]
        buf = pool.swap_out([2, 3])
        assert buf.nbytes == 2 * pool.bytes_per_block
        for a in arrays:
            a.view(np.uint16)[2:4] = 0
        pool.swap_in([2, 3], buf)
        for a, b in zip(arrays, before):
            np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))
        # Swapping into other blocks moves the same bytes there.
        pool.swap_in([4, 5], bytearray(buf.tobytes()))
        for a, b in zip(arrays, before):
            np.testing.assert_array_equal(a.view(np.uint16)[4:6], b.view(np.uint16)[2:4])
        with pytest.raises(pagedkv.InvalidArgumentError):
            pool.swap_out([2, 3], np.empty(10, np.uint8))
        with pytest.raises(TypeError):
            pool.swap_out([2], b"read-only bytes")
        # swap_in only reads its buffer: read-only ones (bytes, a read-only
        # array) are taken as they are (they raised TypeError, "expected a
        # writable contiguous buffer").
        ro = np.frombuffer(buf.tobytes(), dtype=np.uint8)
        assert not ro.flags.writeable
        for src in (buf.tobytes(), ro, memoryview(buf.tobytes())):
            for a in arrays:
                a.view(np.uint16)[4:6] = 0
            pool.swap_in([4, 5], src)
            for a, b in zip(arrays, before):
                np.testing.assert_array_equal(a.view(np.uint16)[4:6], b.view(np.uint16)[2:4])
        with pytest.raises(pagedkv.InvalidArgumentError, match="contiguous"):
            pool.swap_in([4], np.frombuffer(buf.tobytes() * 2, dtype=np.uint8)[::2])
        with pytest.raises(pagedkv.InvalidArgumentError):
            pool.swap_in([4, 5], buf.tobytes()[:10])


def test_pool_is_usable_from_its_own_raw_module(manager_pool):
    # The raw SWIG module is complete: structs, _init functions, out params.
    st = raw.pkv_pool_stats()
    raw.pkv_pool_stats_init(st)
    assert st.struct_size > 0
    got = manager_pool._call(raw.pkv_pool_get_stats)
    assert got.num_blocks == 16
    sid = manager_pool._call(raw.pkv_seq_create, None)
    assert manager_pool._call(raw.pkv_seq_append, sid, np.arange(5, dtype=np.int32), 0) is None
    assert manager_pool._call(raw.pkv_seq_blocks_needed, sid, 4, 0) == 1
    info = manager_pool._call(raw.pkv_seq_get_info, sid)
    assert info.num_tokens == 5
    manager_pool._call(raw.pkv_seq_free, sid)
    t = raw.pkv_tensor_init(4096, raw.PKV_DTYPE_F16, raw.PKV_DEVICE_CPU, 0, [3, 4])
    assert (t.data, t.ndim, t.shape[:2], t.dtype) == (4096, 2, (3, 4), raw.PKV_DTYPE_F16)
    with pytest.raises(pagedkv.InvalidArgumentError):
        raw.pkv_tensor_init(0, raw.PKV_DTYPE_F16, raw.PKV_DEVICE_CPU, 0, [1] * 7)
    n, text = raw.pkv_last_error_copy(8)
    assert n > 7 and len(text) == 7 and "ndim" in raw.pkv_last_error_message()
    p = raw.pkv_attention_params()
    raw.pkv_attention_params_init(p)
    assert p.softmax_scale == 0.0


class _ByteArrayInterface:
    """A host buffer known only by __array_interface__ (no buffer protocol)."""

    def __init__(self, arr):
        self._arr = arr
        self.__array_interface__ = arr.__array_interface__


@pytest.mark.parametrize("kind", ["torch_uint8", "torch_int8", "torch_int16", "iface_uint8"])
def test_swap_takes_byte_tensors_of_any_element_type(kind):
    """swap_out / swap_in copy bytes: a host tensor of uint8 (the usual pinned
    staging buffer) was refused as "DLPack dtype ... not supported", only
    f32/f16/bf16/i32/i64 tensors worked."""
    pool = pagedkv.Pool(num_blocks=8, block_size=4, num_layers=1, num_kv_heads=1, head_dim=8, dtype="f32")
    s = pool.create_sequence()
    s.append([1, 2, 3])
    with pool.prepare([s], 3) as step:
        kv = np.arange(24, dtype=np.float32).reshape(3, 1, 8)
        step.cache_write(0, kv, kv)
    blocks = s.block_table()
    nbytes = len(blocks) * pool.bytes_per_block
    expect = pool.swap_out(blocks)
    if kind.startswith("torch"):
        torch = pytest.importorskip("torch")
        dt = {"torch_uint8": torch.uint8, "torch_int8": torch.int8, "torch_int16": torch.int16}[kind]
        buf = torch.zeros(nbytes // torch.tensor([], dtype=dt).element_size(), dtype=dt)
        as_bytes = lambda: buf.view(torch.uint8).numpy()  # noqa: E731
    else:
        arr = np.zeros(nbytes, np.uint8)
        buf = _ByteArrayInterface(arr)
        as_bytes = lambda: arr  # noqa: E731
    pool.swap_out(blocks, buf)
    np.testing.assert_array_equal(as_bytes(), expect)
    pool.kv_tensor(0, "k").numpy()[...] = 0
    pool.swap_in(blocks, buf)
    np.testing.assert_array_equal(pool.swap_out(blocks), expect)
