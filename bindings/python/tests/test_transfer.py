"""pagedkv.transfer: a sequence's KV moved between two pools over UCX (two
engines in one process, TCP loopback; the two-process tests are C++)."""

import time

import numpy as np
import pytest

import pagedkv
from conftest import pool_reusing_the_tag_of
from pagedkv import transfer

pytestmark = pytest.mark.skipif(not transfer.available(), reason="built without UCX")


def make_pool(block_size=16, num_blocks=64):
    return pagedkv.Pool(
        num_blocks=num_blocks, block_size=block_size, num_layers=2, num_kv_heads=2, head_dim=32, dtype="f32"
    )


def prefill(pool, tokens, rng):
    seq = pool.create_sequence()
    seq.append(tokens)
    with pool.prepare([seq], len(tokens)) as b:
        for layer in range(2):
            k = rng.standard_normal((len(tokens), 2, 32)).astype(np.float32)
            v = rng.standard_normal((len(tokens), 2, 32)).astype(np.float32)
            b.cache_write(layer, k, v)
    return seq


def blocks_of(pool, seq):
    out = []
    for k, v in pool.kv_caches():
        for t in (k, v):
            out.append(t.numpy()[seq.block_table()].copy())
    return out


def pull(src_engine, dst_engine, dst, desc):
    t = dst_engine.import_sequence(dst, desc)
    while t.poll() == transfer.RUNNING:
        src_engine.progress()
    return t


def test_import_is_byte_exact_computed_and_prefix_cacheable():
    rng = np.random.default_rng(3)
    src, dst = make_pool(), make_pool()
    tokens = list(rng.integers(0, 30000, 70))
    seq = prefill(src, tokens, rng)
    with transfer.TransferEngine(transports="tcp") as a, transfer.TransferEngine(transports="tcp") as b:
        exp = a.export(src, seq)
        assert isinstance(exp.descriptor, bytes) and a.num_exports == 1
        free_before = dst.stats().num_free_blocks
        t = pull(a, b, dst, exp.descriptor)
        assert t.state == transfer.DONE
        got = t.sequence
        assert got.num_computed_tokens == len(tokens) == len(got)
        assert t.nbytes == 2 * 2 * 5 * 2 * 16 * 32 * 4
        for x, y in zip(blocks_of(src, seq), blocks_of(dst, got)):
            np.testing.assert_array_equal(x, y)
        probe = dst.create_sequence()
        assert probe.match_prefix([*tokens, 1]) == 64  # the four full blocks hit
        probe.free()
        got.free()
        assert dst.stats().num_free_blocks == free_before
        exp.release()
        exp.release()  # idempotent
        assert a.num_exports == 0
        t.close()
    dst.validate()
    src.validate()


def test_layout_mismatch_and_bad_descriptor_change_nothing():
    rng = np.random.default_rng(4)
    src, dst = make_pool(), make_pool(block_size=32)
    seq = prefill(src, list(range(40)), rng)
    with transfer.TransferEngine(transports="tcp") as a, transfer.TransferEngine(transports="tcp") as b:
        with a.export(src, seq) as exp:
            before = dst.stats()
            with pytest.raises(pagedkv.InvalidArgumentError, match=r"block_size 16 \(exporter\) vs 32"):
                b.import_sequence(dst, exp.descriptor)
            with pytest.raises(pagedkv.InvalidArgumentError, match="descriptor"):
                b.import_sequence(dst, exp.descriptor[:-3])
            with pytest.raises(TypeError):
                b.import_sequence(dst, 12)
            after = dst.stats()
            assert (after.num_free_blocks, after.num_seqs) == (before.num_free_blocks, before.num_seqs)
    dst.validate()


def test_cancel_and_out_of_blocks_leave_the_pool_as_before():
    rng = np.random.default_rng(5)
    src, dst, tiny = make_pool(), make_pool(), make_pool(num_blocks=3)
    seq = prefill(src, list(range(100)), rng)
    with transfer.TransferEngine(transports="tcp") as a, transfer.TransferEngine(transports="tcp") as b:
        with a.export(src, seq) as exp:
            before = dst.stats()
            t = b.import_sequence(dst, exp.descriptor)
            t.cancel()
            assert t.poll() == transfer.CANCELLED and t.sequence is None
            assert dst.stats().num_free_blocks == before.num_free_blocks
            assert dst.stats().num_seqs == 0
            with pytest.raises(pagedkv.OutOfBlocksError):
                b.import_sequence(tiny, exp.descriptor)
            assert tiny.stats().num_seqs == 0
            t.close()
    dst.validate()
    tiny.validate()


