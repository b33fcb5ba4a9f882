"""Reference block hashing in Python, written independently of the C++ code.

Hashes follow vLLM's sha256_cbor: hashlib.sha256(cbor2.dumps(x, canonical=True)),
and xxh3_128 is xxhash.xxh3_128_digest over the same bytes. Extra keys follow
vLLM's generate_block_hash_extra_keys (LoRA id, then mm hashes, then the cache
salt on the first block), including its stateful walk over mm items.
"""

import hashlib

import cbor2
import xxhash

SHA256_CBOR = 1
XXH3_128 = 2


def cbor(x):
    return cbor2.dumps(x, canonical=True)


def digest(algo, data):
    if algo == SHA256_CBOR:
        return hashlib.sha256(data).digest()
    if algo == XXH3_128:
        return xxhash.xxh3_128_digest(data)
    raise ValueError(algo)


def root(algo, seed):
    return digest(algo, cbor(seed))


def block(algo, parent, tokens, extra):
    """extra: None or a tuple of ints / strs."""
    return digest(algo, cbor((parent, tuple(tokens), extra)))


def _mm_keys(mm_items, start, end, idx):
    # The walk of vLLM's _gen_mm_extra_hash_keys over mm items sorted by offset.
    keys = []
    if not mm_items:
        return keys, idx
    last_off, last_len, _ = mm_items[-1]
    if last_off + last_len <= start:
        return keys, idx
    while idx < len(mm_items):
        off, length, h = mm_items[idx]
        if end > off:
            if start >= off + length:
                idx += 1
                continue
            keys.append(h)
            if end >= off + length:
                idx += 1
            else:
                break
        else:
            break
    return keys, idx


def prefix(algo, seed, block_size, tokens, lora_id=0, salt="", mm_items=()):
    """Block hashes of the full blocks of tokens. mm_items: [(offset, length, hash)]."""
    parent = root(algo, seed)
    out = []
    mm_idx = 0
    for b in range(len(tokens) // block_size):
        start, end = b * block_size, (b + 1) * block_size
        mm, mm_idx = _mm_keys(list(mm_items), start, end, mm_idx)
        keys = ([lora_id] if lora_id else []) + mm + ([salt] if start == 0 and salt else [])
        parent = block(algo, parent, tokens[start:end], tuple(keys) if keys else None)
        out.append(parent)
    return out


def lcg_tokens(count, seed, lo, hi):
    """Deterministic tokens in [lo, hi], reproduced by the C++ tests."""
    x = seed & 0xFFFFFFFFFFFFFFFF
    span = hi - lo + 1
    out = []
    for _ in range(count):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        out.append(lo + (x >> 11) % span)
    return out
