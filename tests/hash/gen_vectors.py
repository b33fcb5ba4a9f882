#!/usr/bin/env python3
"""Generates tests/hash/vectors.inc: pinned block-hash test vectors.

Expected bytes and digests come from Python (cbor2.dumps(x, canonical=True),
hashlib, xxhash) via pyref.py, never from the C++ code under test. Large token
lists and strings are given as recipes (LCG tokens, repeated text) that the
C++ test expands the same way. Run: python3 tests/hash/gen_vectors.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pyref  # noqa: E402

ALGOS = [(pyref.SHA256_CBOR, "sha"), (pyref.XXH3_128, "xxh")]
MAX_INLINE_CBOR = 600  # bytes; longer encodings are pinned by size + digest only

INT_EDGES = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1,
             -1, -24, -25, -256, -257, -65536, -65537, -(2**31)]


def cstr(s):
    return '"' + s + '"'


def hexs(b):
    return cstr(b.hex())


class Tokens:
    def __init__(self, values=None, count=0, seed=0, lo=0, hi=0):
        if values is not None:
            self.values, self.spec = list(values), (list(values), 0, 0, 0, 0)
        else:
            self.values = pyref.lcg_tokens(count, seed, lo, hi)
            self.spec = ([], count, seed, lo, hi)

    def c(self):
        lst, count, seed, lo, hi = self.spec
        return "{{%s}, %d, %du, %d, %d}" % (", ".join(tok_c(v) for v in lst), count, seed,
                                             lo, hi)


def tok_c(v):
    return "INT32_MIN" if v == -(2**31) else str(v)


class Text:
    """A text string given as UTF-8 hex repeated `repeat` times."""

    def __init__(self, s, repeat=1):
        self.unit, self.repeat = s, repeat
        self.value = s * repeat

    def c(self):
        return "{%s, %d}" % (hexs(self.unit.encode()), self.repeat)


class MmKey:
    """vLLM's multimodal extra key: (content hash, item offset - block start)."""

    def __init__(self, h, rel):
        self.text, self.rel = Text(h), rel
        self.value = (h, rel)


def extra_c(keys):
    if keys is None:
        return "true, {}"
    parts = []
    for k in keys:
        if isinstance(k, MmKey):
            parts.append("{true, 0, %s, true, %d}" % (k.text.c(), k.rel))
        elif isinstance(k, Text):
            parts.append("{true, 0, %s}" % k.c())
        else:
            parts.append("{false, %du, {\"\", 0}}" % k)
    return "false, {%s}" % ", ".join(parts)


def extra_py(keys):
    if keys is None:
        return None
    return tuple(k.value if isinstance(k, (Text, MmKey)) else k for k in keys)


