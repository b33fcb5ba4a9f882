#!/usr/bin/env python3
"""Writes the seed corpus of the multi-group harness (tests/fuzz/corpus_groups/).

Each input is a 4-byte pool header followed by operation bytes
(groups_harness.cpp):
  b0: bits 0-1 groups - 1; bit 2 caching off unless bit 3; bit 4 a first
      plan before anything (planned mode from the start); bit 5 XXH3; bit 6
      recurrent groups take PKV_GROUP_SNAPSHOT_EVERY_BLOCK
  b1: 2 bits per group: PKV_GROUP_FULL / SLIDING_WINDOW / MLA / RECURRENT
  b2: bits 0-1 block size 1/2/4/8, bit 2 block size 3, bits 3-6 wider windows
  b3: num_blocks = 4 + b3 % 40; b3 / 40 shifts the windows
The seeds fix the headers so that every kind mix is covered and fill the
operations from a seeded RNG, creating sequences first. Deterministic:
rerunning rewrites the same files.
"""
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus_groups")

FULL, SWA, MLA, REC = 0, 1, 2, 3


def kinds(*ks):
    v = 0
    for i, k in enumerate(ks):
        v |= k << (2 * i)
    return v


# (b0, b1, b2, b3)
HEADERS = [
    (0x00 | 1, kinds(FULL, SWA), 2, 20),         # Gemma-like, bs 4
    (0x10 | 1, kinds(SWA, FULL), 1, 60),         # planned from the start, bs 2
    (0x10 | 2, kinds(FULL, SWA, SWA), 2 | 8, 110),  # two windows
    (0x00 | 1, kinds(FULL, REC), 2, 24),         # Jamba-like
    (0x10 | 1, kinds(REC, FULL), 1, 30),
    (0x10 | 0, kinds(REC), 2, 8),                # recurrent only, tiny pool
    (0x10 | 0, kinds(MLA), 3, 30),               # MLA alone, bs 8
    (0x00 | 3, kinds(FULL, SWA, MLA, REC), 2, 39),  # every kind
    (0x10 | 3, kinds(SWA, REC, FULL, MLA), 4 | 0x10, 75),  # bs 3
    (0x10 | 2, kinds(FULL, SWA, REC), 0, 35),    # bs 1
    (0x04 | 1, kinds(FULL, SWA), 2, 16),         # caching off
    (0x30 | 1, kinds(SWA, SWA), 2, 5),           # xxh3, exhaustion
    (0x40 | 1, kinds(FULL, REC), 2, 24),         # Jamba-like, snapshots at every block
    (0x50 | 2, kinds(FULL, SWA, REC), 1, 38),    # planned from the start, bs 2, snapshots
    (0x40 | 3, kinds(FULL, SWA, MLA, REC), 0, 12),  # every kind, bs 1, snapshots, tight
]


def ops(rng, n):
    out = []
    for i in range(n):
        if i < 3:
            out.append(rng.choice([0, 1]))  # create
        elif i % 5 == 3:
            out.append(rng.choice([4, 5, 10, 11, 15]))  # append / step
        else:
            out.append(rng.randrange(256))
        out.extend(rng.randrange(256) for _ in range(rng.randrange(3, 8)))
    return bytes(out)


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(20261124)
    for i, h in enumerate(HEADERS):
        for k in range(2):
            data = bytes(h) + ops(rng, 50 + 40 * k)
            with open(os.path.join(OUT, "seed-%02d-%d" % (i, k)), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
