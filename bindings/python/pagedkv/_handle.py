"""Shared ownership of a C handle between Python objects."""

from __future__ import annotations

from typing import Any, TypeVar

from . import _pagedkv as _c

# Owns a C handle: the owner's reference plus one per call in flight and per
# live view. close() drops the owner's reference and makes new calls fail;
# the handle is destroyed when the last reference goes, so a call racing
# close() on another thread, or a view still in use, never sees freed
# memory. Across handles the library does the same: a pool closed while a
# call on one of its batches runs keeps its storage until that call returns
# (docs/threading.md), and later batch calls raise InvalidStateError.
#
# Implemented in the SWIG module (Handle(ptr, destroy, what); acquire(),
# release(), close(), closed): passed where a raw function takes its
# pointer, the argument typemap pins it for the call in C, under the GIL,
# which costs a few nanoseconds where a Python lock and try/finally cost
# more than the library call itself.
Handle = _c._Handle

# _adopt_handle(owner, destroy, what, raw_fn, *args): raw_fn(*args), which
# makes a library object and returns its pointer, and owner._h = the Handle
# owning it, in one C call: a KeyboardInterrupt (any signal handler's
# exception) raised by the interpreter right after a raw call returns can
# then no longer drop the pointer before it has an owner (see
# _Handle._adopt in swig/pagedkv.i). Returns the handle.
_adopt_handle = _c._Handle._adopt


_Owner = TypeVar("_Owner", bound="HandleOwner")


class NoCopy:
    """Refuses copy, deepcopy and pickle, naming the class and
    ``_pickle_why`` (why it cannot travel; what to send instead)."""

    __slots__ = ()
    _pickle_why = "it owns a library handle"

    def __copy__(self) -> Any:
        raise TypeError(no_copy(self))

    def __deepcopy__(self, memo: Any) -> Any:
        raise TypeError(no_copy(self))

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"cannot pickle a pagedkv.{type(self).__name__}: {self._pickle_why}")


class HandleOwner(NoCopy):
    """The lifetime protocol of an object owning a Handle in ``self._h``:
    idempotent close(), ``closed``, context manager, close on collection.
    A copy would share the handle and close it when collected (a copied
    Pool closed the original, a copied Batch aborted it): one object owns
    one handle, so share the object itself."""

    _h: Handle

    def _refuse_second_init(self, what: str) -> None:
        """__init__ of an object that already owns its handle replaced it:
        the old library object was never closed (what still held its handle
        kept it alive) and this object named the new one."""
        if getattr(self, "_h", None) is not None:
            raise TypeError(f"{type(self).__name__}.__init__: this object already owns a {what} (make a new one)")

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


def no_copy(obj: Any) -> str:
    """The message for copying an object that owns or pins a library handle."""
    return f"cannot copy a pagedkv.{type(obj).__name__}: it owns a library handle (share the object itself)"