def block_vectors():
    import random
    rng = random.Random(20240601)
    p32 = bytes(rng.getrandbits(8) for _ in range(32))
    p16 = bytes(rng.getrandbits(8) for _ in range(16))
    cases = []  # (name, parent, Tokens, keys)
    cases.append(("empty_block", p32, Tokens([]), None))
    cases.append(("one_token", p32, Tokens([7]), None))
    cases.append(("int_edges", p32, Tokens(INT_EDGES), None))
    cases.append(("parent16", p16, Tokens([1, 2, 3]), None))
    cases.append(("parent_empty", b"", Tokens([1, 2, 3]), None))
    for n in (23, 24, 255, 256, 65535, 65536):
        cases.append(("len_%d" % n, p32, Tokens(count=n, seed=n, lo=0, hi=151935), None))
    cases.append(("full_range_1000", p32,
                  Tokens(count=1000, seed=99, lo=-(2**31), hi=2**31 - 1), None))
    cases.append(("block16_vocab", p32, Tokens(count=16, seed=5, lo=0, hi=200000), None))
    cases.append(("lora_small", p32, Tokens([1, 2]), [1]))
    cases.append(("lora_edges", p32, Tokens([1, 2]),
                  [23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1]))
    cases.append(("salt", p32, Tokens([3, 4]), [Text("tenant-42")]))
    cases.append(("unicode", p32, Tokens([5]), [Text("h\u00e9llo \u4e16\u754c \U0001F600")]))
    cases.append(("empty_text", p32, Tokens([5]), [Text("")]))
    cases.append(("lora_mm_salt", p32, Tokens([9, 10, 11]),
                  [12345678901, Text("a" * 64), Text("b" * 64), Text("salt")]))
    for n in (23, 24, 255, 256, 65536):
        cases.append(("text_len_%d" % n, p32, Tokens([1]), [Text("x", n)]))
    cases.append(("extra_24_keys", p32, Tokens([1]), [Text("mm%02d" % i) for i in range(24)]))
    # Current vLLM: LoRA name, then (mm hash, offset - block start) pairs.
    cases.append(("lora_name", p32, Tokens([1, 2]), [Text("sql-adapter")]))
    cases.append(("mm_pairs", p32, Tokens([1, 2, 3, 4]),
                  [MmKey("img0", -5), MmKey("img1", 0), MmKey("img2", 3)]))
    cases.append(("mm_pair_edges", p32, Tokens([1]),
                  [MmKey("e", r) for r in (23, 24, -24, -25, 255, -256, -257, 65536,
                                           -65537, 2**32, -(2**32) - 1)]))
    cases.append(("name_mm_salt", p32, Tokens([9, 10]),
                  [Text("adapter-\u00e9"), MmKey("a" * 64, 1), Text("salt")]))
    cases.append(("extra_25_keys", p32, Tokens([1]), list(range(25))))
    out = []
    for algo, tag in ALGOS:
        for name, parent, toks, keys in cases:
            if algo == pyref.XXH3_128 and len(parent) == 32:
                parent = parent[:16]  # chained xxh3 parents are 16 bytes
            data = pyref.cbor((parent, tuple(toks.values), extra_py(keys)))
            assert data == pyref.cbor((parent, toks.values, extra_py(keys)))
            inline = data.hex() if len(data) <= MAX_INLINE_CBOR else ""
            out.append("{%s, %d, %s, %s, %s, %d, %s, %s}," % (
                cstr(tag + "_" + name), algo, hexs(parent), toks.c(), extra_c(keys), len(data),
                cstr(inline), hexs(pyref.digest(algo, data))))
    return out


def root_vectors():
    seeds = [Text(""), Text("0"), Text("42"), Text("a" * 23), Text("a" * 24), Text("s", 256),
             Text("s", 65536), Text("\u00fcnic\u00f6de \u2603 \U0001F680")]
    out = []
    for algo, tag in ALGOS:
        for i, seed in enumerate(seeds):
            data = pyref.cbor(seed.value)
            inline = data.hex() if len(data) <= MAX_INLINE_CBOR else ""
            out.append("{%s, %d, %s, %d, %s, %s}," % (
                cstr("%s_root_%d" % (tag, i)), algo, seed.c(), len(data), cstr(inline),
                hexs(pyref.root(algo, seed.value))))
    return out


