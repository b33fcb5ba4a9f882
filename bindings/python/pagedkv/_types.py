"""Enumerations and result records of the pagedkv package."""

from __future__ import annotations

import enum
import numbers
import operator
from dataclasses import dataclass, fields
from typing import Any, Optional, Tuple, Union

from . import _pagedkv as _c


class DType(enum.IntEnum):
    """Element types (``PKV_DTYPE_*``)."""

    F32 = _c.PKV_DTYPE_F32
    F16 = _c.PKV_DTYPE_F16
    BF16 = _c.PKV_DTYPE_BF16
    I32 = _c.PKV_DTYPE_I32
    I64 = _c.PKV_DTYPE_I64
    FP8_E4M3 = _c.PKV_DTYPE_FP8_E4M3  # KV storage only
    FP8_E5M2 = _c.PKV_DTYPE_FP8_E5M2  # KV storage only

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return int(_c.pkv_dtype_size(int(self)))

    @classmethod
    def parse(cls, value: Any) -> DType:
        """A DType from a DType/int, a name ("bf16", "float16", ...), a numpy
        dtype (bfloat16 through ml_dtypes) or a torch dtype."""
        if isinstance(value, DType):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value)
        name = getattr(value, "name", None) if not isinstance(value, str) else value
        if name is None or not isinstance(name, str):
            name = str(value)
        key = name.lower().replace("torch.", "").replace("numpy.", "")
        try:
            return _DTYPE_NAMES[key]
        except KeyError:
            raise ValueError(
                f"unknown dtype {value!r}; expected one of f32, f16, bf16, i32, i64, fp8_e4m3, fp8_e5m2"
            ) from None

    def __str__(self) -> str:
        return _DTYPE_STR[self]


_DTYPE_NAMES = {
    "f32": DType.F32,
    "fp32": DType.F32,
    "float32": DType.F32,
    "float": DType.F32,
    "f16": DType.F16,
    "fp16": DType.F16,
    "float16": DType.F16,
    "half": DType.F16,
    "bf16": DType.BF16,
    "bfloat16": DType.BF16,
    "i32": DType.I32,
    "int32": DType.I32,
    "i64": DType.I64,
    "int64": DType.I64,
    "long": DType.I64,
    "fp8_e4m3": DType.FP8_E4M3,
    "e4m3": DType.FP8_E4M3,
    "float8_e4m3fn": DType.FP8_E4M3,
    "fp8_e5m2": DType.FP8_E5M2,
    "e5m2": DType.FP8_E5M2,
    "float8_e5m2": DType.FP8_E5M2,
}
_DTYPE_STR = {
    DType.F32: "float32",
    DType.F16: "float16",
    DType.BF16: "bfloat16",
    DType.I32: "int32",
    DType.I64: "int64",
    DType.FP8_E4M3: "float8_e4m3fn",
    DType.FP8_E5M2: "float8_e5m2",
}


class DeviceType(enum.IntEnum):
    """Device kinds (DLPack numbering, ``PKV_DEVICE_*``)."""

    CPU = _c.PKV_DEVICE_CPU
    CUDA = _c.PKV_DEVICE_CUDA


@dataclass(frozen=True)
class Device:
    """A device: ``Device.parse("cuda:1")``, ``str(dev) == "cuda:1"``."""

    type: DeviceType
    index: int = 0

    @classmethod
    def parse(cls, value: Any) -> Device:
        """From a Device, "cpu", "cuda", "cuda:N", a torch.device or an int
        (a CUDA ordinal)."""
        if isinstance(value, Device):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(DeviceType.CUDA, value)
        text = str(value).strip().lower()
        kind, _, idx = text.partition(":")
        if kind not in ("cpu", "cuda") or (idx and not idx.isdigit()):
            raise ValueError(f"unknown device {value!r}; expected 'cpu', 'cuda' or 'cuda:N'")
        if kind == "cpu":
            return cls(DeviceType.CPU, 0)
        return cls(DeviceType.CUDA, int(idx) if idx else 0)

    def __str__(self) -> str:
        return "cpu" if self.type == DeviceType.CPU else f"cuda:{self.index}"


CPU = Device(DeviceType.CPU, 0)


