"""Offload tiers for the prefix cache (``pagedkv/tiers.h``).

Blocks evicted from a pool's prefix cache go to host memory (and a file
below it) on a copy thread; :func:`match_prefix_tiered` finds them again and
the next :meth:`Pool.prepare` loads them back, checksum verified. A corrupt
or unreadable block is a miss: the plan raises :class:`InvalidStateError`
naming the tokens to compute, never serving its bytes.

    pool = Pool(num_blocks=..., num_layers=..., ...)
    tiers.attach(pool, host_bytes=8 << 30, file_dir="/mnt/nvme", file_bytes=64 << 30)
    seq = pool.create_sequence()
    m = tiers.match_prefix_tiered(seq, prompt)   # m.num_cached tokens need no prefill
    seq2, m2 = tiers.admit_tiered(pool, prompt)  # or admission in one call
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Optional, Tuple

from . import _pagedkv as _c
from ._pool import Sequence, _adopt_seq, _check_pool, _count, _index, _seq_opts
from ._types import MMItemLike, _copy_fields, _flag

if TYPE_CHECKING:
    from ._pool import Pool

MEDIUM_DEVICE: int = _c.PKV_MEDIUM_DEVICE
MEDIUM_HOST: int = _c.PKV_MEDIUM_HOST
MEDIUM_FILE: int = _c.PKV_MEDIUM_FILE


@dataclass(frozen=True)
class TierMatch:
    """What :func:`match_prefix_tiered` attached, in tokens (``pkv_tier_match``)."""

    num_cached: int
    device_tokens: int
    host_tokens: int
    file_tokens: int

    @classmethod
    def _from_c(cls, s: Any) -> TierMatch:
        return _copy_fields(cls, s)


@dataclass(frozen=True)
class TierStats:
    """Counters of one tier (``pkv_tier_stats``). ``bytes_loaded / load_ns``
    is the load bandwidth in bytes per nanosecond."""

    medium: int
    capacity_blocks: int
    num_blocks: int
    bytes: int
    num_stored: int
    num_removed: int
    num_hits: int
    num_loaded: int
    bytes_stored: int
    bytes_loaded: int
    load_ns: int
    num_checksum_failures: int
    num_io_errors: int
    num_dropped: int

    @classmethod
    def _from_c(cls, s: Any) -> TierStats:
        return _copy_fields(cls, s)


def attach(pool: Pool, *, host_bytes: int, file_dir: Optional[str] = None, file_bytes: int = 0) -> None:
    """Gives a pool with storage (CPU, or CUDA: page-locked host memory) a
    host tier of host_bytes and, with file_dir, a file tier of file_bytes
    below it. host_bytes=0 with a
    file_dir: a file tier alone, each evicted block hashed and written
    straight from the pool (one pass). Once per pool."""
    _check_pool(pool)
    opts = {"host_bytes": _count(host_bytes, "host_bytes"), "file_bytes": _count(file_bytes, "file_bytes")}
    if file_dir is not None:
        opts["file_dir"] = file_dir
    pool._call(_c.pkv_pool_attach_tiers, opts)


def match_prefix_tiered(seq: Sequence, tokens: Any, hashes: Any = None) -> TierMatch:
    """Sequence.match_prefix, continued with blocks found in the tiers; those
    are loaded by the next plan (before anything reads them). hashes: the
    tokens' block hashes computed beforehand (:meth:`Pool.hash_prefix` with
    the sequence's keys; ``pkv_seq_match_prefix_hashes_tiered``), checked as
    by Sequence.match_prefix and followed through the tiers too."""
    if not isinstance(seq, Sequence):  # an id raised AttributeError naming `_pool`
        raise TypeError(f"seq: expected a pagedkv.Sequence, got {type(seq).__name__}")
    if hashes is None:
        return TierMatch._from_c(seq._pool._call(_c.pkv_seq_match_prefix_tiered, seq._id, tokens))
    return TierMatch._from_c(seq._pool._call(_c.pkv_seq_match_prefix_hashes_tiered, seq._id, tokens, hashes))


def admit_tiered(
    pool: Pool,
    tokens: Any,
    *,
    hashes: Any = None,
    lookahead: int = 0,
    priority: int = 0,
    lora_id: int = 0,
    cache_salt: Optional[str] = None,
    mm_items: Iterable[MMItemLike] = (),
    lora_name: Optional[str] = None,
    owned: bool = True,
    lora_path: Optional[str] = None,
) -> Tuple[Sequence, TierMatch]:
    """Pool.admit whose lookup goes on into the tiers after the device hits
    (``pkv_seq_admit_tiered``). The prompt fits exactly when it fits
    Pool.admit (tier hits take blocks the prompt needs anyway), and then
    every tier hit is taken; all or nothing (OutOfBlocksError: no sequence,
    no hit). Returns (sequence, TierMatch): ``num_cached`` tokens need no
    prefill, and the next plan loads the host and file ones. owned: as
    Pool.admit's (False: the Sequence object does not free the sequence
    when it is collected; the id stays the engine's to free)."""
    _check_pool(pool)
    opts = _seq_opts(priority, lora_id, cache_salt, mm_items, lora_name, lora_path)
    owned = _flag(owned, "owned")
    la = _index(lookahead, "lookahead")
    h = pool._h
    seq, m = _adopt_seq(pool, h, owned, _c.pkv_seq_admit_tiered, h, opts, tokens, hashes, la)
    return seq, TierMatch._from_c(m)


def stats(pool: Pool, medium: int = MEDIUM_HOST) -> TierStats:
    """The counters of the pool's host (MEDIUM_HOST) or file (MEDIUM_FILE) tier."""
    _check_pool(pool)
    return TierStats._from_c(pool._call(_c.pkv_pool_get_tier_stats, _count(medium, "medium")))


def flush(pool: Pool) -> None:
    """Waits until queued offloads are in their tier and pending loads ran."""
    _check_pool(pool)
    pool._call(_c.pkv_pool_flush_tiers)


__all__ = [
    "MEDIUM_DEVICE",
    "MEDIUM_FILE",
    "MEDIUM_HOST",
    "TierMatch",
    "TierStats",
    "admit_tiered",
    "attach",
    "flush",
    "match_prefix_tiered",
    "stats",
]
