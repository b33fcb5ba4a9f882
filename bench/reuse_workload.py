#!/usr/bin/env python3
"""Issue 22 on the demo workload: what partial-block reuse and retention
priorities buy, measured with the block manager alone (no K/V storage: the
figures are tokens and blocks, not time).

1. Partial-block hits. The demo's workload (examples/serving_sim: a few
   system prompts of lognormal(384, 0.5) tokens before half of the requests,
   lognormal(192, 1.0) user tokens, lognormal(128, 0.8) answers; the same
   generator, re-implemented here so this driver does not depend on the
   demo's code) served in waves of --concurrency requests: admit (prefix
   lookup, append the rest of the prompt, one committed prefill step), one
   committed step for the answer, free. The same run with
   ``match_prefix`` (full blocks) and with ``match_prefix_partial`` on a
   pool created with ``enable_partial_reuse``: the extra prefix-hit tokens
   are the tail of each system prompt's last block, which full-block
   caching always recomputes.

2. System-prompt hits under a churn of one-off long documents. Requests
   alternate at random between a system prompt plus a short question and a
   one-off document (lognormal(3000, 0.4) tokens, never seen again) on a pool
   of --churn-blocks blocks that the documents overflow many times. Compared:
   LRU alone; the system prompts' tokens at priority 90; the documents at
   priority 0; the system prompts pinned (max_pinned_blocks sized for them);
   priority 90 for a duration (--duration-requests requests' time once free).
   The figure is the share of system-prompt tokens served from the cache.

Usage (from a build with the Python binding, e.g. the dev build):
  PYTHONPATH=build-dev/bindings/python python3 bench/reuse_workload.py
Prints Markdown tables (bench/results/reuse_workload.md holds a run).
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import numpy as np

import pagedkv

VOCAB = 32000


def lognormal(rng: np.random.Generator, median: float, sigma: float) -> float:
    return median * math.exp(sigma * rng.standard_normal())


def clamp(x: float, lo: int, hi: int) -> int:
    return int(min(max(round(x), lo), hi))


# ---------------------------------------------------------------- workload


def demo_workload(args: argparse.Namespace) -> tuple[list[np.ndarray], list[tuple[int, np.ndarray, int]]]:
    """(system prompts, requests as (system prompt index or -1, prompt, output_len))."""
    rng = np.random.default_rng(args.seed)
    max_system = args.max_context // 4
    systems = [
        rng.integers(0, VOCAB, clamp(lognormal(rng, 384, 0.5), 1, max_system), dtype=np.int32)
        for _ in range(args.system_prompts)
    ]
    requests = []
    for _ in range(args.requests):
        sp = int(rng.integers(args.system_prompts)) if rng.random() < args.shared_prefix else -1
        sys_tokens = systems[sp] if sp >= 0 else np.empty(0, np.int32)
        room = args.max_context * 3 // 4 - len(sys_tokens)
        user = rng.integers(0, VOCAB, clamp(lognormal(rng, 192, 1.0), 1, room), dtype=np.int32)
        prompt = np.concatenate([sys_tokens, user])
        out_len = clamp(lognormal(rng, 128, 0.8), 1, args.max_context - len(prompt))
        requests.append((sp, prompt, out_len))
    return systems, requests


def step(pool: pagedkv.Pool, seq: pagedkv.Sequence) -> None:
    """One committed step over the sequence's uncomputed tokens."""
    info = seq.info()
    q = info.num_tokens - info.num_computed_tokens
    if q:
        with pool.prepare([seq], [q]):
            pass  # manager-only: the engine wrote the K/V; the step commits here


