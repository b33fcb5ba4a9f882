"""Inputs of every kind a caller may hand the package: a clear exception
naming the argument, never a warning printed or a value silently changed."""

import warnings

import numpy as np
import pytest

import pagedkv

H, D = 2, 64


def _step():
    pool = pagedkv.Pool(num_blocks=16, block_size=16, num_layers=1, num_kv_heads=H, head_dim=D, dtype="f32")
    seq = pool.create_sequence()
    seq.append(list(range(5)))
    step = pool.prepare([seq], 5)
    rng = np.random.default_rng(0)
    kv = rng.standard_normal((5, H, D)).astype(np.float32)
    step.cache_write(0, kv, kv)
    q = rng.standard_normal((5, 4, D)).astype(np.float32)
    return pool, seq, step, q


@pytest.mark.parametrize("name", ["softmax_scale", "logit_softcap"])
@pytest.mark.parametrize("value", [np.complex128(0.125 + 1j), np.complex64(0.5), 0.125 + 0j])
def test_complex_float_arguments_are_refused_not_truncated(name, value):
    pool, _seq, step, q = _step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's ComplexWarning was printed, the imaginary part dropped
        with pytest.raises(TypeError, match=f"{name}: expected a float, got complex"):
            step.attention(0, q, **{name: value})
    step.close()
    pool.close()


def test_float_argument_given_an_array_names_it():
    pool, _seq, step, q = _step()
    with pytest.raises(TypeError, match="softmax_scale: expected a float, got ndarray"):
        step.attention(0, q, softmax_scale=np.array([0.125]))
    assert np.array_equal(step.attention(0, q, softmax_scale=np.float32(0.125)), step.attention(0, q))
    step.close()
    pool.close()


def test_complex_kv_scales_are_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match=r"k_scales\[0\]: expected a float, got complex"):
            pagedkv.Pool(
                num_blocks=4, num_layers=1, num_kv_heads=1, head_dim=64, dtype="fp8_e4m3",
                k_scales=np.array([1 + 1j]), v_scales=[1.0],
            )  # fmt: skip


def test_token_elements_whose_index_refuses_are_named():
    torch = pytest.importorskip("torch")
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    seq = pool.create_sequence()
    # numpy() refuses both, so the tensor was read element by element and
    # the 0-d tensors' own "only integer tensors of a single element can be
    # converted to an index" came out, naming no argument.
    for bad in (torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([1.0], dtype=torch.bfloat16)):
        with pytest.raises(TypeError, match=r"tokens\[0\]: expected an int, got Tensor"):
            seq.append(bad)
        with pytest.raises(TypeError, match=r"tokens\[0\]: expected an int, got Tensor"):
            pagedkv.hash_prefix(bad, block_size=1)
    assert len(seq) == 0
    pool.validate()
    pool.close()


@pytest.mark.parametrize("bad", [5, None, np.int32(5), np.array(7, dtype=np.int32)])
def test_hash_prefix_of_a_non_sequence_names_tokens(bad):
    with pytest.raises(TypeError, match="tokens: expected a sequence or buffer of ints"):
        pagedkv.hash_prefix(bad, block_size=1)


def test_hash_prefix_reads_a_generator_as_append_does():
    tokens = list(range(9))
    assert pagedkv.hash_prefix((t for t in tokens), block_size=4) == pagedkv.hash_prefix(tokens, block_size=4)
    pool = pagedkv.Pool(num_blocks=8, block_size=4)
    assert pool.hash_prefix(iter(tokens)) == pool.hash_prefix(tokens)
    pool.close()