class HashAlgo(enum.IntEnum):
    """Block hash functions (``PKV_HASH_*``)."""

    SHA256_CBOR = _c.PKV_HASH_SHA256_CBOR
    XXH3_128 = _c.PKV_HASH_XXH3_128

    @property
    def digest_size(self) -> int:
        return int(_c.pkv_hash_size(int(self)))

    @classmethod
    def parse(cls, value: Any) -> HashAlgo:
        if isinstance(value, HashAlgo):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value)
        key = str(value).lower().replace("-", "_")
        for algo, names in ((cls.SHA256_CBOR, ("sha256_cbor", "sha256")), (cls.XXH3_128, ("xxh3_128", "xxh3"))):
            if key in names:
                return algo
        raise ValueError(f"unknown hash algorithm {value!r}; expected 'sha256_cbor' or 'xxh3_128'")


class EventType(enum.IntEnum):
    """KV cache event kinds (``PKV_EVENT_*``)."""

    BLOCK_STORED = _c.PKV_EVENT_BLOCK_STORED
    BLOCK_REMOVED = _c.PKV_EVENT_BLOCK_REMOVED
    ALL_CLEARED = _c.PKV_EVENT_ALL_CLEARED
    #: A cached block's retention priority changed (``num_tokens`` holds it).
    BLOCK_PRIORITY = _c.PKV_EVENT_BLOCK_PRIORITY


class KV(enum.IntEnum):
    """Which half of a layer's cache (``PKV_KV_*``)."""

    KEY = _c.PKV_KV_KEY
    VALUE = _c.PKV_KV_VALUE

    @classmethod
    def parse(cls, value: Any) -> KV:
        if isinstance(value, KV):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value)
        key = str(value).lower()
        if key in ("k", "key", "keys"):
            return cls.KEY
        if key in ("v", "value", "values"):
            return cls.VALUE
        raise ValueError(f"unknown cache half {value!r}; expected 'k' or 'v'")


class KvLayout(enum.IntEnum):
    """KV page layout of a pool (``PKV_KV_LAYOUT_*``): MHA (K and V per
    layer) or MLA (one latent tensor per layer; see :mod:`pagedkv.mla`)."""

    MHA = _c.PKV_KV_LAYOUT_MHA
    MLA = _c.PKV_KV_LAYOUT_MLA

    @classmethod
    def parse(cls, value: Any) -> KvLayout:
        if isinstance(value, KvLayout):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value)
        key = str(value).lower()
        if key in ("mha", "mla"):
            return cls[key.upper()]
        raise ValueError(f"unknown kv_layout {value!r}; expected 'mha' or 'mla'")


class PlanArray(enum.IntEnum):
    """Arrays of a step plan (``PKV_PLAN_*``)."""

    SLOT_MAPPING = _c.PKV_PLAN_SLOT_MAPPING
    QUERY_INDPTR = _c.PKV_PLAN_QUERY_INDPTR
    PAGE_INDPTR = _c.PKV_PLAN_PAGE_INDPTR
    PAGE_INDICES = _c.PKV_PLAN_PAGE_INDICES
    LAST_PAGE_LEN = _c.PKV_PLAN_LAST_PAGE_LEN
    CONTEXT_LENS = _c.PKV_PLAN_CONTEXT_LENS


class SnapshotArray(enum.IntEnum):
    """A recurrent group's arrays of a HybridPool plan (``PKV_PLAN_SNAPSHOT_*``,
    ``Batch.plan_group`` only): CSR over the sequences of the state snapshots
    to save (``KVGroupSpec.recurrent(..., snapshot_every_block=True)``), the
    query row after which each is taken (int64) and its state slot (int32)."""

    INDPTR = _c.PKV_PLAN_SNAPSHOT_INDPTR
    ROWS = _c.PKV_PLAN_SNAPSHOT_ROWS
    BLOCKS = _c.PKV_PLAN_SNAPSHOT_BLOCKS


@dataclass(frozen=True)
class MMItem:
    """A multimodal item covering tokens [offset, offset + length), named by
    a content hash string."""

    offset: int
    length: int
    hash: str


MMItemLike = Union[MMItem, Tuple[int, int, str]]


def _no_mm(items: Any) -> bool:
    """Whether mm_items is its default (the empty tuple) or None. Compared
    by ``mm_items != ()`` and read by ``items or ()``, a numpy array or a
    torch tensor raised numpy's ValueError "operands could not be broadcast"
    or torch's RuntimeError "Boolean value of Tensor with more than one
    value is ambiguous", naming nothing."""
    return items is None or (items.__class__ is tuple and not items)


