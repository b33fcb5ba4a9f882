"""Every status code raises its own exception class, with the library's message."""

import subprocess
import sys

import numpy as np
import pytest

import pagedkv
from pagedkv import _pagedkv as raw

CLASSES = {
    raw.PKV_E_INVALID_ARGUMENT: (pagedkv.InvalidArgumentError, ValueError),
    raw.PKV_E_NOT_FOUND: (pagedkv.NotFoundError, LookupError),
    raw.PKV_E_OUT_OF_BLOCKS: (pagedkv.OutOfBlocksError, None),
    raw.PKV_E_OUT_OF_MEMORY: (pagedkv.OutOfMemoryError, MemoryError),
    raw.PKV_E_UNSUPPORTED: (pagedkv.UnsupportedError, NotImplementedError),
    raw.PKV_E_CUDA: (pagedkv.CudaError, RuntimeError),
    raw.PKV_E_BUFFER_TOO_SMALL: (pagedkv.BufferTooSmallError, None),
    raw.PKV_E_INVALID_STATE: (pagedkv.InvalidStateError, RuntimeError),
    raw.PKV_E_INVARIANT: (pagedkv.InvariantError, AssertionError),
    raw.PKV_E_INTERNAL: (pagedkv.InternalError, RuntimeError),
}


def test_one_class_per_status():
    assert set(raw.ERROR_CLASSES) == set(CLASSES)
    seen = set()
    for code, (cls, py_base) in CLASSES.items():
        assert raw.ERROR_CLASSES[code] is cls
        assert issubclass(cls, pagedkv.PagedKVError)
        if py_base is not None:
            assert issubclass(cls, py_base)
        assert cls.status == code
        assert cls not in seen
        seen.add(cls)
        err = cls("text")
        assert err.status == code and err.message == "text" and str(err) == "text"
        assert err.status_name == pagedkv.status_string(code).split(":")[0]


def expect(cls, fn, *words):
    with pytest.raises(cls) as info:
        fn()
    err = info.value
    assert type(err) is cls
    assert err.status == cls.status
    assert err.message and str(err) == err.message
    for w in words:
        assert w in err.message, (w, err.message)
    return err


def test_invalid_argument():
    expect(pagedkv.InvalidArgumentError, lambda: pagedkv.Pool(num_blocks=8, block_size=0), "block_size")
    expect(pagedkv.InvalidArgumentError, lambda: pagedkv.Pool(num_blocks=1), "num_blocks")


def test_not_found(manager_pool):
    seq = manager_pool.create_sequence()
    seq.free()
    expect(pagedkv.NotFoundError, lambda: seq.append([1, 2, 3]))
    expect(pagedkv.NotFoundError, lambda: seq.info())
    expect(pagedkv.NotFoundError, lambda: manager_pool._call(raw.pkv_seq_get_info, 0x12345))


def test_out_of_blocks(manager_pool):
    seq = manager_pool.create_sequence()
    before = manager_pool.stats()
    err = expect(pagedkv.OutOfBlocksError, lambda: seq.append(list(range(1000))))
    assert "free" in err.message
    assert manager_pool.stats() == before  # nothing changed
    assert seq.num_tokens == 0


def test_out_of_memory():
    # 2 PiB of host KV storage, more than any address space: a real
    # allocation failure whatever the overcommit policy, cleanly reported.
    expect(
        pagedkv.OutOfMemoryError,
        lambda: pagedkv.Pool(
            num_blocks=1024, block_size=1024, num_layers=4096, num_kv_heads=256, head_dim=256, dtype="f32"
        ),
    )


@pytest.mark.skipif(pagedkv.features().cuda, reason="this build has CUDA")
def test_unsupported_without_cuda():
    expect(
        pagedkv.UnsupportedError,
        lambda: pagedkv.Pool(num_blocks=8, num_layers=1, num_kv_heads=1, head_dim=64, device="cuda"),
        "CUDA",
    )