def test_swap_out_of_a_non_sequence_names_blocks():
    pool = pagedkv.Pool(num_blocks=8, block_size=4, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32")
    with pytest.raises(TypeError, match="blocks: expected a sequence or buffer of ints, got int"):
        pool.swap_out(3)
    buf = pool.swap_out(b for b in [1, 2])  # a generator: read once
    assert buf.nbytes == 2 * pool.bytes_per_block
    pool.close()


@pytest.mark.parametrize("flag", ["enable_prefix_caching", "enable_events", "enable_retention", "tagged_keys"])
@pytest.mark.parametrize("bad", ["false", "no", 2, 0.0, None.__class__])
def test_bool_options_refuse_what_is_not_a_bool(flag, bad):
    # bool() read these: enable_prefix_caching="false" enabled prefix caching.
    with pytest.raises((TypeError, ValueError), match=f"{flag}: expected a bool"):
        pagedkv.Pool(num_blocks=8, **{flag: bad})


def test_bool_arguments_refuse_strings_everywhere():
    with pytest.raises(TypeError, match="strict_key_domains: expected a bool, got str"):
        pagedkv.hash_prefix([1, 2, 3, 4], block_size=4, strict_key_domains="False")
    with pytest.raises(TypeError, match="tagged_keys: expected a bool, got str"):
        pagedkv.hash_prefix([1, 2, 3, 4], block_size=4, tagged_keys="no")
    pool = pagedkv.Pool(num_blocks=8, block_size=4)
    with pytest.raises(TypeError, match="owned: expected a bool, got str"):
        pool.create_sequence(owned="False")
    with pytest.raises(TypeError, match="owned: expected a bool, got str"):
        pool.admit([1, 2, 3], owned="False")
    assert pool.stats().num_seqs == 0  # refused before anything was created
    seq = pool.create_sequence()
    seq.append([1])
    with pytest.raises(TypeError, match="own: expected a bool, got str"):
        pool.sequence(seq.id, own="no")
    with pytest.raises(TypeError, match="persistent_table: expected a bool, got str"):
        pool.prepare([seq], 1, persistent_table="no")
    with pytest.raises(TypeError, match="enable_prefix_caching: expected a bool, got str"):
        pagedkv.HybridPool([pagedkv.KVGroupSpec.full(1, 1, 8)], num_blocks=8, enable_prefix_caching="no")
    pool.close()


def test_bool_arguments_take_bools_and_integer_scalars():
    torch = pytest.importorskip("torch")
    for value in (True, 1, np.True_, np.int8(1), torch.tensor(True)):
        pool = pagedkv.Pool(num_blocks=8, enable_events=value, enable_prefix_caching=value)
        assert pool.options.enable_events is True and pool.options.enable_prefix_caching is True
        pool.close()
    for value in (False, 0, np.False_):
        pool = pagedkv.Pool(num_blocks=8, enable_prefix_caching=value)
        assert pool.options.enable_prefix_caching is False
        pool.close()
    assert pagedkv.hash_prefix([1] * 4, block_size=4, tagged_keys=np.True_) == pagedkv.hash_prefix(
        [1] * 4, block_size=4, tagged_keys=True
    )


def test_misshapen_arguments_name_themselves():
    pool = pagedkv.Pool(num_blocks=8, block_size=4, enable_retention=True)
    seq = pool.create_sequence()
    seq.append([1, 2, 3])
    for bad in (5, None, np.uint64(5), np.array(5, dtype=np.uint64)):
        with pytest.raises(TypeError, match="seqs: expected Sequence objects"):
            pool.prepare(bad)
        with pytest.raises(TypeError, match="seqs: expected Sequence objects"):
            pool.prepare_decode(bad, [1])
    with pytest.raises(TypeError, match="query_counts: expected an int, got ndarray"):
        pool.prepare([seq], np.array(1.5))
    with pool.prepare([seq], np.array(3)) as step:  # a 0-d integer array is a count
        assert step.num_tokens == 3
    for bad in ([5], [(0, 1)], [None]):
        with pytest.raises(TypeError, match=r"mm_items\[0\]: expected an MMItem or a tuple"):
            pool.create_sequence(mm_items=bad)
        with pytest.raises(TypeError, match=r"mm_items\[0\]: expected an MMItem or a tuple"):
            pagedkv.hash_prefix([1] * 4, block_size=4, mm_items=bad)
    with pytest.raises(TypeError, match="ranges: expected an iterable of retention ranges, got int"):
        seq.set_retention(5)
    with pytest.raises(TypeError, match=r"ranges\[1\]: expected a RetentionRange or a tuple"):
        seq.set_retention([(0, 4, 50, 0), 7])
    assert pool.stats().num_seqs == 1
    pool.validate()
    pool.close()


def test_status_string_takes_ints_only():
    assert pagedkv.status_string(-1) == pagedkv.status_string(np.int32(-1))
    with pytest.raises(TypeError, match="status: expected an int, got str"):
        pagedkv.status_string("-1")  # int() parsed it


def test_swap_out_names_its_buffer_argument():
    pool = pagedkv.Pool(num_blocks=8, block_size=4, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32")
    n = pool.bytes_per_block
    # The raw call's TypeError named "host_buffer", a parameter the Python API does not have.
    with pytest.raises(TypeError, match="buffer: expected a writable contiguous buffer, got a read-only bytes"):
        pool.swap_out([1], bytes(n))
    with pytest.raises(TypeError, match="buffer: expected a writable contiguous buffer, got a not contiguous ndarray"):
        pool.swap_out([1], np.zeros(2 * n, np.uint8)[::2])
    assert len(pool.swap_out([1], bytearray(n))) == n
    pool.close()


def test_swap_in_names_its_buffer_argument():
    pool = pagedkv.Pool(num_blocks=8, block_size=4, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32")
    n = pool.bytes_per_block
    data = pool.swap_out([1])
    strided = np.zeros(2 * n, np.uint8)[::2]  # writable, not contiguous
    strided[:] = data
    # As swap_out's: the raw call's TypeError named "host_buffer" and asked
    # swap_in, which only reads it, for a writable buffer.
    with pytest.raises(TypeError, match=r"^buffer: expected a contiguous buffer, got a not contiguous ndarray$"):
        pool.swap_in([1], strided)
    pool.swap_in([1], bytes(data))  # read-only will do
    pool.swap_in([1], np.ascontiguousarray(strided))
    pool.close()


def test_flags_given_past_the_checked_entry_points_are_checked():
    # Pool.prepare and KVGroupSpec.recurrent check their flags; the public
    # Batch constructor and a KVGroupSpec built directly read them with
    # bool(): persistent_table="no" made a persistent table (17 pages),
    # snapshot_every_block="no" asked for snapshots.
    pool = pagedkv.Pool(block_size=4, num_blocks=8)
    seq = pool.create_sequence()
    seq.append([1, 2, 3])
    with pytest.raises(TypeError, match="persistent_table: expected a bool, got str"):
        pagedkv.Batch(pool, [seq], [3], persistent_table="no")
    with pagedkv.Batch(pool, [seq], [3], persistent_table=np.False_) as b:
        assert b.info().num_pages == 1
    spec = pagedkv.KVGroupSpec(pagedkv.GroupKind.RECURRENT, 1, state_bytes=64, snapshot_every_block="no")
    with pytest.raises(TypeError, match="snapshot_every_block: expected a bool, got str"):
        pagedkv.HybridPool([pagedkv.KVGroupSpec.full(1, 1, 8), spec], block_size=4, num_blocks=8)
    pool.close()


def test_flags_take_0d_numpy_bool_arrays():
    # np.True_ and np.array(1) were taken, np.array(True) (a 0-d bool array:
    # what np.load of a saved flag gives) refused as "expected a bool, got ndarray".
    pool = pagedkv.Pool(block_size=4, num_blocks=8, enable_events=np.array(True))
    assert pool.options.enable_events
    pool.close()
    with pytest.raises(TypeError, match="enable_events: expected a bool, got ndarray"):
        pagedkv.Pool(block_size=4, num_blocks=8, enable_events=np.array([True, False]))


def test_bool_arguments_defaulting_to_false_take_none_as_before():
    # bool(None) is False: a wrapper forwarding its own None default
    # (prepare(..., persistent_table=opt)) got the default; e76be72 made it a
    # TypeError. owned (default True) still refuses None: bool(None) made the
    # handle a borrowing one, the opposite of the default.
    pool = pagedkv.Pool(block_size=4, num_blocks=8)
    seq = pool.create_sequence()
    seq.append([1, 2, 3])
    with pool.prepare([seq], [3], persistent_table=None) as b:
        assert b.info().num_pages == 1
        b.abort()
    with pagedkv.Batch(pool, [seq], [3], persistent_table=None) as b:
        assert b.info().num_pages == 1
        b.abort()
    assert pool.sequence(seq.id, own=None).owned is False
    spec = pagedkv.KVGroupSpec.recurrent(1, 64, snapshot_every_block=None)
    assert spec.snapshot_every_block is False
    assert (
        pagedkv.KVGroupSpec(pagedkv.GroupKind.RECURRENT, 1, state_bytes=64, snapshot_every_block=None)._to_c()["flags"]
        == 0
    )
    with pytest.raises(TypeError, match="owned: expected a bool, got NoneType"):
        pool.create_sequence(owned=None)
    pool.close()


def test_retention_range_fields_name_themselves_when_index_refuses():
    # A float torch tensor has __index__, which raises: the raw TypeError
    # ("only integer tensors of a single element can be converted to an
    # index") named no range or field, where a float was named.
    torch = pytest.importorskip("torch")
    pool = pagedkv.Pool(block_size=4, num_blocks=8, enable_retention=True)
    seq = pool.create_sequence()
    seq.append([1, 2, 3, 4, 5])
    with pytest.raises(TypeError, match=r"^ranges\[0\]\.token_begin: expected an int, got Tensor$"):
        seq.set_retention([(torch.tensor(0.5), 4, 1, 0)])
    with pytest.raises(TypeError, match=r"^ranges\[1\]\.token_end: expected an int, got Tensor$"):
        seq.set_retention([(0, 4, 1, 0), (0, torch.tensor(4.0), 1, 0)])
    seq.set_retention([(torch.tensor(0), torch.tensor(4), 1, 0)])  # integer tensors are ints
    pool.close()


def test_float_argument_given_a_tensor_of_several_elements_names_it_and_prints_nothing():
    """_real called float() on any tensor: one of several elements (or none)
    raised torch's ValueError "only one element tensors can be converted to
    Python scalars", naming no argument, and printed torch's UserWarning
    "Converting a tensor with requires_grad=True to a scalar" first when it
    required grad (so did a valid 0-d one); a [[x]] tensor was taken as x,
    where numpy's is refused (found by fuzz_api.py)."""
    torch = pytest.importorskip("torch")
    pool, _seq, step, q = _step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for bad in (torch.zeros(3, requires_grad=True), torch.zeros(0), torch.zeros(1, 1), np.zeros((1, 1))):
            with pytest.raises(TypeError, match=r"^softmax_scale: expected a float, got (Tensor|ndarray) of shape"):
                step.attention(0, q, softmax_scale=bad)
        scale = torch.tensor(0.125, requires_grad=True)
        assert np.array_equal(step.attention(0, q, softmax_scale=scale), step.attention(0, q, softmax_scale=0.125))
    step.close()
    pool.close()


def test_kv_scales_given_a_tensor_without_storage_or_a_scalar_name_themselves():
    """_floats called tolist() and iterated what it gave: a sparse torch
    tensor raised torch's RuntimeError "Cannot access data pointer of Tensor
    that doesn't have storage", a meta one NotImplementedError "Cannot copy
    out of meta tensor", a 0-d array or tensor and an int "'float' object is
    not iterable", none naming the argument (found by fuzz_api.py). Now a
    TypeError naming k_scales / v_scales; the scales stay as they were."""
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own note on sparse invariant checks
        sparse = torch.sparse_coo_tensor([[0]], [1.0], (1,))
    pool = pagedkv.Pool(num_blocks=4, num_layers=1, num_kv_heads=1, head_dim=8, dtype="fp8_e4m3")
    before = pool.kv_scales()
    for bad in (sparse, torch.empty(1, device="meta"), np.array(2.0), torch.tensor(2.0), 5):
        with pytest.raises(TypeError, match=r"^k_scales: expected a sequence of floats, got "):
            pool.set_kv_scales(bad, [1.0])
        with pytest.raises(TypeError, match=r"^v_scales: expected a sequence of floats, got "):
            pagedkv.Pool(
                num_blocks=4, num_layers=1, num_kv_heads=1, head_dim=8, dtype="fp8_e4m3", k_scales=[1.0], v_scales=bad
            )
    assert pool.kv_scales() == before
    pool.set_kv_scales(torch.tensor([2.0]), np.array([3.0]))
    assert pool.kv_scales() == ([2.0], [3.0])


def test_priority_and_lora_id_given_an_array_or_tensor_name_themselves():
    """create_sequence / admit / admit_tiered (and import_sequence's lora_id)
    read ``not priority`` / ``not lora_id`` before converting them: a torch
    tensor raised torch's RuntimeError "Boolean value of Tensor with more
    than one value is ambiguous", a numpy array numpy's ValueError "The
    truth value of an array ... is ambiguous", naming neither, and
    NotImplemented printed Python's DeprecationWarning first (found by
    fuzz_api.py). Now a TypeError naming the argument, no sequence made;
    None stays the default, integer scalars are taken."""
    torch = pytest.importorskip("torch")
    from pagedkv import tiers

    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    calls = [
        lambda **kw: pool.create_sequence(**kw),
        lambda **kw: pool.admit([1, 2, 3], **kw)[0],
        lambda **kw: tiers.admit_tiered(pool, [1, 2, 3], **kw)[0],
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn in calls:
            for name in ("priority", "lora_id"):
                for bad in (torch.tensor([1, 2]), torch.zeros(0), np.array([1, 2]), NotImplemented):
                    with pytest.raises(TypeError, match=f"^{name}: expected an int, got "):
                        fn(**{name: bad})
                assert pool.stats().num_seqs == 0
            s = fn(priority=np.int32(3), lora_id=torch.tensor(2))
            assert (s.info().priority, s.info().lora_id) == (3, 2)
            s.free()
            fn(priority=None, lora_id=None).free()
    pool.validate()
