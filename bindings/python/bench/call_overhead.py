"""What the Python layers cost per call: the pagedkv package against the raw
SWIG module against the C work itself, measured in one run.

    PYTHONPATH=<build>/bindings/python python3 bindings/python/bench/call_overhead.py

Prints microseconds per call (best of 5 repeats) and the package/raw ratio.
"""

from __future__ import annotations

import platform
import timeit

import numpy as np

import pagedkv
from pagedkv import _pagedkv as raw


def best(fn, number):
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main() -> None:
    rows = []
    pool = pagedkv.Pool(num_blocks=4096, block_size=16, num_layers=1, num_kv_heads=8, head_dim=128, dtype="bf16")
    ptr = pool._h.acquire()  # the raw pointer, pinned for the run
    seq = pool.create_sequence()
    seq.append(list(range(100)))
    rows.append(("version (no pool)", best(pagedkv.version, 20000), best(raw.pkv_version_string, 20000)))
    rows.append(("stats()", best(pool.stats, 5000), best(lambda: raw.pkv_pool_get_stats(ptr), 5000)))
    rows.append(("seq info()", best(seq.info, 5000), best(lambda: raw.pkv_seq_get_info(ptr, seq.id), 5000)))

    def pkg_append():
        seq.append([1])
        seq.truncate(100)

    def raw_append():
        raw.pkv_seq_append(ptr, seq.id, [1], 0)
        raw.pkv_seq_truncate(ptr, seq.id, 100)

    rows.append(("append 1 + truncate", best(pkg_append, 5000), best(raw_append, 5000)))

    def pkg_create_free():
        pool.create_sequence().free()

    def raw_create_free():
        raw.pkv_seq_free(ptr, raw.pkv_seq_create(ptr, None))

    rows.append(("create_sequence + free", best(pkg_create_free, 5000), best(raw_create_free, 5000)))

    def pkg_alloc1():
        s = pool.create_sequence()
        s.append([7])
        s.free()

    def raw_alloc1():
        sid = raw.pkv_seq_create(ptr, None)
        raw.pkv_seq_append(ptr, sid, [7], 0)
        raw.pkv_seq_free(ptr, sid)

    rows.append(("create, append 1, free", best(pkg_alloc1, 5000), best(raw_alloc1, 5000)))
    prompt = np.arange(64, dtype=np.int32)
    rows.append(
        (
            "admit 64 tokens + free",
            best(lambda: pool.admit(prompt)[0].free(), 2000),
            best(lambda: raw.pkv_seq_free(ptr, raw.pkv_seq_admit(ptr, None, prompt, 0)[0]), 2000),
        )
    )

    seqs = []
    for i in range(64):
        s = pool.create_sequence()
        s.append(list(range(i, i + 500)))
        seqs.append(s)
    with pool.prepare(seqs, 500) as b:
        b.commit()
    ids = [s.id for s in seqs]
    ids_np = np.array(ids, dtype=np.uint64)
    toks = np.ones(64, dtype=np.int32)
    ones = [1] * 64

    def pkg_batch_append():
        pool.append_batch(ids_np, toks)
        for s in seqs:
            s.truncate(500)

    def raw_batch_append():
        raw.pkv_seq_append_batch(ptr, (ids_np, toks))
        for i in ids:
            raw.pkv_seq_truncate(ptr, i, 500)

    rows.append(("append_batch 64 + truncates", best(pkg_batch_append, 200), best(raw_batch_append, 200)))

    def pkg_prepare():
        pool.prepare(seqs, 1).close()

    def raw_prepare():
        raw.pkv_batch_destroy(raw.pkv_batch_prepare(ptr, (ids, ones), None))

    rows.append(("prepare 64 decode seqs", best(pkg_prepare, 500), best(raw_prepare, 500)))

    step = pool.prepare(seqs, 1)
    bptr = step._h.acquire()
    import ml_dtypes

    bf16 = ml_dtypes.bfloat16
    q = np.random.default_rng(0).standard_normal((64, 32, 128)).astype(bf16)
    out = np.empty_like(q)
    k = np.random.default_rng(1).standard_normal((64, 8, 128)).astype(bf16)

    def as_tuple(a):
        return (a.ctypes.data, 0, raw.PKV_DTYPE_BF16, 1, 0, a.shape, tuple(s // 2 for s in a.strides))

    rows.append(
        (
            "cache_write 64x8x128",
            best(lambda: step.cache_write(0, k, k), 500),
            best(lambda: raw.pkv_cache_write(bptr, 0, as_tuple(k), as_tuple(k), None), 500),
        )
    )
    rows.append(
        (
            "attention 64 seqs x 500 ctx",
            best(lambda: step.attention(0, q, out), 20),
            best(lambda: raw.pkv_attention_forward(bptr, 0, as_tuple(q), as_tuple(out), None, None, None), 20),
        )
    )
    step._h.release()
    step.close()
    pool._h.release()
    pool.close()

    print(
        f"pagedkv {pagedkv.version()} python call costs on {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}"
    )
    print(f"{'call':<28} {'package us':>11} {'raw us':>9} {'package/raw':>12}")
    for name, pkg, r in rows:
        print(f"{name:<28} {pkg:>11.2f} {r:>9.2f} {pkg / r:>12.2f}")


if __name__ == "__main__":
    main()