def test_unknown_export_and_closed_engine():
    e = transfer.TransferEngine(transports="tcp", timeout_ms=1000, export_ttl_ms=0)
    with pytest.raises(pagedkv.NotFoundError, match="export 12345"):
        pagedkv._pagedkv.pkv_transfer_export_release(e._h, 12345)
    e.close()
    e.close()
    with pytest.raises(pagedkv.InvalidStateError):
        e.progress()


def test_cancel_after_a_failure_keeps_the_failure():
    """Transfer.cancel() of a transfer that had failed (here: timed out
    connecting, the exporter never progressing) set its state to CANCELLED,
    so poll() returned CANCELLED and wait() None, hiding the failure,
    although the library's cancel is a no-op on a failed transfer and its
    poll goes on reporting the failure. The state is FAILED once poll()
    raised, poll() and wait() keep raising, and cancel() leaves it so."""
    rng = np.random.default_rng(6)
    src, dst = make_pool(), make_pool()
    seq = prefill(src, list(range(40)), rng)
    free_before = dst.stats().num_free_blocks
    with transfer.TransferEngine(transports="tcp") as a, transfer.TransferEngine(transports="tcp", timeout_ms=1) as b:
        with a.export(src, seq) as exp:
            t = b.import_sequence(dst, exp.descriptor)  # a never progresses: the wire-up times out
            with pytest.raises(pagedkv.InvalidStateError, match="timed out"):
                for _ in range(10000):
                    if t.poll() != transfer.RUNNING:
                        break
                    time.sleep(0.001)
            assert t.state == transfer.FAILED
            t.cancel()
            assert t.state == transfer.FAILED
            with pytest.raises(pagedkv.InvalidStateError, match="timed out"):
                t.poll()
            with pytest.raises(pagedkv.InvalidStateError, match="timed out"):
                t.wait()
            assert t.sequence is None
            assert dst.stats().num_free_blocks == free_before
            t.close()
    dst.validate()


def test_release_of_an_expired_export_or_after_close_is_a_no_op():
    """Export.release() is idempotent, but raised NotFoundError once the
    engine had expired the export (export_ttl_ms), so a `with
    engine.export(...)` block raised on exit, and InvalidStateError once
    the engine was closed (which released every export). Both are no-ops
    now: the export was released."""
    rng = np.random.default_rng(7)
    src = make_pool()
    seq = prefill(src, list(range(40)), rng)
    free_before = src.stats().num_free_blocks
    with transfer.TransferEngine(transports="tcp", export_ttl_ms=1) as a:
        exp = a.export(src, seq)
        with a.export(src, seq):
            time.sleep(0.01)
            a.progress()  # expires both
        assert a.num_exports == 0
        exp.release()
        exp.release()
    b = transfer.TransferEngine(transports="tcp")
    exp = b.export(src, seq)
    b.close()
    exp.release()
    seq.free()
    assert src.stats().num_free_blocks > free_before
    src.validate()


def test_polls_racing_to_done_give_one_owner_of_the_sequence(monkeypatch):
    # Two threads polling one transfer both got DONE and the new id from the
    # library; each made an owning Sequence. Transfer.sequence kept the later
    # one and collecting the other freed the sequence: Transfer.sequence said
    # "live" while the pool held no sequence. The race is replayed in one
    # thread: a second poll runs between the first's library call and its
    # bookkeeping.
    import gc

    rng = np.random.default_rng(9)
    src, dst = make_pool(), make_pool()
    seq = prefill(src, list(range(40)), rng)
    with transfer.TransferEngine(transports="tcp") as a, transfer.TransferEngine(transports="tcp") as b:
        exp = a.export(src, seq)
        t = b.import_sequence(dst, exp.descriptor)
        raw = pagedkv._pagedkv.pkv_transfer_poll
        interleaved = []

        def racing(h):
            r = raw(h)
            if r[0] == transfer.DONE and not interleaved:
                interleaved.append(None)
                interleaved[0] = t.poll()  # the other thread's poll, here
            return r

        monkeypatch.setattr(pagedkv._pagedkv, "pkv_transfer_poll", racing)
        while t.poll() == transfer.RUNNING:
            a.progress()
        monkeypatch.undo()
        gc.collect()
        assert interleaved == [transfer.DONE] and t.state == transfer.DONE
        assert dst.stats().num_seqs == 1
        assert t.sequence.num_computed_tokens == 40  # not freed by a second owner
        t.sequence.free()
        exp.release()
        t.close()
    dst.validate()


