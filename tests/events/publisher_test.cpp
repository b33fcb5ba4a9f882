// The C API of pagedkv/events.h: the versioned drain, and the publisher
// over real ZeroMQ sockets (a SUB and a REQ socket of libzmq, as a router
// would open them). The Python suite decodes the same stream with vLLM's
// class layout; here the framing, sequence numbers, replay and stats.
#include <gtest/gtest.h>
#include <zmq.h>

#include <msgpack.hpp>
#include <string>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

struct Pool {
  pkv_pool* p = nullptr;
  explicit Pool(uint32_t max_events = 1024, uint32_t events = 1) {
    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.block_size = 4;
    o.num_blocks = 64;
    o.enable_events = events;
    o.max_events = max_events;
    EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  }
  ~Pool() { pkv_pool_destroy(p); }
  pkv_seq_id append(const std::vector<int32_t>& t) {
    pkv_seq_id s = 0;
    EXPECT_EQ(pkv_seq_create(p, nullptr, &s), PKV_OK);
    EXPECT_EQ(pkv_seq_append(p, s, t.data(), t.size(), 0), PKV_OK) << pkv_last_error_message();
    return s;
  }
};

std::vector<std::string> recv_all(void* s, int timeout_ms) {
  std::vector<std::string> frames;
  zmq_pollitem_t it{s, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&it, 1, timeout_ms) <= 0) return frames;
  int more = 1;
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, 0) < 0) break;
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
    more = zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
  return frames;
}

uint64_t be64(const std::string& s) {
  uint64_t v = 0;
  for (unsigned char c : s) v = (v << 8) | c;
  return v;
}

std::string endpoint(pkv_event_publisher* pub, uint32_t which) {
  char buf[256];
  uint64_t len = 0;
  EXPECT_EQ(pkv_event_publisher_endpoint(pub, which, buf, sizeof buf, &len), PKV_OK);
  return std::string(buf, len);
}

pkv_event_publisher* make(pkv_pool* pool, const char* ep, const char* replay,
                          uint64_t steps = 100) {
  pkv_event_publisher_options o;
  pkv_event_publisher_options_init(&o);
  o.topic = "kv";
  o.buffer_steps = steps;
  pkv_event_publisher* pub = nullptr;
  pkv_status st = pkv_event_publisher_create(pool, ep, replay, &o, &pub);
  EXPECT_EQ(st, PKV_OK) << pkv_last_error_message();
  return pub;
}

TEST(EventsV2, DrainCarriesTokensAndStopsWhereTheyDoNotFit) {
  Pool pool;
  std::vector<int32_t> t(13);
  for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t(1000 + 7 * i);
  pool.append(t);  // 3 full blocks: 3 stored events
  std::vector<pkv_event_v2> ev(8);
  for (auto& e : ev) e.struct_size = sizeof e;
  std::vector<int32_t> ids(8, -1);
  uint64_t n = 99;
  // Room for the ids of 2 blocks only: 2 events, the third stays queued.
  ASSERT_EQ(pkv_pool_drain_events_v2(pool.p, ev.data(), ev.size(), ids.data(), 8, &n), PKV_OK);
  ASSERT_EQ(n, 2u);
  for (uint64_t i = 0; i < n; ++i) {
    EXPECT_EQ(ev[i].type, uint32_t(PKV_EVENT_BLOCK_STORED));
    EXPECT_EQ(ev[i].seq_no, i + 1);
    EXPECT_EQ(ev[i].medium, uint32_t(PKV_MEDIUM_DEVICE));
    EXPECT_EQ(ev[i].block_size, 4u);
    EXPECT_EQ(ev[i].num_token_ids, 4u);
    EXPECT_EQ(ev[i].token_offset, 4 * i);
    EXPECT_EQ(ev[i].has_parent, i > 0 ? 1u : 0u);
    for (uint32_t k = 0; k < 4; ++k) EXPECT_EQ(ids[4 * i + k], t[4 * i + k]);
  }
  EXPECT_EQ(std::memcmp(&ev[1].parent_hash, &ev[0].block_hash, sizeof(pkv_block_hash)), 0);
  // No room at all for the next one: an error naming the room, nothing lost.
  EXPECT_EQ(pkv_pool_drain_events_v2(pool.p, ev.data(), ev.size(), ids.data(), 3, &n),
            PKV_E_BUFFER_TOO_SMALL);
  EXPECT_NE(std::string(pkv_last_error_message()).find("token_capacity"), std::string::npos);
  ASSERT_EQ(pkv_pool_drain_events_v2(pool.p, ev.data(), ev.size(), ids.data(), 4, &n), PKV_OK);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(ev[0].seq_no, 3u);
  EXPECT_EQ(ids[0], t[8]);
  ASSERT_EQ(pkv_pool_drain_events_v2(pool.p, ev.data(), ev.size(), ids.data(), 4, &n), PKV_OK);
  EXPECT_EQ(n, 0u);
}