def run_partial(args: argparse.Namespace, requests, partial: bool) -> dict:
    rng = np.random.default_rng(args.seed + 1)
    pool = pagedkv.Pool(num_blocks=args.blocks, block_size=args.block_size, enable_partial_reuse=partial)
    rejected = 0
    for w in range(0, len(requests), args.concurrency):
        live = []
        for _sp, prompt, out_len in requests[w : w + args.concurrency]:
            s = pool.create_sequence()
            got = s.match_prefix_partial(prompt).num_cached if partial else s.match_prefix(prompt)
            try:
                s.append(prompt[got:])
                step(pool, s)
                s.append(rng.integers(0, VOCAB, out_len, dtype=np.int32))
                step(pool, s)
            except pagedkv.OutOfBlocksError:
                rejected += 1
            live.append(s)
        for s in live:
            s.free()
        if w % (20 * args.concurrency) == 0:
            pool.validate()
    pool.validate()
    st = pool.stats()
    pool.close()
    return {
        "query": st.prefix_query_tokens,
        "hit": st.prefix_hit_tokens,
        "partial_hits": st.num_partial_hits,
        "partial_tokens": st.partial_hit_tokens,
        "rejected": rejected,
    }


def churn_workload(args: argparse.Namespace, systems):
    """(system prompt index or -1 for a document, prompt) in arrival order."""
    rng = np.random.default_rng(args.seed + 2)
    out = []
    for _ in range(args.churn_requests):
        if rng.random() < args.doc_share:
            n = clamp(lognormal(rng, args.doc_median, 0.4), 64, args.max_context)
            out.append((-1, rng.integers(0, VOCAB, n, dtype=np.int32)))
        else:
            sp = int(rng.integers(len(systems)))
            q = rng.integers(0, VOCAB, clamp(lognormal(rng, 48, 0.5), 1, 512), dtype=np.int32)
            out.append((sp, np.concatenate([systems[sp], q])))
    return out