@pytest.mark.skipif(pagedkv.cuda_device_count() > 0, reason="a GPU is present")
def test_cuda_pool_without_a_device():
    # CPU-only builds say unsupported; CUDA builds on a machine without a GPU
    # report the runtime's error. Either way a clean exception.
    with pytest.raises((pagedkv.UnsupportedError, pagedkv.CudaError)) as info:
        pagedkv.Pool(num_blocks=8, num_layers=1, num_kv_heads=1, head_dim=64, device="cuda")
    assert info.value.message


@pytest.mark.skipif(pagedkv.cuda_device_count() == 0, reason="needs a CUDA device")
def test_cuda_error_on_missing_device():
    # One past the last ordinal: the CUDA runtime refuses it (the library may
    # also catch it first as a bad argument); never a crash.
    with pytest.raises((pagedkv.CudaError, pagedkv.InvalidArgumentError)) as info:
        pagedkv.Pool(
            num_blocks=8, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f16", device=pagedkv.cuda_device_count()
        )
    assert info.value.message


def test_buffer_too_small(manager_pool):
    seq = manager_pool.create_sequence()
    seq.append(list(range(9)))
    expect(pagedkv.BufferTooSmallError, lambda: manager_pool._call(raw.pkv_seq_get_block_table, seq.id, 1))
    expect(pagedkv.BufferTooSmallError, lambda: raw.pkv_hash_prefix({"block_size": 4}, list(range(9)), 1))
    assert seq.block_table() == manager_pool._call(raw.pkv_seq_get_block_table, seq.id, 3)


def test_invalid_state(manager_pool):
    expect(pagedkv.InvalidStateError, lambda: manager_pool.kv_tensor(0, "k"), "storage")
    seq = manager_pool.create_sequence()
    seq.append([1, 2, 3])
    manager_pool.close()
    expect(pagedkv.InvalidStateError, lambda: seq.append([4]), "closed")


def test_invariant_and_internal_are_raised_through_the_status_typemap():
    # No public call can break an invariant or hit a library bug on purpose;
    # these check the C raise path picks the registered class for the code.
    for code in (raw.PKV_E_INVARIANT, raw.PKV_E_INTERNAL):
        cls = raw.ERROR_CLASSES[code]
        err = cls(pagedkv.status_string(code), code)
        assert isinstance(err, pagedkv.PagedKVError) and err.status == code


def test_message_is_captured_per_call(manager_pool):
    first = expect(pagedkv.InvalidArgumentError, lambda: pagedkv.Pool(num_blocks=1))
    seq = manager_pool.create_sequence()
    seq.append([1])  # a successful call clears the thread's message
    assert raw.pkv_last_error_message() == ""
    assert "num_blocks" in first.message  # the exception kept its own copy


def test_python_side_checks_raise_before_the_call():
    with pagedkv.Pool(num_blocks=8, block_size=16, num_layers=1, num_kv_heads=2, head_dim=64, dtype="f32") as pool:
        seq = pool.create_sequence()
        seq.append(list(range(5)))
        with pool.prepare([seq], 5) as b:
            good = np.ones((5, 2, 64), np.float32)
            expect(pagedkv.InvalidArgumentError, lambda: b.cache_write(0, good[:4], good), "k:", "shape")
            expect(pagedkv.InvalidArgumentError, lambda: b.cache_write(0, good, good.astype(np.float16)), "v:", "dtype")
            strided = np.ones((5, 2, 128), np.float32)[:, :, ::2]
            expect(pagedkv.InvalidArgumentError, lambda: b.cache_write(0, strided, good), "innermost")
            ro = np.ones((5, 4, 64), np.float32)
            ro.setflags(write=False)
            expect(pagedkv.InvalidArgumentError, lambda: b.attention(0, good.repeat(2, 1), ro), "out:", "read-only")
            expect(pagedkv.InvalidArgumentError, lambda: b.attention(0, np.ones((5, 3, 64), np.float32)), "multiple")
            with pytest.raises(TypeError, match="q: expected a tensor"):
                b.attention(0, [[1.0]])
            with pytest.raises(TypeError):
                raw.pkv_pool_create({"bogus_field": 1})