def mm_tuples(items: Any) -> list:
    if _no_mm(items):
        return []
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise TypeError(
            f"mm_items: expected an iterable of MMItem or (offset, length, hash) tuples, got {type(items).__name__}"
        )
    out = []
    try:
        listed = iter(items)  # not list(): mm_items=range(2**40) fails at its first item
    except TypeError:  # a 0-d array or tensor: "iteration over a 0-d tensor"
        raise TypeError(
            f"mm_items: expected an iterable of MMItem or (offset, length, hash) tuples, got {type(items).__name__}"
        ) from None
    for i, it in enumerate(listed):
        try:
            off, length, h = (it.offset, it.length, it.hash) if isinstance(it, MMItem) else it
        except (TypeError, ValueError):  # "cannot unpack non-iterable int object", naming nothing
            raise TypeError(
                f"mm_items[{i}]: expected an MMItem or a tuple (offset, length, hash), got {type(it).__name__}"
            ) from None
        out.append((_index(off, f"mm_items[{i}] offset"), _index(length, f"mm_items[{i}] length"), h))
    return out


#: Counts refused before an argument is read or copied (the raw module's
#: conversions check the same; see PKV_PY_MAX_TOKENS in pagedkv.i): a
#: sequence's 2^31 - 1 tokens (also block ids and hashes, and hash_prefix's
#: tokens), and the 2^24 sequences a pool holds at once (seq id arrays).
MAX_TOKENS = (1 << 31) - 1
MAX_SEQS = 1 << 24
MAX_KV_SCALES = 1 << 28  # what pkv_pool_create takes (65536 layers * 4096 heads)
_LIMIT_TEXT = {
    MAX_TOKENS: "2^31 - 1",
    MAX_SEQS: "2^24, the sequences a pool holds at once",
    MAX_KV_SCALES: "2^28",
}


def _check_len(value: Any, name: str, limit: int) -> None:
    """Refuses value when the length it gives without being read (len(),
    or an iterator's __length_hint__, by which list() sizes its copy)
    exceeds limit: InvalidArgumentError, as the library raises for too
    many tokens, before list(range(2**31)) or a copy of a 2^31-element
    broadcast array takes the machine's memory. Unsized values pass."""
    try:
        if isinstance(value, list):  # a subclass's __len__ is not what is read
            n = list.__len__(value)
        elif isinstance(value, tuple):
            n = tuple.__len__(value)
        else:
            n = operator.length_hint(value)
    except OverflowError:  # a __len__ of 2**64 or more
        n = -1
    except TypeError:  # a __len__ returning a non-int etc.: left to the conversion
        return
    if n < 0 or n > limit:
        count = "a length beyond any index" if n < 0 else f"{n} items"
        raise _c.InvalidArgumentError(
            f"{name}: {count}, more than {_LIMIT_TEXT.get(limit, limit)}", _c.PKV_E_INVALID_ARGUMENT
        )