def run_churn(args: argparse.Namespace, systems, reqs, mode: str) -> dict:
    """mode: lru | sys90 | doc0 | pin | sys90-short."""
    bs = args.block_size
    pinned_budget = sum((len(s) + bs - 1) // bs for s in systems)
    retention = mode != "lru"
    pool = pagedkv.Pool(
        num_blocks=args.churn_blocks,
        block_size=bs,
        enable_retention=retention,
        max_pinned_blocks=pinned_budget if mode == "pin" else 0,
    )
    if retention:
        pool.set_clock(0)
    sys_query = sys_hit = 0
    rejected = 0
    # One request per 10 ms of simulated time (the pool's clock is set, so
    # durations are exact and the run is deterministic).
    gap_ns = 10_000_000
    short_ns = gap_ns * args.duration_requests
    for i, (sp, prompt) in enumerate(reqs):
        if retention:
            pool.set_clock(i * gap_ns)
        s = pool.create_sequence()
        if sp >= 0 and mode in ("sys90", "pin", "sys90-short"):
            prio = pagedkv.PRIORITY_PINNED if mode == "pin" else 90
            dur = short_ns if mode == "sys90-short" else 0
            s.set_retention([pagedkv.RetentionRange(0, len(systems[sp]), prio, dur)])
        elif sp < 0 and mode == "doc0":
            s.set_retention([pagedkv.RetentionRange(0, None, 0)])
        got = s.match_prefix(prompt)
        if sp >= 0:
            n = len(systems[sp])
            sys_query += n
            sys_hit += min(got, n)
        try:
            s.append(prompt[got:])
            step(pool, s)
            s.append([1, 2, 3, 4])  # a short answer
            step(pool, s)
        except pagedkv.OutOfBlocksError:
            rejected += 1
        s.free()
    pool.validate()
    st = pool.stats()
    pool.close()
    return {
        "sys_query": sys_query,
        "sys_hit": sys_hit,
        "hit": st.prefix_hit_tokens,
        "query": st.prefix_query_tokens,
        "rejected": rejected,
        "pins_degraded": st.num_pins_degraded,
    }


def index_bytes_per_block(bs: int, num_blocks: int) -> float:
    """What enable_partial_reuse keeps per block (impl/block_pool: parent
    hash, tokens, two chain links, the parent-keyed table's slots)."""
    slots = 16
    while slots < 2 * num_blocks:
        slots *= 2
    return 33 + 4 * bs + 8 + slots * 4 / num_blocks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--system-prompts", type=int, default=4)
    ap.add_argument("--shared-prefix", type=float, default=0.5)
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=4096, help="pool of the partial-reuse run")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--churn-requests", type=int, default=3000)
    ap.add_argument("--churn-blocks", type=int, default=1024)
    ap.add_argument("--doc-share", type=float, default=0.5)
    ap.add_argument("--doc-median", type=float, default=3000)
    ap.add_argument("--duration-requests", type=int, default=16,
                    help="the duration variant's priority lasts this many requests' time once free")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    t0 = time.time()
    systems, requests = demo_workload(args)
    print(f"pagedkv {pagedkv.version()}, {platform.machine()}, seed {args.seed}; block_size {args.block_size}\n")
    print("## Partial-block hits on the demo workload\n")
    print(
        f"{args.requests} requests, {args.shared_prefix:.0%} with one of {args.system_prompts} system prompts "
        f"({', '.join(str(len(s)) for s in systems)} tokens), waves of {args.concurrency}, "
        f"{args.blocks} blocks\n"
    )
    full = run_partial(args, requests, False)
    part = run_partial(args, requests, True)
    with_sys = sum(1 for sp, _, _ in requests if sp >= 0)
    print("| lookup | prompt tokens | prefix-hit tokens | hit rate | partial hits | partial-hit tokens |")
    print("|---|---|---|---|---|---|")
    for name, r in (("full blocks (match_prefix)", full), ("+ partial blocks", part)):
        print(
            f"| {name} | {r['query']} | {r['hit']} | {r['hit'] / r['query']:.2%} | {r['partial_hits']} | "
            f"{r['partial_tokens']} |"
        )
    extra = part["hit"] - full["hit"]
    print(
        f"\nExtra prefix-hit tokens from partial reuse: {extra} ({extra / max(full['hit'], 1):+.1%} over full "
        f"blocks; {extra / max(with_sys, 1):.1f} tokens per system-prompt request; expected about "
        f"mean(len % {args.block_size}) = "
        f"{np.mean([len(s) % args.block_size for s in systems]):.1f}). Requests that did not fit: "
        f"{full['rejected']} / {part['rejected']}."
    )
    per_block = index_bytes_per_block(args.block_size, args.blocks)
    kv_8b = 32 * 8 * 128 * 2 * 2 * args.block_size  # Llama-3-8B-like: layers * kv heads * dim * K,V * bf16
    print(
        f"\nMemory of the partial-hit index: {per_block:.0f} bytes per block ({args.blocks} blocks: "
        f"{per_block * args.blocks / 1024:.0f} KiB), {per_block / kv_8b:.4%} of a block's K/V for a "
        f"Llama-3-8B-like model ({kv_8b // 1024} KiB per block).\n"
    )

    print("## System-prompt hits under a churn of one-off documents\n")
    reqs = churn_workload(args, systems)
    docs = [len(p) for sp, p in reqs if sp < 0]
    print(
        f"{args.churn_requests} requests: {len(docs)} one-off documents (median {int(np.median(docs))} tokens, "
        f"{sum(docs) // (args.churn_blocks * args.block_size)}x the pool), the rest a system prompt "
        f"+ a short question; {args.churn_blocks} blocks of {args.block_size}\n"
    )
    print("| eviction | system-prompt tokens served from cache | all prefix hits | did not fit |")
    print("|---|---|---|---|")
    labels = {
        "lru": "LRU only (default)",
        "sys90": "system prompts at priority 90",
        "doc0": "documents at priority 0",
        "pin": "system prompts pinned (budget = their blocks)",
        "sys90-short": f"priority 90 for {args.duration_requests} requests' time once free (duration)",
    }
    for mode in ("lru", "sys90", "doc0", "pin", "sys90-short"):
        r = run_churn(args, systems, reqs, mode)
        print(
            f"| {labels[mode]} | {r['sys_hit'] / r['sys_query']:.1%} ({r['sys_hit']} / {r['sys_query']}) | "
            f"{r['hit'] / r['query']:.1%} | {r['rejected']} |"
        )
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