def test_counts_and_indices_refuse_floats_and_strings():
    """int() read truncate(2.7) as truncate(2), reserve("5") as 5 and
    cache_write(1.5, ...) as layer 1: non-integral counts and indices are a
    TypeError naming the argument, and nothing changes."""
    pool = pagedkv.Pool(num_blocks=16, block_size=4, num_layers=2, num_kv_heads=1, head_dim=8, dtype="f32")
    s = pool.create_sequence()
    s.append(list(range(6)))
    before = (pool.stats(), s.info(), s.block_table())
    for call, name in (
        (lambda: s.truncate(2.7), "num_tokens"),
        (lambda: s.reserve("5"), "num_tokens"),
        (lambda: s.append([1], 1.5), "lookahead"),
        (lambda: s.blocks_needed(2.5), "num_tokens"),
        (lambda: pool.admit([1, 2, 3], lookahead=0.5), "lookahead"),
        (lambda: pool.kv_tensor(0.9, "k"), "layer"),
        (lambda: pool.sequence(float(s.id)), "seq_id"),
    ):
        with pytest.raises(TypeError, match=name):
            call()
    assert (pool.stats(), s.info(), s.block_table()) == before
    kv = np.ones((6, 1, 8), np.float32)
    with pool.prepare([s], 6) as step:
        with pytest.raises(TypeError, match="layer"):
            step.cache_write(1.5, kv, kv)
        with pytest.raises(TypeError, match="layer"):
            step.attention(0.0, kv)
        with pytest.raises(TypeError, match="sliding_window"):
            step.attention(0, kv, sliding_window=2.5)
        assert float(pool.kv_tensor(1, "k").numpy().sum()) == 0.0
        # Integer scalars (numpy) still work.
        step.cache_write(np.int64(0), kv, kv)
        step.cache_write(np.uint32(1), kv, kv)
    s.truncate(np.int64(4))
    s.reserve(np.int32(64))
    assert s.info().num_tokens == 4
    pool.validate()


def test_kernels_on_a_pool_without_storage_name_the_storage():
    """A manager-only pool's plan: cache_write and attention say the pool has
    no storage (they said "q: expected dtype bfloat16" for a float32 q)."""
    pool = pagedkv.Pool(num_blocks=8, block_size=4)
    s = pool.create_sequence()
    s.append([1, 2, 3])
    x = np.ones((3, 1, 8), np.float32)
    with pool.prepare([s], 3) as step:
        for call in (lambda: step.attention(0, x), lambda: step.cache_write(0, x, x)):
            with pytest.raises(pagedkv.InvalidStateError, match="no KV storage"):
                call()
    pool.validate()


def test_pool_options_refuse_floats_strings_and_unordered_ids():
    """Pool(block_size=16.9) was a pool of 16-token blocks, k_scales="12"
    the scales [1.0, 2.0], and a set of tokens was appended in hash order:
    each is a TypeError naming the argument, and nothing is created or
    appended."""
    with pytest.raises(TypeError, match="block_size"):
        pagedkv.Pool(num_blocks=8, block_size=16.9)
    with pytest.raises(TypeError, match="num_blocks"):
        pagedkv.Pool(num_blocks="8")
    with pytest.raises(TypeError, match="floats"):
        pagedkv.Pool(num_blocks=8, num_layers=1, num_kv_heads=1, head_dim=8, dtype="fp8_e4m3", k_scales="12")
    pool = pagedkv.Pool(num_blocks=np.int64(16), block_size=np.int32(4))  # integer scalars still work
    assert pool.options.block_size == 4
    s = pool.create_sequence()
    for tokens in ({1, 2, 3}, frozenset({1}), {1: 2}):
        with pytest.raises(TypeError, match="tokens: expected an ordered sequence"):
            s.append(tokens)
    with pytest.raises(TypeError, match="tokens: expected a 1-d array of ints, got 2 dimensions"):
        s.append(np.zeros((2, 2), dtype=np.int32))
    assert s.num_tokens == 0
    with pytest.raises(TypeError, match="ordered sequence"):
        pool.free_batch({s.id})
    assert pool.stats().num_seqs == 1
    pool.validate()


