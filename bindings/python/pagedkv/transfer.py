"""Moving a sequence's KV between pools, across processes and machines, over
UCX (``pagedkv/transfer.h``; docs/scale-out-transfer.md).

Prefill side::

    eng = TransferEngine(transports="tcp")
    exp = eng.export(pool, seq)          # pins seq's computed blocks
    send(exp.descriptor)                 # bytes: ship them any way you like
    ...                                  # eng.progress() while peers read (TCP)
    exp.release()                        # when the decode side is done

Decode side::

    t = eng.import_sequence(pool, descriptor)
    seq = t.wait()                       # or poll() from an event loop
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Optional

from . import _pagedkv as _c
from ._handle import Handle, HandleOwner, NoCopy, _adopt_handle
from ._pool import Pool, Sequence, _check_pool, _index, _seq_opts
from ._types import _real

_adopt_polled = Sequence._adopt_polled

RUNNING = _c.PKV_TRANSFER_RUNNING
DONE = _c.PKV_TRANSFER_DONE
FAILED = _c.PKV_TRANSFER_FAILED
CANCELLED = _c.PKV_TRANSFER_CANCELLED


def available() -> bool:
    """Whether this build has the UCX transport."""
    return bool(_c.pkv_transfer_available())


class Export(NoCopy):
    """A pinned, exported sequence: ``descriptor`` (bytes) for the importer,
    ``release()`` to unpin (idempotent; a no-op once the engine expired the
    export or was closed)."""

    # A copy would release the same pin: the copy's release() unpinned the
    # blocks while this object still said unreleased.
    _pickle_why = "it pins blocks of a live pool (send its descriptor bytes)"

    def __init__(self, engine: TransferEngine, export_id: int, descriptor: bytes) -> None:
        self.engine = engine
        self.id = export_id
        self.descriptor = descriptor
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            try:
                _c.pkv_transfer_export_release(self.engine._h, self.id)
            except _c.NotFoundError:
                pass  # the engine expired it (export_ttl_ms): released already
            except _c.InvalidStateError:
                if not self.engine._h.closed:
                    raise
                # closing the engine released every export

    def __enter__(self) -> Export:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class TransferEngine(HandleOwner):
    """One UCX context and worker. transports: a UCX_TLS list ("shm", "tcp",
    ...; None = UCX's choice); timeout_ms: an import not done by then fails
    (0 = never); export_ttl_ms: exports not released by then are released
    (0 = never)."""

    def __init__(
        self,
        *,
        transports: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        export_ttl_ms: Optional[int] = None,
    ) -> None:
        self._refuse_second_init("transfer engine")
        opts: dict = {"transports": transports}
        if timeout_ms is not None:
            opts["timeout_ms"] = _index(timeout_ms, "timeout_ms")
        if export_ttl_ms is not None:
            opts["export_ttl_ms"] = _index(export_ttl_ms, "export_ttl_ms")
        # The raw calls and their owners in one C call each: an interrupt
        # right after a raw call returned dropped its result (an engine, an
        # export pinning blocks, a running transfer holding blocks).
        _adopt_handle(self, _c.pkv_transfer_engine_destroy, "transfer engine", _c.pkv_transfer_engine_create, opts)

    def export(self, pool: Pool, seq: Any) -> Export:
        """Exports seq's computed tokens (a Sequence or its id) and pins their blocks."""
        _check_pool(pool)
        if isinstance(seq, Sequence):
            # The library's id check alone missed a sequence of a closed pool
            # whose tag a later pool reuses: its id named that pool's sequence,
            # which was exported.
            if seq._pool is not pool:
                raise _c.InvalidArgumentError("seq: the sequence belongs to another pool", _c.PKV_E_INVALID_ARGUMENT)
            seq_id = seq._id
        else:
            seq_id = _index(seq, "seq")
        # The export, its descriptor and the Export in one C call, which
        # releases the export on any failure after it was made.
        return _c._adopt_export(
            Export,
            self,
            _c.pkv_transfer_export,
            _c.pkv_py_transfer_descriptor,
            _c.pkv_transfer_export_release,
            self._h,
            pool._h,
            seq_id,
        )

    def progress(self) -> None:
        """Serves peers' reads (TCP needs the exporter's progress) and expires exports."""
        _c.pkv_transfer_engine_progress(self._h)

    @property
    def num_exports(self) -> int:
        return int(_c.pkv_transfer_engine_num_exports(self._h))

    def import_sequence(
        self,
        pool: Pool,
        descriptor: bytes,
        *,
        lora_id: int = 0,
        cache_salt: Optional[str] = None,
        lora_name: Optional[str] = None,
    ) -> Transfer:
        """Starts pulling descriptor's sequence into pool (layout checked,
        blocks allocated all or nothing: InvalidArgumentError /
        OutOfBlocksError and nothing changes)."""
        _check_pool(pool)
        opts = _seq_opts(0, lora_id, cache_salt, (), lora_name)
        t = Transfer.__new__(Transfer)
        t._start(self, pool)
        _adopt_handle(
            t, _c.pkv_transfer_destroy, "transfer", _c.pkv_transfer_import, self._h, pool._h, opts, descriptor
        )
        return t


class Transfer(HandleOwner):
    """An import in flight. poll() drives it without blocking; wait() until
    it ends. A failed transfer raises its error from poll()/wait(); its
    blocks are back in the pool."""

    def __init__(self, engine: TransferEngine, pool: Pool, ptr: Any) -> None:
        self._start(engine, pool)
        self._h = Handle(ptr, _c.pkv_transfer_destroy, "transfer")

    def _start(self, engine: TransferEngine, pool: Pool) -> None:
        """Everything but the handle (import_sequence sets it with the raw call)."""
        self.engine = engine
        self.pool = pool
        self.sequence: Optional[Sequence] = None
        self.state = RUNNING
        # Polls from several threads: the library answers DONE and the new
        # id to each, and only the first may make the owning Sequence (a
        # second owner, collected, freed the sequence under the first).
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """K/V bytes the transfer reads."""
        return int(_c.pkv_transfer_bytes(self._h))

    def poll(self) -> int:
        """RUNNING, DONE (``self.sequence`` is the new sequence, owned by
        this object's caller) or CANCELLED; raises if it failed (then
        ``state`` is FAILED, and every later poll raises the failure
        again, as the library's does)."""
        if self.state != RUNNING and self.state != FAILED:
            return self.state
        pool = self.pool
        try:
            # The raw poll and, on DONE, self.sequence owning the new id in
            # one C call: an interrupt between them dropped the id (reported
            # again by the next poll, but leaked if the caller then dropped
            # this Transfer). Polls racing on other threads: the first to
            # see DONE makes the one owner, the others find it.
            state, _ = _adopt_polled(self, "sequence", pool, pool._h, _c.pkv_transfer_poll, self._h)
        except _c.PagedKVError:
            if not self._h.closed:  # the transfer's failure, not a closed handle
                self.state = FAILED
            raise
        with self._lock:
            if self.state == DONE or self.sequence is not None:
                # done (an interrupted poll may have made the sequence
                # without getting here)
                self.state = DONE
                return DONE
            if self.state == CANCELLED and int(state) == RUNNING:
                return CANCELLED  # a cancel() on another thread landed after the library's answer
            self.state = int(state)
        return self.state

    def wait(self, timeout: Optional[float] = None) -> Optional[Sequence]:
        """Polls until the transfer ends (or timeout seconds: TimeoutError);
        the new sequence (None if cancelled)."""
        if timeout is not None:
            timeout = _real(timeout, "timeout")
            if math.isnan(timeout):  # never past it: the wait polled forever
                raise ValueError("timeout: NaN is not a number of seconds")
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() == RUNNING:
            if end is not None and time.monotonic() > end:
                raise TimeoutError("transfer still running")
            time.sleep(0)
        return self.sequence

    def cancel(self) -> None:
        """Stops the reads and frees the blocks; InvalidStateError once done.
        A no-op on a failed transfer: it stays FAILED (poll() raises)."""
        _c.pkv_transfer_cancel(self._h)
        with self._lock:  # not between a racing poll's check and its write
            if self.state == RUNNING:  # a failure happens in poll(), which set FAILED
                self.state = CANCELLED
