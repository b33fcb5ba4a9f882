"""KV events with token ids and medium, and a publisher of them in vLLM's
wire format (``pagedkv/events.h``).

:class:`EventPublisher` sends a pool's events over ZeroMQ exactly as vLLM's
``ZmqEventPublisher`` does (PUB frames ``[topic, seq, msgpack batch]`` and a
ROUTER replay socket), so a router written for vLLM's KV events, such as
vLLM's own ``kv_events_subscriber.py``, consumes them unchanged.
:func:`drain_events` is the versioned drain for engines that read the events
themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, List, Optional, Tuple

from . import _pagedkv as _c
from ._handle import HandleOwner, _adopt_handle
from ._pool import _check_pool, _count
from ._types import EventType, _flag, _index

if TYPE_CHECKING:
    from ._pool import Pool


class Medium(IntEnum):
    """Where an event's block lives (``PKV_MEDIUM_*``)."""

    DEVICE = _c.PKV_MEDIUM_DEVICE
    HOST = _c.PKV_MEDIUM_HOST
    FILE = _c.PKV_MEDIUM_FILE


@dataclass(frozen=True)
class EventV2:
    """One KV event with what vLLM's carry: token ids, block size, medium."""

    seq_no: int
    type: EventType
    block_id: int
    medium: Medium
    block_hash: bytes
    parent_hash: Optional[bytes]
    num_tokens: int
    lora_id: int
    block_size: int
    token_ids: Tuple[int, ...]


# Events per raw call: its buffers (events and block_size token ids each)
# are allocated for the whole chunk, whatever is queued.
_DRAIN_CHUNK = 1024


def drain_events(pool: Pool, max_events: int = 1024) -> List[EventV2]:
    """Moves up to max_events oldest events of pool (every medium) out."""
    _check_pool(pool)
    digest = pool._digest
    left = _count(max_events, "max_events")
    out: List[EventV2] = []
    while left > 0:
        cap = min(left, _DRAIN_CHUNK)
        raw = pool._call(_c.pkv_pool_drain_events_v2, (cap, cap * pool.block_size))
        out.extend(
            EventV2(
                seq_no=e.seq_no,
                type=EventType(e.type),
                block_id=e.block_id,
                medium=Medium(e.medium),
                block_hash=e.block_hash[:digest],
                parent_hash=e.parent_hash[:digest] if e.has_parent else None,
                num_tokens=e.num_tokens,
                lora_id=e.lora_id,
                block_size=e.block_size,
                token_ids=tuple(ids),
            )
            for e, ids in raw
        )
        if len(raw) < cap:
            break
        left -= cap
    return out


@dataclass(frozen=True)
class PublisherStats:
    batches_published: int
    events_published: int
    pool_events_published: int
    pool_events_dropped: int
    replay_requests: int


class EventPublisher(HandleOwner):
    """Publishes pool's KV events on endpoint (bound if it holds ``*`` or
    ``::`` or is ipc:// or inproc://, else connected) with an optional replay
    socket bound at replay_endpoint. Call :meth:`publish` once per engine
    step. ``event_encoding``: ``"map"`` (vLLM after PR 42892, the default) or
    ``"array"`` (vLLM 0.9 to 0.23); ``hash_encoding``: ``"int"`` (vLLM's
    default) or ``"bytes"``. ``replay_with_topic``: replay answers
    ``[topic, seq, batch]`` and end ``["", -1, b""]``, as vLLM 0.33 on;
    False (the default): ``[seq, batch]`` and ``[-1, b""]``, as earlier
    vLLM. UnsupportedError in a build without PAGEDKV_EVENTS."""

    def __init__(
        self,
        pool: Pool,
        endpoint: str,
        replay_endpoint: Optional[str] = None,
        *,
        topic: str = "",
        data_parallel_rank: int = 0,
        buffer_steps: int = 10000,
        hwm: int = 100000,
        event_encoding: str = "map",
        hash_encoding: str = "int",
        device_medium: Optional[str] = None,
        replay_with_topic: bool = False,
    ) -> None:
        self._refuse_second_init("event publisher")
        _check_pool(pool)
        encodings = {"map": _c.PKV_EVENTS_ENCODING_MAP, "array": _c.PKV_EVENTS_ENCODING_ARRAY}
        hashes = {"int": _c.PKV_EVENTS_HASH_INT, "bytes": _c.PKV_EVENTS_HASH_BYTES}
        for name, value, words in (
            ("event_encoding", event_encoding, "'map' or 'array'"),
            ("hash_encoding", hash_encoding, "'int' or 'bytes'"),
        ):
            try:  # a list, a dict, a tuple holding one: the lookup's "unhashable type" named neither
                hash(value)
            except TypeError:
                raise TypeError(f"{name}: expected {words}, got {type(value).__name__}") from None
        if event_encoding not in encodings:
            raise _c.InvalidArgumentError(f"event_encoding {event_encoding!r}: not 'map' or 'array'")
        if hash_encoding not in hashes:
            raise _c.InvalidArgumentError(f"hash_encoding {hash_encoding!r}: not 'int' or 'bytes'")
        opts = {
            "topic": topic,
            "data_parallel_rank": _index(data_parallel_rank, "data_parallel_rank"),
            "buffer_steps": _index(buffer_steps, "buffer_steps"),
            "hwm": _index(hwm, "hwm"),
            "event_encoding": encodings[event_encoding],
            "hash_encoding": hashes[hash_encoding],
            "device_medium": device_medium,
            "replay_with_topic": int(_flag(replay_with_topic, "replay_with_topic")),
        }
        # The raw call and self._h in one C call: an interrupt between them
        # dropped the publisher, its sockets bound for the process's life.
        _adopt_handle(
            self,
            _c.pkv_event_publisher_destroy,
            "event publisher",
            _c.pkv_event_publisher_create,
            pool._h,
            endpoint,
            replay_endpoint,
            opts,
        )

    def publish(self) -> int:
        """Drains the pool's pending events and sends them as one batch (none
        when there are none); returns the pool events drained."""
        return int(_c.pkv_event_publisher_publish(self._h))

    @property
    def endpoint(self) -> str:
        """The PUB endpoint after the data-parallel rank's offset."""
        return str(_c.pkv_event_publisher_endpoint(self._h, 0))

    @property
    def replay_endpoint(self) -> str:
        """The replay endpoint after the offset ("" when none)."""
        return str(_c.pkv_event_publisher_endpoint(self._h, 1))

    def stats(self) -> PublisherStats:
        s = _c.pkv_event_publisher_get_stats(self._h)
        return PublisherStats(
            batches_published=s.batches_published,
            events_published=s.events_published,
            pool_events_published=s.pool_events_published,
            pool_events_dropped=s.pool_events_dropped,
            replay_requests=s.replay_requests,
        )