_THREADS_WITHOUT_ROOM = """
import resource

import pagedkv

# An address-space limit a little above what the process maps now: room for
# the pool's few bytes, not for 1023 thread stacks (2-8 MiB each).
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize:"))
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), hard))
try:
    pagedkv.Pool(num_blocks=16, num_layers=1, num_kv_heads=1, head_dim=8, dtype="f32", num_threads=1024)
except pagedkv.OutOfMemoryError as e:
    print("OutOfMemoryError:", e)
else:
    print("created")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_pool_whose_kernel_threads_cannot_start_raises():
    # The CPU backend starts num_threads - 1 threads with the pool. When the
    # system refuses one (address space, pids limit), the threads already
    # started were left waiting on the half-built pool: pool creation hung
    # (or aborted), where it must fail with OutOfMemoryError.
    try:
        r = subprocess.run([sys.executable, "-c", _THREADS_WITHOUT_ROOM], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("Pool(num_threads=1024) hung when its threads could not start")
    assert r.returncode == 0, r.stderr
    if "created" in r.stdout:
        pytest.skip("the system started 1023 threads within the limit")
    assert "OutOfMemoryError:" in r.stdout and "thread" in r.stdout, r.stdout


def test_sequence_options_group_arguments_and_scales_refuse_fractions_and_strings():
    """create_sequence(lora_id=1.7) made a sequence keyed by LoRA 1 (whose
    blocks then hit another adapter's, while hash_prefix(lora_id=1.7)
    refused), lora_id="3" LoRA 3, an mm item at 0.5 one at 0, a HybridPool
    of num_blocks="32" or 32.9 a pool of 32, group_of_layer("1") layer 1 and
    softmax_scale="2" the scale 2.0: each is a TypeError naming the
    argument, and nothing is created or changed."""
    pool = pagedkv.Pool(num_blocks=16, block_size=4, num_layers=1, num_kv_heads=1, head_dim=8, dtype="f32")
    before = pool.stats()
    for call, name in (
        (lambda: pool.create_sequence(lora_id=1.7), "lora_id"),
        (lambda: pool.create_sequence(lora_id="3"), "lora_id"),
        (lambda: pool.create_sequence(priority=2.5), "priority"),
        (lambda: pool.admit([1, 2, 3], priority="1"), "priority"),
        (lambda: pool.admit([1, 2, 3], lora_id=1.5), "lora_id"),
        (lambda: pool.create_sequence(mm_items=[(0.5, 2, "img")]), "offset"),
        (lambda: pool.create_sequence(mm_items=[pagedkv.MMItem(0, "2", "img")]), "length"),
    ):
        with pytest.raises(TypeError, match=name):
            call()
    assert pool.stats() == before
    s = pool.create_sequence(lora_id=np.uint64(3), priority=np.int32(1), mm_items=[(np.int64(0), 2, "img")])
    assert s.info().lora_id == 3 and s.info().priority == 1  # integer scalars still work
    s.append(list(range(4)))
    x = np.ones((4, 1, 8), np.float32)
    with pool.prepare([s], 4) as step:
        step.cache_write(0, x, x)
        for call, name in (
            (lambda: step.attention(0, x, softmax_scale="2"), "softmax_scale"),
            (lambda: step.attention(0, x, logit_softcap=b"1"), "logit_softcap"),
        ):
            with pytest.raises(TypeError, match=name):
                call()
        step.attention(0, x, softmax_scale=np.float32(0.5))  # real scalars still work
    with pytest.raises(TypeError, match="k_scales"):
        pagedkv.Pool(num_blocks=8, num_layers=1, num_kv_heads=1, head_dim=8, dtype="fp8_e4m3", k_scales=["2"])
    with pytest.raises(TypeError, match="begin"):
        pagedkv.Pool(num_blocks=8, block_size=4, enable_retention=True).create_sequence().set_retention(
            [pagedkv.RetentionRange(0.5, 4, 50)]
        )

    full = pagedkv.KVGroupSpec.full
    for make, name in (
        (lambda: pagedkv.HybridPool([full(1, 2, 8)], num_blocks="32"), "num_blocks"),
        (lambda: pagedkv.HybridPool([full(1, 2, 8)], num_blocks=32.9), "num_blocks"),
        (lambda: pagedkv.HybridPool([full(1.9, 2, 8)], num_blocks=32), "num_layers"),
        (lambda: pagedkv.HybridPool([full(1, 2, 8, layer_ids=[0.5])], num_blocks=32), "layer_ids"),
    ):
        with pytest.raises(TypeError, match=name):
            make()
    hp = pagedkv.HybridPool([full(1, 1, 8), full(1, 1, 8)], num_blocks=np.int64(32), block_size=4)
    hs = hp.create_sequence()
    hs.append([1, 2, 3])
    for call, name in (
        (lambda: hp.group_of_layer("1"), "layer"),
        (lambda: hp.group_block_table(hs, 1.5), "group"),
        (lambda: hp.group_stats(0.5), "group"),
        (lambda: hp.take_copies("0"), "group"),
    ):
        with pytest.raises(TypeError, match=name):
            call()
    assert hp.group_of_layer(np.int32(1)) == (1, 0)
    assert hp.group_block_table(hs, np.uint8(1)) == hp.block_tables(hs)[1]


def test_publisher_and_transfer_options_refuse_fractions_and_strings():
    """EventPublisher(data_parallel_rank=0.5) published as rank 0 and
    TransferEngine(timeout_ms="5") timed out after 5 ms: TypeError now."""
    pool = pagedkv.Pool(num_blocks=8, block_size=4, enable_events=True)
    with pytest.raises(TypeError, match="data_parallel_rank"):
        pagedkv.EventPublisher(pool, "inproc://pkv-bad-rank", data_parallel_rank=0.5)
    with pytest.raises(TypeError, match="hwm"):
        pagedkv.EventPublisher(pool, "inproc://pkv-bad-hwm", hwm="10")
    if not pagedkv.transfer.available():
        pytest.skip("built without the UCX transport")
    with pytest.raises(TypeError, match="timeout_ms"):
        pagedkv.TransferEngine(transports="tcp", timeout_ms="5")
    with pytest.raises(TypeError, match="export_ttl_ms"):
        pagedkv.TransferEngine(transports="tcp", export_ttl_ms=2.5)


def test_mm_item_offsets_and_lengths_outside_uint64_are_refused_not_wrapped():
    """The raw module read an mm item's offset and length with no range
    check (PyArg_ParseTuple "K": modulo 2^64): an item at offset 2^64 + 3
    keyed the blocks as an item at 3, and one at offset -5 was accepted as
    2^64 - 5, silently changing or dropping the prompt's multimodal key.
    Each is an OverflowError naming the item, and nothing is created."""
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    tokens = list(range(16))
    before = pool.stats()
    for item in ((2**64 + 3, 4, "img"), (3, 2**64 + 4, "img"), (-5, 2, "img"), (0, -1, "img")):
        for call in (
            lambda item=item: pool.create_sequence(mm_items=[item]),
            lambda item=item: pool.admit(tokens, mm_items=[item]),
            lambda item=item: pool.hash_prefix(tokens, mm_items=[item]),
            lambda item=item: pagedkv.hash_prefix(tokens, block_size=4, mm_items=[item]),
        ):
            with pytest.raises(OverflowError, match=r"mm_items\[0\]"):
                call()
    assert pool.stats() == before
    # The extremes of the range still work.
    pool.create_sequence(mm_items=[(2**64 - 2, 1, "img")]).free()
    assert pool.hash_prefix(tokens, mm_items=[(np.uint64(3), np.int8(4), "img")]) == pool.hash_prefix(
        tokens, mm_items=[(3, 4, "img")]
    )


def test_retention_tuples_take_integer_scalars_and_name_a_bad_field():
    """set_retention's (begin, end, priority, duration_ns) tuples were read
    with PyLong_AsUnsignedLongLong: a numpy integer (as RetentionRange
    takes) raised a bare "TypeError: an integer is required", a fraction
    the same, and -1 "can't convert negative int to unsigned", none naming
    the range or its field. Numbers with __index__ work now, and a bad
    field is named; nothing changes on failure."""
    pool = pagedkv.Pool(num_blocks=16, block_size=4, enable_retention=True)
    s = pool.create_sequence()
    s.append(list(range(8)))
    with pool.prepare([s], 8):
        pass
    before = (pool.stats(), pool.priority_counts())
    for ranges, exc, where in (
        ([(0.5, 8, 50, 0)], TypeError, r"ranges\[0\]\.token_begin"),
        ([(0, 8, 50, 0), (0, "8", 50, 0)], TypeError, r"ranges\[1\]\.token_end"),
        ([(0, 8, -1, 0)], OverflowError, r"ranges\[0\]\.priority"),
        ([(0, 8, 50, 2**64)], OverflowError, r"ranges\[0\]\.duration_ns"),
    ):
        with pytest.raises(exc, match=where):
            s.set_retention(ranges)
    assert (pool.stats(), pool.priority_counts()) == before
    s.set_retention([(np.int64(0), np.uint64(8), np.int32(50), np.uint8(0))])
    assert pool.priority_counts()[50] == 2


def test_raw_last_error_copy_allocates_what_the_message_needs():
    """The raw pkv_last_error_copy(capacity) allocated capacity + 1 bytes:
    2^40 was a MemoryError, and 2^64 - 1 wrapped to malloc(0), into which the
    library then copied the last message (heap overflow; ASan:
    heap-buffer-overflow in pkv_last_error_copy). It allocates at most the
    message's length + 1 now, whatever the capacity."""
    pool = pagedkv.Pool(num_blocks=8)
    s = pool.create_sequence()  # alive: its collection would clear the message
    with pytest.raises(pagedkv.InvalidArgumentError) as err:
        s.truncate(1000)
    msg = str(err.value)
    assert len(msg) > 40
    for cap in (2**64 - 1, 2**40, len(msg) + 1, 1000):
        assert raw.pkv_last_error_copy(cap) == [len(msg), msg]
    assert raw.pkv_last_error_copy(10) == [len(msg), msg[:9]]
    assert raw.pkv_last_error_copy(0) == [len(msg), ""]
    s.free()