TEST(EventsV2, BothDrainsShareOneQueue) {
  Pool pool;
  pool.append({1, 2, 3, 4, 5, 6, 7, 8});
  pkv_event v1[1];
  uint64_t n = 0;
  ASSERT_EQ(pkv_pool_drain_events(pool.p, v1, 1, &n), PKV_OK);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(v1[0].seq_no, 1u);
  pkv_event_v2 v2[2];
  v2[0].struct_size = sizeof v2[0];
  int32_t ids[8];
  ASSERT_EQ(pkv_pool_drain_events_v2(pool.p, v2, 2, ids, 8, &n), PKV_OK);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(v2[0].seq_no, 2u);
  EXPECT_EQ(ids[0], 5);
}

// Publishes n batches of one event each (a prefix-cache reset).
void publish_steps(pkv_pool* pool, pkv_event_publisher* pub, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_EQ(pkv_pool_reset_prefix_cache(pool), PKV_OK);
    ASSERT_EQ(pkv_event_publisher_publish(pub, nullptr), PKV_OK);
  }
}

// A DEALER connected to the publisher's replay socket (linger 0).
void* replay_dealer(void* ctx, pkv_event_publisher* pub) {
  void* s = zmq_socket(ctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  EXPECT_EQ(zmq_connect(s, endpoint(pub, 1).c_str()), 0);
  return s;
}

TEST(Publisher, FramesSequenceNumbersReplayAndStats) {
  Pool pool;
  pkv_event_publisher* pub = make(pool.p, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*");
  ASSERT_NE(pub, nullptr);
  const std::string ep = endpoint(pub, 0), rep = endpoint(pub, 1);
  EXPECT_EQ(ep.find('*'), std::string::npos);
  EXPECT_NE(ep, rep);
  // Nobody listens yet: these are lost on the PUB socket but buffered.
  uint64_t n = 0;
  pool.append({1, 2, 3, 4, 5});
  ASSERT_EQ(pkv_event_publisher_publish(pub, &n), PKV_OK);
  EXPECT_EQ(n, 1u);
  ASSERT_EQ(pkv_event_publisher_publish(pub, &n), PKV_OK);  // nothing pending: nothing sent
  EXPECT_EQ(n, 0u);
  pool.append({9, 9, 9, 9, 9, 9, 9, 9});
  ASSERT_EQ(pkv_event_publisher_publish(pub, &n), PKV_OK);
  EXPECT_EQ(n, 2u);

  void* ctx = zmq_ctx_new();
  void* sub = zmq_socket(ctx, ZMQ_SUB);
  int linger = 0;
  zmq_setsockopt(sub, ZMQ_LINGER, &linger, sizeof linger);
  ASSERT_EQ(zmq_connect(sub, ep.c_str()), 0);
  zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "kv", 2);
  // Probe until the subscription is through (PUB drops until then).
  std::vector<std::string> f;
  for (int i = 0; i < 200 && f.empty(); ++i) {
    ASSERT_EQ(pkv_pool_reset_prefix_cache(pool.p), PKV_OK);
    ASSERT_EQ(pkv_event_publisher_publish(pub, &n), PKV_OK);
    f = recv_all(sub, 20);
  }
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0], "kv");
  ASSERT_EQ(f[1].size(), 8u);
  const uint64_t seen = be64(f[1]);
  EXPECT_GE(seen, 2u);  // 0 and 1 went out before the subscription
  msgpack::object_handle oh = msgpack::unpack(f[2].data(), f[2].size());
  ASSERT_EQ(oh.get().via.array.size, 3u);

  // The gap: ask the replay socket from 0. A DEALER (with the empty
  // delimiter a REQ socket would add): libzmq lets a REQ socket, which
  // vLLM's example subscriber uses, receive only the first of the replies.
  void* req = zmq_socket(ctx, ZMQ_DEALER);
  zmq_setsockopt(req, ZMQ_LINGER, &linger, sizeof linger);
  ASSERT_EQ(zmq_connect(req, rep.c_str()), 0);
  const char start[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  ASSERT_EQ(zmq_send(req, "", 0, ZMQ_SNDMORE), 0);
  ASSERT_EQ(zmq_send(req, start, 8, 0), 8);
  std::vector<uint64_t> replayed;
  for (;;) {
    std::vector<std::string> r = recv_all(req, 2000);
    ASSERT_EQ(r.size(), 3u);
    EXPECT_TRUE(r[0].empty());
    if (r[2].empty()) {
      EXPECT_EQ(r[1], std::string(8, '\xff'));  // -1, the end marker
      break;
    }
    replayed.push_back(be64(r[1]));
    msgpack::object_handle b = msgpack::unpack(r[2].data(), r[2].size());
    EXPECT_EQ(b.get().via.array.size, 3u);
  }
  ASSERT_GE(replayed.size(), seen + 1);
  for (size_t i = 0; i < replayed.size(); ++i) EXPECT_EQ(replayed[i], i);

  pkv_event_publisher_stats st;
  pkv_event_publisher_stats_init(&st);
  ASSERT_EQ(pkv_event_publisher_get_stats(pub, &st), PKV_OK);
  EXPECT_EQ(st.replay_requests, 1u);
  EXPECT_GE(st.batches_published, seen + 1);
  EXPECT_EQ(st.pool_events_dropped, 0u);
  zmq_close(req);
  zmq_close(sub);
  zmq_ctx_term(ctx);
  pkv_event_publisher_destroy(pub);
  pkv_event_publisher_destroy(nullptr);
}

