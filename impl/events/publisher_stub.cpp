// Built without PAGEDKV_EVENTS (ZeroMQ or msgpack-c not found).
#include "error.h"
#include "events/publisher.h"

namespace pagedkv::events {

std::unique_ptr<Publisher> make_publisher(std::shared_ptr<Pool>, const PublisherOptions&) {
  fail(Errc::kUnsupported,
       "this build has no KV event publisher (configure with PAGEDKV_EVENTS=ON; it needs "
       "libzmq and msgpack-c: scripts/deps/events.apt)");
}

}  // namespace pagedkv::events
