"""Integer arguments that SWIG converts (every fixed-width integer parameter
of the raw functions and field of the option structs) are refused by name.

SWIG's own conversion raised "in method 'pkv_seq_append', argument 5 of type
'uint32_t'" (OverflowError for an int out of range, TypeError for anything
else): no parameter name, no range, no value, and a C argument count that is
not the Python one. The exception types are kept; the values accepted are
SWIG's (an int or bool; numpy scalars only through the package, which takes
them with operator.index)."""

import numpy as np
import pytest

import pagedkv
from pagedkv import _pagedkv as raw
from pagedkv import events, mla, transfer
from pagedkv.hybrid import HybridPool, KVGroupSpec

U32 = r"\[0, 2\^32 - 1\] \(uint32_t\)"
U64 = r"\[0, 2\^64 - 1\] \(uint64_t\)"
SEQ = r"\[0, 2\^64 - 1\] \(pkv_seq_id\)"


def small_pool(**kw):
    opts = dict(num_blocks=16, block_size=4, num_layers=2, num_kv_heads=1, head_dim=8, dtype="f32")
    opts.update(kw)
    return pagedkv.Pool(**opts)


@pytest.fixture
def pool_seq():
    pool = small_pool()
    seq = pool.create_sequence()
    seq.append([1, 2, 3])
    yield pool, seq
    pool.close()


def test_raw_out_of_range_ints_name_function_parameter_range_and_value(pool_seq):
    pool, seq = pool_seq
    h, sid = pool._h, seq.id
    cases = [
        (lambda v: raw.pkv_seq_append(h, sid, [4], v), "pkv_seq_append: num_lookahead", U32, (-1, 2**32)),
        (lambda v: raw.pkv_seq_append(h, v, [4], 0), "pkv_seq_append: seq", SEQ, (-1, 2**64)),
        (lambda v: raw.pkv_seq_truncate(h, sid, v), "pkv_seq_truncate: num_tokens", U64, (-1, 2**64)),
        (lambda v: raw.pkv_pool_kv_tensor(h, v, 0), "pkv_pool_kv_tensor: layer", U32, (-1, 2**32)),
        (lambda v: raw.pkv_pool_kv_tensor(h, 0, v), "pkv_pool_kv_tensor: which", U32, (-2, 2**33)),
        (lambda v: raw.pkv_pool_set_clock(h, v), "pkv_pool_set_clock: now_ns", U64, (-(2**70), 2**64)),
        (
            lambda v: raw.pkv_status_string(v),
            "pkv_status_string: status",
            r"\[-2\^31, 2\^31 - 1\] \(pkv_status\)",
            (-(2**31) - 1, 2**31),
        ),
        (
            lambda v: raw.pkv_seq_get_block_table(h, sid, v),
            "pkv_seq_get_block_table: capacity",
            U64,
            (-1, 2**64),
        ),
        (lambda v: raw.pkv_last_error_copy(v), "pkv_last_error_copy: capacity", U64, (-1, 2**64)),
    ]
    for call, where, rng, values in cases:
        for v in values:
            with pytest.raises(OverflowError, match=f"^{where} must be an int in {rng}, got {v}$"):
                call(v)
    assert len(seq) == 3 and seq.block_table() == pool.sequence(sid).block_table()
    pool.validate()


def test_raw_non_ints_are_a_type_error_naming_the_parameter(pool_seq):
    pool, seq = pool_seq
    h, sid = pool._h, seq.id
    for bad, shown in ((1.5, r"1\.5 \(float\)"), ("1", r"'1' \(str\)"), (None, r"None \(NoneType\)")):
        with pytest.raises(TypeError, match=f"^pkv_seq_append: num_lookahead must be an int in {U32}, got {shown}$"):
            raw.pkv_seq_append(h, sid, [4], bad)
        with pytest.raises(TypeError, match=f"^pkv_seq_get_info: seq must be an int in {SEQ}, got {shown}$"):
            raw.pkv_seq_get_info(h, bad)
        with pytest.raises(TypeError, match=f"^pkv_pool_group_take_copies: capacity .* got {shown}$"):
            raw.pkv_pool_group_take_copies(h, 0, bad)
    assert len(seq) == 3
    pool.validate()


def test_raw_accepts_what_swig_accepted(pool_seq):
    """Ints at both ends of the range and bools reach the library; numpy
    integer scalars (not int instances) stay the TypeError SWIG raised, now
    saying how to pass them."""
    pool, seq = pool_seq
    h, sid = pool._h, seq.id
    assert raw.pkv_status_string(-(2**31)) and raw.pkv_status_string(2**31 - 1)
    assert raw.pkv_dtype_size(2**32 - 1) == 0 and raw.pkv_dtype_size(0) == 0
    with pytest.raises(pagedkv.NotFoundError):
        raw.pkv_seq_get_info(h, 2**64 - 1)  # in range: the library's answer
    raw.pkv_seq_append(h, sid, [4], True)
    raw.pkv_seq_append(h, sid, [5], False)
    assert len(seq) == 5
    for np_int in (np.int64(0), np.uint32(1), np.int8(0)):
        with pytest.raises(TypeError, match=r"^pkv_seq_append: num_lookahead .* \(numpy\.\w+\); pass int\(value\)$"):
            raw.pkv_seq_append(h, sid, [6], np_int)
    assert len(seq) == 5
    pool.validate()


def test_huge_int_is_shown_by_its_size(pool_seq):
    pool, _ = pool_seq
    with pytest.raises(OverflowError, match=f"^pkv_seq_append: seq must be an int in {SEQ}, got an int of 16610 bits$"):
        raw.pkv_seq_append(pool._h, 10**5000, [1], 0)  # str() of it raises ValueError


