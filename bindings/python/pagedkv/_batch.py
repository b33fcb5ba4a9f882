"""Batch: one engine step's plan, cache writes and paged attention."""

from __future__ import annotations

import operator
import struct
import sys
import threading
from collections.abc import Iterator
from typing import Any, Dict, List, Optional, Tuple, Union
from typing import Sequence as Seq

from . import _pagedkv as _c
from ._handle import HandleOwner, _adopt_handle
from ._pool import Pool, Sequence, _index
from ._tensor import TensorView, check, describe, empty_like, stream_ptr
from ._types import (
    MAX_SEQS,
    BatchInfo,
    DType,
    KvLayout,
    PlanArray,
    SnapshotArray,
    _check_len,
    _flag,
    _real,
)

_SNAPSHOT_ARRAYS = frozenset(int(a) for a in SnapshotArray)


class Batch(HandleOwner):
    """The step plan for a set of sequences (``pkv_batch_prepare``): slot
    mapping, CSR page table, context lengths and query offsets, built once;
    pending copy-on-write copies run when it is prepared.

    Per layer call :meth:`cache_write` then :meth:`attention`. Appending to,
    truncating or freeing one of its sequences makes the plan stale
    (InvalidStateError). A Batch keeps its pool and sequences alive; it is a
    context manager and close() is idempotent. One Batch serialises its own
    calls; use one Batch per thread for concurrent kernels.

    The step's tokens count as computed (prefix hits, sliding window) only
    once it is committed: on a pool with storage, by a successful
    :meth:`cache_write` of every layer; otherwise by :meth:`commit` (the
    engine wrote K/V elsewhere). ``with pool.prepare(...) as b:`` commits a
    manager-only pool's step when the block ends normally and aborts any
    step when it raises; :meth:`close` (and garbage collection) of a step
    never committed aborts it. A plan whose context holds tokens nobody
    wrote raises InvalidStateError: compute from
    ``seq.num_computed_tokens`` on.
    """

    _aborted = False  # abort() succeeded: leaving a `with` block commits nothing
    # commit() succeeded: close() has nothing to abort. Its abort() then
    # raised InvalidStateError, caught: a C++ exception, a formatted message
    # and a Python exception on every step of a `with` block (a tenth of
    # the package's 1024-sequence decode step). On a pool with storage the
    # write of the last unwritten layer commits (_layer_written).
    _committed = False
    _layers: Optional[set] = None  # layers written, until every one is

    def __init__(
        self,
        pool: Pool,
        seqs: Seq[Sequence],
        query_counts: Union[int, Seq[int]] = 1,
        stream: Any = None,
        persistent_table: bool = False,
    ) -> None:
        # A second __init__ replaced a live plan's handle: the old plan was
        # destroyed uncommitted and unaborted (its tokens counted as computed
        # on a manager-only pool), and a carried _committed left the new one
        # unaborted by close().
        if getattr(self, "_h", None) is not None:
            raise TypeError("Batch.__init__: this object already owns a batch (prepare a new one)")
        # As Pool.prepare's: bool() made persistent_table="no" a persistent table.
        persistent_table = _flag(persistent_table, "persistent_table", none_is_false=True)
        self._ids = None
        if not isinstance(pool, Pool):  # pool._h raised AttributeError, naming nothing
            raise TypeError(f"pool: expected a pagedkv.Pool, got {type(pool).__name__}")
        _check_len(seqs, "seqs", MAX_SEQS)  # before list() or the id array's copy
        if not isinstance(seqs, (list, tuple)) and _is_array(seqs):
            # An id array (uint64): the engine keeps its sequences alive. The
            # plan is made from the snapshot Batch.sequences reports, not the
            # caller's array, which an engine thread may rewrite meanwhile.
            ids = self._ids = _id_snapshot(seqs)
            seqs = None
        else:
            try:
                seqs = list(seqs)
            except TypeError:  # "'int' object is not iterable", naming nothing
                raise TypeError(f"seqs: expected Sequence objects or ids, got {type(seqs).__name__}") from None
            ids = self._collect_ids(pool, seqs)
        n = len(ids)
        if getattr(query_counts, "ndim", None) == 0:  # a 0-d array: "iteration over a 0-d array"
            query_counts = _index(query_counts, "query_counts")
        if query_counts.__class__ is not int and not hasattr(query_counts, "__len__"):
            if hasattr(query_counts, "__index__"):  # a numpy integer scalar
                query_counts = operator.index(query_counts)
            elif not hasattr(query_counts, "__iter__"):
                raise TypeError(f"query_counts: expected an int or ints, got {type(query_counts).__name__}")
        if isinstance(query_counts, int):
            if query_counts < 0:
                raise OverflowError("query_counts: expected an int in [0, 2^32 - 1]")
            counts: Any = query_counts
        else:
            _check_len(query_counts, "query_counts", MAX_SEQS)  # before the list below
            try:  # ints only: int() would truncate 1.9 to 1 and read "3" as 3
                counts = [operator.index(c) for c in query_counts]
            except TypeError:
                for i, c in enumerate(query_counts):
                    if not hasattr(c, "__index__"):
                        raise TypeError(f"query_counts[{i}]: expected an int, got {type(c).__name__}") from None
                raise
            if len(counts) != n:
                raise _c.InvalidArgumentError(
                    f"query_counts: {len(counts)} counts for {n} sequences", _c.PKV_E_INVALID_ARGUMENT
                )
        self._pool = pool
        self._seqs = seqs  # alive while the plan is: their GC would free them
        self._lock = threading.Lock()
        s = stream_ptr(stream)
        if persistent_table:
            flags = _c.PKV_PREPARE_PERSISTENT_TABLE
            self._adopt(_c.pkv_batch_prepare_ex, pool._h, (ids, counts), flags, s)
        else:
            self._adopt(_c.pkv_batch_prepare, pool._h, (ids, counts), s)

    @classmethod
    def _decode(cls, pool: Pool, seqs: Any, tokens: Any, stream: Any, persistent_table: bool) -> Batch:
        """Pool.prepare_decode: appends tokens[i] to seqs[i] and prepares the
        plan of those tokens in one call (``pkv_batch_prepare_decode``)."""
        self = cls.__new__(cls)
        self._ids = None
        _check_len(seqs, "seqs", MAX_SEQS)  # before list() or the id array's copy
        if not isinstance(seqs, (list, tuple)) and not _is_array(seqs):
            if isinstance(seqs, Iterator):  # a generator of Sequences or ids: read once, as prepare()
                seqs = list(seqs)
        if isinstance(seqs, (list, tuple)) and (not seqs or isinstance(seqs[0], Sequence)):
            seqs = list(seqs)
            ids: Any = self._collect_ids(pool, seqs)
        else:
            # Ids (a uint64 array is copied whole, not converted): the engine
            # keeps their sequences alive while the plan is in use. The plan
            # is made from the snapshot (see __init__).
            ids = self._ids = _id_snapshot(seqs)
            seqs = None
        self._pool = pool
        self._seqs = seqs
        self._lock = threading.Lock()
        flags = _c.PKV_PREPARE_PERSISTENT_TABLE if persistent_table else 0
        self._adopt(_c.pkv_batch_prepare_decode, pool._h, (ids, tokens), flags, stream_ptr(stream))
        return self

    def _adopt(self, prepare: Any, *args: Any) -> None:
        """prepare(*args), a raw call making a plan, and self._h owning it
        in one C call (an interrupt between them dropped the plan: never
        destroyed, its step neither committed nor aborted, its persistent
        table kept); then reads its info. Once self._h is set, an exception
        (an interrupt included) leaves the plan to close(), which aborts."""
        h = _adopt_handle(self, _c.pkv_batch_destroy, "batch", prepare, *args)
        try:
            self._info = BatchInfo._from_c(_c.pkv_batch_get_info(h))
        except BaseException:
            # A plan destroyed with neither commit nor abort counts as
            # committed on a manager-only pool (batch.h): this step never ran.
            try:
                _c.pkv_batch_abort(h)
            except _c.PagedKVError:
                pass
            h.close()
            raise

    @staticmethod
    def _collect_ids(pool: Pool, seqs: List[Sequence]) -> List[int]:
        try:  # the common case in one pass; the checks below name the culprit
            ids = [s._id for s in seqs if s._pool is pool and s.__class__ is Sequence]
        except AttributeError:
            ids = []
        if len(ids) != len(seqs):
            for i, s in enumerate(seqs):
                if not isinstance(s, Sequence):
                    raise TypeError(f"seqs[{i}]: expected a pagedkv.Sequence, got {type(s).__name__}")
                if s.pool is not pool:
                    raise _c.InvalidArgumentError(
                        f"seqs[{i}]: the sequence belongs to another pool", _c.PKV_E_INVALID_ARGUMENT
                    )
            ids = [s.id for s in seqs]
        return ids

    # ------------------------------------------------------------ calls

    def _call(self, fn: Any, *args: Any) -> Any:
        with self._lock:  # the handle is pinned for the call by the raw module
            # A view of the pool's storage (kv_tensor) pins the C pool past
            # close(): without this check the plan's writes, kernels and
            # commit went on in a closed pool while such a view lived, and
            # failed only once none did.
            if self._pool._h.closed:
                raise _c.InvalidStateError("the pool is closed", _c.PKV_E_INVALID_STATE)
            return fn(self._h, *args)

    # ------------------------------------------------------------ commit

    def commit(self) -> None:
        """The step's writes happened: its tokens count as computed.
        Idempotent; InvalidStateError after :meth:`abort`."""
        self._call(_c.pkv_batch_commit)
        self._committed = True

    def abort(self) -> None:
        """The step failed before its writes: nothing of it counts.
        Idempotent; InvalidStateError if it was already committed."""
        self._call(_c.pkv_batch_abort)
        self._aborted = True

    def close(self) -> None:
        """Aborts the step unless it was committed, then releases the plan."""
        h = getattr(self, "_h", None)
        if h is not None and not h.closed and not self._committed:
            try:
                self.abort()
            except _c.PagedKVError:
                pass  # committed (its writes happened), or closed meanwhile
        super().close()

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        try:
            # The engine's own writes ended normally, unless the block
            # aborted the step itself (a commit would raise: it was aborted).
            if (
                exc_type is None
                and self._pool.num_layers == 0
                and not self._committed
                and not self._h.closed
                and not self._aborted
            ):
                self.commit()
        finally:
            self.close()

    # ------------------------------------------------------------ plan

    @property
    def pool(self) -> Pool:
        return self._pool

    @property
    def sequences(self) -> List[Sequence]:
        """The plan's sequences (borrowing handles when it was made from ids)."""
        if self._seqs is None:
            return [Sequence(self._pool, int(i), owned=False) for i in self._ids]
        return list(self._seqs)

    def info(self) -> BatchInfo:
        return self._info

    @property
    def num_tokens(self) -> int:
        """Total queries: the rows of q, k, v and out."""
        return self._info.num_tokens

    @property
    def num_seqs(self) -> int:
        return self._info.num_seqs

    def plan(self, which: Union[PlanArray, int]) -> TensorView:
        """A zero-copy, read-only view of one plan array (on the pool's
        device); it keeps the plan alive while in use. The arrays are the
        callers' copy: the library's kernels keep their own."""
        return self._view(_c.pkv_batch_plan_tensor, int(PlanArray(which)))

    def plan_group(self, group: int, which: Union[PlanArray, SnapshotArray, int]) -> TensorView:
        """plan() for one KV group of a plan over a HybridPool
        (``pkv_batch_plan_tensor_group``): that group's page table and slot
        mapping (a recurrent group: one page per sequence, its state slot,
        and the :class:`SnapshotArray` arrays of the state snapshots to
        save); the query offsets and context lengths are shared. Group 0 of a
        single-group plan is plan()."""
        w = _index(which, "which")
        if w not in _SNAPSHOT_ARRAYS:
            w = int(PlanArray(w))
        return self._view(_c.pkv_batch_plan_tensor_group, _index(group, "group"), w)

    def token_positions(self) -> TensorView:
        """int64 [num_tokens]: each query row's position in its sequence (the
        position ids a model's rotary embedding takes). A zero-copy,
        read-only view like plan()."""
        return self._view(_c.pkv_batch_token_positions)

    def last_token_indices(self) -> TensorView:
        """int64 [num_seqs]: the query row of each sequence's last scheduled
        token (the rows to compute logits for). A zero-copy, read-only view
        like plan()."""
        return self._view(_c.pkv_batch_last_token_indices)

    def _view(self, fn: Any, *args: Any) -> TensorView:
        with self._lock:
            return TensorView._pinned(self._h, fn, *args, readonly=True)

    def plan_arrays(self) -> Dict[str, TensorView]:
        """Every plan array by lower-case name (slot_mapping, query_indptr,
        page_indptr, page_indices, last_page_len, context_lens)."""
        return {p.name.lower(): self.plan(p) for p in PlanArray}

    # ------------------------------------------------------------ kernels

    def _tensor(
        self, x: Any, name: str, dtype: Optional[DType], shape: Seq[Optional[int]], stream: int, writable: bool = False
    ) -> Any:
        if not self._pool.has_storage:
            # The library says so too, but only after these tensor checks,
            # which would complain about a dtype first.
            raise _c.InvalidStateError(
                "the pool has no KV storage (created with num_layers 0): no kernel can run on it",
                _c.PKV_E_INVALID_STATE,
            )
        desc = describe(x, name, stream=stream, expect=dtype)
        check(desc, name, dtype=dtype, device=self._pool.device, shape=shape, writable=writable)
        return desc

    def _mha_only(self, call: str, mla_call: str) -> None:
        if self._pool.options.kv_layout == KvLayout.MLA:
            # The library refuses too, but only after the tensor checks,
            # which hold MLA-shaped tensors against a made-up MHA shape.
            raise _c.InvalidStateError(
                f"Batch.{call}() cannot serve an MLA pool (kv_layout 'mla'): use Batch.{mla_call}() (pkv_{mla_call})",
                _c.PKV_E_INVALID_STATE,
            )

    def cache_write(self, layer: int, k: Any, v: Any, stream: Any = None) -> None:
        """Scatters the step's new keys and values, each [num_tokens,
        num_kv_heads, head_dim] of the pool's dtype and device, into layer.
        An FP8 pool takes float32, float16 or bfloat16 k and v and stores
        x / scale, rounded to nearest even and saturated."""
        s = stream_ptr(stream)
        p = self._pool
        self._mha_only("cache_write", "mla_cache_write")
        shape = (self._info.num_tokens, p.num_kv_heads, p.head_dim)
        act = _activation_dtype(p.dtype)
        kd = self._tensor(k, "k", act, shape, s)
        vd = self._tensor(v, "v", act, shape, s)
        layer = _index(layer, "layer")
        self._call(_c.pkv_cache_write, layer, kd.as_c(p.device), vd.as_c(p.device), s)
        self._layer_written(layer)

    def _layer_written(self, layer: int) -> None:
        # The library commits the step when its last unwritten layer is
        # written (pkv_cache_write): close() then has nothing to abort.
        if self._committed:
            return
        if self._layers is None:
            self._layers = set()
        self._layers.add(layer)
        if len(self._layers) >= self._pool.num_layers and not self._aborted:
            self._committed = True

    def attention(
        self,
        layer: int,
        q: Any,
        out: Any = None,
        *,
        lse: Any = None,
        softmax_scale: float = 0.0,
        sliding_window: int = 0,
        logit_softcap: float = 0.0,
        stream: Any = None,
    ) -> Union[Any, Tuple[Any, Any]]:
        """Paged attention of every query of the plan over its sequence.

        q: [num_tokens, num_q_heads, head_dim] (num_q_heads a multiple of
        num_kv_heads). out: same shape and dtype (allocated like q when None).
        lse: None, True (allocate) or a float32 [num_tokens, num_q_heads]
        tensor for the log-sum-exp. softmax_scale 0 means 1/sqrt(head_dim).
        Returns out, or (out, lse) when lse was asked for.
        """
        s = stream_ptr(stream)
        p = self._pool
        self._mha_only("attention", "mla_attention")
        qd = self._tensor(q, "q", _activation_dtype(p.dtype), (self._info.num_tokens, None, p.head_dim), s)
        heads = qd.shape[1]
        if heads == 0 or (p.num_kv_heads and heads % p.num_kv_heads):
            raise _c.InvalidArgumentError(
                f"q: {heads} query heads is not a positive multiple of the pool's {p.num_kv_heads} KV heads",
                _c.PKV_E_INVALID_ARGUMENT,
            )
        if out is None:
            out = empty_like(q)
        od = self._tensor(out, "out", qd.dtype, qd.shape, s, writable=True)
        want_lse = lse is not None and lse is not False
        ld = None
        if want_lse:
            if lse is True:
                lse = empty_like(q, (qd.shape[0], heads), float32=True)
            ld = self._tensor(lse, "lse", DType.F32, (qd.shape[0], heads), s, writable=True)
        params = {
            "softmax_scale": _c_float("softmax_scale", softmax_scale),
            "sliding_window": _index(sliding_window, "sliding_window"),
            "logit_softcap": _c_float("logit_softcap", logit_softcap),
        }
        dev = p.device
        self._call(
            _c.pkv_attention_forward,
            _index(layer, "layer"),
            qd.as_c(dev),
            od.as_c(dev),
            ld.as_c(dev) if ld is not None else None,
            params,
            s,
        )
        return (out, lse) if want_lse else out

    def mla_cache_write(self, layer: int, kv_c: Any, k_pe: Any, stream: Any = None) -> None:
        """MLA pools: :func:`pagedkv.mla.cache_write` on this step."""
        from . import mla

        mla.cache_write(self, layer, kv_c, k_pe, stream)

    def mla_attention(self, layer: int, q_latent: Any, q_pe: Any, out: Any = None, **kw: Any) -> Any:
        """MLA pools: :func:`pagedkv.mla.attention` on this step."""
        from . import mla

        return mla.attention(self, layer, q_latent, q_pe, out, **kw)

    def __repr__(self) -> str:
        # Says when the plan is closed, as Pool's and Sequence's reprs say
        # closed / freed (it read as a usable plan after close()).
        i = getattr(self, "_info", None)
        h = getattr(self, "_h", None)
        state = "closed, " if h is None or h.closed else ""
        if i is None:  # __init__ failed before the plan existed
            return f"<pagedkv.Batch {state.rstrip(', ') or 'unprepared'}>"
        return f"<pagedkv.Batch {state}{i.num_seqs} seqs, {i.num_tokens} tokens, {i.num_pages} pages>"


