#!/usr/bin/env python3
"""Writes the seed corpus of the ops harness (tests/fuzz/corpus/).

Each input is a 4-byte pool header (storage, caching, events, hash, window,
num_blocks, block_size, dtype/heads/layers) followed by operation bytes. The
seeds fix the headers so that every configuration class is covered and fill
the operations from a seeded RNG, biased towards creating sequences first.
Deterministic: rerunning rewrites the same files.
"""
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")

# (b0 flags, b1 num_blocks selector, b2 block-size selector, b3 storage shape)
HEADERS = [
    (0x02, 6, 3, 0),      # manager, caching, bs 4, 8 blocks
    (0x02, 1, 0, 0),      # tiny pool (3 blocks), bs 1: exhaustion everywhere
    (0x00, 14, 2, 0),     # caching off, bs 3
    (0x0A, 30, 4, 0),     # events on, bs 8, many blocks
    (0x1A, 9, 1, 0),      # xxh3 + events, bs 2
    (0x62, 12, 3 | 8, 0),  # sliding window
    (0x82, 6, 3, 1),      # a broken create first
    (0x03, 10, 0, 0x00),  # storage f32, bs 8, 1 kv head, 1 layer, hd 80
    (0x03, 20, 1, 0x25),  # storage f16, bs 16, 2 kv heads, hd 64
    (0x03, 7, 0, 0x3A),   # storage bf16, GQA group 2, 2 layers, hd 64
    (0x0B, 16, 0, 0x21),  # storage + events
    (0x63, 18, 0 | 16, 0x20),  # storage + sliding window
    (0x01, 8, 1, 0x02),   # storage, caching off
    # Issue 22: 0x04 = partial-block hits and retention priorities on. The
    # seed-reuse-* files next to these were picked from biased random runs
    # for the partial hits they reach.
    (0x06, 6, 3, 0),      # manager, bs 4
    (0x07, 20, 1, 0x25),  # storage f16, bs 16
]


def ops(rng, n):
    out = []
    for i in range(n):
        if i < 3:
            out.append(rng.choice([0, 1]))  # create
        else:
            out.append(rng.randrange(256))
        out.extend(rng.randrange(256) for _ in range(rng.randrange(2, 6)))
    return bytes(out)


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(20240611)
    for i, h in enumerate(HEADERS):
        for k in range(2):
            data = bytes(h) + ops(rng, 40 + 30 * k)
            with open(os.path.join(OUT, "seed-%02d-%d" % (i, k)), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
