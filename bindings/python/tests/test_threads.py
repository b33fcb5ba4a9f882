"""Several Python threads on one pool."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import pagedkv
from conftest import random_tensor, reference_attention


def run_threads(target, n):
    errors = []

    def wrap(i):
        try:
            target(i)
        except BaseException as e:  # reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_concurrent_block_management():
    pool = pagedkv.Pool(num_blocks=64, block_size=4, enable_events=True)
    shared = list(range(16))
    counts = [0] * 4

    def work(i):
        rng = np.random.default_rng(i)
        live = []
        for step in range(150):
            op = rng.integers(0, 5)
            try:
                if op == 0 or not live:
                    s = pool.create_sequence()
                    s.match_prefix([*shared, i])
                    s.append(rng.integers(0, 50, int(rng.integers(1, 9))).tolist())
                    live.append(s)
                elif op == 1:
                    live[int(rng.integers(len(live)))].append([int(rng.integers(50))])
                elif op == 2:
                    live.append(live[int(rng.integers(len(live)))].fork())
                elif op == 3:
                    s = live[int(rng.integers(len(live)))]
                    s.truncate(int(rng.integers(0, s.num_tokens + 1)))
                else:
                    live.pop(int(rng.integers(len(live)))).free()
            except pagedkv.OutOfBlocksError:
                if live:
                    live.pop(0).free()
            counts[i] += 1
            if step % 25 == 0:
                pool.validate()
        for s in live:
            s.free()

    run_threads(work, 4)
    assert counts == [150] * 4
    pool.validate()
    st = pool.stats()
    assert st.num_seqs == 0 and st.num_used_blocks == 0 and st.num_free_blocks == 63
    seq_nos = [e.seq_no for e in pool.events()]
    assert seq_nos == sorted(seq_nos)


def test_concurrent_attention_on_one_pool():
    pool = pagedkv.Pool(
        num_blocks=64, block_size=16, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32", num_threads=2
    )

    def work(i):
        rng = np.random.default_rng(100 + i)
        s = pool.create_sequence()
        n = int(rng.integers(5, 40))
        s.append(list(range(n)))
        with pool.prepare([s], n) as step:
            k = random_tensor(rng, (n, 1, 64), np.float32)
            v = random_tensor(rng, (n, 1, 64), np.float32)
            step.cache_write(0, k, v)
            for _ in range(5):
                q = random_tensor(rng, (n, 2, 64), np.float32)
                out = step.attention(0, q)
                ref, _ = reference_attention(q, k, v)
                np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)
        s.free()

    run_threads(work, 4)
    pool.validate()
    pool.close()


def test_close_races_with_calls():
    # Calls in flight keep the pool; calls after close raise cleanly.
    for _ in range(5):
        pool = pagedkv.Pool(num_blocks=32, block_size=4)
        start = threading.Barrier(4)

        def work(i, pool=pool, start=start):
            start.wait()
            if i == 0:
                pool.close()
                return
            for _ in range(200):
                try:
                    s = pool.create_sequence()
                    s.append([1, 2, 3])
                    s.free()
                except pagedkv.InvalidStateError:
                    return

        run_threads(work, 4)
        assert pool.closed


def test_the_gil_is_released_during_long_calls():
    tokens = np.arange(1 << 21, dtype=np.int32)
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        best = 0
        for _ in range(3):
            before = ticks[0]
            pagedkv.hash_prefix(tokens, block_size=16)
            best = max(best, ticks[0] - before)
    finally:
        stop.set()
        t.join()
    # With the GIL held for the whole hash, the spinning thread could not
    # have counted at all between the two reads.
    assert best > 100


def test_pool_close_during_attention_on_another_thread():
    # Issue 14: the library keeps the pool's storage until a running kernel
    # returns; the batch's later calls raise InvalidStateError.
    import random
    import time

    rng = np.random.default_rng(14)
    n = 16384
    for _ in range(5):
        pool = pagedkv.Pool(
            num_blocks=n // 16 + 2, block_size=16, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32", num_threads=2
        )
        s = pool.create_sequence()
        s.append(rng.integers(0, 50000, n, dtype=np.int32))
        k = random_tensor(rng, (n, 1, 64), np.float32)
        v = random_tensor(rng, (n, 1, 64), np.float32)
        with pool.prepare([s], n) as step:
            step.cache_write(0, k, v)
        b = pool.prepare([s], 1)
        q = random_tensor(rng, (1, 1, 64), np.float32)
        started = threading.Event()
        outcome = []

        def attend(b=b, q=q, started=started, outcome=outcome, v=v):
            lo, hi = v[:, 0, :].min(axis=0), v[:, 0, :].max(axis=0)
            try:
                while True:
                    out = b.attention(0, q)
                    # a convex combination of the values: within their range
                    assert np.all(out[0, 0] >= lo - 1e-4) and np.all(out[0, 0] <= hi + 1e-4)
                    started.set()
            except pagedkv.InvalidStateError as e:
                outcome.append(e)
            except BaseException as e:
                outcome.append(e)
                started.set()

        t = threading.Thread(target=attend)
        t.start()
        started.wait()
        time.sleep(random.random() * 0.002)
        pool.close()
        t.join()
        assert len(outcome) == 1 and isinstance(outcome[0], pagedkv.InvalidStateError), outcome
        with pytest.raises(pagedkv.InvalidStateError):
            b.attention(0, q)
        assert b.info().num_tokens == 1
        b.close()


_ARRAY_WRITTEN_DURING_CALL = """
import sys, threading, time

