#!/usr/bin/env python3
"""Live cross-check of the block hashes against Python (cbor2 canonical,
hashlib, xxhash) on thousands of random inputs.

Usage: crosscheck.py PATH/TO/hash_crosscheck [num_cases]
The seed is random per run and printed; set PKV_HASH_SEED to replay one.
Fails (never skips) when cbor2 or xxhash cannot be imported: CI installs
them from scripts/deps/hash.pip.
"""

import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pyref  # noqa: E402  (imports cbor2 and xxhash: ImportError fails the test)

INT_EDGES = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, -1, -24, -25, -256, -257,
             -65536, -65537, -(2**31)]
UINT_EDGES = [1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1]


def x(b):
    return "x" + b.hex()


def rand_token(rng):
    r = rng.random()
    if r < 0.1:
        return rng.choice(INT_EDGES)
    if r < 0.3:
        return rng.randint(-(2**31), 2**31 - 1)
    if r < 0.5:
        return rng.randint(0, 300)
    return rng.randint(0, 200000)


def rand_len(rng, small, big):
    r = rng.random()
    if r < 0.005:
        return rng.choice([65535, 65536, 70000])
    if r < 0.1:
        return rng.randint(0, big)
    return rng.randint(0, small)


def rand_text(rng):
    n = rand_len(rng, 30, 300)
    alphabet = "ab09-_ \u00e9\u00fc\u4e16\u754c\U0001F600\u0000\u007f"
    if rng.random() < 0.5:
        return "".join(rng.choice("0123456789abcdef") for _ in range(n))
    return "".join(rng.choice(alphabet) for _ in range(n))


def rand_uint(rng):
    if rng.random() < 0.3:
        return rng.choice(UINT_EDGES)
    return rng.getrandbits(rng.randint(1, 64)) or 1


def rand_key(rng):
    r = rng.random()
    if r < 0.3:
        return rand_uint(rng)
    if r < 0.6:
        # (mm hash, offset - block start): past items give negative offsets.
        rel = rng.choice([0, 1, -1, 23, 24, -24, -25, 2**31, -(2**40)]) if rng.random() < 0.3 \
            else rng.randint(-5000, 5000)
        return (rand_text(rng), rel)
    return rand_text(rng)


def block_case(rng):
    algo = rng.choice([pyref.SHA256_CBOR, pyref.XXH3_128])
    parent = bytes(rng.getrandbits(8) for _ in range(rng.choice([32, 16, 16, 0, 5])))
    tokens = [rand_token(rng) for _ in range(rand_len(rng, 40, 400))]
    extra = None
    if rng.random() < 0.6:
        extra = tuple(rand_key(rng) for _ in range(rng.choice([1, 1, 2, 3, 5, 23, 24, 30])))
    line = "B %d %s %d %s %d" % (algo, x(parent), len(tokens), " ".join(map(str, tokens)),
                                 len(extra or ()))
    for k in extra or ():
        if isinstance(k, int):
            line += " u %d" % k
        elif isinstance(k, tuple):
            line += " m %s %d" % (x(k[0].encode()), k[1])
        else:
            line += " s %s" % x(k.encode())
    data = pyref.cbor((parent, tuple(tokens), extra))
    return line, "%s %s" % (data.hex(), pyref.digest(algo, data).hex())


def root_case(rng):
    algo = rng.choice([pyref.SHA256_CBOR, pyref.XXH3_128])
    seed = rand_text(rng) if rng.random() < 0.8 else str(rng.getrandbits(64))
    data = pyref.cbor(seed)
    return ("R %d %s" % (algo, x(seed.encode())),
            "%s %s" % (data.hex(), pyref.root(algo, seed).hex()))


def prefix_case(rng, tagged=False):
    algo = rng.choice([pyref.SHA256_CBOR, pyref.XXH3_128])
    bs = rng.choice([1, 2, 3, 7, 16, 16, 16, 32])
    n = rng.randint(0, 400)
    tokens = [rand_token(rng) for _ in range(n)]
    seed = rand_text(rng) if rng.random() < 0.5 else ""
    lora = 0 if rng.random() < 0.5 else rand_uint(rng)
    lora_name = rand_text(rng) if rng.random() < 0.3 else ""
    salt = rand_text(rng) if rng.random() < 0.4 else ""
    mm = []
    pos = rng.randint(0, 40)
    while rng.random() < 0.7 and pos < n + 20:
        length = rng.choice([1, 2, bs, bs + 1, rng.randint(1, 120)])
        mm.append((pos, length, rand_text(rng) or "h"))
        pos += length + rng.choice([0, 0, 1, bs, rng.randint(0, 50)])
    lora_path = rand_text(rng) if tagged and rng.random() < 0.7 else ""
    path = " " + x(lora_path.encode()) if tagged else ""
    line = "%s %d %d %s %d %s%s %s %d" % ("T" if tagged else "P", algo, bs, x(seed.encode()), lora,
                                         x(lora_name.encode()), path, x(salt.encode()), len(mm))
    for off, length, h in mm:
        line += " %d %d %s" % (off, length, x(h.encode()))
    line += " %d %s" % (n, " ".join(map(str, tokens)))
    hashes = pyref.prefix(algo, seed, bs, tokens, lora, salt, mm, lora_name, tagged=tagged,
                          lora_path=lora_path)
    return line, ",".join(h.hex() for h in hashes) or "-"


def main():
    exe = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    seed = int(os.environ.get("PKV_HASH_SEED", random.SystemRandom().getrandbits(32)))
    print("crosscheck: seed %d (PKV_HASH_SEED=%d replays), %d cases" % (seed, seed, count))
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        r = i % 10
        cases.append(root_case(rng) if r == 0 else prefix_case(rng) if r < 3
                     else prefix_case(rng, tagged=True) if r < 5 else block_case(rng))
    proc = subprocess.run([exe], input="\n".join(c[0] for c in cases) + "\n",
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print("crosscheck: helper exited %d: %s" % (proc.returncode, proc.stderr))
        return 1
    got = proc.stdout.split("\n")
    bad = 0
    for i, (line, want) in enumerate(cases):
        have = got[i] if i < len(got) else "<missing>"
        if have != want:
            bad += 1
            if bad <= 3:
                print("MISMATCH case %d\n  input: %.300s\n  want:  %.300s\n  got:   %.300s"
                      % (i, line, want, have))
    print("crosscheck: %d/%d cases agree" % (count - bad, count))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
