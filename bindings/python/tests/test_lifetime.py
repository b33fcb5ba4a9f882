"""Lifetimes across the FFI boundary: nothing dangles, nothing leaks."""

import gc
import sys
import weakref

import numpy as np
import pytest

import pagedkv


def make_pool(**kw):
    kw.setdefault("num_blocks", 16)
    kw.setdefault("block_size", 4)
    return pagedkv.Pool(**kw)


def test_dropped_pool_lives_while_sequences_do():
    pool = make_pool()
    seqs = [pool.create_sequence() for _ in range(3)]
    for seq in seqs:
        seq.append([1, 2, 3, 4, 5])
    del seq
    ref = weakref.ref(pool)
    del pool
    gc.collect()
    assert ref() is not None  # sequences hold it
    child = seqs[0].fork()
    child.append([6])
    assert child.num_tokens == 6
    assert ref().stats().num_seqs == 4
    ref().validate()
    del seqs, child
    gc.collect()
    assert ref() is None  # and it went with them


def test_garbage_collected_sequences_are_freed():
    pool = make_pool()
    s = pool.create_sequence()
    s.append(list(range(10)))
    assert pool.stats().num_seqs == 1
    del s
    gc.collect()
    st = pool.stats()
    assert st.num_seqs == 0 and st.num_used_blocks == 0
    pool.validate()


def test_sequences_outliving_a_closed_pool():
    pool = make_pool()
    s = pool.create_sequence()
    s.append([1])
    pool.close()
    gc.collect()
    with pytest.raises(pagedkv.InvalidStateError):
        s.info()
    del s  # finalizer on a closed pool: silent
    gc.collect()