def _index(value: Any, name: str) -> int:
    """value as an int: ints, bools and integer scalars (numpy, torch) only.
    int() truncated 2.7 to 2 and read "5" as 5, so truncate(2.7) dropped a
    token and cache_write(1.5, ...) wrote layer 1 without a word."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}") from None


def _flag(value: Any, name: str, *, none_is_false: bool = False) -> bool:
    """value as a bool: True/False, 0/1 (numpy and torch bool and integer
    scalars too). bool() read any object: enable_prefix_caching="false"
    enabled prefix caching, tagged_keys="no" keyed blocks vLLM 0.33's way.
    none_is_false: None is False, for an argument whose default is False
    (bool(None) was False: persistent_table=None, forwarded by a wrapper's
    own default, is the default)."""
    if value is True or value is False:
        return value
    if value is None and none_is_false:
        return False
    try:
        v = operator.index(value)
    except TypeError:
        # numpy's bool scalar and a 0-d bool array (np.array(True), what
        # np.load of a saved flag gives) have no __index__.
        if type(value).__name__ in ("bool", "bool_") or (
            getattr(getattr(value, "dtype", None), "kind", None) == "b" and getattr(value, "ndim", None) == 0
        ):
            return bool(value)
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}") from None
    if v not in (0, 1):
        raise ValueError(f"{name}: expected a bool (or 0 / 1), got {v}")
    return bool(v)


def _real(value: Any, name: str) -> float:
    """value as a float: numbers only (int, float, numpy and torch scalars).
    float() also parsed strings, so softmax_scale="2" was the scale 2.0."""
    t = type(value)
    if t is float or t is int:
        return float(value)
    if not (hasattr(t, "__float__") or hasattr(t, "__index__")) or (
        isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real)
    ):
        # A numpy complex scalar has __float__: float() printed a
        # ComplexWarning and dropped the imaginary part (softmax_scale=0.1+2j
        # ran with 0.1).
        raise TypeError(f"{name}: expected a float, got {t.__name__}")
    ndim = getattr(value, "ndim", 0)
    if ndim.__class__ is int and ndim != 0:
        # A torch tensor of several elements (or none) raised torch's
        # ValueError "only one element tensors can be converted to Python
        # scalars", naming nothing, after printing a UserWarning when it
        # required grad; a [[x]] tensor was taken as x where numpy's is not.
        raise TypeError(f"{name}: expected a float, got {t.__name__} of shape {tuple(value.shape)}")
    detach = getattr(value, "detach", None)
    if detach is not None and getattr(value, "requires_grad", False) is True:
        # float() of a torch scalar requiring grad printed torch's UserWarning
        # "Converting a tensor with requires_grad=True to a scalar".
        value = detach()
    try:
        return float(value)
    except (TypeError, RuntimeError, ValueError) as e:  # a complex torch scalar, a meta tensor
        raise TypeError(f"{name}: expected a float, got {t.__name__} ({e})") from None


_FIELD_GETTERS: dict = {}


def _copy_fields(cls: Any, struct: Any, **override: Any) -> Any:
    # The field names and one attrgetter per class, made once: stats() and
    # info() are called every step.
    got = _FIELD_GETTERS.get(cls)
    if got is None:
        names = tuple(f.name for f in fields(cls))
        got = _FIELD_GETTERS[cls] = (names, operator.attrgetter(*names))
    names, getter = got
    if override:  # fields the struct does not hold by these names (PoolOptions)
        return cls(**{n: override[n] if n in override else getattr(struct, n) for n in names})
    values = getter(struct)
    return cls(*values) if len(names) > 1 else cls(values)


@dataclass(frozen=True)
class PoolOptions:
    """The options a pool was created with (num_blocks resolved)."""

    block_size: int
    num_blocks: int
    memory_budget_bytes: int
    hash_algo: HashAlgo
    enable_prefix_caching: bool
    hash_seed: str
    sliding_window: int
    enable_events: bool
    max_events: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: DType
    device: Device
    num_threads: int
    strict_key_domains: bool
    tagged_keys: bool  # vLLM 0.33's tagged extra keys (strict_key_domains 2 in C)
    kv_scale_granularity: str  # "tensor" or "head" (FP8 pools' k/v scales)
    num_kv_scales: int  # scales per K (and per V) of an FP8 pool; 0 otherwise
    enable_partial_reuse: bool
    enable_retention: bool
    max_pinned_blocks: int
    kv_layout: KvLayout
    kv_lora_rank: int  # MLA pools: latent width; 0 otherwise
    qk_rope_head_dim: int  # MLA pools: rotary key width; 0 otherwise

    @classmethod
    def _from_c(cls, s: Any) -> PoolOptions:
        return _copy_fields(
            cls,
            s,
            hash_algo=HashAlgo(s.hash_algo),
            enable_prefix_caching=bool(s.enable_prefix_caching),
            enable_events=bool(s.enable_events),
            hash_seed=s.hash_seed or "",
            dtype=DType(s.dtype),
            device=Device(DeviceType(s.device_type), s.device_id),
            strict_key_domains=s.strict_key_domains == _c.PKV_KEY_DOMAINS_STRICT,
            tagged_keys=s.strict_key_domains == _c.PKV_KEY_DOMAINS_VLLM_TAGGED,
            kv_scale_granularity="head" if s.kv_scale_granularity == _c.PKV_KV_SCALE_PER_HEAD else "tensor",
            enable_partial_reuse=bool(s.enable_partial_reuse),
            enable_retention=bool(s.enable_retention),
            kv_layout=KvLayout(s.kv_layout),
        )


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool's counters (``pkv_pool_stats``)."""

    block_size: int
    num_blocks: int
    num_free_blocks: int
    num_used_blocks: int
    num_cached_blocks: int
    num_seqs: int
    num_tokens: int
    usage: float
    prefix_query_tokens: int
    prefix_hit_tokens: int
    num_evictions: int
    num_cow_copies: int
    num_events_dropped: int
    kv_bytes_per_block: int
    kv_bytes_allocated: int
    kv_bytes_used: int
    kv_bytes_wasted: int
    #: Partial-block hits (enable_partial_reuse) and the tokens they reused
    #: (included in prefix_hit_tokens).
    num_partial_hits: int
    partial_hit_tokens: int
    #: Cached blocks at PRIORITY_PINNED, and pins the budget turned into
    #: PRIORITY_PINNED - 1.
    num_pinned_blocks: int
    num_pins_degraded: int

    @property
    def prefix_hit_rate(self) -> float:
        """prefix_hit_tokens / prefix_query_tokens (0 before any query)."""
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0

    @classmethod
    def _from_c(cls, s: Any) -> PoolStats:
        return _copy_fields(cls, s)