def test_raw_capacities_whose_byte_size_wraps_are_not_allocated_short():
    """The raw out-array typemaps allocated capacity * 4 bytes for block
    tables (pkv_seq_get_block_table, pkv_seq_group_block_table) and copy
    lists (pkv_pool_group_take_copies): capacity 2^62 wrapped that to
    malloc(0), and the library wrote the whole table into it (heap
    overflow: "malloc(): invalid size", the interpreter aborted). A
    capacity beyond what any table holds is clamped now (2^31 entries),
    allocated with an overflow check (a machine that cannot reserve that
    much answers MemoryError, never a short buffer)."""

    def call(fn, *args):
        try:
            return fn(*args)
        except MemoryError:
            return None

    pool = pagedkv.Pool(num_blocks=256, block_size=4)
    s = pool.create_sequence()
    s.append(list(range(800)))
    table = s.block_table()
    assert len(table) == 200
    for cap in (2**62, 2**62 + 1, 2**64 - 1):
        assert call(raw.pkv_seq_get_block_table, pool._h, s.id, cap) in (table, None)
        assert call(raw.pkv_seq_group_block_table, pool._h, s.id, 0, cap) in (table, None)
    hp = pagedkv.HybridPool([pagedkv.KVGroupSpec.recurrent(1, 64)], num_blocks=64, block_size=4)
    h = hp.create_sequence()
    h.append([1, 2, 3, 4])
    with hp.prepare([h], 4):
        pass
    child = h.fork()
    child.append([5])  # starts from the parent's state: a copy
    copies = call(raw.pkv_pool_group_take_copies, hp._h, 0, 2**62)
    assert copies is None or (len(copies[0]) == len(copies[1]) == 1)
    x = [bytearray(100) for _ in range(1000)]  # a corrupted heap failed here
    del x


