"""Issue 23: a plan's token positions and last-token rows, as zero-copy
read-only numpy views, for random mixes of prefill, chunked prefill and
decode, checked against the test's own bookkeeping."""

import numpy as np
import pytest

import pagedkv


@pytest.mark.parametrize("num_layers", [0, 1])
def test_positions_and_last_rows_follow_the_schedule(num_layers):
    rng = np.random.default_rng(23 + num_layers)
    with pagedkv.Pool(
        num_blocks=256, block_size=4, num_layers=num_layers, num_kv_heads=1, head_dim=8, dtype="f32"
    ) as pool:
        seqs = [pool.create_sequence() for _ in range(6)]
        computed = [0] * len(seqs)
        for s in seqs:
            s.append(rng.integers(0, 1000, int(rng.integers(1, 30))).tolist())
        for _ in range(10):
            sched, counts, want_pos, want_last = [], [], [], []
            for i, s in enumerate(seqs):
                if computed[i] == s.num_tokens:
                    s.append([int(rng.integers(0, 1000))])  # decode
                if rng.random() < 0.3 and (sched or i + 1 < len(seqs)):
                    continue  # not scheduled this step
                left = s.num_tokens - computed[i]
                chunk = int(rng.integers(1, left + 1))
                if chunk < left:  # chunked prefill: the rest of the prompt waits
                    s.truncate(computed[i] + chunk)
                sched.append(s)
                counts.append(chunk)
                want_pos.extend(range(computed[i], computed[i] + chunk))
                want_last.append(len(want_pos) - 1)
                computed[i] += chunk
            with pool.prepare(sched, counts) as step:
                pos = step.token_positions().numpy()
                last = step.last_token_indices().numpy()
                assert pos.dtype == np.int64 and last.dtype == np.int64
                np.testing.assert_array_equal(pos, want_pos)
                np.testing.assert_array_equal(last, want_last)
                assert not pos.flags.writeable and not last.flags.writeable
                # Views, not copies: every call sees the plan's one buffer.
                again = step.token_positions().numpy()
                assert again.ctypes.data == pos.ctypes.data
                assert np.shares_memory(again, pos)
                if num_layers:
                    kv = rng.standard_normal((step.num_tokens, 1, 8)).astype(np.float32)
                    step.cache_write(0, kv, kv)
                else:
                    step.commit()


def test_views_outlive_the_batch_object():
    """A view keeps the plan alive (like plan()), so reading it after the
    with-block is safe."""
    with pagedkv.Pool(num_blocks=16, block_size=4, num_layers=0, num_kv_heads=1, head_dim=8, dtype="f32") as pool:
        s = pool.create_sequence()
        s.append(list(range(7)))
        with pool.prepare([s], 7) as step:
            view = step.token_positions()
            last = step.last_token_indices()
        assert view.numpy().tolist() == list(range(7))
        assert last.numpy().tolist() == [6]


def test_closed_batch_is_an_error():
    with pagedkv.Pool(num_blocks=16, block_size=4, num_layers=0, num_kv_heads=1, head_dim=8, dtype="f32") as pool:
        s = pool.create_sequence()
        s.append([1, 2, 3])
        step = pool.prepare([s], 3)
        step.commit()
        step.close()
        with pytest.raises(pagedkv.PagedKVError):
            step.token_positions()
        with pytest.raises(pagedkv.PagedKVError):
            step.last_token_indices()
