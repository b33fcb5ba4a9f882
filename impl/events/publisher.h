// A pool's KV events published over ZeroMQ the way vLLM's ZmqEventPublisher
// does: a PUB socket sending [topic, seq as 8 bytes big endian, msgpack
// batch], and an optional ROUTER replay socket that answers a start seq
// with the buffered (seq, batch) pairs from there and an end marker
// (seq -1, empty payload). Built with PAGEDKV_EVENTS (libzmq, msgpack-c);
// without it create() fails with kUnsupported.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "events/wire.h"

namespace pagedkv {
class Pool;
}

namespace pagedkv::events {

struct PublisherOptions {
  std::string endpoint;         // PUB: bound if it holds '*' or '::' or is ipc:// or inproc://
  std::string replay_endpoint;  // ROUTER, bound; empty = no replay
  std::string topic;
  uint32_t dp_rank = 0;  // offsets a tcp port (or suffixes an inproc name), as vLLM
  uint64_t buffer_steps = 10000;
  int32_t hwm = 100000;
  // Replay answers [topic, seq, batch] and end ["", -1, empty] (vLLM 0.33
  // on) instead of [seq, batch] and [-1, empty].
  bool replay_with_topic = false;
  WireOptions wire;
};

struct PublisherStats {
  uint64_t batches_published = 0;
  uint64_t events_published = 0;  // vLLM events (runs of pool events)
  uint64_t pool_events_published = 0;
  uint64_t pool_events_dropped = 0;  // lost in the pool's queue (seq gaps) before a publish
  uint64_t replay_requests = 0;
  uint64_t next_seq = 0;
};

class Publisher {
 public:
  virtual ~Publisher() = default;
  // Drains every pending event of the pool and sends them as one batch
  // (none when there are none). Returns the pool events drained.
  virtual uint64_t publish() = 0;
  virtual PublisherStats stats() const = 0;
  // The endpoints after the rank offset (what was bound or connected).
  virtual std::string endpoint() const = 0;
  virtual std::string replay_endpoint() const = 0;
};

// Throws Error: kInvalidArgument (bad endpoint, socket errors naming the
// endpoint), kUnsupported (built without PAGEDKV_EVENTS).
std::unique_ptr<Publisher> make_publisher(std::shared_ptr<Pool> pool, const PublisherOptions& o);

// vLLM's offset_endpoint_port: tcp port + rank, inproc name + "_dp<rank>".
std::string offset_endpoint(const std::string& endpoint, uint32_t rank);
// Throws kInvalidArgument when a tcp:// endpoint's port is neither "*" nor
// a number up to 65535: libzmq 4.3 takes 99999 modulo 65536 and binds
// another port without a word.
void check_tcp_port(const std::string& endpoint);
// Throws kInvalidArgument naming `what` for the multicast transports
// (pgm://, epgm://, norm://): a NORM session that fails to start (an
// address libzmq cannot use, e.g. "norm://*:5") hits a zmq_assert that
// aborts the process from libzmq's I/O thread after the connect returned,
// and OpenPGM prints warnings to stderr; a KV event router takes tcp://,
// ipc:// or inproc:// (vLLM's publisher) anyway.
void check_transport(const std::string& endpoint, const char* what);

}  // namespace pagedkv::events
