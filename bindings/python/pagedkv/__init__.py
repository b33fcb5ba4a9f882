"""pagedkv: paged KV-cache management and kernels for LLM inference.

A :class:`Pool` holds fixed-size KV blocks, a prefix cache and per-sequence
block tables; :class:`Sequence` objects append tokens, fork and truncate;
:meth:`Pool.prepare` builds a :class:`Batch` (one engine step's plan) whose
:meth:`Batch.cache_write` and :meth:`Batch.attention` run the kernels on
tensors from numpy, torch or cupy without copying them.

Errors are :class:`PagedKVError` subclasses, one per library status code.
"""

from __future__ import annotations

from . import _pagedkv, mla, tiers, transfer
from ._batch import Batch
from ._hash import hash_prefix, hash_root, hash_size
from ._pagedkv import (
    BufferTooSmallError,
    CudaError,
    InternalError,
    InvalidArgumentError,
    InvalidStateError,
    InvariantError,
    NotFoundError,
    OutOfBlocksError,
    OutOfMemoryError,
    PagedKVError,
    UnsupportedError,
)
from ._pool import Pool, Sequence
from ._tensor import TensorView
from ._types import (
    KV,
    BatchInfo,
    Device,
    DeviceType,
    DType,
    Event,
    EventType,
    Features,
    HashAlgo,
    KvLayout,
    MMItem,
    PlanArray,
    PoolOptions,
    PoolStats,
    PrefixMatch,
    RetentionRange,
    SequenceInfo,
    SnapshotArray,
    _index,
)
from .events import EventPublisher, EventV2, Medium
from .hybrid import GroupKind, GroupStats, HybridPool, KVGroupSpec
from .transfer import Transfer, TransferEngine

__version__: str = _pagedkv.PKV_VERSION_STRING
"""Version of the headers this package was built against."""

ABI_VERSION: int = _pagedkv.PKV_ABI_VERSION
NULL_BLOCK: int = _pagedkv.PKV_NULL_BLOCK
#: Retention priorities (Sequence.set_retention): blocks without a range sit
#: at PRIORITY_DEFAULT; PRIORITY_PINNED is never evicted (max_pinned_blocks).
PRIORITY_MIN: int = _pagedkv.PKV_PRIORITY_MIN
PRIORITY_DEFAULT: int = _pagedkv.PKV_PRIORITY_DEFAULT
PRIORITY_MAX: int = _pagedkv.PKV_PRIORITY_MAX
PRIORITY_PINNED: int = _pagedkv.PKV_PRIORITY_PINNED


def version() -> str:
    """Version of the loaded library ("MAJOR.MINOR.PATCH")."""
    return str(_pagedkv.pkv_version_string())


def version_number() -> int:
    """MAJOR * 10000 + MINOR * 100 + PATCH of the loaded library."""
    return int(_pagedkv.pkv_version_number())


def abi_version() -> int:
    """ABI version of the loaded library."""
    return int(_pagedkv.pkv_abi_version())


def features() -> Features:
    """What the loaded library was built with."""
    return Features._from_bits(int(_pagedkv.pkv_features()))


def cuda_device_count() -> int:
    """CUDA devices visible to the library (0 without CUDA or a GPU)."""
    return int(_pagedkv.pkv_cuda_device_count())


def status_string(status: int) -> str:
    """Static text naming a status code."""
    return str(_pagedkv.pkv_status_string(_index(status, "status")))  # int() parsed "-1"


__all__ = [
    "ABI_VERSION",
    "KV",
    "NULL_BLOCK",
    "PRIORITY_DEFAULT",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "PRIORITY_PINNED",
    "Batch",
    "BatchInfo",
    "BufferTooSmallError",
    "CudaError",
    "DType",
    "Device",
    "DeviceType",
    "Event",
    "EventPublisher",
    "EventType",
    "EventV2",
    "Features",
    "GroupKind",
    "GroupStats",
    "HashAlgo",
    "HybridPool",
    "InternalError",
    "InvalidArgumentError",
    "InvalidStateError",
    "InvariantError",
    "KVGroupSpec",
    "KvLayout",
    "MMItem",
    "Medium",
    "NotFoundError",
    "OutOfBlocksError",
    "OutOfMemoryError",
    "PagedKVError",
    "PlanArray",
    "Pool",
    "PoolOptions",
    "PoolStats",
    "PrefixMatch",
    "RetentionRange",
    "Sequence",
    "SequenceInfo",
    "SnapshotArray",
    "TensorView",
    "Transfer",
    "TransferEngine",
    "UnsupportedError",
    "abi_version",
    "cuda_device_count",
    "features",
    "hash_prefix",
    "hash_root",
    "hash_size",
    "mla",
    "status_string",
    "tiers",
    "transfer",
    "version",
    "version_number",
]
