"""A pure-Python reference of what the batched and engine-facing calls let
a user observe (live sequences, their lengths and computed tokens, free
blocks, prefix hits after committed steps, plan rows), run against long
random interleavings of valid and invalid calls: append_batch,
prepare_decode (the steady path included, persistent tables), admit with
and without precomputed hashes, free_batch, prepare/commit/abort, truncate,
fork, reserve. Every failing call must change nothing (stats, tables,
events); pool.validate() after every call."""

from __future__ import annotations

import array
import random

import numpy as np
import pytest

import pagedkv

BS = 4


def run(seed, nblocks, predict_hits, steps=400):
    rng = random.Random(seed)
    pool = pagedkv.Pool(num_blocks=nblocks, block_size=BS, enable_events=True)
    other = pagedkv.Pool(num_blocks=8, block_size=BS)
    foreign = other.create_sequence()
    live = {}  # id -> [Sequence, tokens, computed, salt]
    written = set()  # (salt, prefix tuple) of written full blocks
    freed_ids = []
    held_views = []
    list(pool.events())

    def snap():
        st = pool.stats()
        return (
            st.num_free_blocks,
            st.num_cached_blocks,
            st.num_seqs,
            st.num_tokens,
            st.prefix_query_tokens,
            st.prefix_hit_tokens,
            st.num_evictions,
            st.num_cow_copies,
            sorted((i, len(v[0]), v[0].num_computed_tokens, tuple(v[0].block_table())) for i, v in live.items()),
        )

    def check_model():
        assert pool.stats().num_seqs == len(live), (pool.stats().num_seqs, len(live))
        held = set()
        for i, (s, toks, comp, _salt) in live.items():
            inf = s.info()
            assert inf.num_tokens == len(toks), (inf.num_tokens, len(toks))
            assert inf.num_computed_tokens == comp, (i, inf.num_computed_tokens, comp)
            held.update(b for b in s.block_table() if b)
        assert pool.stats().num_free_blocks == nblocks - 1 - len(held), (
            pool.stats().num_free_blocks,
            nblocks - 1 - len(held),
        )
        pool.validate()

    def mark_written(v):
        _s, toks, comp, salt = v
        for j in range(len(toks) // BS):
            if (j + 1) * BS <= comp:
                written.add((salt, tuple(toks[: (j + 1) * BS])))

    def check_plan(b, sel, pt):
        A = {k: np.asarray(v.numpy()) for k, v in b.plan_arrays().items()}
        assert [s.id for s in b.sequences] == list(sel)
        for r, i in enumerate(sel):
            s, toks = live[i][0], live[i][1]
            bt = s.block_table()
            n = len(toks)
            assert A["context_lens"][r] == n
            assert A["slot_mapping"][r] == bt[(n - 1) // BS] * BS + (n - 1) % BS
            lo, hi = A["page_indptr"][r], A["page_indptr"][r + 1]
            npg = (n - 1) // BS + 1
            row = list(A["page_indices"][lo:hi])
            if pt:
                assert row[:npg] == bt[:npg] and not any(row[npg:]), (row, bt)
            else:
                assert row == bt[:npg], (row, bt)
            assert A["last_page_len"][r] == (n - 1) % BS + 1

    def share(sel):
        # a fork sharing a block the step wrote sees those slots written too
        blocks = set()
        for i in sel:
            blocks.update(b for b in live[i][0].block_table() if b)
        for j, v in live.items():
            if j not in sel and blocks.intersection(v[0].block_table()):
                c = v[0].num_computed_tokens
                assert v[2] <= c <= len(v[1]), (j, v[2], c)
                v[2] = c
                mark_written(v)

    def predict(toks, salt):
        k = 0
        while (k + 1) * BS <= len(toks) - 1 and (salt, tuple(toks[: (k + 1) * BS])) in written:
            k += 1
        return k * BS

    def expect_fail(name, call, *args, **kwargs):
        before = snap()
        try:
            call(*args, **kwargs)
        except Exception as e:
            assert isinstance(e, (pagedkv.PagedKVError, TypeError, ValueError, OverflowError)), (name, type(e), e)
            after = snap()
            ev = list(pool.events())
            assert before == after, (name, e, before, after)
            assert not ev, (name, e, ev)
            return e
        raise AssertionError(f"{name}: no error")

    def tokbuf(vals):
        kind = rng.randrange(6)
        if kind == 0:
            return list(vals)
        if kind == 1:
            return np.array(vals, dtype=rng.choice([np.int32, np.int64, np.uint16, ">i4", ">i8"]))
        if kind == 2:
            return array.array(rng.choice("ilq"), vals)
        if kind == 3:
            return np.repeat(np.array(vals, dtype=np.int64), 2)[::2]
        if kind == 4:
            return memoryview(array.array("i", vals))
        return tuple(vals)

    def idbuf(seqs):
        kind = rng.randrange(4)
        if kind == 0:
            return [s for s in seqs]
        if kind == 1:
            return np.array([s.id for s in seqs], dtype=np.uint64)
        if kind == 2:
            return [s.id for s in seqs]
        return iter([s for s in seqs])

    prompts = [[rng.randrange(50) for _ in range(rng.randrange(1, 14))] for _ in range(6)]
    for step in range(steps):
        op = rng.randrange(11)
        ids = list(live)
        try:
            if op in (0, 1):  # admit
                base = rng.choice(prompts)
                toks = base[: rng.randrange(1, len(base) + 1)] + [rng.randrange(50) for _ in range(rng.randrange(0, 3))]
                salt = rng.choice([None, None, "s"])
                use_h = rng.random() < 0.5
                kw = {"cache_salt": salt} if salt else {}
                if use_h:
                    H = pool.hash_prefix(toks, **kw)
                    if rng.random() < 0.3 and H:
                        H = H[: rng.randrange(len(H))]
                    kw["hashes"] = H
                if rng.random() < 0.2:
                    bad = list(toks)
                    bad[rng.randrange(len(bad))] = rng.choice([2**31, -(2**31) - 1, 1.5, "x", None])
                    ints = all(isinstance(x, int) and -(2**31) <= x < 2**31 for x in bad)
                    expect_fail("admit bad token", pool.admit, tokbuf(bad) if ints else bad, **kw)
                    continue
                try:
                    s, hit = pool.admit(tokbuf(toks), **kw)
                except pagedkv.OutOfBlocksError:
                    continue
                if predict_hits:
                    ph = predict(toks, salt)
                    if use_h:
                        ph = min(ph, BS * len(kw["hashes"]))
                    if hit != ph:
                        t2 = pool.create_sequence(**({"cache_salt": salt} if salt else {}))
                        tok_hit = t2.match_prefix(toks)
                        t2.free()
                        raise AssertionError(f"hit {hit}, expected {ph} (token path {tok_hit})")
                    assert hit == ph, ("hit", hit, ph, toks, salt, use_h)
                v = [s, list(toks), hit, salt or None]
                live[s.id] = v
            elif op == 2 and ids:  # commit a step for some seqs
                sel = rng.sample(ids, rng.randrange(1, len(ids) + 1))
                sel = [i for i in sel if len(live[i][1]) > 0]
                if not sel:
                    continue
                seqs = [live[i][0] for i in sel]
                counts = [max(1, len(live[i][1]) - live[i][2]) for i in sel]
                if rng.random() < 0.5:
                    with pool.prepare(seqs, counts, persistent_table=rng.random() < 0.5) as b:
                        b.commit()
                    for i in sel:
                        live[i][2] = len(live[i][1])
                        mark_written(live[i])
                    share(sel)
                else:
                    with pool.prepare(seqs, counts) as b:
                        b.abort()
            elif op == 3 and ids:  # append_batch valid
                sel = rng.sample(ids, rng.randrange(1, len(ids) + 1))
                toks = [rng.randrange(50) for _ in sel]
                try:
                    pool.append_batch(idbuf([live[i][0] for i in sel]), tokbuf(toks))
                except pagedkv.OutOfBlocksError:
                    continue
                for i, t in zip(sel, toks):
                    live[i][1].append(t)
            elif op == 4 and ids:  # append_batch invalid
                sel = rng.sample(ids, rng.randrange(1, len(ids) + 1))
                toks = [rng.randrange(50) for _ in sel]
                k = rng.randrange(len(sel))
                how = rng.randrange(5)
                seqs = [live[i][0] for i in sel]
                if how == 0:
                    toks[k] = 2**31
                    tb = np.array(toks, dtype=np.int64)
                elif how == 1:
                    seqs.insert(k, seqs[k])
                    toks.insert(k, 1)
                    tb = tokbuf(toks)
                elif how == 2 and freed_ids:
                    seqs = [s.id for s in seqs]
                    seqs.insert(k, rng.choice(freed_ids))
                    toks.insert(k, 1)
                    tb = toks
                elif how == 3:
                    seqs.insert(k, foreign)
                    toks.insert(k, 1)
                    tb = toks
                else:
                    tb = tokbuf([*toks, 1])
                expect_fail("append_batch", pool.append_batch, seqs, tb)
            elif op == 5 and ids:  # prepare_decode valid or invalid
                sel = rng.sample(ids, rng.randrange(1, len(ids) + 1))
                if rng.random() < 0.6:
                    sel = sorted(ids)  # repeat the running batch: the steady path
                toks = [rng.randrange(50) for _ in sel]
                ready = all(live[i][2] == len(live[i][1]) for i in sel)
                seqs = idbuf([live[i][0] for i in sel])
                if not ready or rng.random() < 0.2:
                    if ready:
                        toks.append(1)
                    expect_fail("prepare_decode", pool.prepare_decode, seqs, tokbuf(toks))
                    continue
                pt = rng.random() < 0.5
                try:
                    b = pool.prepare_decode(seqs, tokbuf(toks), persistent_table=pt)
                except pagedkv.OutOfBlocksError:
                    # all or nothing; checked by the model next
                    continue
                for i, t in zip(sel, toks):
                    live[i][1].append(t)
                check_plan(b, sel, pt)
                if rng.random() < 0.3:  # keep its views: later plans must not change them
                    views = b.plan_arrays()
                    held_views.append(({k: np.array(v.numpy()) for k, v in views.items()}, views))
                    if len(held_views) > 3:
                        held_views.pop(0)
                if rng.random() < 0.7:
                    b.commit()
                    for i in sel:
                        live[i][2] = len(live[i][1])
                        mark_written(live[i])
                    share(sel)
                b.close()
            elif op == 6 and ids:  # free_batch valid
                sel = rng.sample(ids, rng.randrange(1, min(3, len(ids)) + 1))
                pool.free_batch(idbuf([live[i][0] for i in sel]))
                for i in sel:
                    del live[i]
                    freed_ids.append(i)
            elif op == 7 and ids:  # free_batch invalid
                sel = rng.sample(ids, rng.randrange(1, len(ids) + 1))
                seqs = [live[i][0] for i in sel]
                k = rng.randrange(len(seqs) + 1)
                how = rng.randrange(3)
                if how == 0:
                    seqs.insert(k, seqs[min(k, len(seqs) - 1)])
                elif how == 1 and freed_ids:
                    seqs = [s.id for s in seqs]
                    seqs.insert(k, rng.choice(freed_ids))
                else:
                    seqs.insert(k, foreign)
                expect_fail("free_batch", pool.free_batch, seqs)
            elif op == 8 and ids:  # truncate
                i = rng.choice(ids)
                v = live[i]
                n = rng.randrange(len(v[1]) + 1)
                if predict_hits:
                    n -= n % BS  # a partial truncate drops the block's hash
                v[0].truncate(n)
                del v[1][n:]
                v[2] = min(v[2], n)
            elif op == 9 and ids:  # fork
                i = rng.choice(ids)
                v = live[i]
                try:
                    c = v[0].fork()
                except pagedkv.OutOfBlocksError:
                    continue
                live[c.id] = [c, list(v[1]), v[2], v[3]]
            elif op == 10 and ids:  # reserve / append
                i = rng.choice(ids)
                v = live[i]
                v[0].reserve(len(v[1]) + rng.randrange(40))
        except AssertionError as e:
            raise AssertionError(f"seed {seed} step {step} op {op}: {e}") from None
        for want, views in held_views:
            for k, v in views.items():
                assert np.array_equal(np.asarray(v.numpy()), want[k]), ("held plan view changed", k)
        try:
            list(pool.events())
            check_model()
        except AssertionError as e:
            raise AssertionError(f"seed {seed} step {step} op {op}: {e}") from None


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("num_blocks", [400, 24])
def test_batched_calls_against_a_reference(seed, num_blocks):
    # 400 blocks: nothing is evicted, so every prefix hit is predicted;
    # 24: appends and admissions run out of blocks mid-batch.
    run(seed, num_blocks, num_blocks > 100, steps=600)


def test_length_mismatches_are_invalid_argument_errors():
    """Arguments that must be of equal length (or whole hashes) and are not
    raise InvalidArgumentError, as prepare_decode's and the library's own
    checks do: a PagedKVError an engine catches (it is still a ValueError),
    not a bare ValueError, and nothing changes."""
    with pagedkv.Pool(block_size=4, num_blocks=32, num_layers=1, num_kv_heads=1, head_dim=4) as pool:
        a, b = pool.create_sequence(), pool.create_sequence()
        a.append([1, 2, 3, 4, 5])
        stats = pool.stats()
        calls = {
            "seqs and tokens differ in length": lambda: pool.append_batch([a, b], [7]),
            "seqs and query_counts differ in length": lambda: pagedkv._pagedkv.pkv_batch_prepare(
                pool._h, (np.array([a.id, b.id], dtype=np.uint64), np.ones(3, dtype=np.uint32)), None
            ),
            "src and dst differ in length": lambda: pool.copy_blocks([1, 2], [3]),
            "not a whole number of 32-byte hashes": lambda: pool.admit([1, 2, 3, 4], hashes=b"x" * 33),
            "not a whole number of 32-byte hashes ": lambda: b.match_prefix([1, 2, 3, 4], hashes=b"x" * 31),
        }
        for message, call in calls.items():
            with pytest.raises(pagedkv.InvalidArgumentError, match=message.strip()) as e:
                call()
            assert isinstance(e.value, ValueError), message
        assert pool.stats() == stats
        assert (len(a), len(b)) == (5, 0)
    with pytest.raises(pagedkv.InvalidArgumentError, match="k_scales and v_scales differ in length"):
        pagedkv.Pool(
            block_size=4,
            num_blocks=8,
            num_layers=1,
            num_kv_heads=1,
            head_dim=4,
            dtype="fp8_e4m3",
            k_scales=[1.0],
            v_scales=[1.0, 2.0],
        )
