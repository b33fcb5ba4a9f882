"""Several KV groups in one pool (``pagedkv/groups.h``): hybrid models.

A :class:`HybridPool` gives each group of layers (full attention, sliding
window, MLA latent, recurrent state) its own block table per sequence, all drawing block ids
from one budget, with prefix caching keyed by (block hash, group): a hit is
the longest prefix every group can serve, as vLLM's hybrid coordinator finds
it. It is manager only: the engine owns the KV tensors. Sequences are the
ordinary :class:`pagedkv.Sequence` (append, reserve, fork, truncate, free act on every
group, all or nothing); ``Sequence.block_table()`` is group 0's table.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple
from typing import Sequence as Seq

from . import _pagedkv as _c
from ._handle import _adopt_handle
from ._pagedkv import NotFoundError
from ._pool import Pool, Sequence, _key_domains
from ._types import DType, HashAlgo, PoolOptions, _check_len, _flag, _index

#: A group's most layers (pkv_kv_group_spec.num_layers) and a pool's most
#: groups (pkv_pool_create_groups).
_MAX_GROUP_LAYERS = 65536
_MAX_GROUPS = 64


class GroupKind(enum.IntEnum):
    """``PKV_GROUP_*``."""

    FULL = _c.PKV_GROUP_FULL
    SLIDING_WINDOW = _c.PKV_GROUP_SLIDING_WINDOW
    MLA = _c.PKV_GROUP_MLA
    RECURRENT = _c.PKV_GROUP_RECURRENT


@dataclass(frozen=True)
class KVGroupSpec:
    """One group of layers (``pkv_kv_group_spec``). Use the constructors
    :meth:`full`, :meth:`window`, :meth:`mla` and :meth:`recurrent`."""

    kind: GroupKind = GroupKind.FULL
    num_layers: int = 1
    num_kv_heads: int = 0
    head_dim: int = 0
    sliding_window: int = 0
    kv_lora_rank: int = 0
    rope_dim: int = 0
    dtype: Any = None
    state_bytes: int = 0
    #: The model layers of this group (``num_layers`` ints), e.g. the odd
    #: layers of a sliding-window/full interleave. Give them for every group
    #: or for none; without them layers are numbered through the groups in
    #: order. :meth:`HybridPool.group_of_layer` maps them back.
    layer_ids: Optional[Tuple[int, ...]] = None
    #: Recurrent groups: every step plan gives a state snapshot slot at each
    #: block boundary inside each query chunk (``PKV_GROUP_SNAPSHOT_EVERY_BLOCK``),
    #: read with ``plan_group(g, SnapshotArray.*)``, so a prompt
    #: prefilled in one chunk can be hit at any of its block boundaries.
    snapshot_every_block: bool = False

    @classmethod
    def full(
        cls, num_layers: int, num_kv_heads: int, head_dim: int, dtype: Any = None, layer_ids: Any = None
    ) -> KVGroupSpec:
        return cls(GroupKind.FULL, num_layers, num_kv_heads, head_dim, dtype=dtype, layer_ids=_ids(layer_ids))

    @classmethod
    def window(
        cls,
        sliding_window: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: Any = None,
        layer_ids: Any = None,
    ) -> KVGroupSpec:
        return cls(
            GroupKind.SLIDING_WINDOW,
            num_layers,
            num_kv_heads,
            head_dim,
            sliding_window,
            dtype=dtype,
            layer_ids=_ids(layer_ids),
        )

    @classmethod
    def mla(
        cls, num_layers: int, kv_lora_rank: int = 512, rope_dim: int = 64, dtype: Any = None, layer_ids: Any = None
    ) -> KVGroupSpec:
        return cls(
            GroupKind.MLA,
            num_layers,
            kv_lora_rank=kv_lora_rank,
            rope_dim=rope_dim,
            dtype=dtype,
            layer_ids=_ids(layer_ids),
        )

    @classmethod
    def recurrent(
        cls, num_layers: int, state_bytes: int, layer_ids: Any = None, snapshot_every_block: bool = False
    ) -> KVGroupSpec:
        """A fixed-size state per sequence (Mamba): ``state_bytes`` per layer.
        Each sequence holds one state slot; with prefix caching the state at
        block boundaries is kept as a snapshot that later prompts resume from
        (copies from :meth:`HybridPool.take_copies`): where appends start,
        and with ``snapshot_every_block`` at every block boundary inside a
        committed plan's query chunk, written by the engine into the slots
        the plan's ``SnapshotArray`` arrays name."""
        return cls(
            GroupKind.RECURRENT,
            num_layers,
            state_bytes=state_bytes,
            layer_ids=_ids(layer_ids),
            snapshot_every_block=_flag(snapshot_every_block, "snapshot_every_block", none_is_false=True),
        )

    def _to_c(self) -> dict:
        d = {
            "kind": _index(self.kind, "kind"),
            "num_layers": _index(self.num_layers, "num_layers"),
            "num_kv_heads": _index(self.num_kv_heads, "num_kv_heads"),
            "head_dim": _index(self.head_dim, "head_dim"),
            "sliding_window": _index(self.sliding_window, "sliding_window"),
            "kv_lora_rank": _index(self.kv_lora_rank, "kv_lora_rank"),
            "rope_dim": _index(self.rope_dim, "rope_dim"),
            "state_bytes": _index(self.state_bytes, "state_bytes"),
            # A spec built directly (or by dataclasses.replace) skips
            # recurrent()'s check: bool() read snapshot_every_block="no" as True.
            "flags": _c.PKV_GROUP_SNAPSHOT_EVERY_BLOCK
            if _flag(self.snapshot_every_block, "snapshot_every_block", none_is_false=True)
            else 0,
        }
        if self.dtype is not None:
            d["dtype"] = int(DType.parse(self.dtype))
        if self.layer_ids is not None:
            # a spec built directly (or by dataclasses.replace) skips _ids' bound
            d["layer_ids"] = list(_ids(self.layer_ids))
        return d


