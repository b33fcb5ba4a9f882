"""Pool and Sequence: the block manager, prefix cache and KV storage."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, Iterator, List, Optional, Tuple, Union
from typing import Sequence as Seq

from . import _pagedkv as _c
from ._handle import HandleOwner, NoCopy, _adopt_handle
from ._tensor import TensorView, describe, stream_ptr
from ._types import (
    KV,
    MAX_KV_SCALES,
    MAX_SEQS,
    MAX_TOKENS,
    Device,
    DeviceType,
    DType,
    Event,
    HashAlgo,
    KvLayout,
    MMItemLike,
    PoolOptions,
    PoolStats,
    PrefixMatch,
    RetentionRange,
    SequenceInfo,
    _check_len,
    _flag,
    _index,
    _no_mm,
    _real,
    mm_tuples,
)

if TYPE_CHECKING:
    from ._batch import Batch

Tokens = Union[Seq[int], Any]  # any int sequence or int32 buffer (numpy, array.array)

_EVENT_CHUNK = 256
_NO_MM: tuple = ()  # create_sequence's mm_items default, told by identity


class Pool(HandleOwner):
    """A KV block pool: block manager, prefix cache and (optionally) the KV
    storage of ``num_layers`` layers.

    Every argument is optional; omitted ones take the library's defaults
    (block_size 16, sha256_cbor hashing, prefix caching on, bf16, CPU). With
    ``num_layers == 0`` the pool manages block tables only.

    A Pool is a context manager; ``close()`` is idempotent. Sequences and
    step plans keep their pool alive; operations on a closed pool raise
    :class:`InvalidStateError`; views of its storage keep the memory until
    they are gone. Every method may be called from any thread.
    """

    def __init__(
        self,
        *,
        num_blocks: Optional[int] = None,
        block_size: Optional[int] = None,
        memory_budget_bytes: Optional[int] = None,
        num_layers: Optional[int] = None,
        num_kv_heads: Optional[int] = None,
        head_dim: Optional[int] = None,
        dtype: Any = None,
        device: Any = None,
        hash_algo: Any = None,
        hash_seed: Optional[str] = None,
        enable_prefix_caching: Optional[bool] = None,
        sliding_window: Optional[int] = None,
        enable_events: Optional[bool] = None,
        max_events: Optional[int] = None,
        num_threads: Optional[int] = None,
        strict_key_domains: Optional[bool] = None,
        tagged_keys: Optional[bool] = None,
        kv_scale_granularity: Optional[str] = None,
        k_scales: Optional[Seq[float]] = None,
        v_scales: Optional[Seq[float]] = None,
        enable_partial_reuse: Optional[bool] = None,
        enable_retention: Optional[bool] = None,
        max_pinned_blocks: Optional[int] = None,
        kv_layout: Any = None,
        kv_lora_rank: Optional[int] = None,
        qk_rope_head_dim: Optional[int] = None,
    ) -> None:
        self._refuse_second_init("pool")
        opts: dict = {}
        for key, value in (
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("memory_budget_bytes", memory_budget_bytes),
            ("num_layers", num_layers),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("sliding_window", sliding_window),
            ("max_events", max_events),
            ("num_threads", num_threads),
            ("max_pinned_blocks", max_pinned_blocks),
            ("kv_lora_rank", kv_lora_rank),
            ("qk_rope_head_dim", qk_rope_head_dim),
        ):
            if value is not None:
                opts[key] = _index(value, key)
        if dtype is not None:
            opts["dtype"] = int(DType.parse(dtype))
        if device is not None:
            dev = Device.parse(device)
            opts["device_type"] = int(dev.type)
            opts["device_id"] = dev.index
        if hash_algo is not None:
            opts["hash_algo"] = int(HashAlgo.parse(hash_algo))
        if hash_seed is not None:
            opts["hash_seed"] = hash_seed
        if enable_prefix_caching is not None:
            opts["enable_prefix_caching"] = int(_flag(enable_prefix_caching, "enable_prefix_caching"))
        if enable_events is not None:
            opts["enable_events"] = int(_flag(enable_events, "enable_events"))
        if strict_key_domains is not None or tagged_keys is not None:
            opts["strict_key_domains"] = _key_domains(strict_key_domains, tagged_keys)
        if kv_scale_granularity is not None:
            opts["kv_scale_granularity"] = _scale_granularity(kv_scale_granularity)
        if k_scales is not None or v_scales is not None:
            opts["k_scales"] = _floats(k_scales, "k_scales")
            opts["v_scales"] = _floats(v_scales, "v_scales")
        if enable_partial_reuse is not None:
            opts["enable_partial_reuse"] = int(_flag(enable_partial_reuse, "enable_partial_reuse"))
        if enable_retention is not None:
            opts["enable_retention"] = int(_flag(enable_retention, "enable_retention"))
        if kv_layout is not None:  # "mha" / "mla" (pagedkv.mla)
            opts["kv_layout"] = int(KvLayout.parse(kv_layout))
        # The raw call and self._h in one C call: an interrupt between them
        # dropped the pointer and the pool (its arena) was never destroyed.
        h = _adopt_handle(self, _c.pkv_pool_destroy, "pool", _c.pkv_pool_create, opts)
        try:
            self._options = PoolOptions._from_c(_c.pkv_pool_get_options(h))
            self._bytes_per_block = int(_c.pkv_pool_bytes_per_block(h))
        except BaseException:
            self._h.close()
            raise
        self._digest = self._options.hash_algo.digest_size

    # ------------------------------------------------------------ calls

    def _call(self, fn: Any, *args: Any) -> Any:
        # The handle is pinned for the call by the raw module's typemap.
        return fn(self._h, *args)

    # ------------------------------------------------------------ properties

    @property
    def options(self) -> PoolOptions:
        """The options the pool was created with, num_blocks resolved."""
        return self._options

    @property
    def block_size(self) -> int:
        return self._options.block_size

    @property
    def num_blocks(self) -> int:
        """Total blocks, the null block included."""
        return self._options.num_blocks

    @property
    def num_layers(self) -> int:
        return self._options.num_layers

    @property
    def num_kv_heads(self) -> int:
        return self._options.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self._options.head_dim

    @property
    def dtype(self) -> DType:
        return self._options.dtype

    @property
    def device(self) -> Device:
        return self._options.device

    @property
    def hash_algo(self) -> HashAlgo:
        return self._options.hash_algo

    @property
    def bytes_per_block(self) -> int:
        """K plus V bytes one block takes over all layers (0 without storage)."""
        return self._bytes_per_block

    @property
    def has_storage(self) -> bool:
        return self._options.num_layers > 0

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.num_blocks} blocks of {self.block_size}"
        return f"<pagedkv.Pool {state}, {self.num_layers} layers, {self.dtype}, {self.device}>"

    # ------------------------------------------------------------ state

    def stats(self) -> PoolStats:
        """A snapshot of the pool's counters."""
        return PoolStats._from_c(self._call(_c.pkv_pool_get_stats))

    def events(self, max_events: Optional[int] = None) -> Iterator[Event]:
        """Drains recorded KV events (enable_events=True), oldest first.

        Events are removed from the pool as the iterator advances (in chunks);
        it ends when none are left or after max_events."""
        left = math.inf if max_events is None else _count(max_events, "max_events")
        while left > 0:
            chunk = self._call(_c.pkv_pool_drain_events, int(min(left, _EVENT_CHUNK)))
            for e in chunk:
                yield Event._from_c(e, self._digest)
            left -= len(chunk)
            if len(chunk) < _EVENT_CHUNK:
                return

    def validate(self) -> None:
        """Checks every invariant; raises InvariantError naming a broken one."""
        self._call(_c.pkv_pool_validate)

    def set_clock(self, now_ns: int) -> None:
        """From now on the pool's clock for retention durations reads now_ns
        (tests, simulations; it never runs back); expiries due now apply."""
        self._call(_c.pkv_pool_set_clock, _index(now_ns, "now_ns"))

    def priority_counts(self) -> List[int]:
        """Cached blocks per retention priority: index p for p in 0..100."""
        return list(self._call(_c.pkv_pool_get_priority_counts, _c.PKV_PRIORITY_MAX + 1))

    def reset_prefix_cache(self) -> None:
        """Forgets every cached hash (an ALL_CLEARED event is recorded)."""
        self._call(_c.pkv_pool_reset_prefix_cache)

    # ------------------------------------------------------------ storage

    def kv_tensor(self, layer: int, which: Union[KV, str, int]) -> TensorView:
        """A zero-copy view of one layer's K or V storage, shape [num_blocks,
        num_kv_heads, block_size, head_dim]. The view keeps the storage alive
        (even past close()) until it and arrays made from it are gone."""
        args = (_index(layer, "layer"), int(KV.parse(which)))
        return TensorView._pinned(self._h, _c.pkv_pool_kv_tensor, *args)  # the view releases the pin

    def kv_caches(self) -> List[tuple]:
        """[(k_view, v_view)] for every layer. InvalidStateError on an MLA
        pool, which stores one latent tensor per layer and no V: its
        ``kv_tensor(layer, "k")``."""
        if self._options.kv_layout == KvLayout.MLA:
            # The library would refuse layer 0's V, naming a `which` the
            # caller never passed.
            raise _c.InvalidStateError(
                'kv_caches(): an MLA pool stores one latent tensor per layer and no V; use kv_tensor(layer, "k")',
                _c.PKV_E_INVALID_STATE,
            )
        return [(self.kv_tensor(i, KV.KEY), self.kv_tensor(i, KV.VALUE)) for i in range(self.num_layers)]

    def copy_blocks(self, src: Tokens, dst: Tokens, stream: Any = None) -> None:
        """Copies blocks src[i] -> dst[i] in every layer, K and V. The pairs
        are copied at once: a destination may not be another pair's source
        or destination (InvalidArgumentError, nothing copied)."""
        self._call(_c.pkv_pool_copy_blocks, (src, dst), stream_ptr(stream))

    def swap_out(self, blocks: Tokens, buffer: Any = None, stream: Any = None) -> Any:
        """Copies the given blocks' contents into a host buffer laid out
        [blocks][layers][K,V][heads][block_size][head_dim] (allocated as a
        numpy uint8 array when None; pinned memory for CUDA pools). Returns
        the buffer."""
        _check_len(blocks, "blocks", MAX_TOKENS)  # before list() and the buffer of n blocks
        if isinstance(blocks, Iterator):  # a generator: read once
            blocks = list(blocks)
        try:
            # a list subclass is read as the list it is, whatever its __len__ says
            n = list.__len__(blocks) if isinstance(blocks, list) else len(blocks)
        except TypeError:  # "object of type 'int' has no len()", naming nothing
            raise TypeError(f"blocks: expected a sequence or buffer of ints, got {type(blocks).__name__}") from None
        if buffer is None:
            import numpy as np

            buffer = np.empty(n * self._bytes_per_block, dtype=np.uint8)
        host, keep = _host_buffer(buffer, writable=True)
        self._call(_c.pkv_pool_swap_blocks, blocks, host, _c.PKV_SWAP_OUT, stream_ptr(stream))
        del keep  # held (and the memory with it) until the call returned
        return buffer

    def swap_in(self, blocks: Tokens, buffer: Any, stream: Any = None) -> None:
        """Copies a buffer written by swap_out back into the given blocks
        (a read-only buffer, e.g. bytes, will do: it is only read)."""
        host, keep = _host_buffer(buffer, writable=False)
        self._call(_c.pkv_pool_swap_blocks, blocks, host, _c.PKV_SWAP_IN, stream_ptr(stream))
        del keep  # held (and the memory with it) until the call returned

    # ------------------------------------------------------------ FP8 scales

    def kv_scales(self) -> tuple:
        """(k_scales, v_scales) of an FP8 pool: lists of num_layers floats
        (per tensor) or num_layers * num_kv_heads (per head, layer major).
        InvalidStateError on other dtypes."""
        k, v = self._call(_c.pkv_pool_get_kv_scales, max(1, self._options.num_kv_scales))
        return list(k), list(v)

    def set_kv_scales(self, k_scales: Seq[float], v_scales: Seq[float]) -> None:
        """Replaces an FP8 pool's scales (as many as kv_scales() returns;
        each finite and > 0). Safe while other threads run kernels on the
        pool: they finish with the old scales (docs/threading.md). Stored
        codes stay: they are read with the new scales from now on."""
        self._call(_c.pkv_pool_set_kv_scales, (_floats(k_scales, "k_scales"), _floats(v_scales, "v_scales")))

    # ------------------------------------------------------------ sequences

    def create_sequence(
        self,
        *,
        priority: int = 0,
        lora_id: int = 0,
        cache_salt: Optional[str] = None,
        mm_items: Iterable[MMItemLike] = _NO_MM,
        lora_name: Optional[str] = None,
        owned: bool = True,
        lora_path: Optional[str] = None,
    ) -> Sequence:
        """A new empty sequence. It is freed by free(), by leaving its `with`
        block, by closing the pool, or (owned=True, the default) when the
        returned Sequence object is garbage collected. An engine that keeps
        only ``seq.id`` passes owned=False (or calls ``seq.detach()``): the
        pool then owns the sequence until it is freed explicitly, and
        ``pool.sequence(id)`` gives a handle back. lora_name keys its blocks
        by LoRA adapter name, as current vLLM does; on a pool with
        tagged_keys=True, lora_path too (vLLM 0.33 keys both)."""
        # Every option at its default (the common call): no helper frames.
        # `mm_items is _NO_MM` is the default's identity, never its value (a
        # numpy array's == is an array).
        if (
            owned is True
            and priority.__class__ is int
            and not priority
            and lora_id.__class__ is int
            and not lora_id
            and cache_salt is None
            and lora_name is None
            and lora_path is None
            and mm_items is _NO_MM
        ):
            return _create_seq(self, self._h, True)
        if owned is not True:
            owned = _flag(owned, "owned")
        opts = _seq_opts(priority, lora_id, cache_salt, mm_items, lora_name, lora_path)
        if opts is not None:
            h = self._h
            return _adopt_seq(self, h, owned, _seq_create, h, opts)
        return _create_seq(self, self._h, owned)  # the C defaults: create and wrap in one C call

    def sequence(self, seq_id: int, *, own: bool = False) -> Sequence:
        """A handle for an existing sequence id (NotFoundError if it is stale
        or unknown). The handle borrows: garbage collecting it leaves the
        sequence alone, unless own=True makes this handle its owner (freed
        when collected, as create_sequence's). free() on any handle frees
        the sequence."""
        seq_id = _index(seq_id, "seq_id")
        own = _flag(own, "own", none_is_false=True)
        self._call(_c.pkv_seq_get_info, seq_id)  # NotFoundError for a stale id
        return Sequence(self, seq_id, owned=own)

    def prepare(
        self,
        seqs: Seq[Sequence],
        query_counts: Union[int, Seq[int]] = 1,
        stream: Any = None,
        *,
        persistent_table: bool = False,
    ) -> Batch:
        """The step plan for seqs, each with query_counts[i] new tokens (an
        int applies to all: 1 for decode). Its tokens count as computed
        only when the step is committed: see :class:`Batch`. seqs may be a
        uint64 numpy array of ids (the fastest; the engine then keeps the
        sequences alive while the plan is in use).

        persistent_table=True (``pkv_batch_prepare_ex`` with
        PKV_PREPARE_PERSISTENT_TABLE): the page table is a block table of
        padded rows that the pool keeps across steps, rewriting only the
        rows whose sequence or block table changed: row i holds seqs[i]'s
        pages at ``PAGE_INDICES[i * stride + j]``, 0 (the null block) past
        them, ``PAGE_INDPTR[i] == i * stride``. Keep each sequence at the
        same index from step to step."""
        return _batch_class()(
            self, seqs, query_counts, stream, _flag(persistent_table, "persistent_table", none_is_false=True)
        )

    def prepare_decode(
        self,
        seqs: Any,
        tokens: Tokens,
        stream: Any = None,
        *,
        persistent_table: bool = False,
    ) -> Batch:
        """One decode step in one call (``pkv_batch_prepare_decode``):
        appends tokens[i] (one token id) to seqs[i] and returns the plan whose
        queries are those tokens, as :meth:`append_batch` then
        ``prepare(seqs, 1, stream, persistent_table=...)`` would. seqs:
        Sequence objects of this pool or ids (a uint64 numpy array of ids is
        the fastest: copied whole, not converted); tokens: any int buffer (numpy int32,
        array.array, a CPU torch tensor) or sequence of the same length
        (else InvalidArgumentError).

        All or nothing: when the plan cannot be built (an unknown id:
        NotFoundError; a repeated one: InvalidArgumentError; too few free
        blocks: OutOfBlocksError; a context no committed step wrote:
        InvalidStateError) nothing is appended. The Batch is committed,
        aborted and closed like prepare()'s. UnsupportedError on a
        HybridPool (append, then prepare)."""
        return _batch_class()._decode(
            self, seqs, tokens, stream, _flag(persistent_table, "persistent_table", none_is_false=True)
        )

    def admit(
        self,
        tokens: Tokens,
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
    ) -> Tuple[Sequence, int]:
        """Admission in one call: a new sequence (as create_sequence), the
        prefix-cache lookup of tokens and the append of the rest (+
        lookahead slots). All or nothing: OutOfBlocksError when the prompt
        does not fit, and then no sequence exists and no hit is taken.
        Returns (sequence, cached tokens). hashes: the prompt's block hashes
        computed beforehand (:meth:`hash_prefix` with the same keys, e.g.
        when the request arrived), so the lookup does not hash again."""
        opts = _seq_opts(priority, lora_id, cache_salt, mm_items, lora_name, lora_path)
        la = lookahead if lookahead.__class__ is int else _index(lookahead, "lookahead")
        if owned is not True:
            owned = _flag(owned, "owned")
        # The raw call and the handle in one C call: an interrupt between
        # them dropped the id, and the sequence stayed in the pool for good.
        h = self._h
        if hashes is None:
            return _adopt_seq(self, h, owned, _seq_admit, h, opts, tokens, la)
        return _adopt_seq(self, h, owned, _seq_admit_hashes, h, opts, tokens, hashes, la)

    def append_batch(self, seqs: Any, tokens: Tokens) -> None:
        """Decode append: tokens[i] (one token id) to seqs[i] for distinct
        sequences, in one call. seqs: Sequence objects or ids (a uint64
        numpy array of ids is the fastest); tokens: any int buffer (numpy,
        array.array, a CPU torch tensor) or sequence. All or nothing: an
        error names the offending index and changes nothing."""
        _seq_append_batch(self._h, (_ids(seqs, self), tokens))

    def free_batch(self, seqs: Any) -> None:
        """Frees the given distinct sequences (Sequence objects or ids) in
        one call. All or nothing: a stale or repeated id raises and frees
        none."""
        _check_len(seqs, "seqs", MAX_SEQS)  # before list()
        if isinstance(seqs, Iterator):  # a generator: read once
            seqs = list(seqs)
        # `seqs and ...` was the truth value of a numpy id array: ValueError
        # ("ambiguous") for two or more ids, and for none.
        if isinstance(seqs, (list, tuple)) and seqs and isinstance(seqs[0], Sequence):
            ids = _ids(seqs, self)
            _seq_free_batch(self._h, ids)
            for s in seqs:
                s._freed = True
        else:
            _seq_free_batch(self._h, seqs)

    def hash_prefix(
        self,
        tokens: Tokens,
        *,
        lora_id: int = 0,
        cache_salt: Optional[str] = None,
        mm_items: Iterable[MMItemLike] = (),
        lora_name: Optional[str] = None,
        lora_path: Optional[str] = None,
    ) -> List[bytes]:
        """The block hashes this pool would give tokens' full blocks."""
        from ._hash import hash_prefix

        o = self._options
        return hash_prefix(
            tokens,
            block_size=o.block_size,
            algo=o.hash_algo,
            seed=o.hash_seed,
            lora_id=lora_id,
            cache_salt=cache_salt,
            mm_items=mm_items,
            lora_name=lora_name,
            strict_key_domains=o.strict_key_domains,
            tagged_keys=o.tagged_keys,
            lora_path=lora_path,
        )


