"""Prefix hashing without a pool, for routers predicting cache hits."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, List, Optional

from . import _pagedkv as _c
from ._types import MAX_TOKENS, HashAlgo, MMItemLike, _check_len, mm_tuples


def hash_size(algo: Any = HashAlgo.SHA256_CBOR) -> int:
    """Digest length in bytes of a hash algorithm."""
    return HashAlgo.parse(algo).digest_size


def hash_root(algo: Any = HashAlgo.SHA256_CBOR, seed: str = "") -> bytes:
    """The root hash h_{-1} = H(cbor(seed))."""
    a = HashAlgo.parse(algo)
    return _c.pkv_hash_root(int(a), seed)[: a.digest_size]


def hash_prefix(
    tokens: Any,
    *,
    block_size: int = 16,
    algo: Any = HashAlgo.SHA256_CBOR,
    seed: str = "",
    lora_id: int = 0,
    cache_salt: Optional[str] = None,
    mm_items: Iterable[MMItemLike] = (),
    lora_name: Optional[str] = None,
    strict_key_domains: bool = False,
    tagged_keys: bool = False,
    lora_path: Optional[str] = None,
) -> List[bytes]:
    """Chained hashes of the full blocks of tokens, exactly as a pool with the
    same block_size, algo, seed and strict_key_domains computes them
    (vLLM-compatible for sha256_cbor without strict_key_domains: current vLLM
    keys a LoRA adapter by lora_name, older vLLM by lora_id). tagged_keys:
    vLLM 0.33's tagged extra keys, ("lora", lora_name, lora_path), ("mm",
    hash, offset), ("cache_salt", salt), as a pool with tagged_keys=True.
    Returns floor(len(tokens) / block_size) digests.

    At most 2**31 - 1 tokens, the most a pool's sequence holds (the C call
    itself has no limit): more is InvalidArgumentError, raised from the
    length before the tokens are read or copied."""
    from ._pool import _index, _key_domains

    a = HashAlgo.parse(algo)
    block_size = _index(block_size, "block_size")
    opts = {
        "algo": int(a),
        "block_size": block_size,
        "seed": seed,
        "lora_id": _index(lora_id, "lora_id"),
        "cache_salt": cache_salt,
        "lora_name": lora_name,
        "lora_path": lora_path,
        "mm_items": mm_tuples(mm_items),
        "strict_key_domains": _key_domains(strict_key_domains, tagged_keys),
    }
    _check_len(tokens, "tokens", MAX_TOKENS)  # before list() or the conversion's copy
    if isinstance(tokens, Iterator):  # a generator: read once, as Sequence.append reads it
        tokens = list(tokens)
    try:
        # A list or tuple subclass is read as the list or tuple it is (the
        # conversion does not call its __len__): its own length sizes the
        # result, whatever __len__ says.
        if isinstance(tokens, list):
            n = list.__len__(tokens)
        elif isinstance(tokens, tuple):
            n = tuple.__len__(tokens)
        else:
            n = len(tokens)
    except TypeError:  # "object of type 'int' has no len()", naming nothing
        raise TypeError(f"tokens: expected a sequence or buffer of ints, got {type(tokens).__name__}") from None
    capacity = n // block_size if block_size > 0 else 0
    try:
        hashes = _c.pkv_hash_prefix(opts, tokens, capacity)
    except _c.BufferTooSmallError:
        # Iterating tokens gave more items than its __len__ said (the
        # result was sized by len()): the caller's object, not a buffer of ours.
        raise ValueError(f"tokens: len() gave {n}, but iterating {type(tokens).__name__} gave more items") from None
    return [h[: a.digest_size] for h in hashes]
