// pagedkv/events.h: the versioned event drain and the ZeroMQ publisher.
#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "capi_util.h"
#include "events/publisher.h"
#include "kv_pool.h"

namespace pc = pkv_capi;
using pagedkv::Errc;
using pagedkv::fail;

struct pkv_event_publisher {
  std::unique_ptr<pagedkv::events::Publisher> impl;
};

namespace {

constexpr uint32_t kEventV2V1 = sizeof(pkv_event_v2);
// The first release's options ended at device_medium.
constexpr uint32_t kPublisherOptionsV1 = offsetof(pkv_event_publisher_options, replay_with_topic);
constexpr uint32_t kPublisherStatsV1 = sizeof(pkv_event_publisher_stats);

std::string str(uint64_t v) { return std::to_string(v); }

// The defaults of pkv_event_publisher_options that are not 0 (for pc::fill_defaults).
void publisher_options_defaults(pkv_event_publisher_options& o) {
  o.topic = "";
  o.buffer_steps = 10000;
  o.hwm = 100000;
  o.event_encoding = PKV_EVENTS_ENCODING_MAP;
  o.hash_encoding = PKV_EVENTS_HASH_INT;
}

pagedkv::events::Publisher& publisher_of(const pkv_event_publisher* p) {
  pc::require(p, "pub");
  return *p->impl;
}

}  // namespace