def test_views_keep_storage_past_close():
    pool = make_pool(num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32")
    arr = pool.kv_tensor(0, "v").numpy()
    arr[...] = 3.0
    pool.close()
    del pool
    gc.collect()
    # The storage is still there: the view pins it.
    assert float(arr.sum()) == 3.0 * arr.size
    arr[1, 0, 0, 0] = 4.0
    del arr
    gc.collect()


def test_batches_keep_their_sequences_and_pool():
    pool = make_pool()
    s = pool.create_sequence()
    s.append([1, 2, 3])
    b = pool.prepare([s], 3)
    sref, pref = weakref.ref(s), weakref.ref(pool)
    del s, pool
    gc.collect()
    assert sref() is not None and pref() is not None
    assert b.plan(pagedkv.PlanArray.CONTEXT_LENS).numpy().tolist() == [3]
    del b
    gc.collect()
    assert sref() is None and pref() is None


def test_many_pools_and_batches_do_not_accumulate():
    # Repeated create/destroy with gc in between: every handle is released
    # (the sanitizer builds check the library; here the Python side).
    refs = []
    for i in range(20):
        pool = make_pool(num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32")
        s = pool.create_sequence()
        s.append(list(range(7)))
        with pool.prepare([s], 7) as b:
            kv = np.ones((7, 1, 64), np.float32)
            b.cache_write(0, kv, kv)
            b.attention(0, np.ones((7, 1, 64), np.float32))
        refs.append(weakref.ref(pool))
        del pool, s, b
        if i % 5 == 0:
            gc.collect()
    gc.collect()
    assert all(r() is None for r in refs)


def test_exceptions_do_not_pin_objects():
    pool = make_pool()
    s = pool.create_sequence()
    try:
        s.append(list(range(1000)))
    except pagedkv.OutOfBlocksError as e:
        err = e.with_traceback(None)  # the traceback's frames would hold them
    pref = weakref.ref(pool)
    del pool, s
    gc.collect()
    assert pref() is None
    assert err.status == pagedkv.OutOfBlocksError.status


def test_sequence_in_a_reference_cycle_is_collected_and_freed():
    # Sequence's fields live in its C base, which takes part in garbage
    # collection: a cycle through a sequence and its pool is found, and the
    # owned sequence is freed when the cycle goes.
    pool = make_pool()
    seq = pool.create_sequence()
    seq.append([1, 2, 3, 4, 5])
    pool.keep = [seq]  # pool -> list -> seq -> pool
    pool_ref, seq_ref = weakref.ref(pool), weakref.ref(seq)
    probe = make_pool()  # a second pool, to check the first's blocks came back
    assert pool.stats().num_seqs == 1
    del pool, seq
    gc.collect()
    assert seq_ref() is None and pool_ref() is None
    probe.validate()


def test_create_free_fast_path_keeps_its_guarantees():
    pool = make_pool()
    seq = pool.create_sequence()
    assert seq.pool is pool and seq.owned and not seq.freed
    seq.append([1, 2, 3, 4, 5])
    assert pool.stats().num_free_blocks == 15 - 2
    seq.free()
    assert seq.freed and pool.stats().num_seqs == 0 and pool.stats().num_free_blocks == 15
    seq.free()  # idempotent
    with pytest.raises(pagedkv.NotFoundError):
        seq.append([1])  # use after free is refused by the library
    borrowed = pool.create_sequence(owned=False)
    sid = borrowed.id
    del borrowed
    gc.collect()
    assert pool.sequence(sid).id == sid  # a borrowing handle never frees
    pool.sequence(sid).free()
    assert pool.stats().num_seqs == 0
    other = pool.create_sequence()
    pool.free_batch([other.id])
    other.free()  # freed by id elsewhere: a no-op, not an error
    assert other.freed
    last = pool.create_sequence()
    pool.close()
    last.free()  # closing released everything: a no-op
    assert last.freed
    with pytest.raises(pagedkv.InvalidStateError):
        pool.create_sequence()
    with pytest.raises(TypeError):
        pagedkv.Sequence._create(pool, None, True)


def test_a_second_init_of_a_sequence_handle_is_refused_and_changes_nothing():
    """Sequence.__init__ called again on a live handle re-pointed it: a
    failing call (a bad seq_id) first cleared its ownership, and a valid one
    made it name another id; either way the sequence it owned was never
    freed (a leaked sequence and its blocks until the pool closed)."""
    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    s = pool.create_sequence()
    s.append([1, 2, 3])
    other = pool.create_sequence(owned=False)
    for args in ((pool, -1), (pool, other.id), (pool, s.id, False)):
        with pytest.raises(TypeError, match="already names a sequence"):
            s.__init__(*args)
        assert s.owned and s.id != other.id and len(s) == 3
    del s
    gc.collect()
    assert pool.stats().num_seqs == 1  # other's only
    u = pagedkv.Sequence.__new__(pagedkv.Sequence)
    u.__init__(pool, other.id, owned=True)  # a handle never initialised still is
    assert u.owned and u.id == other.id
    del u
    gc.collect()
    assert pool.stats().num_seqs == 0


def test_a_second_init_of_a_live_pool_is_refused_and_changes_nothing():
    """Pool.__init__ (HybridPool's, TransferEngine's) called again on a live
    object replaced its handle with a new pool's: the old pool was never
    closed (its sequences and blocks lived on, unreachable by pool.close()),
    and its sequences, whose _pool is the object, reached the new pool by
    some calls (len(): NotFoundError "not an id of this pool") and the old
    one by others (append)."""
    from pagedkv import transfer
    from pagedkv.hybrid import HybridPool, KVGroupSpec

    pool = pagedkv.Pool(num_blocks=16, block_size=4)
    s = pool.create_sequence()
    s.append([1, 2, 3])
    with pytest.raises(TypeError, match="already owns a pool"):
        pool.__init__(num_blocks=8, block_size=4)
    assert pool.num_blocks == 16 and len(s) == 3 and pool.stats().num_seqs == 1
    pool.close()
    assert s.freed
    hp = HybridPool([KVGroupSpec.mla(61, 512, 64)], num_blocks=4, block_size=64)
    groups = hp.groups
    with pytest.raises(TypeError, match="already owns a pool"):
        hp.__init__([KVGroupSpec.mla(61, 512, 64), KVGroupSpec.mla(61, 512, 64)], num_blocks=8, block_size=64)
    assert hp.groups == groups and hp.num_blocks == 4
    hp.close()
    with transfer.TransferEngine(transports="tcp") as eng:
        h = eng._h
        with pytest.raises(TypeError, match="already owns a transfer engine"):
            eng.__init__(transports="tcp")
        assert eng._h is h
    fresh = pagedkv.Pool.__new__(pagedkv.Pool)
    fresh.__init__(num_blocks=4, block_size=4)  # never initialised: still is
    assert fresh.num_blocks == 4
    fresh.close()


def test_sequence_handles_do_not_leak():
    pool = make_pool(num_blocks=64)
    refs = (sys.getrefcount(pool), sys.getrefcount(pool._h))
    for _ in range(3):
        for _ in range(2000):
            pool.create_sequence().free()
            pool.create_sequence().append([1])  # freed by collection
        gc.collect()
        assert pool.stats().num_seqs == 0 and pool.stats().num_free_blocks == 63
    assert (sys.getrefcount(pool), sys.getrefcount(pool._h)) == refs  # no handle kept a reference
    pool.validate()


def test_objects_owning_handles_refuse_copy_and_pickle():
    """copy.copy shared the handle: a collected copy of a TensorView released
    its pin a second time, so the pool's memory went while arrays over it
    were in use (a segfault reading them); a collected copy of a Pool closed
    the original, one of a Batch aborted it. They refuse copy and pickle now
    (as Sequence, a C type, always did)."""
    import copy
    import pickle

    pool = make_pool(num_layers=1, num_kv_heads=1, head_dim=4, dtype="float32")
    seq = pool.admit([1, 2, 3, 4, 5])[0]
    batch = pool.prepare([seq], 5)
    view = pool.kv_tensor(0, "k")
    arr = np.asarray(view)
    arr[:] = 1.0
    for obj in (pool, batch, view, batch.plan(pagedkv.PlanArray.CONTEXT_LENS)):
        for fn in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match=r"cannot (copy|pickle) a pagedkv"):
                fn(obj)
    gc.collect()
    assert not pool.closed and not batch.closed
    assert len(seq) == 5
    pool.close()
    del pool, view
    gc.collect()
    assert arr.sum() == arr.size  # the pin of the view kept the storage
    batch.close()


def test_plan_calls_fail_after_close_while_a_storage_view_lives():
    """A kv_tensor view pins the C pool past close(); the plan's calls must
    still fail as they do when no view is alive (they wrote K/V, ran
    attention and committed into the closed pool)."""
    pool = make_pool(num_layers=1, num_kv_heads=1, head_dim=8, dtype="f32")
    s = pool.create_sequence()
    s.append(list(range(6)))
    plan = pool.prepare([s], 6)
    view = pool.kv_tensor(0, "k").numpy()
    pool.close()
    kv = np.ones((6, 1, 8), np.float32)
    with pytest.raises(pagedkv.InvalidStateError, match="closed"):
        plan.cache_write(0, kv, kv)
    with pytest.raises(pagedkv.InvalidStateError, match="closed"):
        plan.attention(0, np.ones((6, 1, 8), np.float32))
    with pytest.raises(pagedkv.InvalidStateError, match="closed"):
        plan.commit()
    assert float(view.sum()) == 0.0  # nothing was written
    # The plan still describes itself, and closes quietly.
    assert plan.plan(pagedkv.PlanArray.SLOT_MAPPING).numpy().shape == (6,)
    plan.close()
    del view
    gc.collect()


def test_a_sequence_of_a_closed_pool_says_it_is_freed():
    """Closing the pool frees its sequences (the library released them), yet
    their handles said freed == False and "live" until free() was called
    on each, the no-op that only set the flag."""
    pool = make_pool()
    s = pool.create_sequence()
    s.append([1])
    borrowed = pool.sequence(s.id)
    assert not s.freed and "live" in repr(s)
    pool.close()
    for h in (s, borrowed):
        assert h.freed and "freed" in repr(h)
        with pytest.raises(pagedkv.InvalidStateError):
            h.info()
    s.free()  # still a no-op
    assert s.freed


def test_sequence_copy_and_pickle_are_refused_naming_the_sequence():
    """copy.copy(seq) and copy.deepcopy(seq) said "cannot pickle 'Sequence'
    object" (object's default reduce), naming neither copying nor why; they
    refuse as the other handle owners do now, and nothing changes."""
    import copy
    import pickle

    pool = make_pool()
    seq = pool.create_sequence()
    seq.append([1, 2, 3])
    for fn in (copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match=r"cannot copy a pagedkv\.Sequence: it .*share the object itself"):
            fn(seq)
    with pytest.raises(TypeError, match=r"cannot copy a pagedkv\.Sequence"):
        copy.deepcopy({"request": [seq]})
    with pytest.raises(TypeError, match=r"cannot pickle a pagedkv\.Sequence"):
        pickle.dumps(seq)
    gc.collect()
    assert len(seq) == 3 and pool.stats().num_seqs == 1


_VIEW_GEOMETRY_ASSIGNED = """
import numpy as np, pagedkv
p = pagedkv.Pool(num_blocks=4, block_size=4, num_layers=1, num_kv_heads=1, head_dim=4, dtype="f32")
s = p.create_sequence()
s.append([1])
b = p.prepare([s], 1)
for v in (p.kv_tensor(0, "k"), b.plan(pagedkv.PlanArray.SLOT_MAPPING)):
    before = (v.data, v.shape, v.strides, v.dtype, v.device, v.readonly)
    for attr, value in (("shape", (1 << 30,)), ("strides", (1 << 20,) * 4), ("data", 8),
                        ("dtype", pagedkv.DType.I64), ("readonly", False), ("device", "cpu")):
        try:
            setattr(v, attr, value)
        except AttributeError:
            pass
        else:
            raise SystemExit(f"view.{attr} = ... was taken")
    assert (v.data, v.shape, v.strides, v.dtype, v.device, v.readonly) == before
    a = np.asarray(v)
    assert a.shape == before[1] and a.ctypes.data == before[0]
    a.sum()
v = p.kv_tensor(0, "k")
p.close()
v.__del__()  # released by hand: the pool's memory is gone
try:
    np.asarray(v)
except ValueError as e:
    assert "released" in str(e), e
else:
    raise SystemExit("a released view still described the freed memory")
print("ok")
"""


def test_a_view_s_geometry_cannot_be_reassigned():
    # numpy builds an array over (data, shape, strides, dtype) as the view
    # gives them: `view.shape = (1 << 30,)` then np.asarray(view) read past
    # the pool's storage (a segmentation fault). Run in a child: a crash is a
    # failure here, not the end of pytest.
    import subprocess

    r = subprocess.run([sys.executable, "-c", _VIEW_GEOMETRY_ASSIGNED], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr[-2000:])


_INTERRUPTED_CREATES = """
import signal, sys, threading, time, gc
import pagedkv

mode = sys.argv[1]
p = pagedkv.Pool(num_blocks=1 << 16, block_size=4)
base = p.create_sequence()
base.append(list(range(8)))
armed = False


class Interrupt(BaseException):
    pass


def handler(signum, frame):
    if armed:
        raise Interrupt()


signal.signal(signal.SIGUSR1, handler)
stop = False


def pester():
    while not stop:
        time.sleep(0.0002)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)


t = threading.Thread(target=pester, daemon=True)
t.start()
interrupts = 0
end = time.monotonic() + 1.5
while time.monotonic() < end and interrupts < 300:
    try:
        armed = True
        if mode == "admit":
            p.admit([1, 2, 3, 4, 5])
        elif mode == "admit_hashes":
            p.admit([1, 2, 3, 4, 5], hashes=[])
        elif mode == "fork":
            base.fork()
        elif mode == "create":
            p.create_sequence(cache_salt="x")
        armed = False
    except Interrupt:
        armed = False
        interrupts += 1
stop = True
t.join()
gc.collect()
base.free()
print(interrupts, p.stats().num_seqs)
"""


@pytest.mark.parametrize("mode", ["admit", "admit_hashes", "fork", "create"])
def test_an_interrupt_as_a_sequence_is_made_does_not_leak_it(mode):
    # A signal handler's exception (KeyboardInterrupt) pending when the raw
    # call returned was raised at the interpreter's next check, between the
    # call and the Sequence made from its id: the id was lost and the
    # sequence (and its blocks) stayed in the pool with no handle to free it.
    import subprocess

    r = subprocess.run([sys.executable, "-c", _INTERRUPTED_CREATES, mode], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    interrupts, leaked = map(int, r.stdout.split())
    assert interrupts > 0
    assert leaked == 0, f"{leaked} sequences without a handle after {interrupts} interrupts"


_INTERRUPTED_HANDLES = """
import gc, os, signal, sys, threading, time
import numpy as np
import pagedkv
from pagedkv import transfer

mode = sys.argv[1]
limit = int(sys.argv[2])


class Interrupt(BaseException):
    pass


armed = False


def handler(signum, frame):
    if armed:
        raise Interrupt()


ARENA = 517 * 65536  # the K/V bytes of the pools below: an odd size, mapped on its own


def arenas():
    # mappings made of pool arenas (adjacent ones merge)
    n = 0
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            n += (hi - lo) // ARENA if (hi - lo) % ARENA == 0 else 0
    return n


def fds():
    return len(os.listdir("/proc/self/fd"))


def storage_pool(num_blocks=64):
    return pagedkv.Pool(num_blocks=num_blocks, block_size=16, num_layers=2, num_kv_heads=2, head_dim=32, dtype="f32")


def prefilled(pool):
    seq = pool.create_sequence()
    seq.append(list(range(40)))
    with pool.prepare([seq], 40) as b:
        for layer in range(2):
            z = np.zeros((40, 2, 32), np.float32)
            b.cache_write(layer, z, z)
    return seq


if mode in ("pool", "hybrid"):
    big = dict(num_blocks=517, block_size=16)
    if mode == "pool":
        op = lambda: pagedkv.Pool(num_layers=1, num_kv_heads=8, head_dim=128, dtype="f16", **big)
    else:
        from pagedkv.hybrid import HybridPool, KVGroupSpec
        op = lambda: HybridPool([KVGroupSpec.full(1, 8, 128, dtype="f16")], **big)
    op()
    gc.collect()
    before = arenas()
elif mode in ("prepare", "prepare_persistent", "prepare_decode"):
    p = pagedkv.Pool(num_blocks=1 << 12, block_size=4)
    seqs = []

    def pre():  # fresh sequences each time (a dropped plan aborts its step)
        for s in seqs:
            s.free()
        seqs[:] = [p.create_sequence() for _ in range(16)]
        for s in seqs:
            s.append([1, 2, 3, 4, 5])
        if mode == "prepare_decode":
            p.prepare(seqs, 5).commit()

    if mode == "prepare":
        op = lambda: p.prepare(seqs, 5)
    elif mode == "prepare_persistent":
        op = lambda: p.prepare(seqs, 5, persistent_table=True)
    else:
        op = lambda: p.prepare_decode(seqs, [7] * len(seqs))
elif mode == "kv_tensor":
    p = pagedkv.Pool(num_layers=1, num_kv_heads=8, head_dim=128, dtype="f16", num_blocks=517, block_size=16)
    op = lambda: p.kv_tensor(0, "k")
elif mode == "plan_view":
    p = pagedkv.Pool(num_blocks=1 << 12, block_size=4)
    seqs = [p.create_sequence() for _ in range(64)]
    for s in seqs:
        s.append([1, 2, 3, 4, 5])
    plan = p.prepare(seqs, 5)
    op = lambda: plan.plan(pagedkv.PlanArray.SLOT_MAPPING)
elif mode == "publisher":
    p = pagedkv.Pool(num_blocks=64, block_size=4, enable_events=True)
    used = []

    def op():
        used.append(f"inproc://pkv-intr-{len(used)}")
        pagedkv.EventPublisher(p, used[-1])
else:
    a = transfer.TransferEngine(transports="tcp")
    b = transfer.TransferEngine(transports="tcp")
    src, dst = storage_pool(), storage_pool(1 << 12)
    seq = prefilled(src)
    desc = a.export(src, seq).descriptor
    if mode == "engine":
        transfer.TransferEngine(transports="tcp").close()
        gc.collect()
        before = fds()
        op = lambda: transfer.TransferEngine(transports="tcp")
    elif mode == "export":
        # An Export dropped by its caller stays pinned until released or
        # expired, by design: every Export made is kept (from its __new__)
        # and released at the end; only ids that never had one are leaks.
        made = []

        class Kept(transfer.Export):
            def __new__(cls, *args):
                e = super().__new__(cls)
                made.append(e)
                return e

        transfer.Export = Kept
        op = lambda: a.export(src, seq)
    elif mode == "import":
        op = lambda: b.import_sequence(dst, desc)
    elif mode == "poll":
        def op():
            t = b.import_sequence(dst, desc)
            while t.poll() == transfer.RUNNING:
                a.progress()

signal.signal(signal.SIGUSR1, handler)
stop = False
# The pester needs the GIL to signal: hand it over often, so that signals
# also land during raw calls too short to release the GIL for long.
sys.setswitchinterval(1e-5)


def pester():
    while not stop:
        time.sleep(0.0002)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)


t = threading.Thread(target=pester, daemon=True)
t.start()
interrupts = 0
end = time.monotonic() + 3
pre = globals().get("pre", lambda: None)
while time.monotonic() < end and interrupts < limit:
    pre()
    try:
        armed = True
        op()
        armed = False
    except Interrupt:
        armed = False
        interrupts += 1
stop = True
t.join()
gc.collect()
if mode in ("pool", "hybrid"):
    leaked = arenas() - before
elif mode == "kv_tensor":
    # a view's pin lost keeps the pool (its arena) past close()
    p.close()
    gc.collect()
    leaked = arenas()
elif mode == "plan_view":
    plan.close()  # a pin lost keeps the plan, which keeps its sequences
    del plan
    gc.collect()
    for s in seqs:
        s.free()
    leaked = p.stats().num_seqs
elif mode.startswith("prepare"):
    # a plan never destroyed keeps its sequences: freed, they stay counted
    for s in seqs:
        s.free()
    leaked = p.stats().num_seqs
elif mode == "publisher":
    leaked = 0
    for ep in used:  # a publisher never destroyed keeps its endpoint bound
        try:
            pagedkv.EventPublisher(p, ep).close()
        except pagedkv.PagedKVError:
            leaked += 1
elif mode == "engine":
    one = fds()
    extra = transfer.TransferEngine(transports="tcp")  # the fds of one engine
    per = max(1, fds() - one)
    extra.close()
    leaked = round((one - before) / per)
elif mode == "export":
    for e in made:
        if getattr(e, "_released", True) is False:
            e.release()
    leaked = a.num_exports - 1  # the one exported for desc
elif mode in ("import", "poll"):
    leaked = dst.stats().num_seqs  # running transfers hold a sequence; done ones are one
print(interrupts, leaked)
"""


@pytest.mark.parametrize(
    "mode",
    [
        "pool",
        "hybrid",
        "prepare",
        "prepare_persistent",
        "prepare_decode",
        "kv_tensor",
        "plan_view",
        "publisher",
        "engine",
        "export",
        "import",
        "poll",
    ],
)
def test_an_interrupt_as_a_library_object_is_made_does_not_leak_it(mode):
    # As for sequences above: the raw call returned a new pool, plan,
    # publisher, engine, export or transfer (or a done transfer's sequence,
    # or a pin for a view) and Python code wrapped it afterwards; an
    # interrupt raised in between dropped it for good. Before the fix the
    # transfer modes leaked at nearly every interrupt (engine 40/40, export
    # 300/300, import 300/300, poll 201/300); the others' raw calls are too
    # short for a signal to land in them here (0 before too): they guard
    # the helpers' use at those sites.
    import subprocess

    from pagedkv import transfer

    if mode in ("engine", "export", "import", "poll") and not transfer.available():
        pytest.skip("built without UCX")
    if mode == "publisher":
        pytest.importorskip("zmq")  # the events build goes with the tests' zmq
    limit = "40" if mode in ("pool", "hybrid", "engine") else "300"
    r = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_HANDLES, mode, limit], capture_output=True, text=True, timeout=120
    )
    if mode == "publisher" and "UnsupportedError" in r.stderr:
        pytest.skip("built without PAGEDKV_EVENTS")
    assert r.returncode == 0, r.stderr[-2000:]
    interrupts, leaked = map(int, r.stdout.split())
    assert interrupts > 0
    assert leaked == 0, f"{leaked} {mode} objects never released after {interrupts} interrupts"
