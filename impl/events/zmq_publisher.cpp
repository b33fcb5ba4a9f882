// The ZeroMQ publisher (PAGEDKV_EVENTS). One lock guards the PUB socket,
// the replay buffer and the counters; the ROUTER socket belongs to the
// replay thread alone (ZeroMQ sockets are not thread-safe), so a router
// asking for a replay is answered while the engine is between steps.
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "error.h"
#include "events/publisher.h"
#include "kv_pool.h"

namespace pagedkv::events {

namespace {

std::string be64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) s[size_t(i)] = char(v & 0xff);
  return s;
}

[[noreturn]] void zfail(const std::string& what, const std::string& endpoint) {
  fail(Errc::kInvalidArgument, what + " '" + endpoint + "': " + zmq_strerror(zmq_errno()));
}

// Signals (a Go or Python host's runtime sends them to every thread)
// interrupt ZeroMQ calls with EINTR: those are retried, never half-done.
int send_frame(void* s, const void* data, size_t size, int flags) {
  int rc;
  do {
    rc = zmq_send(s, data, size, flags);
  } while (rc < 0 && zmq_errno() == EINTR);
  return rc;
}

// The largest frame or ZMTP command (READY, with an identity of at most 255
// bytes) a peer may send to either socket, beyond a PUB's topic.
constexpr int64_t kMaxIncoming = 4096;

bool binds(const std::string& e) {
  return e.find('*') != std::string::npos || e.find("::") != std::string::npos ||
         e.rfind("ipc://", 0) == 0 || e.rfind("inproc://", 0) == 0;
}

class ZmqPublisher final : public Publisher {
 public:
  ZmqPublisher(std::shared_ptr<Pool> pool, const PublisherOptions& o)
      : pool_(std::move(pool)), o_(o) {
    check_tcp_port(o.endpoint);
    check_tcp_port(o.replay_endpoint);
    o_.endpoint = offset_endpoint(o.endpoint, o.dp_rank);
    if (!o.replay_endpoint.empty())
      o_.replay_endpoint = offset_endpoint(o.replay_endpoint, o.dp_rank);
    dropped_at_start_ = pool_->stats().num_events_dropped;
    ctx_ = zmq_ctx_new();
    if (!ctx_) fail(Errc::kOutOfMemory, "cannot create a ZeroMQ context");
    try {
      open();
    } catch (...) {
      close();
      throw;
    }
    if (replay_) thread_ = std::thread([this] { serve_replays(); });
  }