def test_functions_taking_a_pool_or_batch_name_a_wrong_argument():
    """The module-level functions taking a pool (tiers.*, mla.is_mla /
    bytes_per_token, events.drain_events, EventPublisher, TransferEngine's
    export / import_sequence) and a batch (mla.cache_write / attention), and
    the Batch constructor, read ``pool._h`` / ``batch._pool`` first: a seq id
    or None raised AttributeError "'int' object has no attribute '_h'",
    naming no argument (found by fuzz_api.py). Now a TypeError naming it,
    before anything changes."""
    from pagedkv import events, mla, tiers, transfer

    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    seq = pool.create_sequence()
    before = pool.stats()
    calls = [
        lambda x: tiers.attach(x, host_bytes=4096),
        lambda x: tiers.admit_tiered(x, [1, 2, 3]),
        lambda x: tiers.stats(x),
        lambda x: tiers.flush(x),
        lambda x: mla.is_mla(x),
        lambda x: mla.bytes_per_token(x),
        lambda x: events.drain_events(x),
        lambda x: events.EventPublisher(x, "inproc://wrong-pool"),
        lambda x: pagedkv.Batch(x, [seq], 1),
    ]
    if transfer.available():
        eng = transfer.TransferEngine(transports="tcp")
        calls += [lambda x: eng.export(x, seq), lambda x: eng.import_sequence(x, b"")]
    for fn in calls:
        for wrong in (seq.id, None, "pool", seq):
            with pytest.raises(TypeError, match=r"^pool: expected a pagedkv\.Pool, got "):
                fn(wrong)
    for fn in (mla.cache_write, mla.attention):
        for wrong in (None, pool, 3):
            with pytest.raises(TypeError, match=r"^batch: expected a pagedkv\.Batch, got "):
                fn(wrong, 0, None, None, **({"softmax_scale": 0.1} if fn is mla.attention else {}))
    assert pool.stats() == before
    pool.validate()