def _check_pool(pool: Any, name: str = "pool") -> None:
    """A TypeError naming the argument for anything but a Pool: the
    module-level functions taking a pool (tiers, mla, events, transfer) read
    ``pool._h`` / ``pool._call`` first, so a pool id or None raised
    AttributeError "'int' object has no attribute '_h'", naming nothing."""
    if not isinstance(pool, Pool):
        raise TypeError(f"{name}: expected a pagedkv.Pool, got {type(pool).__name__}")


def _key_domains(strict: Optional[bool], tagged: Optional[bool]) -> int:
    """strict_key_domains of the C options (PKV_KEY_DOMAINS_*) from the two
    flags; both set is refused (tagged keys already keep domains apart)."""
    strict = strict is not None and _flag(strict, "strict_key_domains")
    tagged = tagged is not None and _flag(tagged, "tagged_keys")
    if strict and tagged:
        raise _c.InvalidArgumentError("strict_key_domains and tagged_keys: choose one (tagged keys keep domains apart)")
    if tagged:
        return int(_c.PKV_KEY_DOMAINS_VLLM_TAGGED)
    return int(_c.PKV_KEY_DOMAINS_STRICT) if strict else int(_c.PKV_KEY_DOMAINS_VLLM)


def _count(value: Any, name: str) -> int:
    """_index for a count: a negative one is a ValueError naming it (the C
    call saw -1 as 2**64 - 1 and reported a capacity "too large")."""
    n = _index(value, name)
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return n