@dataclass(frozen=True)
class PrefixMatch:
    """What ``Sequence.match_prefix_partial`` attached (``pkv_prefix_match``).

    ``num_cached`` tokens count as computed: whole cached blocks plus
    ``partial_tokens`` reused from the first slots of block ``copy_src``,
    copied into the sequence's new block ``copy_dst``. A pool with storage
    makes the copy itself; an engine managing its own K/V (num_layers 0)
    copies slots ``[0, partial_tokens)`` of every layer before its next
    step's writes. Both are NULL_BLOCK when no copy is needed."""

    num_cached: int
    partial_tokens: int
    copy_src: int
    copy_dst: int

    @classmethod
    def _from_c(cls, s: Any) -> PrefixMatch:
        return _copy_fields(cls, s)


@dataclass(frozen=True)
class RetentionRange:
    """Keep tokens [begin, end) at a retention priority (0..100; 100 pins),
    for duration_ns once their blocks are free (0 = for good); end None = to
    the end of the sequence (``pkv_retention_range``)."""

    begin: int = 0
    end: Optional[int] = None
    priority: int = 35
    duration_ns: int = 0

    def _as_tuple(self) -> tuple:
        end = (1 << 64) - 1 if self.end is None else _index(self.end, "end")  # PKV_TOKEN_END
        return (
            _index(self.begin, "begin"),
            end,
            _index(self.priority, "priority"),
            _index(self.duration_ns, "duration_ns"),
        )


@dataclass(frozen=True)
class SequenceInfo:
    """A snapshot of one sequence (``pkv_seq_info``)."""

    priority: int
    num_tokens: int
    num_cached_tokens: int
    num_blocks: int
    num_slots: int
    lora_id: int
    #: Leading tokens whose K/V is written (committed steps, written prefix
    #: hits): the next step must compute every token from here on.
    num_computed_tokens: int

    @classmethod
    def _from_c(cls, s: Any) -> SequenceInfo:
        return _copy_fields(cls, s)


@dataclass(frozen=True)
class BatchInfo:
    """Sizes of a step plan (``pkv_batch_info``)."""

    num_seqs: int
    num_tokens: int
    num_pages: int
    max_context: int
    max_query: int
    block_size: int

    @classmethod
    def _from_c(cls, s: Any) -> BatchInfo:
        return _copy_fields(cls, s)


@dataclass(frozen=True)
class Event:
    """One KV cache event; hashes are trimmed to the pool's digest size."""

    seq_no: int
    type: EventType
    block_id: int
    block_hash: bytes
    parent_hash: Optional[bytes]
    num_tokens: int
    lora_id: int

    @classmethod
    def _from_c(cls, e: Any, digest_size: int) -> Event:
        return cls(
            seq_no=e.seq_no,
            type=EventType(e.type),
            block_id=e.block_id,
            block_hash=e.block_hash[:digest_size],
            parent_hash=e.parent_hash[:digest_size] if e.has_parent else None,
            num_tokens=e.num_tokens,
            lora_id=e.lora_id,
        )


@dataclass(frozen=True)
class Features:
    """What the loaded library was built with (``pkv_features``)."""

    cuda: bool
    xxhash: bool
    sha256: bool
    bf16: bool
    bits: int

    @classmethod
    def _from_bits(cls, bits: int) -> Features:
        return cls(
            cuda=bool(bits & _c.PKV_FEATURE_CUDA),
            xxhash=bool(bits & _c.PKV_FEATURE_XXHASH),
            sha256=bool(bits & _c.PKV_FEATURE_SHA256),
            bf16=bool(bits & _c.PKV_FEATURE_BF16),
            bits=bits,
        )
