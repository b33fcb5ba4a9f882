"""pagedkv against vLLM V1's Python block manager, side by side in one run.

Replays the block-manager traces of issue 16 through pagedkv's C ABI (the
raw SWIG module, one C call per operation) and through the pagedkv Python
package, and, when --vllm points at a copy of vLLM's files, through vLLM's
own BlockPool (vllm/v1/core/block_pool.py, loaded by vllm_loader.py with
every other vLLM import stubbed). Prints microseconds per trace and the
ratios pagedkv / vLLM (below 1 = pagedkv faster).

    PYTHONPATH=build/bindings/python python3 bench/vs_vllm.py [--vllm DIR]

Without --vllm it prints pagedkv's figures only. vLLM's side drives the
BlockPool directly, the way its KVCacheManager does for one request (new
blocks, cached full blocks hashed with sha256_cbor, hits by precomputed
request hashes, frees in reverse order) but without the manager's own
layers above it, so its figures are a lower bound of vLLM's cost. The
decode-step "plan" on vLLM's side is what its model runner does in numpy:
update a persistent [seqs, max_blocks] block table for new blocks, then the
slot mapping and sequence lengths; pagedkv's is a full step plan
(pkv_batch_prepare: slot mapping, CSR page table, context lengths); the
fused row appends and plans in one call (pkv_batch_prepare_decode with the
persistent table, Pool.prepare_decode).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

import pagedkv
from pagedkv import _pagedkv as raw

BS = 16
NSEQ = 1024
CTX = 1000
STEPS = 32
EXTRA = 1200  # tokens each decode sequence may gain over the run


CLOCK = (
    time.perf_counter
)  # --cpu-time: time.thread_time (a loaded machine's preemption not counted)


def best(fn, number, repeat=5):
    """Best of repeat runs of fn() number times, in microseconds per call."""
    times = []
    for _ in range(repeat):
        t0 = CLOCK()
        for _ in range(number):
            fn()
        times.append((CLOCK() - t0) / number)
    return min(times) * 1e6


def pair(raw_fn, pkg_fn, number, repeat=5):
    """best() of raw_fn and pkg_fn, their repetitions interleaved so that a
    change of load on the machine (other jobs) hits both alike."""
    r, p = [], []
    for _ in range(repeat):
        r.append(best(raw_fn, number, 1))
        p.append(best(pkg_fn, number, 1))
    return min(r), min(p)


def triple(vllm_fn, raw_fn, pkg_fn, number, repeat=7):
    """pair() with vLLM's trace in the same rounds: the short traces' ratios
    to vLLM moved by 2x between runs measured minutes apart on a shared
    VM, interleaved they hold."""
    v, r, p = [], [], []
    for _ in range(repeat):
        v.append(best(vllm_fn, number, 1))
        r.append(best(raw_fn, number, 1))
        p.append(best(pkg_fn, number, 1))
    return min(v), min(r), min(p)


def tokens(n, seed):
    return np.random.default_rng(seed).integers(0, 152064, size=n, dtype=np.int32)


# ------------------------------------------------------------------ pagedkv


def pagedkv_traces(vshort=None):
    """pagedkv's figures: (raw, package) per trace. vshort: vLLM's short
    traces (vllm_traces), measured here interleaved with pagedkv's; their
    figures go to out["vllm"]."""
    out = {"vllm": {}}

    def measure(key, raw_fn, pkg_fn, number, vkey=None):
        vfn = vshort.get(vkey or key) if vshort else None
        if vfn is None:
            out[key] = pair(raw_fn, pkg_fn, number)
        else:
            v, r, p = triple(vfn, raw_fn, pkg_fn, number)
            out["vllm"][key] = v
            out[key] = (r, p)

    pool = pagedkv.Pool(
        num_blocks=NSEQ * ((CTX + 16 + EXTRA) // BS + 4) + 4096, block_size=BS
    )
    h = pool._h
    seq0 = pool.create_sequence()

    def pkg_create_free():
        pool.create_sequence().free()

    def raw_create_free():
        raw.pkv_seq_free(h, raw.pkv_seq_create(h, None))

    out["create_free"] = pair(raw_create_free, pkg_create_free, 20000)

    def pkg_alloc1():
        s = pool.create_sequence()
        s.append([7])
        s.free()

    def raw_alloc1():
        sid = raw.pkv_seq_create(h, None)
        raw.pkv_seq_append(h, sid, [7], 0)
        raw.pkv_seq_free(h, sid)

    measure("alloc1", raw_alloc1, pkg_alloc1, 20000)

    def pkg_app_trunc():
        seq0.append([7])
        seq0.truncate(0)

    def raw_app_trunc():
        raw.pkv_seq_append(h, seq0.id, [7], 0)
        raw.pkv_seq_truncate(h, seq0.id, 0)

    measure("append_truncate", raw_app_trunc, pkg_app_trunc, 20000, "alloc1")

    empty = np.empty(0, dtype=np.int32)

    def pkg_alloc64():
        s = pool.create_sequence()
        s.append(empty, lookahead=64 * BS)
        s.free()

    def raw_alloc64():
        sid = raw.pkv_seq_create(h, None)
        raw.pkv_seq_append(h, sid, empty, 64 * BS)
        raw.pkv_seq_free(h, sid)

    measure("alloc64", raw_alloc64, pkg_alloc64, 5000)

    # Decode: 1024 sequences of ~1000 computed tokens.
    seqs = [pool.admit(tokens(CTX + i % 16, i))[0] for i in range(NSEQ)]
    with pool.prepare(seqs, [len(s) for s in seqs]) as b:
        b.commit()
    ids = np.array([s.id for s in seqs], dtype=np.uint64)
    step = [0]

    def next_tokens():
        step[0] += 1
        return (
            (np.arange(NSEQ, dtype=np.int64) * 40503 + step[0] * 2654435761) % 152064
        ).astype(np.int32)

    def raw_decode():
        t = next_tokens().tolist()
        for i in range(NSEQ):
            raw.pkv_seq_append(h, int(ids[i]), [t[i]], 0)

    def raw_decode_batch():
        raw.pkv_seq_append_batch(h, (ids, next_tokens()))

    def pkg_decode():
        pool.append_batch(ids, next_tokens())

    out["decode_each"] = (best(raw_decode, STEPS // 8, 3), None)
    out["decode"] = pair(raw_decode_batch, pkg_decode, STEPS)
    # The appends above were never computed: one step computes them, so the
    # decode plans below attend over written context.
    with pool.prepare(seqs, [len(s) - s.num_computed_tokens for s in seqs]) as b:
        b.commit()
    ones = np.ones(NSEQ, dtype=np.uint32)

    def raw_step():
        raw.pkv_seq_append_batch(h, (ids, next_tokens()))
        bt = raw.pkv_batch_prepare(h, (ids, ones), None)
        raw.pkv_batch_commit(bt)
        raw.pkv_batch_destroy(bt)

    def pkg_step():
        pool.append_batch(ids, next_tokens())
        with pool.prepare(ids, 1) as b:  # the id array: no per-sequence Python work
            b.commit()

    out["decode_plan"] = pair(raw_step, pkg_step, STEPS)

    def raw_step_pt():
        raw.pkv_seq_append_batch(h, (ids, next_tokens()))
        bt = raw.pkv_batch_prepare_ex(
            h, (ids, ones), raw.PKV_PREPARE_PERSISTENT_TABLE, None
        )
        raw.pkv_batch_commit(bt)
        raw.pkv_batch_destroy(bt)

    def pkg_step_pt():
        pool.append_batch(ids, next_tokens())
        with pool.prepare(ids, 1, persistent_table=True) as b:
            b.commit()

    out["decode_plan_pt"] = pair(raw_step_pt, pkg_step_pt, STEPS)

    def raw_step_fused():
        bt = raw.pkv_batch_prepare_decode(
            h, (ids, next_tokens()), raw.PKV_PREPARE_PERSISTENT_TABLE, None
        )
        raw.pkv_batch_commit(bt)
        raw.pkv_batch_destroy(bt)

    def pkg_step_fused():
        with pool.prepare_decode(ids, next_tokens(), persistent_table=True) as b:
            b.commit()

    out["decode_fused_pt"] = pair(raw_step_fused, pkg_step_fused, STEPS)
    pool.free_batch(seqs)

    # Admission of an 8k-token prompt fully cached (written), by hashes
    # computed at arrival, and by tokens (hashed again) for reference.
    prompt = tokens(8192, 99)
    warm = pool.create_sequence()
    warm.append(prompt)
    with pool.prepare([warm], len(prompt)) as b:
        b.commit()
    hashes = pool.hash_prefix(prompt)
    packed = b"".join(x.ljust(32, b"\0") for x in hashes)

    def raw_admit():
        sid, _ = raw.pkv_seq_admit_hashes(h, None, prompt, packed, 0)
        raw.pkv_seq_free(h, sid)

    def pkg_admit():
        s, _ = pool.admit(prompt, hashes=packed)
        s.free()

    def pkg_admit_tokens():
        s, _ = pool.admit(prompt)
        s.free()

    out["admit8k"] = pair(raw_admit, pkg_admit, 2000)
    out["admit8k_tokens"] = (None, best(pkg_admit_tokens, 200))
    assert pool.admit(prompt, hashes=packed)[1] == 8192 - BS
    return out


# -------------------------------------------------------------------- vLLM


class _Req:
    """What BlockPool.cache_full_blocks reads of a request."""

    __slots__ = ("block_hashes", "blocks", "tokens")

    def __init__(self):
        self.block_hashes = []
        self.blocks = []
        self.tokens = []


def vllm_traces(root):
    """vLLM's figures per trace, and its short traces as functions (for
    pagedkv_traces to interleave with its own)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import vllm_loader

    bp, kcu = vllm_loader.load(root)
    from vllm.utils.hashing import sha256_cbor

    kcu.init_none_hash(sha256_cbor)
    hash_block = kcu.hash_block_tokens
    out = {}
    nblocks = NSEQ * ((CTX + 16 + EXTRA) // BS + 4) + 4096
    pool = bp.BlockPool(nblocks, True, BS)

    def alloc1():
        pool.free_blocks(pool.get_new_blocks(1))

    # A rollback frees the block the token took: append 1 + truncate 0 is
    # alloc1 on vLLM's side.
    short = {"alloc1": alloc1}

    def alloc64():
        pool.free_blocks(reversed(pool.get_new_blocks(64)))

    short["alloc64"] = alloc64

    def append_token(r, t):
        r.tokens.append(t)
        n = len(r.tokens)
        if (n - 1) % BS == 0:  # the token starts a block
            r.blocks.extend(pool.get_new_blocks(1))
        if n % BS == 0:  # it fills one: hash and cache it
            parent = r.block_hashes[-1] if r.block_hashes else None
            r.block_hashes.append(hash_block(sha256_cbor, parent, r.tokens[-BS:], None))
            full = n // BS
            pool.cache_full_blocks(r, r.blocks, full - 1, full, BS, 0)

    reqs = []
    for i in range(NSEQ):
        r = _Req()
        toks = tokens(CTX + i % 16, i).tolist()
        r.blocks = pool.get_new_blocks((len(toks) + BS - 1) // BS)
        r.tokens = toks
        parent = None
        for j in range(len(toks) // BS):
            parent = hash_block(sha256_cbor, parent, toks[j * BS : (j + 1) * BS], None)
            r.block_hashes.append(parent)
        pool.cache_full_blocks(r, r.blocks, 0, len(toks) // BS, BS, 0)
        reqs.append(r)
    step = [0]

    def next_tokens():
        step[0] += 1
        return (
            (np.arange(NSEQ, dtype=np.int64) * 40503 + step[0] * 2654435761) % 152064
        ).tolist()

    def decode():
        for r, t in zip(reqs, next_tokens()):
            append_token(r, t)

    out["decode"] = best(decode, STEPS)
    # The model runner's inputs: a persistent block table updated with new
    # blocks, then slot mapping and sequence lengths, in numpy.
    max_blocks = (CTX + 16 + EXTRA) // BS + 8
    table = np.zeros((NSEQ, max_blocks), dtype=np.int32)
    nrow = np.zeros(NSEQ, dtype=np.int32)
    for i, r in enumerate(reqs):
        ids_ = [b.block_id for b in r.blocks]
        table[i, : len(ids_)] = ids_
        nrow[i] = len(ids_)
    rows = np.arange(NSEQ)

    def decode_plan():
        decode()
        for i, r in enumerate(reqs):
            k = len(r.blocks)
            if k != nrow[i]:
                table[i, nrow[i] : k] = [b.block_id for b in r.blocks[nrow[i] :]]
                nrow[i] = k
        seq_lens = np.fromiter(
            (len(r.tokens) for r in reqs), dtype=np.int32, count=NSEQ
        )
        pos = seq_lens - 1
        slot = table[rows, pos // BS].astype(np.int64) * BS + pos % BS
        qsl = np.arange(NSEQ + 1, dtype=np.int32)
        return slot, qsl, seq_lens

    out["decode_plan"] = best(decode_plan, STEPS)
    for r in reqs:
        pool.free_blocks(reversed(r.blocks))

    prompt = tokens(8192, 99).tolist()
    warm = _Req()
    warm.tokens = prompt
    warm.blocks = pool.get_new_blocks(len(prompt) // BS)
    parent = None
    for j in range(len(prompt) // BS):
        parent = hash_block(sha256_cbor, parent, prompt[j * BS : (j + 1) * BS], None)
        warm.block_hashes.append(parent)
    pool.cache_full_blocks(warm, warm.blocks, 0, len(warm.blocks), BS, 0)
    pool.free_blocks(reversed(warm.blocks))
    hashes = warm.block_hashes
    cap = (len(prompt) - 1) // BS

    def admit():
        hit = []
        for hsh in hashes[:cap]:  # find_longest_cache_hit, one group
            b = pool.get_cached_block(hsh, [0])
            if b is None:
                break
            hit.append(b[0])
        pool.touch(hit)
        blocks = hit + pool.get_new_blocks(1)  # the token left to compute
        pool.free_blocks(reversed(blocks))
        return len(hit)

    assert admit() == cap
    out["admit8k"] = best(admit, 2000)
    return out, short


ROWS = [
    ("create_free", "create_sequence + free (no vLLM counterpart)"),
    ("alloc1", "single-block alloc+free (create, append 1, free)"),
    ("append_truncate", "append 1 + truncate 0"),
    ("alloc64", "64-block alloc+free"),
    ("decode", "decode step, 1024 seqs: appends"),
    ("decode_plan", "same + step plan"),
    ("decode_plan_pt", "same, persistent-table plan"),
    ("decode_fused_pt", "same in one call: prepare_decode, persistent table"),
    ("admit8k", "admission, 8k-token full hit (hashes at arrival)"),
]
# Rows compared with another row of vLLM's (its plan is one way only).
VLLM_ROW = {"decode_plan_pt": "decode_plan", "decode_fused_pt": "decode_plan"}


def machine():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, pagedkv {pagedkv.version()}"


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--vllm", help="directory holding vLLM's files (vllm/v1/core/block_pool.py)"
    )
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with the thread's CPU clock instead of wall time (for a machine shared with other jobs)",
    )
    args = ap.parse_args()
    global CLOCK
    if args.cpu_time:
        CLOCK = time.thread_time
    vl, vshort = vllm_traces(args.vllm) if args.vllm else (None, None)
    pk = pagedkv_traces(vshort)
    if vl is not None:
        vl.update(pk["vllm"])
    print(f"# {machine()}")
    print(f"# clock: {'thread CPU time' if CLOCK is time.thread_time else 'wall time'}")
    print(
        "# microseconds per trace, best of 5 (raw and package interleaved; the three short traces best of 7,"
        " vLLM's interleaved too); ratio = pagedkv / vLLM (below 1: faster);"
    )
    print(
        "# package / raw: the Python package's cost over the raw SWIG calls (issue 16: within 2x)"
    )
    if vl is None:
        print("| trace | C ABI (raw SWIG) us | Python package us | package / raw |")
        print("|---|---|---|---|")
    else:
        print(
            "| trace | vLLM us | C ABI (raw SWIG) us | package us | C ABI / vLLM | package / vLLM | package / raw |"
        )
        print("|---|---|---|---|---|---|---|")
    for key, name in ROWS:
        r, p = pk[key]
        v = vl.get(VLLM_ROW.get(key, key)) if vl is not None else None
        if vl is None:
            print(f"| {name} | {r:.2f} | {p:.2f} | {p / r:.2f} |")
        elif v is None:
            print(f"| {name} | | {r:.2f} | {p:.2f} | | | {p / r:.2f} |")
        else:
            print(
                f"| {name} | {v:.2f} | {r:.2f} | {p:.2f} | {r / v:.3f} | {p / v:.3f} | {p / r:.2f} |"
            )
    each, by_tokens = pk["decode_each"][0], pk["admit8k_tokens"][1]
    if vl is None:
        print(f"| (decode appends, one raw call per sequence) | {each:.2f} | | |")
        print(f"| (admission by tokens, hashed again) | | {by_tokens:.2f} | |")
    else:
        print(f"| (decode appends, one raw call per sequence) | | {each:.2f} | | | | |")
        print(f"| (admission by tokens, hashed again) | | | {by_tokens:.2f} | | | |")


if __name__ == "__main__":
    main()