TEST(Publisher, KeepsThePoolAliveAndCountsDrops) {
  pkv_event_publisher* pub = nullptr;
  {
    Pool pool(2);
    pub = make(pool.p, "inproc://pkv-test-drops", nullptr);
    ASSERT_NE(pub, nullptr);
    pool.append(std::vector<int32_t>(20, 3));  // 5 stored events, 2 kept
  }  // the pool handle is gone; the publisher still holds the pool
  uint64_t n = 0;
  ASSERT_EQ(pkv_event_publisher_publish(pub, &n), PKV_OK);
  EXPECT_EQ(n, 2u);
  pkv_event_publisher_stats st;
  pkv_event_publisher_stats_init(&st);
  ASSERT_EQ(pkv_event_publisher_get_stats(pub, &st), PKV_OK);
  EXPECT_EQ(st.pool_events_dropped, 3u);
  EXPECT_EQ(st.pool_events_published, 2u);
  EXPECT_EQ(st.batches_published, 1u);
  pkv_event_publisher_destroy(pub);
}

TEST(Publisher, RankOffsetsThePort) {
  Pool pool;
  pkv_event_publisher_options o;
  pkv_event_publisher_options_init(&o);
  o.data_parallel_rank = 2;
  pkv_event_publisher* pub = nullptr;
  ASSERT_EQ(pkv_event_publisher_create(pool.p, "inproc://pkv-rank", nullptr, &o, &pub), PKV_OK);
  EXPECT_EQ(endpoint(pub, 0), "inproc://pkv-rank_dp2");
  EXPECT_EQ(endpoint(pub, 1), "");
  pkv_event_publisher_destroy(pub);
}

// libzmq 4.3 bound tcp://*:99999 as port 34463 (99999 mod 65536).
TEST(Publisher, RefusesPortsOutOfRange) {
  Pool pool;
  const char* bad[] = {"tcp://*:99999",      "tcp://127.0.0.1:65536", "tcp://127.0.0.1:123456",
                       "tcp://127.0.0.1:-1", "tcp://127.0.0.1:",      "tcp://127.0.0.1:8x"};
  for (const char* e : bad) {
    for (int replay = 0; replay < 2; ++replay) {
      pkv_event_publisher* pub = nullptr;
      const pkv_status st =
          replay ? pkv_event_publisher_create(pool.p, "tcp://127.0.0.1:*", e, nullptr, &pub)
                 : pkv_event_publisher_create(pool.p, e, nullptr, nullptr, &pub);
      EXPECT_EQ(st, PKV_E_INVALID_ARGUMENT) << e;
      EXPECT_EQ(pub, nullptr) << e;
      EXPECT_NE(std::string(pkv_last_error_message()).find("65535"), std::string::npos) << e;
    }
  }
  // The largest port and the wildcard still work.
  pkv_event_publisher* pub = nullptr;
  ASSERT_EQ(pkv_event_publisher_create(pool.p, "tcp://127.0.0.1:*", nullptr, nullptr, &pub),
            PKV_OK);
  pkv_event_publisher_destroy(pub);
}