def test_struct_setters_name_struct_and_field():
    o = raw.pkv_pool_options()
    before = o.block_size
    for bad, exc in ((-1, OverflowError), (2**32, OverflowError), (2.0, TypeError), (np.uint32(4), TypeError)):
        with pytest.raises(exc, match=f"^pkv_pool_options.block_size must be an int in {U32}, got "):
            o.block_size = bad
        assert o.block_size == before
    o.block_size = True
    assert o.block_size == 1
    t = raw.pkv_tensor()
    with pytest.raises(
        OverflowError, match=r"^pkv_tensor\.shape\[1\] must be an int in \[-2\^63, 2\^63 - 1\] \(int64_t\)"
    ):
        t.shape = [1, 2**63]
    with pytest.raises(
        OverflowError, match=r"^pkv_tensor\.device_id must be an int in \[-2\^31, 2\^31 - 1\] \(int32_t\)"
    ):
        t.device_id = 2**31
    t.shape = [np.int64(3), 2]  # array elements take any integer, as before
    assert t.shape[:2] == (3, 2)


def test_tensor_tuples_name_the_element():
    with pytest.raises(OverflowError, match=f"^k: byte_offset must be an int in {U64}, got -1$"):
        raw.pkv_cache_write(None, 0, (0, -1, 0, 0, 0, (1,), None), None, None)
    with pytest.raises(TypeError, match=r"^k: shape\[1\] must be an int .* got 'a' \(str\)$"):
        raw.pkv_cache_write(None, 0, (0, 0, 0, 0, 0, (1, "a"), None), None, None)
    with pytest.raises(TypeError, match=r"^pkv_tensor_init: shape\[0\] must be an int .* got 1\.5 \(float\)$"):
        raw.pkv_tensor_init(None, raw.PKV_DTYPE_F32, raw.PKV_DEVICE_CPU, 0, [1.5])
    t = raw.pkv_tensor_init(None, raw.PKV_DTYPE_F32, raw.PKV_DEVICE_CPU, 0, [np.int64(2), 3])
    assert t.shape[:2] == (2, 3)


def test_package_calls_name_the_argument(pool_seq):
    """The package converts with operator.index (numpy ints, bools accepted)
    and passes the range check to the raw call: its error now names it."""
    pool, seq = pool_seq
    for bad in (-1, 2**32, np.int64(-1), np.uint64(2**40)):
        with pytest.raises(OverflowError, match=f"^pkv_seq_append: num_lookahead must be an int in {U32}"):
            seq.append([9], lookahead=bad)
    seq.append([9], lookahead=np.uint8(1))
    seq.append([10], lookahead=True)
    assert len(seq) == 5
    with pytest.raises(OverflowError, match=r"^pkv_seq_get_info: seq must be an int"):
        pool.sequence(-1)
    with pytest.raises(OverflowError, match=r"^pkv_pool_kv_tensor: layer must be an int"):
        pool.kv_tensor(-1, "k")
    with pytest.raises(OverflowError, match=r"^pkv_seq_truncate: num_tokens must be an int"):
        seq.truncate(-1)
    with pytest.raises(OverflowError, match=r"^pkv_pool_set_clock: now_ns must be an int"):
        pool.set_clock(2**64)
    with pytest.raises(OverflowError, match=f"^pkv_pool_options.block_size must be an int in {U32}, got 4294967296$"):
        small_pool(block_size=2**32)
    with pytest.raises(OverflowError, match=f"^pkv_pool_options.num_blocks must be an int in {U64}, got -1$"):
        small_pool(num_blocks=-1)
    assert len(seq) == 5
    pool.validate()


def test_package_groups_events_transfer_mla_name_the_argument():
    hp = HybridPool([KVGroupSpec.window(8, 2, 2, 8), KVGroupSpec.full(2, 2, 8)], num_blocks=16, block_size=4)
    s = hp.create_sequence()
    for call, where in (
        (lambda v: hp.take_copies(v), "pkv_pool_group_take_copies: group"),
        (lambda v: hp.group_stats(v), "pkv_pool_group_stats: group"),
        (lambda v: hp.group_of_layer(v), "pkv_pool_group_of_layer: layer"),
        (lambda v: hp.group_block_table(s, v), "pkv_seq_group_block_table: group"),
    ):
        for v in (-1, 2**32):
            with pytest.raises(OverflowError, match=f"^{where} must be an int in {U32}, got {v}$"):
                call(v)
    hp.validate()
    # Option fields go through the struct's setters (before the C call, so
    # also in builds without events or UCX).
    for v in (-1, 2**32):
        with pytest.raises(
            OverflowError, match=f"^pkv_event_publisher_options.data_parallel_rank must be an int in {U32}"
        ):
            events.EventPublisher(hp, "inproc://pkv-int-args", data_parallel_rank=v)
        with pytest.raises(OverflowError, match=f"^pkv_transfer_options.timeout_ms must be an int in {U32}, got {v}$"):
            transfer.TransferEngine(timeout_ms=v)
    hp.close()

    pool = small_pool(num_kv_heads=None, head_dim=None, kv_layout="mla", kv_lora_rank=16, qk_rope_head_dim=8)
    seq = pool.create_sequence()
    seq.append([1, 2, 3])
    batch = pagedkv.Batch(pool, [seq], [3])
    kv, pe = np.zeros((3, 16), np.float32), np.zeros((3, 8), np.float32)
    for v in (-1, 2**32):
        with pytest.raises(OverflowError, match=f"^pkv_mla_cache_write: layer must be an int in {U32}, got {v}$"):
            mla.cache_write(batch, v, kv, pe)
    mla.cache_write(batch, np.int64(1), kv, pe)
    batch.close()
    pool.close()
