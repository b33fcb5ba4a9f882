"""Persistent page tables (pool.prepare(..., persistent_table=True)): every
plan array equals the CSR plan's over the same state, row by row, under a
random workload (decode steps, appends with lookahead, frees, forks,
truncates, prefix hits, reordered and resized batches)."""

import random

import numpy as np
import pytest

import pagedkv


def arrays(b):
    return {k: np.array(v) for k, v in b.plan_arrays().items()}


def check_same(pers, csr):
    for k in ("slot_mapping", "query_indptr", "last_page_len", "context_lens"):
        np.testing.assert_array_equal(pers[k], csr[k], err_msg=k)
    n = len(csr["context_lens"])
    indptr = pers["page_indptr"]
    stride = int(indptr[1]) if n else 0
    np.testing.assert_array_equal(indptr, np.arange(n + 1) * stride)
    assert len(pers["page_indices"]) == n * stride
    table = pers["page_indices"].reshape(n, stride)
    for i in range(n):
        row = csr["page_indices"][csr["page_indptr"][i] : csr["page_indptr"][i + 1]]
        np.testing.assert_array_equal(table[i, : len(row)], row, err_msg=f"row {i}")
        assert not table[i, len(row) :].any(), f"row {i}: padding must be the null block"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_persistent_plan_equals_csr_plan(seed):
    rng = random.Random(seed)
    pool = pagedkv.Pool(num_blocks=3000, block_size=4)
    live = []

    def tok():
        return rng.randrange(50)  # a small vocabulary: prefix hits happen

    def add():
        s, _ = pool.admit([tok() for _ in range(1 + rng.randrange(30))])
        live.append(s)

    for _ in range(12):
        add()
    for _ in range(200):
        r = rng.randrange(100)
        if r < 60:
            pool.append_batch([s.id for s in live], np.array([tok() for _ in live], dtype=np.int32))
        elif r < 68:
            rng.choice(live).append([tok(), tok(), tok()], lookahead=rng.randrange(6))
        elif r < 74 and len(live) > 2:
            live.pop(rng.randrange(len(live))).free()
        elif r < 80:
            add()
        elif r < 85 and len(live) < 30:
            live.append(rng.choice(live).fork())
        elif r < 90:
            s = rng.choice(live)
            s.truncate(len(s) - min(len(s) - 1, rng.randrange(9)))
        elif r < 95:
            rng.shuffle(live)
        q = [max(1, len(s) - s.num_computed_tokens) for s in live]
        pers = pool.prepare(live, q, persistent_table=True)
        csr = pool.prepare(live, q)
        check_same(arrays(pers), arrays(csr))
        csr.abort()
        csr.close()
        pers.commit()
        if rng.randrange(4):
            pers.close()  # else it lives on: the next plan must not change it
            kept = None
        else:
            kept = (pers, arrays(pers))
        pool.validate()
        if kept is not None:
            pers2 = pool.prepare(live, 1, persistent_table=True)
            for k, v in arrays(kept[0]).items():
                np.testing.assert_array_equal(v, kept[1][k], err_msg=f"live plan's {k} changed")
            pers2.abort()
            pers2.close()
            kept[0].close()


def test_persistent_flag_rejects_bad_input_like_prepare():
    pool = pagedkv.Pool(num_blocks=64, block_size=4)
    s = pool.create_sequence()
    s.append([1, 2, 3])
    gone = pool.create_sequence()
    gone.free()
    with pytest.raises(pagedkv.NotFoundError, match=r"seqs\[1\]"):
        pool.prepare([s, gone], 1, persistent_table=True)
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"query_counts\[0\]"):
        pool.prepare([s], 7, persistent_table=True)
    from pagedkv import _pagedkv as raw

    with pytest.raises(pagedkv.InvalidArgumentError, match="flags"):
        raw.pkv_batch_prepare_ex(pool._h, ([s.id], [1]), 6, None)
    with pool.prepare([s], 3, persistent_table=True) as b:
        assert b.info().num_pages == int(np.array(b.plan(pagedkv.PlanArray.PAGE_INDPTR))[1])
    pool.validate()


def test_attention_over_persistent_table_equals_csr():
    # The library's kernels read both layouts: the same step's attention
    # output, element by element, through a persistent-table plan and a CSR
    # plan, over sequences of different lengths (rows padded differently).
    rng = np.random.default_rng(7)
    with pagedkv.Pool(num_blocks=64, block_size=4, num_layers=2, num_kv_heads=2, head_dim=32, dtype="f32") as pool:
        seqs = [pool.create_sequence() for _ in range(5)]
        for i, s in enumerate(seqs):
            s.append(rng.integers(0, 1000, size=3 + 5 * i).astype(np.int32))

        def kv(n):
            return rng.standard_normal((n, 2, 32)).astype(np.float32)

        with pool.prepare(seqs, [len(s) for s in seqs]) as step:  # the prompts' K/V
            n = step.info().num_tokens
            for layer in range(2):
                step.cache_write(layer, kv(n), kv(n))
        for _ in range(6):  # decode steps: rows grow, new blocks appear
            pool.append_batch([s.id for s in seqs], rng.integers(0, 1000, size=5).astype(np.int32))
            k = [kv(5) for _ in range(2)]
            v = [kv(5) for _ in range(2)]
            q = rng.standard_normal((5, 4, 32)).astype(np.float32)
            outs = []
            for persistent in (True, False):
                with pool.prepare(seqs, 1, persistent_table=persistent) as step:
                    for layer in range(2):
                        step.cache_write(layer, k[layer], v[layer])
                        outs.append(np.array(step.attention(layer, q)))
            for layer in range(2):
                assert np.isfinite(outs[layer]).all()
                np.testing.assert_array_equal(outs[layer], outs[2 + layer])
        pool.validate()