extern "C" {

pkv_status pkv_pool_drain_events_v2(pkv_pool* pool, pkv_event_v2* out, uint64_t capacity,
                                    int32_t* token_buf, uint64_t token_capacity,
                                    uint64_t* out_count) {
  PKV_GUARD({
    pagedkv::Pool& p = pc::pool_of(pool);
    pc::require(out_count, "out_count");
    uint32_t stride = kEventV2V1;
    if (capacity > 0) {
      pc::require(out, "out");
      pc::check_struct_size(out[0].struct_size, kEventV2V1, "out[0]", "pkv_event_v2",
                            "sizeof(pkv_event_v2)");
      stride = out[0].struct_size;
    }
    if (token_capacity > 0) pc::require(token_buf, "token_buf");
    const uint32_t bs = p.options().block_size;
    // One event at a time: whether the next one's ids fit is known only
    // once it is at the head, and a drained event cannot be put back.
    uint64_t done = 0, used = 0;
    std::vector<int32_t> ids(bs);
    while (done < capacity) {
      pagedkv::Event e;
      const int got = p.drain_one_event(&e, ids.data(), token_capacity - used >= bs);
      if (got == 0) break;
      if (got < 0) {
        if (done == 0)
          fail(Errc::kBufferTooSmall, "token_capacity " + str(token_capacity) +
                                          " cannot hold the next stored block's " + str(bs) +
                                          " token ids");
        break;
      }
      pkv_event_v2 o;
      std::memset(&o, 0, sizeof o);
      o.struct_size = stride;
      o.type = uint32_t(e.type);
      o.seq_no = e.seq_no;
      o.block_id = e.block_id;
      o.medium = e.medium;
      pc::copy_hash(e.block_hash, &o.block_hash);
      pc::copy_hash(e.parent_hash, &o.parent_hash);
      o.has_parent = e.parent_hash.empty() ? 0 : 1;
      o.num_tokens = e.num_tokens;
      o.lora_id = e.lora_id;
      o.block_size = bs;
      if (e.has_tokens) {
        std::memcpy(token_buf + used, ids.data(), sizeof(int32_t) * bs);
        o.num_token_ids = bs;
        o.token_offset = used;
        used += bs;
      }
      auto* dst = reinterpret_cast<pkv_event_v2*>(reinterpret_cast<char*>(out) + done * stride);
      std::memcpy(static_cast<void*>(dst), &o, std::min<size_t>(stride, sizeof o));
      ++done;
    }
    *out_count = done;
  });
}

void pkv_event_publisher_options_init(pkv_event_publisher_options* opts) {
  pc::init_frozen<pc::kPublisherOptionsFrozen>(opts, publisher_options_defaults);
}

pkv_status pkv_event_publisher_options_init_sized(pkv_event_publisher_options* opts, size_t size) {
  PKV_GUARD(pc::init_sized(opts, "opts", size, kPublisherOptionsV1, "pkv_event_publisher_options",
                           publisher_options_defaults));
}

pkv_status pkv_event_publisher_create(pkv_pool* pool, const char* endpoint,
                                      const char* replay_endpoint,
                                      const pkv_event_publisher_options* opts,
                                      pkv_event_publisher** out) {
  PKV_GUARD({
    pc::require(out, "out");
    pc::require(pool, "pool");
    pc::require(endpoint, "endpoint");
    pc::pool_of(pool);  // a multi-group pool has no event publisher
    std::shared_ptr<pagedkv::Pool> p = pool->impl;
    pkv_event_publisher_options def;
    pc::fill_defaults(&def, publisher_options_defaults);
    if (!opts) opts = &def;
    pc::check_struct_size(opts->struct_size, kPublisherOptionsV1, "opts",
                          "pkv_event_publisher_options", "pkv_event_publisher_options_init");
    if (!p->events_enabled())
      fail(Errc::kInvalidArgument, "pool was created without enable_events: it records no events");
    if (!*endpoint) fail(Errc::kInvalidArgument, "endpoint is empty");
    if (replay_endpoint && !*replay_endpoint)
      fail(Errc::kInvalidArgument, "replay_endpoint is empty (NULL = no replay socket)");
    if (opts->event_encoding > PKV_EVENTS_ENCODING_ARRAY)
      fail(Errc::kInvalidArgument, "opts->event_encoding is " + str(opts->event_encoding) +
                                       ", not PKV_EVENTS_ENCODING_MAP or _ARRAY");
    if (opts->hash_encoding > PKV_EVENTS_HASH_BYTES)
      fail(Errc::kInvalidArgument, "opts->hash_encoding is " + str(opts->hash_encoding) +
                                       ", not PKV_EVENTS_HASH_INT or _BYTES");
    if (opts->hwm < 0) fail(Errc::kInvalidArgument, "opts->hwm is negative");
    if (opts->reserved != 0) fail(Errc::kInvalidArgument, "opts->reserved is not 0");
    if (opts->device_medium && !*opts->device_medium)
      fail(Errc::kInvalidArgument, "opts->device_medium is empty (NULL = the default)");
    const bool with_topic = PKV_HAS_FIELD(opts, replay_with_topic) && opts->replay_with_topic;
    if (PKV_HAS_FIELD(opts, replay_with_topic) && opts->replay_with_topic > 1)
      fail(Errc::kInvalidArgument,
           "opts->replay_with_topic is " + str(opts->replay_with_topic) + ", not 0 or 1");
    if (PKV_HAS_FIELD(opts, reserved1) && opts->reserved1 != 0)
      fail(Errc::kInvalidArgument, "opts->reserved1 is not 0");
    pagedkv::events::PublisherOptions o;
    o.endpoint = endpoint;
    o.replay_endpoint = replay_endpoint ? replay_endpoint : "";
    o.topic = opts->topic ? opts->topic : "";
    o.dp_rank = opts->data_parallel_rank;
    o.buffer_steps = opts->buffer_steps;
    o.hwm = opts->hwm;
    o.replay_with_topic = with_topic;
    o.wire.map_events = opts->event_encoding == PKV_EVENTS_ENCODING_MAP;
    o.wire.int_hashes = opts->hash_encoding == PKV_EVENTS_HASH_INT;
    o.wire.medium[0] = opts->device_medium                           ? opts->device_medium
                       : p->options().device_type == PKV_DEVICE_CUDA ? "GPU"
                                                                     : "CPU";
    // Checked before any socket opens, so the message names the argument.
    pagedkv::events::check_transport(o.endpoint, "endpoint");
    if (!o.replay_endpoint.empty())
      pagedkv::events::check_transport(o.replay_endpoint, "replay_endpoint");
    pagedkv::events::offset_endpoint(o.endpoint, o.dp_rank);
    if (!o.replay_endpoint.empty()) pagedkv::events::offset_endpoint(o.replay_endpoint, o.dp_rank);
    auto h = std::make_unique<pkv_event_publisher>();
    h->impl = pagedkv::events::make_publisher(std::move(p), o);
    *out = h.release();
  });
}

pkv_status pkv_event_publisher_publish(pkv_event_publisher* pub, uint64_t* out_num_events) {
  PKV_GUARD({
    const uint64_t n = publisher_of(pub).publish();
    if (out_num_events) *out_num_events = n;
  });
}

void pkv_event_publisher_stats_init(pkv_event_publisher_stats* stats) {
  pc::init_frozen<pc::kPublisherStatsFrozen>(stats);
}

pkv_status pkv_event_publisher_stats_init_sized(pkv_event_publisher_stats* stats, size_t size) {
  PKV_GUARD(pc::init_sized(stats, "stats", size, kPublisherStatsV1, "pkv_event_publisher_stats"));
}

pkv_status pkv_event_publisher_get_stats(const pkv_event_publisher* pub,
                                         pkv_event_publisher_stats* out) {
  PKV_GUARD({
    const pagedkv::events::Publisher& p = publisher_of(pub);
    pc::require(out, "out");
    pc::check_struct_size(out->struct_size, kPublisherStatsV1, "out", "pkv_event_publisher_stats",
                          "pkv_event_publisher_stats_init");
    const pagedkv::events::PublisherStats s = p.stats();
    pkv_event_publisher_stats r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.batches_published = s.batches_published;
    r.events_published = s.events_published;
    r.pool_events_published = s.pool_events_published;
    r.pool_events_dropped = s.pool_events_dropped;
    r.replay_requests = s.replay_requests;
    pc::write_out(out, r);
  });
}

pkv_status pkv_event_publisher_endpoint(const pkv_event_publisher* pub, uint32_t which, char* buf,
                                        uint64_t capacity, uint64_t* out_len) {
  PKV_GUARD({
    const pagedkv::events::Publisher& p = publisher_of(pub);
    pc::require(out_len, "out_len");
    if (which > 1) fail(Errc::kInvalidArgument, "which is " + str(which) + ", not 0 or 1");
    if (capacity > 0) pc::require(buf, "buf");
    const std::string e = which == 0 ? p.endpoint() : p.replay_endpoint();
    *out_len = e.size();
    if (capacity < e.size() + 1)
      fail(Errc::kBufferTooSmall, "capacity " + str(capacity) + " cannot hold the endpoint (" +
                                      str(e.size() + 1) + " bytes with its NUL)");
    std::memcpy(buf, e.c_str(), e.size() + 1);
  });
}

void pkv_event_publisher_destroy(pkv_event_publisher* pub) { delete pub; }

}  // extern "C"