def _check_seq(seq: Any) -> None:
    # An id reached seq.info(): AttributeError "'int' object has no attribute 'info'".
    if not isinstance(seq, Sequence):
        raise TypeError(f"seq: expected a pagedkv.Sequence, got {type(seq).__name__}")


def _ids(layer_ids: Any) -> Optional[Tuple[int, ...]]:
    """layer_ids as a tuple of ints, read no further than a group's most
    layers: ``layer_ids=range(2**40)`` built a tuple of 2^40 ints (the
    process hung, then was killed for memory), as did an endless iterator."""
    if layer_ids is None:
        return None
    _check_len(layer_ids, "layer_ids", _MAX_GROUP_LAYERS)  # before anything is read
    try:
        it = iter(layer_ids)
    except TypeError:  # "'int' object is not iterable", naming nothing
        raise TypeError(f"layer_ids: expected a sequence of ints, got {type(layer_ids).__name__}") from None
    ids = tuple(_index(i, "layer_ids") for i in itertools.islice(it, _MAX_GROUP_LAYERS + 1))
    if len(ids) > _MAX_GROUP_LAYERS:
        raise _c.InvalidArgumentError(
            f"layer_ids: more than {_MAX_GROUP_LAYERS} entries (a group's most layers)", _c.PKV_E_INVALID_ARGUMENT
        )
    return ids


@dataclass(frozen=True)
class GroupStats:
    """Counters of one group (``pkv_group_stats``)."""

    kind: GroupKind
    num_used_blocks: int
    num_cached_blocks: int
    num_null_entries: int
    bytes_per_block: int