import numpy as np

import pagedkv

which = sys.argv[1]
pool = pagedkv.Pool(num_blocks=4096, block_size=16, num_layers=1, num_kv_heads=1, head_dim=64, dtype="f32")
n = 1000
src = np.arange(1, n + 1, dtype=np.int32)
dst = np.arange(n + 1, 2 * n + 1, dtype=np.int32)
buf = pool.swap_out(src)
ids, good = (dst, 2 * n) if which == "copy_blocks" else (src, n)
calls = {
    "copy_blocks": lambda: pool.copy_blocks(src, dst),
    "swap_out": lambda: pool.swap_out(src, buf),
    "swap_in": lambda: pool.swap_in(src, buf),
}
stop = False


def writer():  # an id far out of range, then the valid one again, without end
    while not stop:
        ids[-1] = 1 << 30
        ids[-1] = good


t = threading.Thread(target=writer)
t.start()
end = time.monotonic() + 2.0
while time.monotonic() < end:
    try:
        calls[which]()
    except pagedkv.InvalidArgumentError:
        pass  # the id was out of range when the call read it
stop = True
t.join()
pool.validate()
print("ok")
"""


@pytest.mark.parametrize("which", ["copy_blocks", "swap_out", "swap_in"])
def test_block_id_array_written_by_another_thread_during_the_call(which):
    """The calls run without the GIL, and the raw module passed them the
    caller's own int32 array: a thread writing it between the library's
    check of the block ids and its copy made the copy go out of bounds
    (a segmentation fault). The call now reads a private copy: each call
    either copies valid blocks or raises InvalidArgumentError."""
    r = subprocess.run(
        [sys.executable, "-c", _ARRAY_WRITTEN_DURING_CALL, which], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


_MMAP_CLOSED_DURING_SWAP_IN = """
import mmap, os, tempfile, threading, time

import numpy as np

import pagedkv

pool = pagedkv.Pool(num_blocks=2048, block_size=16, num_layers=2, num_kv_heads=4, head_dim=64, dtype="f32")
blocks = np.arange(1, 1501, dtype=np.int32)
size = len(blocks) * pool.bytes_per_block
fd, path = tempfile.mkstemp()
os.unlink(path)
os.ftruncate(fd, size)
current = [mmap.mmap(fd, size, access=mmap.ACCESS_READ)]
stop = False