def _is_array(x: Any) -> bool:
    """hasattr(x, "__array_interface__") without asking a numpy array for
    it: numpy builds the interface dict and its type string on each read,
    twice per prepare_decode step (a tenth of the package's own cost)."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return True
    return hasattr(x, "__array_interface__")


def _id_snapshot(ids: Any) -> Any:
    """The ids a plan was made from, as they were then: engines reuse their
    id array from step to step, and Batch.sequences must name the plan's."""
    if getattr(ids, "ndim", None) == 0:  # a numpy scalar or 0-d array: "len() of unsized object"
        raise TypeError(f"seqs: expected Sequence objects or a 1-d array of ids, got a 0-d {type(ids).__name__}")
    if _is_array(ids) and callable(getattr(ids, "copy", None)):
        return ids.copy()  # numpy: one memcpy
    try:
        return list(ids)
    except TypeError:  # "'int' object is not iterable", naming nothing
        raise TypeError(f"seqs: expected Sequence objects or ids, got {type(ids).__name__}") from None


_FLT_MAX = struct.unpack("f", struct.pack("I", 0x7F7FFFFF))[0]


def _c_float(name: str, x: Any) -> float:
    """x as the C float the call takes. A non-zero value that rounds to 0
    there (below ~1.4e-45) would silently mean "the default" for a scale:
    refused instead. A finite value beyond the largest C float is refused
    here too (the raw setter's OverflowError named the setter, not the
    argument); inf and NaN are left to the library's check."""
    v = _real(x, name)
    if v != 0.0 and abs(v) < 1.0 and struct.unpack("f", struct.pack("f", v))[0] == 0.0:
        raise _c.InvalidArgumentError(f"{name} = {v!r} rounds to 0 as a C float", _c.PKV_E_INVALID_ARGUMENT)
    if _FLT_MAX < abs(v) < float("inf"):
        raise _c.InvalidArgumentError(
            f"{name} = {v!r} is beyond the largest C float ({_FLT_MAX!r})", _c.PKV_E_INVALID_ARGUMENT
        )
    return v


def _activation_dtype(pool_dtype: DType) -> Optional[DType]:
    """The dtype k, v and q must have: the pool's, or for an FP8 pool any
    of float32, float16, bfloat16 (the library checks which)."""
    return None if pool_dtype in (DType.FP8_E4M3, DType.FP8_E5M2) else pool_dtype
