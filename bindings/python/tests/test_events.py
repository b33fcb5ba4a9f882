"""KV events over ZeroMQ, decoded the way a router written for vLLM decodes
them: msgspec structs with the class layout of vllm/distributed/kv_events.py
(current map-encoded events, and the array-encoded ones of vLLM <= 0.23),
a SUB socket for [topic, seq, payload] and a replay request [start seq]
answered by [seq, payload]... and [-1, b""], as in vLLM's
examples/online_serving/kv_events_subscriber.py. That example asks with a
REQ socket, which libzmq lets receive only the first reply; these tests use
a DEALER (plus the empty delimiter frame a REQ socket adds), which receives
them all."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

import pytest

import pagedkv
from pagedkv.events import EventPublisher, Medium, drain_events

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")


def _publisher_or_skip(pool: pagedkv.Pool, *args: Any, **kw: Any) -> EventPublisher:
    try:
        return EventPublisher(pool, *args, **kw)
    except pagedkv.UnsupportedError:
        pytest.skip("built without PAGEDKV_EVENTS")


# ---- vLLM's layout (the current one: events are tagged maps; the batch an array)


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: List[Any]
    data_parallel_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: List[Union[int, bytes]]
    parent_block_hash: Union[int, bytes, None]
    token_ids: List[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[List[Optional[Tuple[Any, ...]]]] = None
    group_idx: Optional[int] = None


class BlockRemoved(KVCacheEvent):
    block_hashes: List[Union[int, bytes]]
    medium: Optional[str]
    group_idx: Optional[int] = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: List[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


# ---- vLLM 0.10's layout (array_like events, no lora_name yet)


class LegacyEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class LegacyStored(LegacyEvent, tag="BlockStored"):
    block_hashes: List[int]
    parent_block_hash: Optional[int]
    token_ids: List[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]


class LegacyRemoved(LegacyEvent, tag="BlockRemoved"):
    block_hashes: List[int]
    medium: Optional[str]


class LegacyCleared(LegacyEvent, tag="AllBlocksCleared"):
    pass


class LegacyBatch(EventBatch):
    events: List[Union[LegacyStored, LegacyRemoved, LegacyCleared]]


# ---- a subscriber as vLLM's example writes it


class Subscriber:
    def __init__(self, endpoint: str, replay: Optional[str], topic: str, batch_type: Any) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(endpoint)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, topic)
        self.replay = None
        if replay:
            self.replay = self.ctx.socket(zmq.DEALER)
            self.replay.connect(replay)
        self.decoder = msgspec.msgpack.Decoder(type=batch_type)
        self.batches: Dict[int, Any] = {}
        self.last_seq = -1
        self.replays = 0

    def request_replay(self, start: int) -> None:
        assert self.replay is not None
        self.replays += 1
        self.replay.send_multipart([b"", start.to_bytes(8, "big")])
        while self.replay.poll(2000):
            _delim, seq_bytes, payload = self.replay.recv_multipart()
            if not payload:  # end marker: seq -1 and an empty payload
                assert int.from_bytes(seq_bytes, "big", signed=True) == -1
                return
            seq = int.from_bytes(seq_bytes, "big")
            self.batches[seq] = self.decoder.decode(payload)
            self.last_seq = max(self.last_seq, seq)
        raise AssertionError("replay: no end marker")

    def poll(self, timeout_ms: int = 500) -> bool:
        if not self.sub.poll(timeout_ms):
            return False
        _topic, seq_bytes, payload = self.sub.recv_multipart()
        seq = int.from_bytes(seq_bytes, "big")
        if seq > self.last_seq + 1 and self.replay is not None:
            self.request_replay(self.last_seq + 1)
        self.batches[seq] = self.decoder.decode(payload)
        self.last_seq = max(self.last_seq, seq)
        return True

    def close(self) -> None:
        self.ctx.destroy(linger=0)


def _as_int(h: bytes) -> int:
    return int.from_bytes(h[-8:], "big")  # vLLM's maybe_convert_block_hash


def _wait_connected(pub: EventPublisher, sub: Subscriber, pool: pagedkv.Pool) -> None:
    # PUB drops what is sent before a subscription arrives: probe with
    # cleared-cache batches until one gets through, then start from a clean
    # slate (what was missed is replayed, or was only probes).
    for _ in range(200):
        pool.reset_prefix_cache()
        pub.publish()
        if sub.poll(20):
            while sub.poll(100):  # probes still in flight
                pass
            return
    raise AssertionError("subscriber never connected")


def _workload(pool: pagedkv.Pool, pub: EventPublisher, steps: List[List[int]]) -> List[Any]:
    seqs = []
    for prompt in steps:
        s = pool.create_sequence()
        s.append(prompt)
        seqs.append(s)
        pub.publish()
    for s in seqs:
        s.free()  # never computed: their blocks leave the cache (BlockRemoved)
    pub.publish()
    pool.reset_prefix_cache()
    pub.publish()
    return seqs


BS = 4
SHARED = [11, 12, 13, 14, 15, 16, 17, 18]
PROMPTS = [[*SHARED, 1, 2, 3, 4, 5], [*SHARED, 6, 7, 8, 9], [40, 41, 42, 43, 44]]


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_vllm_subscriber_decodes_stream(encoding: str) -> None:
    with pagedkv.Pool(num_blocks=64, block_size=BS, enable_events=True) as pool:
        pub = _publisher_or_skip(
            pool,
            "tcp://127.0.0.1:*",
            "tcp://127.0.0.1:*",
            topic="kv-events",
            data_parallel_rank=0,
            event_encoding=encoding,
        )
        assert pub.endpoint.startswith("tcp://127.0.0.1:") and "*" not in pub.endpoint
        batch_type = KVEventBatch if encoding == "map" else LegacyBatch
        sub = Subscriber(pub.endpoint, pub.replay_endpoint, "kv-events", batch_type)
        try:
            _wait_connected(pub, sub, pool)
            first = sub.last_seq + 1
            _workload(pool, pub, PROMPTS)
            while sub.poll(500):
                pass
            seqs = sorted(s for s in sub.batches if s >= first)
            assert seqs == list(range(first, first + len(PROMPTS) + 2))
            got = [sub.batches[s] for s in seqs]
        finally:
            sub.close()
            pub.close()
    stored_t = BlockStored if encoding == "map" else LegacyStored
    removed_t = BlockRemoved if encoding == "map" else LegacyRemoved
    cleared_t = AllBlocksCleared if encoding == "map" else LegacyCleared
    for b in got:
        assert b.data_parallel_rank == 0 and b.ts > 1.6e9
    # One BlockStored per step with the prompt's full blocks (appended
    # without a prefix lookup: blocks of their own, equal hashes or not),
    # chained from the root, hashes as pagedkv.hash_prefix computes them.
    stored: list = []
    for prompt, batch in zip(PROMPTS, got):
        hashes = [_as_int(h) for h in pagedkv.hash_prefix(prompt, block_size=BS)]
        full = len(prompt) // BS
        assert len(batch.events) == 1
        ev = batch.events[0]
        assert isinstance(ev, stored_t)
        assert ev.block_hashes == hashes[:full]
        assert ev.parent_block_hash is None
        assert ev.token_ids == prompt[: full * BS]
        assert ev.block_size == BS and ev.lora_id is None and ev.medium == "CPU"
        if encoding == "map":
            assert ev.lora_name is None and ev.extra_keys is None
        stored += hashes[:full]
    # Freed before any step computed them: every block leaves the cache.
    removed = got[len(PROMPTS)]
    assert all(isinstance(e, removed_t) and e.medium == "CPU" for e in removed.events)
    assert sorted(h for e in removed.events for h in e.block_hashes) == sorted(stored)
    assert len(got[-1].events) == 1 and isinstance(got[-1].events[0], cleared_t)


def test_replay_fills_a_gap() -> None:
    with pagedkv.Pool(num_blocks=64, block_size=BS, enable_events=True) as pool:
        pub = _publisher_or_skip(pool, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_steps=100)
        # Published before anyone listens: lost on the PUB socket, kept for replay.
        _workload(pool, pub, PROMPTS)
        missed = pub.stats().batches_published
        assert missed == len(PROMPTS) + 2
        sub = Subscriber(pub.endpoint, pub.replay_endpoint, "", KVEventBatch)
        try:
            _wait_connected(pub, sub, pool)  # the first one it sees is past a gap
            assert sub.replays == 1 and pub.stats().replay_requests == 1
            assert sorted(sub.batches) == list(range(sub.last_seq + 1))
            lost = [sub.batches[s] for s in range(missed)]
            assert isinstance(lost[0].events[0], BlockStored)
            assert lost[0].events[0].token_ids == PROMPTS[0][: (len(PROMPTS[0]) // BS) * BS]
            assert isinstance(lost[-1].events[0], AllBlocksCleared)
        finally:
            sub.close()
            pub.close()


def test_replay_answers_only_what_is_buffered() -> None:
    with pagedkv.Pool(num_blocks=64, block_size=BS, enable_events=True) as pool:
        pub = _publisher_or_skip(pool, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_steps=2)
        _workload(pool, pub, PROMPTS)  # 5 batches, the last 2 kept
        ctx = zmq.Context()
        try:
            req = ctx.socket(zmq.DEALER)
            req.connect(pub.replay_endpoint)
            req.send_multipart([b"", (0).to_bytes(8, "big")])
            seqs = []
            while req.poll(2000):
                _delim, seq_bytes, payload = req.recv_multipart()
                if not payload:
                    break
                seqs.append(int.from_bytes(seq_bytes, "big"))
            assert seqs == [3, 4]
        finally:
            ctx.destroy(linger=0)
            pub.close()


def test_dropped_events_are_reported() -> None:
    with pagedkv.Pool(num_blocks=64, block_size=BS, enable_events=True, max_events=2) as pool:
        pub = _publisher_or_skip(pool, "inproc://pkv-drop")
        s = pool.create_sequence()
        s.append(list(range(5 * BS)))  # 5 stored events; the queue keeps 2
        assert pub.publish() == 2
        st = pub.stats()
        assert st.pool_events_dropped == 3 and st.pool_events_published == 2
        assert pool.stats().num_events_dropped == 3
        pub.close()


def test_drain_events_v2_carries_tokens_and_medium() -> None:
    with pagedkv.Pool(num_blocks=64, block_size=BS, enable_events=True) as pool:
        s = pool.create_sequence()
        tokens = list(range(100, 100 + 3 * BS + 1))
        s.append(tokens)
        evs = drain_events(pool)
        assert [e.type for e in evs] == [pagedkv.EventType.BLOCK_STORED] * 3
        hashes = pagedkv.hash_prefix(tokens, block_size=BS)
        for j, e in enumerate(evs):
            assert e.medium == Medium.DEVICE and e.block_size == BS
            assert e.token_ids == tuple(tokens[j * BS : (j + 1) * BS])
            assert e.block_hash == hashes[j]
            assert e.parent_hash == (hashes[j - 1] if j else None)
        assert [e.seq_no for e in evs] == [1, 2, 3]
        assert drain_events(pool) == []
        # A negative count read as 2**64 - 1 ("capacity too large").
        for bad in (lambda: drain_events(pool, -1), lambda: list(pool.events(-1))):
            with pytest.raises(ValueError, match="max_events must be >= 0"):
                bad()
        for bad in (lambda: drain_events(pool, 2.5), lambda: list(pool.events(2.5))):
            with pytest.raises(TypeError, match="max_events"):
                bad()


def test_drain_events_v2_any_count_drains_in_chunks() -> None:
    """drain_events(pool, n) asked the raw call for room for n events and
    n * block_size token ids at once: a count above 2**20 (or, with 1024-token
    blocks, above 65536) was a ValueError ("capacity or token_capacity too
    large") however few events were queued, and a large one allocated that
    much. "Up to max_events": any count drains what is there, in order."""
    with pagedkv.Pool(num_blocks=3000, block_size=BS, enable_events=True, max_events=5000) as pool:
        s = pool.create_sequence()
        tokens = list(range(2500 * BS))
        s.append(tokens)  # 2500 stored events: more than one chunk
        evs = drain_events(pool, 2**21)
        assert [e.seq_no for e in evs] == list(range(1, 2501))
        assert evs[-1].token_ids == tuple(tokens[-BS:])
        assert drain_events(pool, 2**40) == []
    with pagedkv.Pool(num_blocks=8, block_size=1024, enable_events=True) as pool:
        s = pool.create_sequence()
        s.append(list(range(2048)))
        evs = drain_events(pool, 100_000)
        assert [e.num_tokens for e in evs] == [1024, 1024]
        s.append(list(range(1024)))
        assert [e.seq_no for e in drain_events(pool, 1)] == [3]


def test_publisher_bad_arguments() -> None:
    with pagedkv.Pool(num_blocks=8, block_size=BS) as pool:  # events off
        try:
            with pytest.raises(pagedkv.InvalidArgumentError, match="enable_events"):
                EventPublisher(pool, "inproc://pkv-bad")
        except pagedkv.UnsupportedError:
            pytest.skip("built without PAGEDKV_EVENTS")
    with pagedkv.Pool(num_blocks=8, block_size=BS, enable_events=True) as pool:
        with pytest.raises(pagedkv.InvalidArgumentError, match="event_encoding"):
            EventPublisher(pool, "inproc://pkv-bad", event_encoding="json")
        with pytest.raises(pagedkv.InvalidArgumentError, match="ipc:///nonexistent"):
            _publisher_or_skip(pool, "ipc:///nonexistent/dir/sock")
        with pytest.raises(pagedkv.InvalidArgumentError, match="port"):
            _publisher_or_skip(pool, "tcp://127.0.0.1:*", data_parallel_rank=1)
        # libzmq alone bound port 99999 as 34463.
        with pytest.raises(pagedkv.InvalidArgumentError, match="65535"):
            _publisher_or_skip(pool, "tcp://*:99999")
        with pytest.raises(pagedkv.InvalidArgumentError, match="65535"):
            _publisher_or_skip(pool, "tcp://127.0.0.1:*", "tcp://127.0.0.1:70000")
        pub = _publisher_or_skip(pool, "inproc://pkv-ok")
        pub.close()
        pub.close()  # idempotent
        with pytest.raises(pagedkv.InvalidStateError):
            pub.publish()


def test_publisher_encodings_of_another_type_are_named() -> None:
    """event_encoding / hash_encoding were looked up in a dict as given: a
    list or dict raised a bare "unhashable type: 'list'", naming neither."""
    with pagedkv.Pool(num_blocks=8, block_size=BS, enable_events=True) as pool:
        for kw in ({"event_encoding": ["map"]}, {"hash_encoding": {"int": 1}}, {"event_encoding": ("map", [])}):
            name = next(iter(kw))
            with pytest.raises(
                TypeError, match=f"^{name}: expected 'map' or 'array'|^{name}: expected 'int' or 'bytes'"
            ):
                EventPublisher(pool, "inproc://pkv-bad-type", **kw)
        with pytest.raises(pagedkv.InvalidArgumentError, match="hash_encoding 'hex'"):
            EventPublisher(pool, "inproc://pkv-bad-type", hash_encoding="hex")


def test_replay_with_topic_frames_answers_as_vllm_0_33() -> None:
    # vLLM 0.33's _service_replay (its PR 45177) answers [topic, seq, batch]
    # and ends with [b"", -1, b""]; replay_with_topic=True does the same.
    with pagedkv.Pool(num_blocks=64, block_size=BS, enable_events=True) as pool:
        with pytest.raises(TypeError, match="replay_with_topic"):
            EventPublisher(pool, "inproc://rwt", "inproc://rwt-r", replay_with_topic="yes")
        pub = _publisher_or_skip(pool, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", topic="kv@pod", replay_with_topic=True)
        _workload(pool, pub, PROMPTS)
        n = pub.stats().batches_published
        ctx = zmq.Context()
        try:
            req = ctx.socket(zmq.DEALER)
            req.connect(pub.replay_endpoint)
            req.send_multipart([b"", (1).to_bytes(8, "big")])
            seqs = []
            while req.poll(2000):
                delim, topic, seq_bytes, payload = req.recv_multipart()
                assert delim == b""
                if not payload:
                    assert topic == b"" and seq_bytes == b"\xff" * 8
                    break
                assert topic == b"kv@pod"
                assert isinstance(msgspec.msgpack.decode(payload), list)
                seqs.append(int.from_bytes(seq_bytes, "big"))
            assert seqs == list(range(1, n))
        finally:
            ctx.destroy(linger=0)
            pub.close()