def test_a_poll_racing_a_cancel_does_not_undo_it(monkeypatch):
    # A poll on one thread got RUNNING from the library; cancel() on another
    # then set the state to CANCELLED, and the poll wrote its RUNNING over
    # it: `state` said RUNNING after cancel() had returned (and the poll
    # returned RUNNING for a transfer that no longer ran). The race is
    # replayed in one thread: the cancel runs between the poll's library
    # call and its bookkeeping.
    rng = np.random.default_rng(10)
    src, dst = make_pool(), make_pool()
    seq = prefill(src, list(range(40)), rng)
    free_before = dst.stats().num_free_blocks
    with transfer.TransferEngine(transports="tcp") as a, transfer.TransferEngine(transports="tcp") as b:
        with a.export(src, seq) as exp:
            t = b.import_sequence(dst, exp.descriptor)  # a never progresses: it stays RUNNING
            raw = pagedkv._pagedkv.pkv_transfer_poll

            def racing(h):
                r = raw(h)
                assert r[0] == transfer.RUNNING
                t.cancel()  # the other thread's cancel, here
                assert t.state == transfer.CANCELLED
                return r

            monkeypatch.setattr(pagedkv._pagedkv, "pkv_transfer_poll", racing)
            got = t.poll()
            monkeypatch.undo()
            assert got == transfer.CANCELLED and t.state == transfer.CANCELLED
            assert t.poll() == transfer.CANCELLED and t.wait() is None
            assert dst.stats().num_free_blocks == free_before
            t.close()
    dst.validate()


def test_export_copy_and_pickle_are_refused_naming_the_export():
    # copy.copy(export) made a second object releasing the same pin: the
    # copy's release() unpinned the original's blocks while the original
    # still said unreleased (and its descriptor, sent on, failed to import);
    # deepcopy and pickle were refused as copies of the TransferEngine.
    import copy
    import pickle

    rng = np.random.default_rng(11)
    src = make_pool()
    seq = prefill(src, list(range(40)), rng)
    with transfer.TransferEngine(transports="tcp") as a:
        with a.export(src, seq) as exp:
            for f in (copy.copy, copy.deepcopy):
                with pytest.raises(TypeError, match=r"^cannot copy a pagedkv\.Export: "):
                    f(exp)
            with pytest.raises(TypeError, match=r"^cannot pickle a pagedkv\.Export: .*descriptor"):
                pickle.dumps(exp)
            assert a.num_exports == 1
            assert pickle.loads(pickle.dumps(exp.descriptor)) == exp.descriptor
        assert a.num_exports == 0


def test_wait_timeout_is_a_number_and_nan_is_refused():
    # wait(timeout=nan) compared the clock against nan, never true: it
    # polled forever; wait(timeout="1") failed adding the string to the
    # clock ("unsupported operand type(s)"), naming nothing.
    import threading

    rng = np.random.default_rng(12)
    src, dst = make_pool(), make_pool()
    seq = prefill(src, list(range(40)), rng)
    with transfer.TransferEngine(transports="tcp") as a, transfer.TransferEngine(transports="tcp") as b:
        with a.export(src, seq) as exp:
            t = b.import_sequence(dst, exp.descriptor)  # a never progresses: it stays RUNNING
            got = []

            def wait_nan():
                try:
                    got.append(t.wait(timeout=float("nan")))
                except Exception as e:
                    got.append(e)

            th = threading.Thread(target=wait_nan)
            th.start()
            th.join(5)
            if th.is_alive():  # unblock it before failing
                t.cancel()
                th.join()
            assert len(got) == 1 and isinstance(got[0], ValueError) and "timeout" in str(got[0]), got
            with pytest.raises(TypeError, match=r"^timeout: expected a float"):
                t.wait(timeout="1")
            with pytest.raises(TimeoutError):
                t.wait(timeout=0.01)
            assert t.state == transfer.RUNNING
            t.cancel()
            assert t.wait(timeout=1) is None
            t.close()
    dst.validate()


def test_export_of_a_sequence_of_another_pool_is_refused():
    """export(pool, seq) passed seq's id to pool unchecked: a sequence of a
    closed pool whose tag a later pool reuses (65535 pool creations later)
    has the id of that pool's first sequence, which was exported (and its
    blocks pinned) in its place."""
    rng = np.random.default_rng(5)
    pagedkv.Pool(num_blocks=2, block_size=4).close()
    old = make_pool()
    stale = prefill(old, list(range(20)), rng)
    old.close()
    pool = pool_reusing_the_tag_of(stale.id, make_pool)
    mine = prefill(pool, list(range(100, 120)), rng)
    assert mine.id >> 48 == stale.id >> 48 and mine.id != stale.id  # the tag came back, the id did not
    live_other = make_pool()
    other = prefill(live_other, list(range(20)), rng)
    with transfer.TransferEngine(transports="tcp") as engine:
        for seq in (stale, other):
            with pytest.raises(pagedkv.InvalidArgumentError, match="seq: the sequence belongs to another pool"):
                engine.export(pool, seq)
        assert engine.num_exports == 0
        with engine.export(pool, mine) as ex:
            assert engine.num_exports == 1 and ex.id
    pool.validate()