// libzmq accepted norm://*:5, then aborted the process from its I/O thread
// when the session failed to start; OpenPGM printed to stderr.
TEST(Publisher, RefusesMulticastTransports) {
  Pool pool;
  for (const char* e : {"norm://*:5", "norm://x", "pgm://127.0.0.1;239.192.1.1:5555",
                        "epgm://lo;239.192.1.1:5555"}) {
    for (int replay = 0; replay < 2; ++replay) {
      pkv_event_publisher* pub = nullptr;
      const pkv_status st =
          replay ? pkv_event_publisher_create(pool.p, "tcp://127.0.0.1:*", e, nullptr, &pub)
                 : pkv_event_publisher_create(pool.p, e, nullptr, nullptr, &pub);
      EXPECT_EQ(st, PKV_E_INVALID_ARGUMENT) << e;
      EXPECT_EQ(pub, nullptr) << e;
      const std::string msg = pkv_last_error_message();
      EXPECT_NE(msg.find(replay ? "replay_endpoint" : "endpoint"), std::string::npos) << msg;
      EXPECT_NE(msg.find("not supported"), std::string::npos) << msg;
    }
  }
}

}  // namespace

namespace {

// Connects a socket of type to endpoint with a monitor; true once the
// publisher has ended the connection (ZMQ_EVENT_DISCONNECTED) within ms.
struct Peer {
  void* s = nullptr;
  void* mon = nullptr;
  Peer(void* ctx, int type, const std::string& ep, const std::string& name) {
    s = zmq_socket(ctx, type);
    int linger = 0, ivl = 60000;  // no reconnect within the test
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    const std::string addr = "inproc://mon-" + name;
    EXPECT_EQ(zmq_socket_monitor(s, addr.c_str(), ZMQ_EVENT_DISCONNECTED), 0);
    mon = zmq_socket(ctx, ZMQ_PAIR);
    zmq_setsockopt(mon, ZMQ_LINGER, &linger, sizeof linger);
    EXPECT_EQ(zmq_connect(mon, addr.c_str()), 0);
    EXPECT_EQ(zmq_connect(s, ep.c_str()), 0);
  }
  ~Peer() {
    zmq_close(mon);
    zmq_close(s);
  }
  bool dropped(int ms) { return !recv_all(mon, ms).empty(); }
};

}  // namespace