def prefix_vectors():
    out = []
    specs = [
        # name, block_size, seed, lora, salt, mm items, Tokens[, options]
        ("plain", 16, "", 0, "", [], Tokens(count=200, seed=1, lo=0, hi=151935)),
        ("seed_partial_tail", 16, "1234", 0, "", [], Tokens(count=100, seed=2, lo=0, hi=32000)),
        ("bs1", 1, "x", 0, "", [], Tokens(count=40, seed=3, lo=-5, hi=5)),
        ("bs7_lora", 7, "", 3, "", [], Tokens(count=50, seed=4, lo=0, hi=1000)),
        ("lora_big", 16, "", 2**40 + 5, "", [], Tokens(count=64, seed=5, lo=0, hi=1000)),
        ("salt", 16, "", 0, "tenant-\u00e9", [], Tokens(count=64, seed=6, lo=0, hi=1000)),
        ("lora_salt", 16, "s", 9, "salty", [], Tokens(count=64, seed=7, lo=0, hi=1000)),
        # mm items spanning several blocks, one ending exactly on a block
        # boundary, two sharing a block, one starting on a boundary.
        ("mm", 16, "", 0, "", [(5, 40, "img0" * 16), (48, 8, "img1"), (58, 3, "img2"),
                               (80, 16, "img3"), (130, 1, "img4")],
         Tokens(count=160, seed=8, lo=0, hi=151935)),
        ("mm_lora_salt", 16, "seed", 77, "s4lt", [(0, 33, "a1"), (33, 15, "b2"),
                                                   (100, 60, "\u56fe\u50cf")],
         Tokens(count=200, seed=9, lo=0, hi=151935)),
        ("too_short", 16, "", 1, "s", [], Tokens(count=15, seed=10, lo=0, hi=10)),
        # Current vLLM keys a LoRA adapter by name.
        ("lora_name", 16, "", 0, "", [], Tokens(count=64, seed=11, lo=0, hi=1000),
         {"lora_name": "sql-lora"}),
        ("lora_name_mm_salt", 4, "s", 0, "salt", [(2, 7, "img")],
         Tokens(count=20, seed=12, lo=0, hi=1000), {"lora_name": "\u00e9-lora"}),
        # issue 13: a block completed by decode that starts where the last mm
        # item ends. Prompt [-1]*4 + [5, 6], item (0, 4), outputs 7, 8: vLLM
        # hashes block 0 with the prompt and block 1 after decode.
        ("mm_offset_decode", 4, "", 0, "", [(0, 4, "img")],
         Tokens([-1, -1, -1, -1, 5, 6, 7, 8]), {"prompt_len": 6}),
        # Items starting mid-block and spanning blocks: negative offsets.
        ("mm_relative_offsets", 4, "", 0, "", [(1, 2, "a"), (3, 6, "b"), (9, 1, "c")],
         Tokens(count=16, seed=13, lo=0, hi=99), {"prompt_len": 14}),
    ]
    for algo, tag in ALGOS:
        for spec in specs:
            name, bs, seed, lora, salt, mm, toks = spec[:7]
            opt = spec[7] if len(spec) > 7 else {}
            lora_name = opt.get("lora_name", "")
            hashes = pyref.prefix(algo, seed, bs, toks.values, lora, salt, mm, lora_name,
                                  opt.get("prompt_len"))
            # The vectors hold for a whole prompt hashed at once as well (our
            # hash_prefix and a pool's appends in any chunks).
            assert hashes == pyref.prefix(algo, seed, bs, toks.values, lora, salt, mm, lora_name)
            mm_c = ", ".join("{%d, %d, %s}" % (o, n, hexs(h.encode())) for o, n, h in mm)
            out.append("{%s, %d, %d, %s, %du, %s, {%s}, %s, {%s}, %s}," % (
                cstr(tag + "_" + name), algo, bs, hexs(seed.encode()), lora, hexs(salt.encode()),
                mm_c, toks.c(), ", ".join(hexs(h) for h in hashes), hexs(lora_name.encode())))
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    lines = ["// Generated by tests/hash/gen_vectors.py from Python cbor2 (canonical=True),",
             "// hashlib and xxhash. Do not edit; regenerate. Included by block_hash_test.cpp.",
             "// clang-format off", ""]
    for decl, vecs in (("const BlockVector kBlockVectors[]", block_vectors()),
                       ("const RootVector kRootVectors[]", root_vectors()),
                       ("const PrefixVector kPrefixVectors[]", prefix_vectors())):
        lines += [decl + " = {"] + ["    " + v for v in vecs] + ["};", ""]
    lines.append("// clang-format on")
    with open(os.path.join(here, "vectors.inc"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