def closer():  # closes the mapping whenever no export pins it, maps it again
    while not stop:
        try:
            current[0].close()
            current[0] = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        except BufferError:
            pass  # a call holds it: it may not go


t = threading.Thread(target=closer)
t.start()
end = time.monotonic() + 3.0
while time.monotonic() < end:
    try:
        pool.swap_in(blocks, current[0])
    except ValueError:
        pass  # closed before the call took it
stop = True
t.join()
print("ok")
"""


def test_read_only_swap_in_buffer_stays_mapped_during_the_call():
    """swap_in of a read-only buffer (an ACCESS_READ mmap) passed its address
    and let go of the buffer before the call: another thread could close
    the mmap while the library read it (a segmentation fault). The buffer
    is now pinned until the call returns, so the close fails (BufferError)."""
    r = subprocess.run([sys.executable, "-c", _MMAP_CLOSED_DURING_SWAP_IN], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


def _run_forked_child(script):
    """Runs script in a fresh interpreter; it must print "child 0" and exit 0."""
    try:
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the forked child hung")
    assert r.returncode == 0 and r.stdout.strip() == "child 0", (r.stdout, r.stderr[-2000:])


_FORKED_CHILD_USES_THE_POOL = """
import os

import numpy as np

import pagedkv

pool = pagedkv.Pool(num_blocks=64, block_size=16, num_layers=1, num_kv_heads=8, head_dim=64, dtype="f32", num_threads=4)
s = pool.create_sequence()
s.append(list(range(40)))
x = np.ones((40, 8, 64), np.float32)
with pool.prepare([s], 40) as b:
    b.cache_write(0, x, x)
    want = b.attention(0, x)
pid = os.fork()
if pid == 0:  # the child: the parent's pool, without its kernel threads
    code = 1
    try:
        with pool.prepare([s], 40) as b:
            b.cache_write(0, x, x)
            got = b.attention(0, x)
        pool.close()
        code = 0 if np.array_equal(got, want) else 2
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
print("child", status)
pool.close()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_runs_kernels_and_closes_the_pool():
    """multiprocessing's fork start method gives a child the parent's pools
    but not their CPU kernel threads: a kernel call there waited forever for
    those threads, and closing (or collecting) the pool joined threads the
    child does not have (SIGSEGV). The child now runs kernels on its own
    thread and lets the parent's workers go."""
    _run_forked_child(_FORKED_CHILD_USES_THE_POOL)


_FORKED_CHILD_USES_A_TIERED_POOL = """
import os

import numpy as np

import pagedkv
from pagedkv import tiers

pool = pagedkv.Pool(num_blocks=9, block_size=4, num_layers=1, num_kv_heads=1, head_dim=8, dtype="f32")
tiers.attach(pool, host_bytes=1 << 20)


def step(tokens):  # a prefill that writes its blocks, then frees them (cached)
    s, cached = pool.admit(tokens)
    n = len(tokens) - cached
    x = np.ones((n, 1, 8), np.float32)
    with pool.prepare([s], n) as b:
        b.cache_write(0, x, x)
    s.free()


for r in range(3):  # evictions: the parent's copy thread offloads
    step([r * 100 + t for t in range(17)])
tiers.flush(pool)
pid = os.fork()
if pid == 0:  # the child: the parent's tiers, without their copy thread
    code = 1
    try:
        for r in range(3, 6):  # evictions in the child
            step([r * 100 + t for t in range(17)])
        tiers.flush(pool)
        s = pool.create_sequence()
        tiers.match_prefix_tiered(s, list(range(17)))
        s.free()
        pool.validate()
        pool.close()
        code = 0
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
print("child", status)
pool.validate()
pool.close()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_uses_and_closes_a_pool_with_tiers():
    """A pool with offload tiers owns a copy thread, which a forked child
    does not have: the child's evictions queued copies nobody made, the
    next plan waited for them forever, and closing the pool joined the
    missing thread. The child now offloads nothing and closes cleanly."""
    _run_forked_child(_FORKED_CHILD_USES_A_TIERED_POOL)