  ~ZmqPublisher() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    close();
  }

  uint64_t publish() override {
    std::lock_guard<std::mutex> lock(mu_);
    const uint32_t bs = pool_->options().block_size;
    // Events a failed call drained (an allocation below threw) are still
    // in events_: they go out first, so an out-of-memory failure loses none.
    size_t n = held_;
    for (;;) {  // everything pending, in chunks
      const size_t chunk = 256;
      // Each buffer checked on its own: a resize that threw leaves the
      // other one short, and a drain into it would write past its end.
      if (tokens_.size() < (n + chunk) * bs) tokens_.resize((n + chunk) * bs);
      if (events_.size() < n + chunk) events_.resize(n + chunk);
      const size_t got = pool_->drain_events(events_.data() + n, chunk, tokens_.data() + n * bs);
      n += got;
      held_ = n;
      if (got < chunk) break;
    }
    stats_.pool_events_dropped = pool_->stats().num_events_dropped - dropped_at_start_;
    if (n == 0) return 0;
    const double ts =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::string payload;
    const size_t num =
        encode_batch(events_.data(), n, tokens_.data(), bs, ts, o_.dp_rank, o_.wire, &payload);
    held_ = 0;
    stats_.pool_events_published += n;
    if (num == 0) return n;  // only events vLLM has no counterpart for
    const uint64_t seq = stats_.next_seq++;
    const std::string seq_bytes = be64(seq);
    // A PUB socket never blocks: past its high-water mark a slow subscriber
    // loses messages and sees the gap in the sequence numbers.
    send_frame(pub_, o_.topic.data(), o_.topic.size(), ZMQ_SNDMORE);
    send_frame(pub_, seq_bytes.data(), 8, ZMQ_SNDMORE);
    send_frame(pub_, payload.data(), payload.size(), 0);
    ++stats_.batches_published;
    stats_.events_published += num;
    if (o_.buffer_steps > 0) {
      if (buffer_.size() >= o_.buffer_steps) buffer_.pop_front();
      buffer_.emplace_back(seq, std::move(payload));
    }
    return n;
  }

  PublisherStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  std::string endpoint() const override { return o_.endpoint; }
  std::string replay_endpoint() const override { return o_.replay_endpoint; }

 private:
  void open() {
    pub_ = zmq_socket(ctx_, ZMQ_PUB);
    if (!pub_) zfail("cannot create a PUB socket for", o_.endpoint);
    int hwm = o_.hwm, linger = 0;
    zmq_setsockopt(pub_, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(pub_, ZMQ_LINGER, &linger, sizeof linger);
    // What a peer may send: a subscription (its prefix; one longer than
    // the topic matches nothing) or a ZMTP command. Unlimited, one 4 MiB
    // subscription took the engine 400 MB (libzmq's subscription trie), a
    // larger one all its memory: such a peer is disconnected instead.
    int64_t max_in = int64_t(kMaxIncoming + o_.topic.size());
    zmq_setsockopt(pub_, ZMQ_MAXMSGSIZE, &max_in, sizeof max_in);
    if (binds(o_.endpoint) ? zmq_bind(pub_, o_.endpoint.c_str()) != 0
                           : zmq_connect(pub_, o_.endpoint.c_str()) != 0)
      zfail(binds(o_.endpoint) ? "cannot bind endpoint" : "cannot connect endpoint", o_.endpoint);
    if (binds(o_.endpoint)) o_.endpoint = last_endpoint(pub_, o_.endpoint);
    if (o_.replay_endpoint.empty()) return;
    replay_ = zmq_socket(ctx_, ZMQ_ROUTER);
    if (!replay_) zfail("cannot create a ROUTER socket for", o_.replay_endpoint);
    zmq_setsockopt(replay_, ZMQ_LINGER, &linger, sizeof linger);
    int mandatory = 1;  // a full pipe says EAGAIN instead of dropping the message
    zmq_setsockopt(replay_, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory);
    max_in = kMaxIncoming;  // a request is 8 bytes: no 1 GB frame is buffered
    zmq_setsockopt(replay_, ZMQ_MAXMSGSIZE, &max_in, sizeof max_in);
    if (zmq_bind(replay_, o_.replay_endpoint.c_str()) != 0)
      zfail("cannot bind replay_endpoint", o_.replay_endpoint);
    o_.replay_endpoint = last_endpoint(replay_, o_.replay_endpoint);
  }

  // What was bound, so that "tcp://127.0.0.1:*" (any free port) reports
  // the port it got.
  static std::string last_endpoint(void* s, const std::string& fallback) {
    char buf[1024];
    size_t len = sizeof buf;
    if (zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, buf, &len) != 0 || len == 0) return fallback;
    return std::string(buf, strnlen(buf, len));
  }

  void close() noexcept {
    if (pub_) zmq_close(pub_);
    if (replay_) zmq_close(replay_);
    pub_ = replay_ = nullptr;
    if (ctx_) zmq_ctx_term(ctx_);
    ctx_ = nullptr;
  }

  static std::vector<std::string> recv_frames(void* s) {
    std::vector<std::string> frames;
    int more = 1;
    while (more) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      int rc;
      do {
        rc = zmq_msg_recv(&m, s, ZMQ_DONTWAIT);
      } while (rc < 0 && zmq_errno() == EINTR);
      if (rc < 0) {
        zmq_msg_close(&m);
        break;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    return frames;
  }

  // vLLM's _service_replay: a request is [identity, "", start seq (big
  // endian, any length)]; the answer every batch buffered at the request with seq >=
  // start, then the end marker (seq -1, empty payload). Malformed requests
  // are ignored; a peer's requests are answered in the order it sent
  // them. Answers are sent as the peer's pipe takes them (the
  // ROUTER is mandatory, each send non-blocking): sent in one go, a reply
  // past the ROUTER's high-water mark (1000 messages) lost the rest of its
  // batches and the end marker, and a blocking send would let one peer
  // that never reads stall everyone's replays.
  void serve_replays() noexcept {
    try {
      bool moved = false;
      while (!stop_) {
        zmq_pollitem_t item{replay_, 0, ZMQ_POLLIN, 0};
        // Peers whose pipes are full are tried again every 10 ms.
        const int rc = zmq_poll(&item, 1, replies_.empty() ? 50 : moved ? 0 : 10);
        if (rc > 0 && (item.revents & ZMQ_POLLIN)) take_request();
        moved = send_replies();
      }
    } catch (...) {  // out of memory: stop answering replays, keep publishing
    }
  }

  void take_request() {
    std::vector<std::string> f = recv_frames(replay_);
    if (f.size() != 3) return;
    // The start as vLLM reads it (int.from_bytes(frame, "big")): empty is
    // 0, a value past 64 bits lies beyond every batch (only the end marker
    // answers it). Ignored, such a request left its peer waiting for good.
    const std::string& b = f[2];
    const size_t lead = b.size() > 8 ? b.size() - 8 : 0;
    uint64_t start = 0;
    if (std::any_of(b.begin(), b.begin() + std::ptrdiff_t(lead), [](char c) { return c != 0; }))
      start = ~uint64_t(0);
    else
      for (size_t i = lead; i < b.size(); ++i) start = (start << 8) | uint8_t(b[i]);
    Reply r{std::move(f[0]), start, 0, now_ns(), false, {}};
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.replay_requests;
      r.end = stats_.next_seq;
    }
    // One answer per peer at a time: its further requests are answered in
    // turn, as vLLM answers them (up to kMaxQueued waiting; past them a
    // request is ignored). A request from a peer whose pipe was full at the
    // last try restarts its reply instead: that peer stopped reading, or
    // reconnected with the same routing id (whose new pipe must not get the
    // rest of the old connection's answers). Past kMaxReplies peers, the
    // one stalled longest (not reading) is dropped.
    for (Reply& x : replies_)
      if (x.id == r.id) {
        if (x.stalled)
          x = std::move(r);
        else if (x.queued.size() < kMaxQueued)
          x.queued.emplace_back(r.next, r.end);
        return;
      }
    if (replies_.size() >= kMaxReplies)
      replies_.erase(
          std::min_element(replies_.begin(), replies_.end(),
                           [](const Reply& a, const Reply& b) { return a.moved_ns < b.moved_ns; }));
    replies_.push_back(std::move(r));
  }

  // Sends what each peer's pipe takes (at most 64 messages a peer a round);
  // true if any message went.
  bool send_replies() {
    bool moved = false;
    for (size_t i = 0; i < replies_.size();) {
      Reply& r = replies_[i];
      bool done = false, gone = false;
      for (int n = 0; n < 64 && !done && !gone; ++n) {
        // The routing id first: a peer whose pipe is full costs no copy of
        // a batch under the lock publish() takes (once it went, the rest of
        // the message goes too).
        int rc;
        do {
          rc = zmq_send(replay_, r.id.data(), r.id.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
        } while (rc < 0 && zmq_errno() == EINTR);
        if (rc < 0) {
          gone = zmq_errno() != EAGAIN;  // EHOSTUNREACH: the peer left
          r.stalled = !gone;
          break;
        }
        uint64_t seq = ~uint64_t(0);
        std::string body;
        try {
          std::lock_guard<std::mutex> lock(mu_);
          auto it = std::lower_bound(
              buffer_.begin(), buffer_.end(), r.next,
              [](const std::pair<uint64_t, std::string>& b, uint64_t s) { return b.first < s; });
          if (it != buffer_.end() && it->first < r.end) {
            seq = it->first;
            body = it->second;
          }
        } catch (...) {  // no memory for the copy: end the message, then stop
          send_frame(replay_, "", 0, ZMQ_SNDMORE);
          send_frame(replay_, "", 0, 0);
          throw;
        }
        const std::string seq_bytes = be64(seq);
        send_frame(replay_, "", 0, ZMQ_SNDMORE);
        if (o_.replay_with_topic) {  // the end marker's topic is empty, as vLLM's
          const bool end = seq == ~uint64_t(0);
          send_frame(replay_, o_.topic.data(), end ? 0 : o_.topic.size(), ZMQ_SNDMORE);
        }
        send_frame(replay_, seq_bytes.data(), 8, ZMQ_SNDMORE);
        send_frame(replay_, body.data(), body.size(), 0);
        r.moved_ns = now_ns();
        r.stalled = false;
        moved = true;
        if (seq == ~uint64_t(0)) {
          done = r.queued.empty();
          if (!done) {  // the peer's next request
            r.next = r.queued.front().first;
            r.end = r.queued.front().second;
            r.queued.pop_front();
          }
        } else {
          r.next = seq + 1;
        }
      }
      if (done || gone)
        replies_.erase(replies_.begin() + std::ptrdiff_t(i));
      else
        ++i;
    }
    return moved;
  }

  static uint64_t now_ns() {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
  }

  // A replay being answered (the replay thread's alone).
  struct Reply {
    std::string id;     // the peer's routing id
    uint64_t next;      // the next seq to send from
    uint64_t end;       // the first seq not buffered at the request
    uint64_t moved_ns;  // when its pipe last took a message
    bool stalled;       // its pipe was full at the last try
    // its later requests, each as (next, end), answered in turn
    std::deque<std::pair<uint64_t, uint64_t>> queued;
  };
  static constexpr size_t kMaxReplies = 1024;
  static constexpr size_t kMaxQueued = 64;
  std::vector<Reply> replies_;

  std::shared_ptr<Pool> pool_;
  PublisherOptions o_;
  void* ctx_ = nullptr;
  void* pub_ = nullptr;
  void* replay_ = nullptr;
  mutable std::mutex mu_;
  std::deque<std::pair<uint64_t, std::string>> buffer_;
  std::vector<Event> events_;
  std::vector<int32_t> tokens_;
  size_t held_ = 0;  // events_[0, held_) drained but not yet encoded
  PublisherStats stats_;
  uint64_t dropped_at_start_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Publisher> make_publisher(std::shared_ptr<Pool> pool, const PublisherOptions& o) {
  return std::make_unique<ZmqPublisher>(std::move(pool), o);
}

}  // namespace pagedkv::events
