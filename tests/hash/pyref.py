"""Reference block hashing in Python, written independently of the C++ code.

Hashes follow vLLM's sha256_cbor: hashlib.sha256(cbor2.dumps(x, canonical=True)),
and xxh3_128 is xxhash.xxh3_128_digest over the same bytes. Extra keys follow
vLLM's generate_block_hash_extra_keys as of vLLM main, 2025-11 (LoRA name, then
one (mm hash, offset - block start) pair per overlapping mm item, then the cache
salt on the first block), including its stateful walk over mm items and its
incremental hashing of blocks completed after the prompt (last mm item only).
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
    """extra: None or a tuple of ints, strs and (str, int) pairs."""
    return digest(algo, cbor((parent, tuple(tokens), extra)))


def _mm_keys(mm_items, start, end, idx, tagged=False):
    """vLLM's _gen_mm_extra_hash_keys: walks mm items (sorted by offset) from
    index idx (-1: the last item only) and keys each item the block
    [start, end) overlaps as (hash, offset - start)."""
    keys = []
    if not mm_items:
        return keys, idx
    last_off, last_len, _ = mm_items[-1]
    if last_off + last_len <= start:
        return keys, idx
    if idx < 0:
        idx += len(mm_items)
    while idx < len(mm_items):
        off, length, h = mm_items[idx]
        if end <= off:
            break  # the block ends before this item
        if start >= off + length:
            idx += 1  # the block starts after this item
            continue
        keys.append(("mm", h, off - start) if tagged else (h, off - start))
        if end < off + length:
            break  # the item goes on past this block
        idx += 1
    return keys, idx


def prefix(algo, seed, block_size, tokens, lora_id=0, salt="", mm_items=(), lora_name="",
           prompt_len=None, tagged=False, lora_path=""):
    """Block hashes of the full blocks of tokens, as vLLM's request block
    hasher produces them: every full block of the first prompt_len tokens
    (default: all) in one pass from the first mm item, then the tokens after
    the prompt one at a time (decode), each pass over new blocks starting from
    the last mm item. mm_items: [(offset, length, hash)]. LoRA keys: the id
    (older vLLM) and/or the name (current vLLM), id first. tagged: vLLM
    0.33.0's generate_block_hash_extra_keys, which tags every key:
    ("lora", name, path), ("mm", hash, offset - start), ("cache_salt", salt)
    (the id, which no tagging vLLM keys, stays bare)."""
    mm_items = list(mm_items)
    parent = root(algo, seed)
    out = []
    n = len(tokens) if prompt_len is None else prompt_len
    calls = [n] + list(range(n + 1, len(tokens) + 1))
    for num_tokens in calls:
        start = len(out) * block_size
        mm_idx = -1 if start > 0 else 0
        while start + block_size <= num_tokens:
            end = start + block_size
            mm, mm_idx = _mm_keys(mm_items, start, end, mm_idx, tagged)
            if tagged:
                lora = [("lora", lora_name, lora_path)] if lora_name else []
                salted = [("cache_salt", salt)] if start == 0 and salt else []
            else:
                lora = [lora_name] if lora_name else []
                salted = [salt] if start == 0 and salt else []
            keys = ([lora_id] if lora_id else []) + lora + mm + salted
            parent = block(algo, parent, tokens[start:end], tuple(keys) if keys else None)
            out.append(parent)
            start = end
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
