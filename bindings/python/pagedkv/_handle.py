"""Shared ownership of a C handle between Python objects."""

from __future__ import annotations

import threading
from typing import Any, Callable, TypeVar

from . import _pagedkv as _c


class Handle:
    """Owns a C handle: the owner's reference plus one per call in flight and
    per live view. close() drops the owner's reference and makes new calls
    fail; the handle is destroyed when the last reference goes, so a call
    racing close() on another thread, or a view still in use, never sees
    freed memory. Across handles the library does the same: a pool closed
    while a call on one of its batches runs keeps its storage until that
    call returns (docs/threading.md), and later batch calls raise
    InvalidStateError."""

    __slots__ = ("_closed", "_destroy", "_lock", "_ptr", "_refs", "_what")

    def __init__(self, ptr: Any, destroy: Callable[[Any], None], what: str) -> None:
        self._ptr = ptr
        self._destroy = destroy
        # Re-entrant: a finalizer (Sequence.__del__) may run on this thread
        # while it holds the lock.
        self._lock = threading.RLock()
        self._refs = 1
        self._closed = False
        self._what = what

    @property
    def closed(self) -> bool:
        return self._closed

    def acquire(self) -> Any:
        """The pointer, pinned until the matching release()."""
        with self._lock:
            if self._closed:
                raise _c.InvalidStateError(f"the {self._what} is closed", _c.PKV_E_INVALID_STATE)
            self._refs += 1
            return self._ptr

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            if self._refs:
                return
            ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._destroy(ptr)

    def close(self) -> None:
        """Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.release()


_Owner = TypeVar("_Owner", bound="HandleOwner")


class HandleOwner:
    """The lifetime protocol of an object owning a Handle in ``self._h``:
    idempotent close(), ``closed``, context manager, close on collection."""

    _h: Handle

    def close(self) -> None:
        """Releases the object (after any call in flight). Idempotent; every
        other call raises InvalidStateError afterwards."""
        h = getattr(self, "_h", None)
        if h is not None:
            h.close()

    @property
    def closed(self) -> bool:
        return self._h.closed

    def __enter__(self: _Owner) -> _Owner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