def test_mm_items_given_as_an_array_or_tensor_is_a_type_error_naming_it():
    """``mm_items`` was compared with ``!= ()`` and read with ``items or ()``:
    a numpy array raised numpy's ValueError ("operands could not be
    broadcast", "truth value of an array ... is ambiguous"), a torch tensor
    torch's RuntimeError "Boolean value of Tensor with more than one value
    is ambiguous" (not an error type the API raises for a bad argument), a
    0-d one "iteration over a 0-d tensor", each naming no argument (found by
    fuzz_api.py). Now a TypeError naming mm_items; an empty array is no
    items, as an empty list is."""
    torch = pytest.importorskip("torch")
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    calls = [
        lambda mm: pagedkv.hash_prefix([1] * 16, block_size=4, mm_items=mm),
        lambda mm: pool.hash_prefix([1] * 16, mm_items=mm),
        lambda mm: pool.create_sequence(mm_items=mm),
        lambda mm: pool.admit([1] * 8, mm_items=mm),
    ]
    before = pool.stats()
    for fn in calls:
        for mm in (torch.tensor([1, 2]), np.array([1, 2]), torch.tensor(3), np.array(3), 5, "ab"):
            with pytest.raises(TypeError, match=r"^mm_items"):
                fn(mm)
        assert pool.stats() == before
        fn(np.array([], dtype=np.int64))  # no items
        fn(None)
    pool.validate()