class HybridPool(Pool):
    """A manager-only pool of several KV groups on one block budget.

    ``groups``: :class:`KVGroupSpec` entries (1..64). ``num_blocks`` or
    ``memory_budget_bytes`` sets the budget; a block costs the largest
    group's page over its layers (groups alias one arena, as in vLLM), which
    ``bytes_per_block`` and the stats' ``kv_bytes_*`` report.
    ``strict_key_domains`` and ``tagged_keys`` (vLLM 0.33's tagged extra
    keys) key every group's blocks as they key a :class:`Pool`'s.
    """

    def __init__(
        self,
        groups: Seq[KVGroupSpec],
        *,
        num_blocks: Optional[int] = None,
        block_size: Optional[int] = None,
        memory_budget_bytes: Optional[int] = None,
        hash_algo: Any = None,
        hash_seed: Optional[str] = None,
        enable_prefix_caching: Optional[bool] = None,
        strict_key_domains: Optional[bool] = None,
        tagged_keys: Optional[bool] = None,
    ) -> None:
        self._refuse_second_init("pool")
        opts: dict = {}
        for key, value in (
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("memory_budget_bytes", memory_budget_bytes),
        ):
            if value is not None:
                opts[key] = _index(value, key)
        if hash_algo is not None:
            opts["hash_algo"] = int(HashAlgo.parse(hash_algo))
        if hash_seed is not None:
            opts["hash_seed"] = hash_seed
        if enable_prefix_caching is not None:
            opts["enable_prefix_caching"] = int(_flag(enable_prefix_caching, "enable_prefix_caching"))
        if strict_key_domains is not None or tagged_keys is not None:
            opts["strict_key_domains"] = _key_domains(strict_key_domains, tagged_keys)
        _check_len(groups, "groups", _MAX_GROUPS)  # tuple(range(2**40)) took the machine's memory
        try:
            self._groups = tuple(itertools.islice(iter(groups), _MAX_GROUPS + 1))
        except TypeError:  # "'int' object is not iterable", naming nothing
            raise TypeError(f"groups: expected a sequence of KVGroupSpec, got {type(groups).__name__}") from None
        if len(self._groups) > _MAX_GROUPS:
            raise _c.InvalidArgumentError(
                f"groups: more than {_MAX_GROUPS} groups (pkv_pool_create_groups)", _c.PKV_E_INVALID_ARGUMENT
            )
        for i, g in enumerate(self._groups):
            if not isinstance(g, KVGroupSpec):
                raise TypeError(f"groups[{i}]: expected a KVGroupSpec, got {type(g).__name__}")
        specs = [g._to_c() for g in self._groups]
        # The raw call and self._h in one C call (see Pool.__init__).
        h = _adopt_handle(self, _c.pkv_pool_destroy, "pool", _c.pkv_pool_create_groups, opts, specs)
        try:
            self._options = PoolOptions._from_c(_c.pkv_pool_get_options(h))
            self._bytes_per_block = int(_c.pkv_pool_bytes_per_block(h))
        except BaseException:
            self._h.close()
            raise
        self._digest = self._options.hash_algo.digest_size

    @property
    def groups(self) -> Tuple[KVGroupSpec, ...]:
        return self._groups

    @property
    def num_groups(self) -> int:
        return int(self._call(_c.pkv_pool_num_groups))

    def __repr__(self) -> str:
        kinds = ", ".join(g.kind.name.lower() for g in self._groups)
        closed = ", closed" if self.closed else ""  # as Pool's repr says it
        return f"HybridPool(groups=[{kinds}], num_blocks={self.num_blocks}, block_size={self.block_size}{closed})"

    def group_of_layer(self, layer: int) -> Tuple[int, int]:
        """The group holding model layer ``layer`` and the layer's index among
        that group's layers (``KeyError`` for a layer no group holds)."""
        try:
            g, k = self._call(_c.pkv_pool_group_of_layer, _index(layer, "layer"))
        except NotFoundError as e:
            raise KeyError(layer) from e
        return int(g), int(k)

    def group_block_table(self, seq: Sequence, group: int) -> List[int]:
        """The block table of ``seq`` in ``group`` (0, the null block, where
        its sliding window released one)."""
        _check_seq(seq)
        group = _index(group, "group")
        cap = max(1, seq.info().num_slots // self.block_size)
        while True:
            try:
                return list(self._call(_c.pkv_seq_group_block_table, seq.id, group, cap))
            except _c.BufferTooSmallError:  # grew on another thread meanwhile
                cap *= 2

    def block_tables(self, seq: Sequence) -> List[List[int]]:
        """Every group's table of ``seq``, in group order."""
        _check_seq(seq)
        return [self.group_block_table(seq, g) for g in range(len(self._groups))]

    def group_stats(self, group: int) -> GroupStats:
        s = self._call(_c.pkv_pool_group_stats, _index(group, "group"))
        return GroupStats(
            GroupKind(s.kind), s.num_used_blocks, s.num_cached_blocks, s.num_null_entries, s.bytes_per_block
        )

    def take_copies(self, group: int) -> Tuple[List[int], List[int]]:
        """Copy-on-write copies (src, dst) recorded for ``group`` since the
        last call; the engine copies those pages in every layer of the group
        before the next step writes."""
        group = _index(group, "group")
        cap = 16
        while True:
            try:
                src, dst = self._call(_c.pkv_pool_group_take_copies, group, cap)
                return list(src), list(dst)
            except _c.BufferTooSmallError:
                cap *= 4


__all__ = ["GroupKind", "GroupStats", "HybridPool", "KVGroupSpec"]
