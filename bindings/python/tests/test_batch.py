"""Step plans, cache writes and paged attention against a float64 reference."""

import numpy as np
import pytest

import pagedkv
from conftest import TOLERANCE, np_dtype, random_tensor, reference_attention


class Model:
    """Keeps what was written for every sequence, as the reference sees it."""

    def __init__(self, pool, dtype):
        self.pool = pool
        self.dtype = dtype
        self.k = {}  # seq id -> [layer] -> list of [Hkv, D] rows
        self.v = {}

    def adopt(self, seq, source=None, upto=0):
        self.k[seq.id] = [
            list(self.k[source.id][layer][:upto]) if source else [] for layer in range(self.pool.num_layers)
        ]
        self.v[seq.id] = [
            list(self.v[source.id][layer][:upto]) if source else [] for layer in range(self.pool.num_layers)
        ]


def poison(pool):
    """NaN in every slot, so reading an unwritten one shows in the output."""
    for k, v in pool.kv_caches():
        for arr in (k.numpy(), v.numpy()):
            arr[...] = np.nan


def run_step(rng, pool, model, seqs, counts, params=None, check_lse=True):
    """Writes fresh K/V for the step, runs attention in every layer and
    checks every output element (and the LSE) against the reference."""
    params = params or {}
    dt = model.dtype
    heads = pool.num_kv_heads * model.group
    with pool.prepare(seqs, counts) as step:
        info = step.info()
        assert info.num_seqs == len(seqs) and info.num_tokens == sum(counts)
        plan = {name: view.numpy() for name, view in step.plan_arrays().items()}
        qptr = plan["query_indptr"]
        np.testing.assert_array_equal(qptr, np.concatenate([[0], np.cumsum(counts)]))
        lens = [s.num_tokens for s in seqs]
        np.testing.assert_array_equal(plan["context_lens"], lens)
        for i, s in enumerate(seqs):  # CSR page table = the block tables
            pages = plan["page_indices"][plan["page_indptr"][i] : plan["page_indptr"][i + 1]]
            np.testing.assert_array_equal(pages, s.block_table()[: len(pages)])
        bs = pool.block_size
        n = info.num_tokens
        for layer in range(pool.num_layers):
            k = random_tensor(rng, (n, pool.num_kv_heads, pool.head_dim), dt)
            v = random_tensor(rng, (n, pool.num_kv_heads, pool.head_dim), dt)
            step.cache_write(layer, k, v)
            kc, vc = pool.kv_tensor(layer, "k").numpy(), pool.kv_tensor(layer, "v").numpy()
            slots = plan["slot_mapping"]
            np.testing.assert_array_equal(kc[slots // bs, :, slots % bs].view(np.uint8), k.view(np.uint8))
            np.testing.assert_array_equal(vc[slots // bs, :, slots % bs].view(np.uint8), v.view(np.uint8))
            for i, s in enumerate(seqs):
                model.k[s.id][layer].extend(k[qptr[i] : qptr[i + 1]])
                model.v[s.id][layer].extend(v[qptr[i] : qptr[i + 1]])
            q = random_tensor(rng, (n, heads, pool.head_dim), dt)
            out, lse = step.attention(layer, q, lse=True, **params)
            assert out.dtype == dt and out.shape == q.shape and lse.dtype == np.float32
            assert np.isfinite(out.astype(np.float32)).all()
            tol = TOLERANCE[model.name]
            for i, s in enumerate(seqs):
                kh = np.stack(model.k[s.id][layer])
                vh = np.stack(model.v[s.id][layer])
                assert len(kh) == lens[i]
                rows = slice(qptr[i], qptr[i + 1])
                ref, ref_lse = reference_attention(
                    q[rows].astype(np.float64),
                    kh.astype(np.float64),
                    vh.astype(np.float64),
                    scale=params.get("softmax_scale"),
                    window=params.get("sliding_window", 0),
                    softcap=params.get("logit_softcap", 0.0),
                )
                got = out[rows].astype(np.float64)
                np.testing.assert_allclose(got, ref, atol=tol, rtol=tol, err_msg=f"seq {i} layer {layer}")
                if check_lse:
                    np.testing.assert_allclose(lse[rows], ref_lse, atol=2e-3, rtol=1e-4)
    return out


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("block_size", [8, 16])
def test_attention_prefill_prefix_decode(rng, dtype, block_size):
    dt = np_dtype(dtype)
    kv_heads = int(rng.integers(1, 3))
    head_dim = int(rng.choice([64, 128]))
    with pagedkv.Pool(
        num_blocks=40,
        block_size=block_size,
        num_layers=2,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        num_threads=2,
    ) as pool:
        poison(pool)
        model = Model(pool, dt)
        model.name = dtype
        model.group = int(rng.choice([1, 2, 4]))
        # Prefill two prompts (partial last pages).
        pa = rng.integers(0, 1000, int(rng.integers(block_size + 1, 3 * block_size))).tolist()
        pc = rng.integers(0, 1000, int(rng.integers(1, 2 * block_size))).tolist()
        a, c = pool.create_sequence(), pool.create_sequence()
        for s, p in ((a, pa), (c, pc)):
            model.adopt(s)
            s.append(p)
        run_step(rng, pool, model, [a, c], [len(pa), len(pc)])
        # A second request sharing a's prompt hits the prefix cache.
        b = pool.create_sequence()
        pb = pa + rng.integers(0, 1000, int(rng.integers(1, block_size))).tolist()
        cached = b.match_prefix(pb)
        assert cached >= block_size and cached % block_size == 0
        model.adopt(b, a, cached)
        b.append(pb[cached:])
        # Mixed step: decode for a, the uncached rest for b, a chunk for c.
        for s, tokens in ((a, [1]), (c, [2, 3, 4, 5, 6])):
            s.append(tokens)
        run_step(rng, pool, model, [a, b, c], [1, len(pb) - cached, 5])
        # A few decode steps, fresh data each time.
        for _ in range(3):
            for s in (a, b, c):
                s.append([7])
            run_step(rng, pool, model, [c, a, b], [1, 1, 1])
        pool.validate()


def test_attention_params(rng):
    dt = np.dtype(np.float32)
    with pagedkv.Pool(num_blocks=24, block_size=16, num_layers=1, num_kv_heads=2, head_dim=64, dtype="f32") as pool:
        poison(pool)
        model = Model(pool, dt)
        model.name, model.group = "f32", 2
        s = pool.create_sequence()
        model.adopt(s)
        s.append(list(range(37)))
        run_step(rng, pool, model, [s], [37], {"softmax_scale": 0.05, "sliding_window": 9, "logit_softcap": 3.0})
        s.append([1])
        run_step(rng, pool, model, [s], [1], {"sliding_window": 20})


def test_fork_copy_on_write_keeps_parent_data(rng):
    dt = np.dtype(np.float32)
    with pagedkv.Pool(num_blocks=24, block_size=8, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32") as pool:
        poison(pool)
        model = Model(pool, dt)
        model.name, model.group = "f32", 1
        parent = pool.create_sequence()
        model.adopt(parent)
        parent.append(list(range(12)))  # partial second block
        run_step(rng, pool, model, [parent], [12])
        child = parent.fork()
        model.adopt(child, parent, 12)
        child.append([100])
        parent.append([200])
        # The plan runs the copy-on-write before the writes.
        run_step(rng, pool, model, [parent, child], [1, 1])
        assert pool.stats().num_cow_copies >= 1


def test_out_and_lse_buffers_are_used_in_place(rng):
    with pagedkv.Pool(num_blocks=8, block_size=16, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32") as pool:
        s = pool.create_sequence()
        s.append(list(range(5)))
        with pool.prepare([s], 5) as step:
            kv = random_tensor(rng, (5, 1, 64), np.float32)
            step.cache_write(0, kv, kv)
            q = random_tensor(rng, (5, 2, 64), np.float32)
            out = np.full((5, 2, 64), np.nan, np.float32)
            lse = np.full((5, 2), np.nan, np.float32)
            got_out, got_lse = step.attention(0, q, out, lse=lse)
            assert got_out is out and got_lse is lse
            assert np.isfinite(out).all() and np.isfinite(lse).all()
            assert step.attention(0, q) is not out  # allocates like q
            # Strided rows: only the innermost dimension must be contiguous.
            wide = np.full((5, 4, 64), np.nan, np.float32)
            step.attention(0, q, wide[:, ::2])
            np.testing.assert_allclose(wide[:, ::2], out, rtol=1e-6, atol=1e-6)
            assert np.isnan(wide[:, 1::2]).all()


def test_stale_plan_and_closed_objects():
    with pagedkv.Pool(num_blocks=8, block_size=16, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32") as pool:
        s = pool.create_sequence()
        s.append(list(range(3)))
        step = pool.prepare([s], 3)
        kv = np.ones((3, 1, 64), np.float32)
        s.append([9])  # the plan no longer matches the sequence
        with pytest.raises(pagedkv.InvalidStateError):
            step.cache_write(0, kv, kv)
        step.close()
        step.close()
        with pytest.raises(pagedkv.InvalidStateError, match="closed"):
            step.cache_write(0, kv, kv)
        fresh = pool.prepare([s], 4)
    # The pool is closed; the plan is still a valid object whose calls fail.
    slots = fresh.plan(pagedkv.PlanArray.SLOT_MAPPING).numpy()
    assert slots.shape == (4,)
    with pytest.raises(pagedkv.InvalidStateError):
        fresh.cache_write(0, np.ones((4, 1, 64), np.float32), np.ones((4, 1, 64), np.float32))
    fresh.close()


def test_prepare_argument_checks():
    with pagedkv.Pool(num_blocks=8, block_size=4) as pool, pagedkv.Pool(num_blocks=8, block_size=4) as other:
        s = pool.create_sequence()
        s.append([1, 2])
        t = other.create_sequence()
        with pytest.raises(pagedkv.InvalidArgumentError, match="another pool"):
            pool.prepare([s, t])
        with pytest.raises(pagedkv.InvalidArgumentError, match="query_counts"):
            pool.prepare([s], [1, 1])
        with pytest.raises(pagedkv.InvalidArgumentError):
            pool.prepare([s], [3])  # more queries than tokens
        with pytest.raises(TypeError):
            pool.prepare([s.id])
        b = pool.prepare([s], 2)
        assert b.sequences == [s] and b.pool is pool and "1 seqs" in repr(b)
        b.close()


def test_query_counts_take_ints_only_and_numpy_scalars():
    """int() truncated 1.9 to 1 and read "3" as 3, and a numpy integer
    scalar count raised "'numpy.int64' object is not iterable"."""
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    s = pool.admit(list(range(6)))[0]
    for bad in ([1.9], ["6"], np.array([6.0]), [np.float32(6)], 6.0):
        with pytest.raises(TypeError, match="query_counts"):
            pool.prepare([s], bad)
    for good in (6, np.int64(6), np.uint32(6), [np.int64(6)], np.array([6], dtype=np.int32), (6,)):
        with pool.prepare([s], good) as b:
            assert b.num_tokens == 6
            b.abort()
    assert s.num_computed_tokens == 0


def test_with_block_that_aborts_does_not_commit_on_exit():
    """Leaving `with pool.prepare(...) as b:` normally commits a manager-only
    pool's step; a block that called b.abort() itself raised
    InvalidStateError ("the batch was aborted") from __exit__'s commit."""
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    s = pool.admit(list(range(6)))[0]
    with pool.prepare([s], 6) as b:
        b.abort()
    assert b.closed and s.num_computed_tokens == 0
    with pool.prepare([s], 6) as b:
        b.commit()
    assert s.num_computed_tokens == 6
    with pool.prepare_decode([s], [7]) as b:
        b.abort()
    assert len(s) == 7 and s.num_computed_tokens == 6


def count_aborts(monkeypatch):
    """The handles pkv_batch_abort is called with, from now on."""
    from pagedkv import _batch

    calls = []
    real = _batch._c.pkv_batch_abort

    def counting(h):
        calls.append(h)
        return real(h)

    monkeypatch.setattr(_batch._c, "pkv_batch_abort", counting)
    return calls


def test_a_committed_batch_is_closed_without_an_abort(monkeypatch):
    """close() of a committed plan called pkv_batch_abort, which raised
    InvalidStateError (caught): a C++ exception and a formatted message on
    every step of a `with` block. A plan aborted or never committed is
    still aborted by close(), and abort() after commit() still raises."""
    calls = count_aborts(monkeypatch)
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    s = pool.admit(list(range(6)))[0]
    with pool.prepare([s], 6) as b:
        b.commit()
    b = pool.prepare_decode([s], [7])  # left by the `with` exit's commit
    with b:
        pass
    assert calls == [] and s.num_computed_tokens == 7
    b = pool.prepare_decode([s], [8])
    b.commit()
    with pytest.raises(pagedkv.InvalidStateError, match="already committed"):
        b.abort()
    b.close()
    assert len(calls) == 1 and s.num_computed_tokens == 8
    b = pool.prepare_decode([s], [9])
    b.close()  # never committed: aborted, the token stays uncomputed
    assert len(calls) == 2 and len(s) == 9 and s.num_computed_tokens == 8


def test_a_step_committed_by_its_last_layer_write_is_closed_without_an_abort(monkeypatch):
    """On a pool with storage, the write of the step's last unwritten layer
    commits it (pkv_cache_write), which the package did not see: close()
    called pkv_batch_abort, refused, on every step of a `with` block. A
    step with a layer left unwritten is still aborted by close()."""
    calls = count_aborts(monkeypatch)
    rng = np.random.default_rng(3)
    with pagedkv.Pool(num_blocks=16, block_size=4, num_layers=2, num_kv_heads=1, head_dim=8, dtype="f32") as pool:
        s = pool.admit(list(range(6)))[0]

        def kv(n):
            return rng.standard_normal((n, 1, 8)).astype(np.float32)

        with pool.prepare([s], 6) as b:
            b.cache_write(1, kv(6), kv(6))
            b.cache_write(1, kv(6), kv(6))  # the same layer again: still one left
            b.cache_write(0, kv(6), kv(6))
        assert calls == [] and s.num_computed_tokens == 6
        with pool.prepare_decode([s], [7]) as b:
            b.cache_write(0, kv(1), kv(1))
        assert len(calls) == 1 and len(s) == 7 and s.num_computed_tokens == 6
        with pool.prepare([s], 1) as b:
            b.abort()
            b.cache_write(0, kv(1), kv(1))  # K/V written, nothing committed
            b.cache_write(1, kv(1), kv(1))
        assert len(calls) == 3 and s.num_computed_tokens == 6  # close() aborted it again


def test_zero_query_heads_are_named_not_called_a_stride():
    """numpy gives an empty array all-zero strides, so q of shape [n, 0,
    head_dim] (no query heads) failed the innermost-stride check: "q: the
    innermost dimension must be contiguous (stride 1), got stride 0" for a
    freshly allocated, contiguous array. The head count is named now, for
    attention and MLA attention."""
    with pagedkv.Pool(num_blocks=8, block_size=4, num_layers=1, num_kv_heads=2, head_dim=8, dtype="f32") as pool:
        s = pool.create_sequence()
        s.append([1, 2, 3])
        with pool.prepare([s], 3) as b:
            x = np.ones((3, 2, 8), np.float32)
            b.cache_write(0, x, x)
            with pytest.raises(pagedkv.InvalidArgumentError, match="0 query heads"):
                b.attention(0, np.zeros((3, 0, 8), np.float32))
            with pytest.raises(pagedkv.InvalidArgumentError, match="0 query heads"):
                b.attention(0, np.zeros((3, 0, 8), np.float32), out=np.zeros((3, 0, 8), np.float32))
    with pagedkv.Pool(
        num_blocks=8, block_size=4, num_layers=1, kv_layout="mla", kv_lora_rank=16, qk_rope_head_dim=8, dtype="f32"
    ) as pool:
        s = pool.create_sequence()
        s.append([1, 2, 3])
        with pool.prepare([s], 3) as b:
            b.mla_cache_write(0, np.ones((3, 16), np.float32), np.ones((3, 8), np.float32))
            with pytest.raises(pagedkv.InvalidArgumentError, match="0 query heads"):
                b.mla_attention(0, np.zeros((3, 0, 16), np.float32), np.zeros((3, 0, 8), np.float32), softmax_scale=0.5)


def test_a_batch_whose_construction_fails_is_aborted_not_committed(monkeypatch):
    """Batch construction reads the new plan's info after the library made
    the plan; an exception there (MemoryError, a KeyboardInterrupt) closed
    the handle, and destroying a plan that was neither committed nor
    aborted counts as committed: a manager-only pool took the step's tokens
    as computed although no step ran. The plan is aborted first now."""
    import pagedkv._batch as batch_module

    with pagedkv.Pool(num_blocks=16, block_size=4) as pool:
        s = pool.create_sequence()
        s.append(list(range(6)))
        with pool.prepare([s], 6):
            pass
        s.append([1, 2])
        assert s.num_computed_tokens == 6

        def fail(_):
            raise RuntimeError("interrupted")

        monkeypatch.setattr(batch_module.BatchInfo, "_from_c", staticmethod(fail))
        with pytest.raises(RuntimeError, match="interrupted"):
            pool.prepare([s], 2)
        monkeypatch.undo()
        assert s.num_computed_tokens == 6
        pool.validate()
        with pool.prepare([s], 2):
            pass
        assert s.num_computed_tokens == 8
        monkeypatch.setattr(batch_module.BatchInfo, "_from_c", staticmethod(fail))
        with pytest.raises(RuntimeError, match="interrupted"):
            pool.prepare_decode([s], [3])  # appended, then its plan aborted
        monkeypatch.undo()
        assert (s.num_tokens, s.num_computed_tokens) == (9, 8)
        pool.validate()
        with pool.prepare([s], 1):
            pass
        assert s.num_computed_tokens == 9


def test_repr_of_a_closed_batch_says_it_is_closed():
    """Pool's repr says "closed" and Sequence's "freed"; a Batch's repr read
    the same before and after close(), as a usable plan, and that of a
    Batch whose __init__ never ran raised AttributeError."""
    pool = pagedkv.Pool(block_size=4, num_blocks=16)
    s = pool.create_sequence()
    s.append([1, 2, 3])
    b = pool.prepare([s], 3)
    assert repr(b) == "<pagedkv.Batch 1 seqs, 3 tokens, 1 pages>"
    b.close()
    assert repr(b) == "<pagedkv.Batch closed, 1 seqs, 3 tokens, 1 pages>"
    assert "closed" in repr(pagedkv.Batch.__new__(pagedkv.Batch))
    pool.close()
    assert "closed" in repr(pool)


def test_a_second_init_of_a_live_batch_is_refused_and_changes_nothing():
    """Batch.__init__ called again on a live plan replaced its handle: the
    old plan was destroyed with neither commit nor abort, which on a
    manager-only pool counts its tokens as computed (a step that never ran);
    after a commit, the carried _committed made close() skip the abort of
    the new plan, so it counted as computed too."""
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    s = pool.admit(list(range(3)))[0]
    b = pool.prepare([s], 3)
    with pytest.raises(TypeError, match="already owns a batch"):
        b.__init__(pool, [s], 3)
    assert b.sequences == [s] and b.num_tokens == 3 and not b.closed
    b.close()  # never committed: aborted
    assert s.num_computed_tokens == 0
    b = pool.prepare([s], 3)
    b.commit()
    s.append([3])
    with pytest.raises(TypeError, match="already owns a batch"):
        b.__init__(pool, [s], 1)
    b.close()
    assert s.num_computed_tokens == 3 and len(s) == 4
    b = pagedkv.Batch.__new__(pagedkv.Batch)
    b.__init__(pool, [s], 1)  # a Batch never initialised still is
    b.close()
    assert s.num_computed_tokens == 3