// A peer sending a huge frame is disconnected at its header, before the
// publisher buffers it: a 4 MiB subscription took the engine 400 MB
// (libzmq's subscription trie), a 1 GB replay frame 2 GB (libzmq's
// message and the replay thread's copy).
TEST(Publisher, PeersSendingHugeFramesAreDisconnected) {
  Pool pool;
  pkv_event_publisher* pub = make(pool.p, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*");
  ASSERT_NE(pub, nullptr);
  void* ctx = zmq_ctx_new();
  // (Not larger: libzmq's SUB socket frees its own subscription trie
  // recursively, one stack frame a byte.)
  const std::string prefix(1 << 14, 'x'), big(1 << 20, 'x');
  {
    Peer sub(ctx, ZMQ_SUB, endpoint(pub, 0), "sub");
    zmq_setsockopt(sub.s, ZMQ_SUBSCRIBE, prefix.data(), prefix.size());
    EXPECT_TRUE(sub.dropped(3000)) << "a 16 KiB subscription was taken";
    Peer dealer(ctx, ZMQ_DEALER, endpoint(pub, 1), "dealer");
    ASSERT_EQ(zmq_send(dealer.s, "", 0, ZMQ_SNDMORE), 0);
    ASSERT_EQ(zmq_send(dealer.s, big.data(), big.size(), 0), int(big.size()));
    EXPECT_TRUE(dealer.dropped(3000)) << "a 1 MiB replay frame was taken";
  }
  // Legitimate peers are still served.
  pool.append({1, 2, 3, 4, 5});
  ASSERT_EQ(pkv_event_publisher_publish(pub, nullptr), PKV_OK);
  void* req = zmq_socket(ctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(req, ZMQ_LINGER, &linger, sizeof linger);
  ASSERT_EQ(zmq_connect(req, endpoint(pub, 1).c_str()), 0);
  const char start[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  ASSERT_EQ(zmq_send(req, "", 0, ZMQ_SNDMORE), 0);
  ASSERT_EQ(zmq_send(req, start, 8, 0), 8);
  std::vector<std::string> r = recv_all(req, 3000);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(be64(r[1]), 0u);
  r = recv_all(req, 3000);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[1], std::string(8, '\xff'));
  zmq_close(req);
  zmq_ctx_term(ctx);
  pkv_event_publisher_destroy(pub);
}

// A replay longer than the ROUTER's high-water mark (1000 messages) comes
// back whole, end marker included, and a peer that asks and never reads
// delays no one else's answer. Sent in one go, the reply lost everything
// past the first 1000 batches, the end marker too: the router waited for
// it forever.
TEST(Publisher, LongReplaysArriveWholeAndANonReadingPeerStallsNoOne) {
  Pool pool;
  const uint64_t steps = 2500;
  pkv_event_publisher* pub = make(pool.p, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", steps);
  ASSERT_NE(pub, nullptr);
  publish_steps(pool.p, pub, steps);
  void* ctx = zmq_ctx_new();
  const char start[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  auto ask = [&](void* s) {
    EXPECT_EQ(zmq_send(s, "", 0, ZMQ_SNDMORE), 0);
    EXPECT_EQ(zmq_send(s, start, 8, 0), 8);
  };
  void* idle = replay_dealer(ctx, pub);  // asks, never reads
  ask(idle);
  void* req = replay_dealer(ctx, pub);
  ask(req);
  uint64_t expect = 0;
  bool end = false;
  while (!end) {
    std::vector<std::string> r = recv_all(req, 3000);
    ASSERT_EQ(r.size(), 3u) << "after " << expect << " batches";
    if (r[2].empty()) {
      EXPECT_EQ(r[1], std::string(8, '\xff'));
      end = true;
    } else {
      ASSERT_EQ(be64(r[1]), expect);
      ++expect;
    }
  }
  EXPECT_EQ(expect, steps);
  zmq_close(idle);
  zmq_close(req);
  zmq_ctx_term(ctx);
  pkv_event_publisher_destroy(pub);
}

// Two requests a peer sends before reading (a DEALER may) are both answered
// whole, each with its end marker, in order, as vLLM's _service_replay
// answers them. A second request restarted the first reply: past its first
// 64 batches the first answer and its end marker were lost, and a router
// waiting for two end markers waited forever.
TEST(Publisher, TwoRequestsFromOnePeerAreBothAnsweredWhole) {
  Pool pool;
  const uint64_t steps = 300;
  pkv_event_publisher* pub = make(pool.p, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", steps);
  ASSERT_NE(pub, nullptr);
  publish_steps(pool.p, pub, steps);
  void* ctx = zmq_ctx_new();
  void* req = replay_dealer(ctx, pub);
  const uint64_t starts[2] = {0, 200};
  for (uint64_t s : starts) {
    char b[8];
    for (int i = 7; i >= 0; --i) b[7 - i] = char((s >> (8 * i)) & 0xff);
    ASSERT_EQ(zmq_send(req, "", 0, ZMQ_SNDMORE), 0);
    ASSERT_EQ(zmq_send(req, b, 8, 0), 8);
  }
  for (uint64_t s : starts) {
    uint64_t expect = s;
    for (;;) {
      std::vector<std::string> r = recv_all(req, 3000);
      ASSERT_EQ(r.size(), 3u) << "request from " << s << ": after " << expect - s << " batches";
      if (r[2].empty()) {
        EXPECT_EQ(r[1], std::string(8, '\xff'));
        break;
      }
      ASSERT_EQ(be64(r[1]), expect) << "request from " << s;
      ++expect;
    }
    EXPECT_EQ(expect, steps) << "request from " << s;
  }
  EXPECT_TRUE(recv_all(req, 200).empty());
  zmq_close(req);
  zmq_ctx_term(ctx);
  pkv_event_publisher_destroy(pub);
}

// opts->replay_with_topic: replay answers framed as vLLM 0.33's
// (_service_replay with its PR 45177): [topic, seq, batch] for each batch,
// then ["", -1, empty].
TEST(Publisher, ReplayWithTopicFramesAnswersAsVllm033) {
  Pool pool;
  pkv_event_publisher_options o;
  ASSERT_EQ(pkv_event_publisher_options_init_sized(&o, sizeof o), PKV_OK);
  EXPECT_EQ(o.replay_with_topic, 0u);  // the default: earlier vLLM's framing
  o.topic = "kv@pod";
  pkv_event_publisher* pub = nullptr;
  o.replay_with_topic = 2;
  EXPECT_EQ(pkv_event_publisher_create(pool.p, "inproc://rt-pub", "inproc://rt-rep", &o, &pub),
            PKV_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pkv_last_error_message()).find("replay_with_topic"), std::string::npos);
  o.replay_with_topic = 1;
  o.reserved1 = 1;
  EXPECT_EQ(pkv_event_publisher_create(pool.p, "inproc://rt-pub", "inproc://rt-rep", &o, &pub),
            PKV_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pkv_last_error_message()).find("reserved1"), std::string::npos);
  EXPECT_EQ(pub, nullptr);
  o.reserved1 = 0;
  ASSERT_EQ(pkv_event_publisher_create(pool.p, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", &o, &pub),
            PKV_OK)
      << pkv_last_error_message();
  for (int i = 0; i < 3; ++i) {
    pool.append({i + 1, 2, 3, 4, 5});
    uint64_t n = 0;
    ASSERT_EQ(pkv_event_publisher_publish(pub, &n), PKV_OK);
    ASSERT_EQ(n, 1u);
  }
  void* ctx = zmq_ctx_new();
  void* dealer = replay_dealer(ctx, pub);
  const char start[8] = {0, 0, 0, 0, 0, 0, 0, 1};
  ASSERT_EQ(zmq_send(dealer, "", 0, ZMQ_SNDMORE), 0);
  ASSERT_EQ(zmq_send(dealer, start, 8, 0), 8);
  for (uint64_t want = 1;; ++want) {
    std::vector<std::string> r = recv_all(dealer, 2000);
    ASSERT_EQ(r.size(), 4u) << "reply " << want;
    EXPECT_TRUE(r[0].empty());
    if (want == 3) {  // the end marker
      EXPECT_TRUE(r[1].empty());
      EXPECT_EQ(r[2], std::string(8, '\xff'));
      EXPECT_TRUE(r[3].empty());
      break;
    }
    EXPECT_EQ(r[1], "kv@pod");
    EXPECT_EQ(be64(r[2]), want);
    msgpack::object_handle b = msgpack::unpack(r[3].data(), r[3].size());
    EXPECT_EQ(b.get().via.array.size, 3u);
  }
  zmq_close(dealer);
  zmq_ctx_term(ctx);
  pkv_event_publisher_destroy(pub);
}

// A start seq of any length is read as vLLM's _service_replay reads it
// (int.from_bytes(frame, "big")): empty is 0, a value past 64 bits lies
// beyond every batch. Such requests were ignored: their peer waited for good.
TEST(Publisher, StartSeqsOfAnyLengthAreReadAsVllmReadsThem) {
  Pool pool;
  pkv_event_publisher* pub = make(pool.p, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*");
  ASSERT_NE(pub, nullptr);
  publish_steps(pool.p, pub, 3);
  void* ctx = zmq_ctx_new();
  void* req = replay_dealer(ctx, pub);
  const auto replay = [&](const std::string& start) {
    EXPECT_EQ(zmq_send(req, "", 0, ZMQ_SNDMORE), 0);
    EXPECT_EQ(zmq_send(req, start.data(), start.size(), 0), int(start.size()));
    std::vector<uint64_t> seqs;
    for (;;) {
      std::vector<std::string> r = recv_all(req, 3000);
      if (r.size() != 3) {
        ADD_FAILURE() << "no end marker";
        return seqs;
      }
      if (r[2].empty()) return seqs;
      seqs.push_back(be64(r[1]));
    }
  };
  EXPECT_EQ(replay(""), (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(replay(std::string("\x02", 1)), (std::vector<uint64_t>{2}));
  EXPECT_EQ(replay(std::string("\0\0\0\0\0\0\0\0\x01", 9)), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(replay(std::string("\x01\0\0\0\0\0\0\0\0", 9)), std::vector<uint64_t>{});
  zmq_close(req);
  zmq_ctx_term(ctx);
  pkv_event_publisher_destroy(pub);
}
