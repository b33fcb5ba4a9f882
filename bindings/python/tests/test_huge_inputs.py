"""Inputs whose length is over a call's limit are refused from the length,
before anything is read, listed or copied.

seq.append(range(2**31)) built a list of 2^31 Python ints (tens of GB: the
process could be killed for memory) and a broadcast numpy array of 2^31
tokens (4 bytes of memory) was copied into an 8 GB buffer, all before the
library refused more than 2^31 - 1 tokens. Each case runs in a child
process under an address-space limit a little above what it holds, so a
conversion that still materialises the input fails there (MemoryError)
instead of taking the test machine's memory."""

import json
import subprocess
import sys
import textwrap

import pytest

import pagedkv

_CHILD = textwrap.dedent(
    r"""
    import json, resource, sys, time, tracemalloc
    import numpy as np
    import pagedkv

    pool = pagedkv.Pool(block_size=16, num_blocks=64)
    spool = pagedkv.Pool(block_size=4, num_blocks=8, num_layers=1, num_kv_heads=1, head_dim=4, dtype="f32")
    s = pool.create_sequence()
    s.append([1, 2, 3])

    class ClaimsLong:  # a __len__ that lies: iterating gives 3 items
        def __len__(self):
            return 1 << 31
        def __iter__(self):
            return iter([1, 2, 3])
        def __getitem__(self, i):
            return [1, 2, 3][i]

    class BeyondIndex(ClaimsLong):
        def __len__(self):
            return 1 << 70

    T = np.broadcast_to(np.int32(1), (1 << 31,))  # 2^31 tokens in 4 bytes
    T8 = np.broadcast_to(np.int8(1), (1 << 31,))
    T64 = np.broadcast_to(np.int64(1), (1 << 31,))
    IDS = np.broadcast_to(np.uint64(s.id), (1 << 25,))  # 2^25 ids in 8 bytes

    class ArrayLike:  # __array_interface__ only: was made contiguous (8 GB) first
        __array_interface__ = T.__array_interface__

    R = range(1 << 31)
    cases = {
        "append range": lambda: s.append(R),
        "append broadcast int32": lambda: s.append(T),
        "append broadcast int8": lambda: s.append(T8),
        "append broadcast int64": lambda: s.append(T64),
        "append iterator": lambda: s.append(iter(R)),
        "append lying len": lambda: s.append(ClaimsLong()),
        "append len beyond index": lambda: s.append(BeyondIndex()),
        "append array interface": lambda: s.append(ArrayLike()),
        "match_prefix": lambda: pool.create_sequence().match_prefix(T),
        "match_prefix_partial": lambda: pool.create_sequence().match_prefix_partial(R),
        "match_prefix hashes": lambda: pool.create_sequence().match_prefix([1] * 32, hashes=R),
        "admit": lambda: pool.admit(R),
        "hash_prefix range": lambda: pagedkv.hash_prefix(R),
        "hash_prefix broadcast": lambda: pagedkv.hash_prefix(T, block_size=1),
        "hash_prefix iterator": lambda: pagedkv.hash_prefix(iter(R)),
        "pool.hash_prefix": lambda: pool.hash_prefix(ClaimsLong()),
        "free_batch range": lambda: pool.free_batch(range(1 << 25)),
        "free_batch ids": lambda: pool.free_batch(IDS),
        "append_batch": lambda: pool.append_batch(IDS, T[: 1 << 25]),
        "prepare ids": lambda: pool.prepare(IDS),
        "prepare range": lambda: pool.prepare(range(1 << 25)),
        "prepare query_counts": lambda: pool.prepare([s], range(1 << 31)),
        "prepare_decode": lambda: pool.prepare_decode(IDS, T[: 1 << 25]),
        "copy_blocks": lambda: spool.copy_blocks(R, R),
        "swap_out": lambda: spool.swap_out(R),
        "swap_in": lambda: spool.swap_in(T, b""),
        "set_retention": lambda: s.set_retention(R),
        "set_kv_scales": lambda: spool.set_kv_scales(R, R),
    }
    vm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:")][0] << 10
    resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), resource.RLIM_INFINITY))
    out = {}
    before = (pool.stats(), s.info(), spool.stats())
    for name, call in cases.items():
        tracemalloc.start()
        t = time.perf_counter()
        try:
            call()
            got = ("no error", "")
        except BaseException as e:
            got = (type(e).__name__, str(e))
        dt = time.perf_counter() - t
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out[name] = [got[0], got[1], dt, peak]
    out["unchanged"] = before == (pool.stats(), s.info(), spool.stats())
    print(json.dumps(out))
    """
)

_ARG = {  # the argument each case's error must name
    "free_batch": "seqs",
    "append_batch": "seqs",
    "prepare ids": "seqs",
    "prepare range": "seqs",
    "prepare query_counts": "query_counts",
    "prepare_decode": "seqs",
    "copy_blocks": "src",
    "swap_out": "blocks",
    "swap_in": "blocks",
    "set_retention": "ranges",
    "set_kv_scales": "k_scales",
    "match_prefix hashes": "hashes",
}


@pytest.fixture(scope="module")
def results():
    r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _arg(case):
    for prefix, arg in _ARG.items():
        if case.startswith(prefix):
            return arg
    return "tokens"


CASES = [
    "append range",
    "append broadcast int32",
    "append broadcast int8",
    "append broadcast int64",
    "append iterator",
    "append lying len",
    "append len beyond index",
    "append array interface",
    "match_prefix",
    "match_prefix_partial",
    "match_prefix hashes",
    "admit",
    "hash_prefix range",
    "hash_prefix broadcast",
    "hash_prefix iterator",
    "pool.hash_prefix",
    "free_batch range",
    "free_batch ids",
    "append_batch",
    "prepare ids",
    "prepare range",
    "prepare query_counts",
    "prepare_decode",
    "copy_blocks",
    "swap_out",
    "swap_in",
    "set_retention",
    "set_kv_scales",
]


@pytest.mark.parametrize("case", CASES)
def test_an_input_over_the_limit_is_refused_from_its_length(results, case):
    kind, msg, seconds, peak = results[case]
    assert kind == "InvalidArgumentError", (kind, msg)
    assert msg.startswith(_arg(case) + ": ") and "more than" in msg, msg
    assert seconds < 0.3, seconds
    assert peak < 100 << 20, peak


def test_refused_inputs_change_nothing(results):
    assert results["unchanged"] is True


def test_the_limits_are_the_librarys():
    """The error is the one the library raises for too many tokens (a
    ValueError too), and an input at the limit's side of it is not refused
    by length: 2^31 - 1 is checked as the library does (reserve)."""
    assert issubclass(pagedkv.InvalidArgumentError, ValueError)
    pool = pagedkv.Pool(block_size=16, num_blocks=64)
    s = pool.create_sequence()
    with pytest.raises(pagedkv.InvalidArgumentError, match="exceeds 2\\^31 - 1"):
        s.reserve(1 << 31)
    s.reserve((1 << 31) - 1)  # the limit itself: allowed
    # 64 retention ranges are the library's limit: 65 given lazily are
    # refused by the library's own message, 64 are read and checked.
    with pytest.raises(pagedkv.InvalidArgumentError, match="ranges: 65 items, more than 64"):
        s.set_retention(iter([(0, 1, 1, 0)] * 65))