def _floats(values: Any, name: str) -> List[float]:
    """A list of floats from any float sequence or 1-d array (None: [])."""
    if values is None:
        return []
    if isinstance(values, (str, bytes)):  # iterating "12" gave [1.0, 2.0]
        raise TypeError(f"{name}: expected a sequence of floats, got {type(values).__name__}")
    _check_len(values, name, MAX_KV_SCALES)  # before tolist() or the list below
    what = f"{name}: expected a sequence of floats, got {type(values).__name__}"
    tolist = getattr(values, "tolist", None)
    if tolist is not None:
        try:
            values = tolist()
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
            # a sparse or meta torch tensor: torch's RuntimeError "Cannot access
            # data pointer of Tensor that doesn't have storage" / NotImplementedError
            raise TypeError(f"{what} ({e})") from None
        if not isinstance(values, list):  # a 0-d array or tensor: "'float' object is not iterable"
            raise TypeError(f"{what} with no dimensions")
    try:
        items = iter(values)
    except TypeError:  # "'int' object is not iterable", naming nothing
        raise TypeError(what) from None
    return [_real(x, f"{name}[{i}]") for i, x in enumerate(items)]


def _scale_granularity(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    key = str(value).lower()
    if key in ("tensor", "per_tensor"):
        return int(_c.PKV_KV_SCALE_PER_TENSOR)
    if key in ("head", "per_head"):
        return int(_c.PKV_KV_SCALE_PER_HEAD)
    raise ValueError(f"kv_scale_granularity {value!r}: expected 'tensor' or 'head'")


def _host_buffer(buffer: Any, writable: bool) -> Tuple[Any, Any]:
    """(host, keep): host is a buffer-protocol object as is, else (address,
    nbytes) of a read-only buffer or a host tensor (e.g. pinned torch
    memory) described without a copy; the caller holds keep until the raw
    call returned. keep holds a buffer export (or the DLPack capsule), so
    the memory cannot be released meanwhile: a read-only mmap closed by
    another thread while the call read it was a segmentation fault."""
    try:
        mv = memoryview(buffer)
    except TypeError:
        mv = None
    if mv is not None:
        if writable and (mv.readonly or not mv.c_contiguous):
            # The raw call's TypeError named "host_buffer", a C parameter.
            why = "read-only" if mv.readonly else "not contiguous"
            mv.release()
            raise TypeError(f"buffer: expected a writable contiguous buffer, got a {why} {type(buffer).__name__}")
        if not mv.readonly and not mv.c_contiguous:
            # swap_in only reads its buffer; a writable strided one went to
            # the raw call as is, whose TypeError named "host_buffer" and
            # asked for a writable buffer.
            mv.release()
            raise TypeError(f"buffer: expected a contiguous buffer, got a not contiguous {type(buffer).__name__}")
        if not mv.readonly or writable:
            mv.release()
            return buffer, None
        # Read-only (bytes, a read-only array) for a call that only reads
        # it: described by address, the caller keeping it alive.
        if not mv.c_contiguous:
            mv.release()
            raise _c.InvalidArgumentError("buffer: expected a contiguous buffer", _c.PKV_E_INVALID_ARGUMENT)
        try:
            import numpy as np
        except ImportError:
            return bytearray(mv), None  # a copy, writable
        arr = np.frombuffer(mv.cast("B"), dtype=np.uint8)  # holds the export
        return (arr.ctypes.data, arr.nbytes), arr
    desc = describe(buffer, "buffer", raw=True)  # bytes: uint8 (pinned torch memory) as well as int32
    if desc.device is None or desc.device.type != DeviceType.CPU:
        raise _c.InvalidArgumentError("buffer: expected host (CPU or pinned) memory", _c.PKV_E_INVALID_ARGUMENT)
    dense = desc.strides == tuple(math.prod(desc.shape[i + 1 :]) for i in range(len(desc.shape)))
    if not dense:
        raise _c.InvalidArgumentError("buffer: expected a contiguous tensor", _c.PKV_E_INVALID_ARGUMENT)
    if writable and desc.readonly:
        raise _c.InvalidArgumentError("buffer: read-only", _c.PKV_E_INVALID_ARGUMENT)
    return (desc.data + desc.byte_offset, desc.nbytes), desc


class Sequence(NoCopy, _c._SeqBase):
    """One request's tokens and block table in a pool.

    Holds a reference to its pool, so the pool stays usable while the
    sequence lives. Freed by free() (idempotent), by leaving a `with` block,
    by closing the pool, or, for an owning handle (create_sequence's and
    fork's, unless detached), when the handle is garbage collected. A
    borrowing handle (``pool.sequence(id)``, or after ``detach()``) never
    frees on collection: the pool owns the sequence until it is freed
    explicitly. Calls on a freed sequence raise NotFoundError (the library
    sees a stale id).
    """

    # _pool, _h, _id, _freed and _owned live in the C base, which also
    # implements free() and whose deallocation frees an owned sequence not
    # freed yet.
    __slots__ = ()
    # A copy would be a second handle of the sequence (object's default
    # reduce refused it, saying "cannot pickle" for a copy).
    _pickle_why = "it names a sequence of a live pool (send its tokens)"

    def __init__(self, pool: Pool, seq_id: int, owned: bool = True) -> None:
        # A second __init__ re-pointed a live handle: the sequence it owned
        # lost its owner (never freed), even when the call then failed.
        if getattr(self, "_id", None) is not None:
            raise TypeError("Sequence.__init__: this handle already names a sequence (make a new one)")
        self._freed = False
        self._owned = False  # until every field is set (__del__ reads them)
        # Checked as pool.sequence(id) checks them: Sequence(pool, -1) made a
        # handle of id -1 (repr "seq -0x...1"), whose calls then failed with
        # the raw module's OverflowError naming "seq".
        if not isinstance(pool, Pool):
            raise TypeError(f"pool: expected a pagedkv.Pool, got {type(pool).__name__}")
        seq_id = _index(seq_id, "seq_id")
        if not 0 <= seq_id <= _SEQ_ID_MAX:
            raise OverflowError(f"seq_id must be an int in [0, 2^64 - 1] (pkv_seq_id), got {seq_id}")
        self._pool = pool
        self._h = pool._h
        self._id = seq_id
        self._owned = owned if owned is True or owned is False else _flag(owned, "owned")

    @property
    def owned(self) -> bool:
        """Whether garbage collecting this handle frees the sequence."""
        return self._owned

    def detach(self) -> int:
        """Gives the sequence to the pool (this handle no longer frees it when
        collected) and returns its id, for engines that keep ids."""
        self._owned = False
        return self._id

    @property
    def id(self) -> int:
        """The library's pkv_seq_id: opaque, names its pool, slot and generation."""
        return self._id

    @property
    def pool(self) -> Pool:
        return self._pool

    @property
    def freed(self) -> bool:
        """Whether free() was called on this handle or the pool was closed
        (which released every sequence). A free through another handle or
        by id (free_batch of ids) is not seen here: calls then raise
        NotFoundError."""
        return self._freed or self._h.closed

    def match_prefix(self, tokens: Tokens, hashes: Any = None) -> int:
        """For an empty sequence: attaches the longest cached run of leading
        full blocks of tokens (leaving at least one token to compute) and
        returns how many tokens it covers. hashes: tokens' block hashes
        computed beforehand (:meth:`Pool.hash_prefix` with this sequence's
        keys), so the lookup does not hash again."""
        if hashes is None:
            return _seq_match_prefix(self._h, self._id, tokens)
        return _seq_match_prefix_hashes(self._h, self._id, tokens, hashes)

    def match_prefix_partial(self, tokens: Tokens) -> PrefixMatch:
        """match_prefix, then (pool created with enable_partial_reuse) a
        partial hit: the first k tokens of a cached block that the next
        tokens agree with are copied into a new block and count as computed."""
        return PrefixMatch._from_c(self._pool._call(_c.pkv_seq_match_prefix_partial, self._id, tokens))

    def set_retention(self, ranges: Iterable[Union[RetentionRange, tuple]]) -> None:
        """Replaces this sequence's retention ranges (pool created with
        enable_retention): RetentionRange objects or (begin, end, priority,
        duration_ns) tuples. Pins beyond max_pinned_blocks raise
        OutOfBlocksError and change nothing."""
        try:
            # more ranges than the library takes: its error, before list() reads them
            _check_len(ranges, "ranges", _c.PKV_RETENTION_MAX_RANGES)
            items = list(ranges)
        except TypeError:  # "'int' object is not iterable", naming nothing
            raise TypeError(f"ranges: expected an iterable of retention ranges, got {type(ranges).__name__}") from None
        rs = []
        for i, r in enumerate(items):
            try:
                rs.append(r._as_tuple() if isinstance(r, RetentionRange) else tuple(r))
            except TypeError:
                raise TypeError(
                    f"ranges[{i}]: expected a RetentionRange or a tuple (begin, end, priority, duration_ns), "
                    f"got {type(r).__name__}"
                ) from None
        self._pool._call(_c.pkv_seq_set_retention, self._id, rs)

    # append(tokens, lookahead=0) is the C base's: the raw call without a
    # Python frame. Arguments it does not take as they are come here.
    if TYPE_CHECKING:

        def append(self, tokens: Tokens, lookahead: int = 0) -> None:
            """Appends tokens (their KV is written by the next step) and
            reserves lookahead further slots. All or nothing:
            OutOfBlocksError changes nothing."""

    def _append_py(self, tokens: Tokens, lookahead: int = 0) -> None:
        _seq_append(self._h, self._id, tokens, _index(lookahead, "lookahead"))

    # Its argument errors are append()'s: "Sequence._append_py() missing 1
    # required positional argument" named a method the caller never called.
    _append_py.__qualname__ = "Sequence.append"  # the message's name from 3.10 on
    _append_py.__code__ = _append_py.__code__.replace(co_name="append")  # before 3.10

    def blocks_needed(self, num_tokens: int, lookahead: int = 0) -> int:
        """Free blocks an append of num_tokens (+ lookahead) would take."""
        return _seq_blocks_needed(self._h, self._id, _index(num_tokens, "num_tokens"), _index(lookahead, "lookahead"))

    def fork(self) -> Sequence:
        """A child sharing every block (copy-on-write on the shared tail)."""
        return _adopt_seq(self._pool, self._h, True, _seq_fork, self._h, self._id)

    def truncate(self, num_tokens: int) -> None:
        """Keeps the first num_tokens tokens, releasing emptied blocks."""
        _seq_truncate(
            self._h, self._id, num_tokens if num_tokens.__class__ is int else _index(num_tokens, "num_tokens")
        )

    def reserve(self, num_tokens: int) -> None:
        """Capacity hint: makes room in this sequence's host memory (token
        ids, block table, block hashes) for num_tokens tokens in all, so that
        appends up to that length never reallocate them. Call it at admission
        with the prompt plus the most tokens the request may generate; decode
        steps then grow no vectors. Takes no KV blocks and changes nothing
        info() shows; at or below the current room it does nothing. Above
        2**31 - 1 tokens: InvalidArgumentError."""
        _seq_reserve(self._h, self._id, num_tokens if num_tokens.__class__ is int else _index(num_tokens, "num_tokens"))

    def info(self) -> SequenceInfo:
        return SequenceInfo._from_c(self._pool._call(_c.pkv_seq_get_info, self._id))

    @property
    def num_tokens(self) -> int:
        return self.info().num_tokens

    def __len__(self) -> int:
        return self.info().num_tokens

    @property
    def num_computed_tokens(self) -> int:
        """Leading tokens whose K/V is written; a step plan's queries must
        cover the rest (``len(seq) - seq.num_computed_tokens`` at least)."""
        return self.info().num_computed_tokens

    def block_table(self) -> List[int]:
        """Block ids in order (0, the null block, where a sliding window
        released one)."""
        cap = self.info().num_blocks
        while True:
            try:
                return self._pool._call(_c.pkv_seq_get_block_table, self._id, cap)
            except _c.BufferTooSmallError:
                # Grew on another thread meanwhile, or (a multi-group pool)
                # num_blocks counts held blocks only, not null entries: at
                # least one more each time, so that a count of 0 cannot loop.
                cap = max(2 * cap, self.info().num_blocks, 1)

    def block_hashes(self) -> List[bytes]:
        """Hashes of the full blocks, in order."""
        cap = self.info().num_blocks
        while True:
            try:
                hashes = self._pool._call(_c.pkv_seq_get_block_hashes, self._id, cap)
                d = self._pool._digest
                return [h[:d] for h in hashes]
            except _c.BufferTooSmallError:
                cap = max(2 * cap, self.info().num_blocks + 1)

    def __enter__(self) -> Sequence:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self.freed else "live" if self._owned else "live, borrowed"
        # "seq 0x%016x": the form every library message prints ids in.
        return f"<pagedkv.Sequence seq {self._id:#018x} {state}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and other._pool is self._pool and other._id == self._id

    def __hash__(self) -> int:
        return hash((id(self._pool), self._id))


_SEQ_ID_MAX = (1 << 64) - 1

# Raw functions bound once (a module attribute lookup per call is measurable
# at this scale).
_seq_create = _c.pkv_seq_create
_seq_admit = _c.pkv_seq_admit
_seq_admit_hashes = _c.pkv_seq_admit_hashes
_seq_append = _c.pkv_seq_append
_seq_append_batch = _c.pkv_seq_append_batch
_seq_free = _c.pkv_seq_free
_seq_free_batch = _c.pkv_seq_free_batch
_seq_truncate = _c.pkv_seq_truncate
_seq_reserve = _c.pkv_seq_reserve
_seq_fork = _c.pkv_seq_fork
_seq_blocks_needed = _c.pkv_seq_blocks_needed
_seq_match_prefix = _c.pkv_seq_match_prefix
_seq_match_prefix_hashes = _c.pkv_seq_match_prefix_hashes


def _seq_opts(
    priority: int,
    lora_id: int,
    cache_salt: Optional[str],
    mm_items: Iterable[MMItemLike],
    lora_name: Optional[str],
    lora_path: Optional[str] = None,
) -> Optional[dict]:
    """pkv_seq_options for the raw call: None (the C defaults, no conversion)
    when every option is at its default, else the dict form."""
    # Ints first: the truth value of a numpy array or a torch tensor given as
    # priority / lora_id raised numpy's ValueError or torch's RuntimeError
    # ("Boolean value of Tensor with more than one value is ambiguous"),
    # naming neither. None stays the default, as `not None` read it.
    if priority.__class__ is not int:
        priority = 0 if priority is None else _index(priority, "priority")
    if lora_id.__class__ is not int:
        lora_id = 0 if lora_id is None else _index(lora_id, "lora_id")
    if (
        not priority
        and not lora_id
        and cache_salt is None
        and lora_name is None
        and lora_path is None
        and _no_mm(mm_items)
    ):
        return None
    return {
        "priority": priority,
        "lora_id": lora_id,
        "lora_name": lora_name,
        "lora_path": lora_path,
        "cache_salt": cache_salt,
        "mm_items": mm_tuples(mm_items),
    }


def _ids(seqs: Any, pool: Pool) -> Any:
    """Sequence ids for a batched call on pool: Sequence objects (of pool)
    become their ids; id arrays and lists pass as they are (a generator is
    read once)."""
    _check_len(seqs, "seqs", MAX_SEQS)  # before list()
    if isinstance(seqs, Iterator):
        seqs = list(seqs)
    if isinstance(seqs, (list, tuple)) and seqs and isinstance(seqs[0], Sequence):
        try:
            ids = [s._id for s in seqs if s._pool is pool]
        except AttributeError:
            ids = []
        if len(ids) != len(seqs):
            # Not all Sequences, or one of another pool: name the first. The
            # library's check of the id alone missed a sequence of a closed
            # pool whose tag a later pool reuses (pool_tag.h): its id named
            # that pool's sequence, which was appended to or freed.
            for i, s in enumerate(seqs):
                if not isinstance(s, Sequence):
                    raise TypeError(f"seqs[{i}]: expected a pagedkv.Sequence, got {type(s).__name__}")
                if s._pool is not pool:
                    raise _c.InvalidArgumentError(
                        f"seqs[{i}]: the sequence belongs to another pool", _c.PKV_E_INVALID_ARGUMENT
                    )
        return ids
    return seqs


_make_seq = Sequence._make
# _adopt_seq(pool, handle, owned, raw_fn, *args): raw_fn(*args), which makes a
# sequence, and its handle in one C call (see _SeqBase._adopt).
_adopt_seq = Sequence._adopt
_create_seq = Sequence._create


def _batch_class() -> Any:
    """pagedkv.Batch (its module imports this one: bound on first use, not
    imported again on every prepare)."""
    global _Batch
    if _Batch is None:
        from ._batch import Batch

        _Batch = Batch
    return _Batch


_Batch: Any = None
