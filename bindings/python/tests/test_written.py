"""Issue 13: no request may ever read K/V that nobody wrote.

Tokens count as computed when their step is committed (every layer written,
Batch.commit(), or a manager-only ``with`` block that ends normally); a
prefix lookup attaches only written blocks; a plan over unwritten context
raises InvalidStateError.
"""

import numpy as np
import pytest

import pagedkv


def nan_pool(num_blocks=16, block_size=16):
    pool = pagedkv.Pool(
        num_blocks=num_blocks, block_size=block_size, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32"
    )
    k, v = pool.kv_caches()[0]
    k.numpy()[...] = np.nan  # any read of a slot nobody wrote shows up
    v.numpy()[...] = np.nan
    return pool


def run_step(pool, seqs, counts, rng):
    """A model step: writes every layer (which commits it), attends, returns out."""
    with pool.prepare(seqs, counts) as b:
        n = b.num_tokens
        k = rng.standard_normal((n, 1, 64)).astype(np.float32)
        v = rng.standard_normal((n, 1, 64)).astype(np.float32)
        b.cache_write(0, k, v)
        q = rng.standard_normal((n, 2, 64)).astype(np.float32)
        return b.attention(0, q)


def test_issue_repro_same_step_sharing_then_free():
    rng = np.random.default_rng(13)
    pool = nan_pool()
    system = list(range(48))
    s1 = pool.create_sequence()
    s1.append([*system, 1])  # admitted in this step
    s2 = pool.create_sequence()
    assert s2.match_prefix([*system, 2]) == 0  # s1's blocks are not written: no hit
    s2.append([*system, 2])
    s1.free()  # preempted before the step
    assert s2.num_computed_tokens == 0
    with pytest.raises(pagedkv.InvalidStateError, match=r"tokens \[0, 48\)"):
        pool.prepare([s2], 1)
    out = run_step(pool, [s2], len(s2) - s2.num_computed_tokens, rng)
    assert np.isfinite(out).all()
    assert s2.num_computed_tokens == 49
    table2 = s2.block_table()
    s2.free()
    s3 = pool.create_sequence()
    assert s3.match_prefix([*system, 3]) == 48
    assert s3.block_table() == table2[:3]  # s2's written blocks
    s3.append([3])
    out = run_step(pool, [s3], 1, rng)
    assert np.isfinite(out).all()
    pool.validate()


@pytest.mark.parametrize("release", ["free", "truncate"])
def test_appended_but_unplanned_blocks_are_never_hit(release):
    pool = pagedkv.Pool(num_blocks=8, block_size=16)
    tokens = list(range(33))
    a = pool.create_sequence()
    a.append(tokens)
    b = pool.create_sequence()
    assert b.match_prefix(tokens) == 0
    a.free() if release == "free" else a.truncate(0)
    assert pool.stats().num_cached_blocks == 0
    assert pool.create_sequence().match_prefix(tokens) == 0
    pool.validate()


def test_model_raising_after_prepare_caches_nothing():
    pool = nan_pool(num_blocks=8)
    tokens = list(range(33))
    a = pool.create_sequence()
    a.append(tokens)

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with pool.prepare([a], 33):
            raise Boom()  # the model raised before its cache writes
    assert a.num_computed_tokens == 0 and len(a) == 33
    assert pool.create_sequence().match_prefix(tokens) == 0
    run_step(pool, [a], 33, np.random.default_rng(1))
    assert a.num_computed_tokens == 33
    assert pool.create_sequence().match_prefix(tokens) == 32


def test_storage_step_without_writes_counts_nothing():
    pool = nan_pool(num_blocks=8)
    a = pool.create_sequence()
    a.append(list(range(20)))
    with pool.prepare([a], 20):
        pass  # no cache_write: nothing was computed
    assert a.num_computed_tokens == 0


def test_manager_only_with_block_commits_and_close_aborts():
    pool = pagedkv.Pool(num_blocks=8, block_size=4)
    a = pool.create_sequence()
    a.append(list(range(9)))
    b = pool.prepare([a], 9)
    b.close()  # never committed: aborted
    assert a.num_computed_tokens == 0
    with pool.prepare([a], 9):
        pass
    assert a.num_computed_tokens == 9
    a.append([9])
    b = pool.prepare([a], 1)
    b.commit()
    b.commit()  # idempotent
    with pytest.raises(pagedkv.InvalidStateError, match="committed"):
        b.abort()
    b.close()
    assert a.num_computed_tokens == 10
    a.append([10])
    b = pool.prepare([a], 1)
    b.abort()
    with pytest.raises(pagedkv.InvalidStateError, match="aborted"):
        b.commit()
    b.close()
    assert a.num_computed_tokens == 10


def test_fork_child_sees_parent_go_away_before_writing():
    pool = pagedkv.Pool(num_blocks=12, block_size=4)
    a = pool.create_sequence()
    a.append(list(range(9)))
    c = a.fork()
    a.free()
    assert c.num_computed_tokens == 0
    with pytest.raises(pagedkv.InvalidStateError, match=r"query_counts\[0\] >= 9"):
        pool.prepare([c], 1)
    with pool.prepare([c], 9):
        pass
    assert c.num_computed_tokens == 9
