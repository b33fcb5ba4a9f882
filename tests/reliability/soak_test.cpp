// Soak: a serving-like workload (continuous batching with shared system
// prompts, chunked prefill, decode, preemption on OUT_OF_BLOCKS and resume
// through the prefix cache) on a CPU pool with storage, for a bounded time
// (PKV_SOAK_SECONDS, default 10). After every step: pkv_pool_validate, the
// stats against the scheduler's own accounting, gap-free events, and one
// attention row per step against a float64 reference computed from the KV
// every token was written with.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

constexpr uint32_t kBs = 16, kLayers = 2, kKvHeads = 2, kGroup = 2, kDim = 64;
constexpr uint32_t kQHeads = kKvHeads * kGroup;

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// KV of a position is a function of what its block hash covers (position and
// token here), so blocks found in the prefix cache hold exactly these values.
float kv(uint64_t pos, int32_t tok, uint32_t layer, uint32_t which, uint32_t head, uint32_t d) {
  uint64_t h = mix(mix(pos * 131 + uint64_t(uint32_t(tok))) ^ (uint64_t(layer) << 40) ^
                   (uint64_t(which) << 36) ^ (uint64_t(head) << 20) ^ d);
  return float(int(h % 129) - 64) / 32.0f;
}

struct Request {
  uint64_t rid = 0;
  std::vector<int32_t> tokens;  // prompt, then generated tokens as they come
  uint64_t prompt_len = 0, max_len = 0;
  pkv_seq_id seq = 0;
  uint64_t done = 0;  // tokens appended to the sequence
  int preempted = 0;
};

double soak_seconds() {
  if (const char* e = std::getenv("PKV_SOAK_SECONDS")) return std::atof(e);
  return 10.0;
}

TEST(Soak, ServingWorkloadKeepsInvariants) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBs;
  o.num_blocks = 97;
  o.num_layers = kLayers;
  o.num_kv_heads = kKvHeads;
  o.head_dim = kDim;
  o.dtype = PKV_DTYPE_F32;
  o.enable_events = 1;
  o.max_events = 1 << 14;
  o.num_threads = 2;
  pkv_pool* pool = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &pool), PKV_OK);

  std::mt19937_64 rng(1234);
  std::vector<std::vector<int32_t>> system_prompts(4);
  for (size_t f = 0; f < system_prompts.size(); ++f)
    for (int i = 0; i < 40 + 24 * int(f); ++i) system_prompts[f].push_back(int32_t(rng() % 30000));

  std::deque<Request> waiting;
  std::vector<Request> running;
  uint64_t next_rid = 1, steps = 0, finished = 0, preemptions = 0, rows_checked = 0,
           tokens_processed = 0, last_event = 0, events_seen = 0;
  auto new_request = [&] {
    Request r;
    r.rid = next_rid++;
    r.tokens = system_prompts[rng() % system_prompts.size()];
    const int extra = 8 + int(rng() % 120);
    for (int i = 0; i < extra; ++i) r.tokens.push_back(int32_t(rng() % 30000));
    r.prompt_len = r.tokens.size();
    r.max_len = r.prompt_len + 4 + rng() % 80;
    waiting.push_back(std::move(r));
  };

  const auto t0 = std::chrono::steady_clock::now();
  const double budget = soak_seconds();
  std::vector<float> kbuf, vbuf, qbuf, obuf;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < budget) {
    ++steps;
    while (waiting.size() < 8) new_request();
    // Admit: a new sequence starts from whatever of its tokens are cached.
    while (running.size() < 16 && !waiting.empty()) {
      Request r = std::move(waiting.front());
      waiting.pop_front();
      ASSERT_EQ(pkv_seq_create(pool, nullptr, &r.seq), PKV_OK);
      uint64_t cached = 0;
      ASSERT_EQ(pkv_seq_match_prefix(pool, r.seq, r.tokens.data(), r.tokens.size(), &cached),
                PKV_OK);
      ASSERT_EQ(cached % kBs, 0u);
      ASSERT_LT(cached, r.tokens.size());
      r.done = cached;
      running.push_back(std::move(r));
    }
    // Schedule: prefill chunks of up to 48 tokens, decode one token. On
    // OUT_OF_BLOCKS the newest request not yet scheduled in this step is
    // preempted and requeued (the current one if it is the newest), as vLLM
    // does. A request already appended to in this step is never the victim:
    // its newly full blocks are in the prefix cache before their KV is
    // written, so freeing it now would leave cached blocks with no KV.
    std::vector<uint32_t> qc(running.size(), 0);
    for (size_t i = 0; i < running.size(); ++i) {
      {
        Request& r = running[i];
        if (r.done >= r.tokens.size())  // decode: sample the next token
          r.tokens.push_back(int32_t(mix(r.rid * 1000003 + r.tokens.size()) % 30000));
      }
      const uint64_t n = std::min<uint64_t>(48, running[i].tokens.size() - running[i].done);
      bool self_preempted = false;
      for (;;) {
        Request& r = running[i];
        pkv_status s = pkv_seq_append(pool, r.seq, r.tokens.data() + r.done, n, 0);
        if (s == PKV_OK) break;
        ASSERT_EQ(s, PKV_E_OUT_OF_BLOCKS) << pkv_last_error_message();
        const size_t victim = running.size() - 1;  // >= i
        ASSERT_TRUE(victim > i || running.size() > 1 || i > 0)
            << "a single request does not fit the pool";
        ASSERT_EQ(pkv_seq_free(pool, running[victim].seq), PKV_OK);
        Request back = std::move(running[victim]);
        back.tokens.resize(std::max<uint64_t>(back.done, back.prompt_len));
        back.done = 0;
        ++back.preempted;
        ++preemptions;
        waiting.push_front(std::move(back));
        running.erase(running.begin() + victim);
        qc.erase(qc.begin() + victim);
        if (victim == i) {
          self_preempted = true;
          break;
        }
      }
      if (self_preempted) break;  // it was the last one
      qc[i] = uint32_t(n);
      running[i].done += n;
    }
    // One plan for the step; K/V for every layer; attention on one layer.
    std::vector<pkv_seq_id> ids;
    for (const Request& r : running) ids.push_back(r.seq);
    pkv_batch* batch = nullptr;
    ASSERT_EQ(pkv_batch_prepare(pool, ids.data(), qc.data(), uint32_t(ids.size()), nullptr, &batch),
              PKV_OK)
        << pkv_last_error_message();
    pkv_batch_info bi;
    pkv_batch_info_init(&bi);
    ASSERT_EQ(pkv_batch_get_info(batch, &bi), PKV_OK);
    const int64_t T = int64_t(bi.num_tokens);
    tokens_processed += uint64_t(T);
    kbuf.assign(size_t(T) * kKvHeads * kDim, 0);
    vbuf.assign(kbuf.size(), 0);
    qbuf.assign(size_t(T) * kQHeads * kDim, 0);
    obuf.assign(qbuf.size(), NAN);
    std::vector<std::pair<size_t, uint64_t>> row_of;  // (request, position)
    for (size_t i = 0; i < running.size(); ++i)
      for (uint64_t p = running[i].done - qc[i]; p < running[i].done; ++p) row_of.push_back({i, p});
    ASSERT_EQ(int64_t(row_of.size()), T);
    const int64_t kshape[3] = {T, kKvHeads, kDim}, qshape[3] = {T, kQHeads, kDim};
    pkv_tensor kt, vt, qt, ot;
    ASSERT_EQ(pkv_tensor_init(kbuf.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, kshape, &kt),
              PKV_OK);
    ASSERT_EQ(pkv_tensor_init(vbuf.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, kshape, &vt),
              PKV_OK);
    ASSERT_EQ(pkv_tensor_init(qbuf.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, qshape, &qt),
              PKV_OK);
    ASSERT_EQ(pkv_tensor_init(obuf.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, qshape, &ot),
              PKV_OK);
    const uint32_t att_layer = uint32_t(steps % kLayers);
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      for (int64_t t = 0; t < T; ++t) {
        const Request& r = running[row_of[t].first];
        const uint64_t p = row_of[t].second;
        for (uint32_t h = 0; h < kKvHeads; ++h)
          for (uint32_t d = 0; d < kDim; ++d) {
            kbuf[(t * kKvHeads + h) * kDim + d] = kv(p, r.tokens[p], layer, 0, h, d);
            vbuf[(t * kKvHeads + h) * kDim + d] = kv(p, r.tokens[p], layer, 1, h, d);
          }
      }
      ASSERT_EQ(pkv_cache_write(batch, layer, &kt, &vt, nullptr), PKV_OK)
          << pkv_last_error_message();
    }
    for (size_t i = 0; i < qbuf.size(); ++i)
      qbuf[i] = float(int(mix(steps * 7919 + i) % 65) - 32) / 32.f;
    ASSERT_EQ(pkv_attention_forward(batch, att_layer, &qt, &ot, nullptr, nullptr, nullptr), PKV_OK)
        << pkv_last_error_message();
    {  // one row against the reference
      const int64_t t = int64_t(rng() % uint64_t(T));
      const Request& r = running[row_of[t].first];
      const uint64_t p = row_of[t].second;
      const double scale = 1.0 / std::sqrt(double(kDim));
      for (uint32_t h = 0; h < kQHeads; ++h) {
        const uint32_t g = h / kGroup;
        std::vector<double> w(p + 1);
        double mx = -INFINITY, sum = 0;
        for (uint64_t k = 0; k <= p; ++k) {
          double dot = 0;
          for (uint32_t d = 0; d < kDim; ++d)
            dot +=
                double(qbuf[(t * kQHeads + h) * kDim + d]) * kv(k, r.tokens[k], att_layer, 0, g, d);
          w[k] = dot * scale;
          mx = std::max(mx, w[k]);
        }
        for (double& x : w) sum += (x = std::exp(x - mx));
        for (uint32_t d = 0; d < kDim; ++d) {
          double ref = 0;
          for (uint64_t k = 0; k <= p; ++k) ref += w[k] * kv(k, r.tokens[k], att_layer, 1, g, d);
          ref /= sum;
          ASSERT_NEAR(obuf[(t * kQHeads + h) * kDim + d], ref, 1e-4 + 1e-4 * std::fabs(ref))
              << "step " << steps << " request " << r.rid << " position " << p << " head " << h;
        }
      }
      ++rows_checked;
    }
    pkv_batch_destroy(batch);

    // Finished requests leave.
    for (size_t i = running.size(); i-- > 0;)
      if (running[i].done >= running[i].max_len) {
        ASSERT_EQ(pkv_seq_free(pool, running[i].seq), PKV_OK);
        running.erase(running.begin() + i);
        ++finished;
      }

    // Invariants.
    ASSERT_EQ(pkv_pool_validate(pool), PKV_OK) << pkv_last_error_message();
    pkv_pool_stats st;
    pkv_pool_stats_init(&st);
    ASSERT_EQ(pkv_pool_get_stats(pool, &st), PKV_OK);
    uint64_t toks = 0;
    for (const Request& r : running) toks += r.done;
    ASSERT_EQ(st.num_seqs, running.size());
    ASSERT_EQ(st.num_tokens, toks);
    ASSERT_EQ(st.num_used_blocks + st.num_free_blocks, st.num_blocks - 1);
    ASSERT_LE(st.kv_bytes_used + st.kv_bytes_wasted, st.kv_bytes_allocated);
    ASSERT_LE(st.prefix_hit_tokens, st.prefix_query_tokens);
    pkv_event ev[256];
    uint64_t n = 0;
    do {
      ASSERT_EQ(pkv_pool_drain_events(pool, ev, 256, &n), PKV_OK);
      for (uint64_t i = 0; i < n; ++i) {
        ASSERT_EQ(ev[i].seq_no, last_event + 1) << "events lost or reordered";
        last_event = ev[i].seq_no;
      }
      events_seen += n;
    } while (n == 256);
  }
  for (const Request& r : running) ASSERT_EQ(pkv_seq_free(pool, r.seq), PKV_OK);
  pkv_pool_stats st;
  pkv_pool_stats_init(&st);
  ASSERT_EQ(pkv_pool_get_stats(pool, &st), PKV_OK);
  EXPECT_EQ(st.num_used_blocks, 0u);
  EXPECT_EQ(st.num_events_dropped, 0u);
  EXPECT_EQ(pkv_pool_validate(pool), PKV_OK);
  EXPECT_GT(preemptions, 0u) << "the workload never filled the pool";
  EXPECT_GT(st.prefix_hit_tokens, 0u);
  std::printf(
      "soak: %.1f s, %llu steps, %llu tokens, %llu requests finished, %llu preemptions, "
      "%llu/%llu prefix tokens hit, %llu events, %llu attention rows checked\n",
      budget, (unsigned long long)steps, (unsigned long long)tokens_processed,
      (unsigned long long)finished, (unsigned long long)preemptions,
      (unsigned long long)st.prefix_hit_tokens, (unsigned long long)st.prefix_query_tokens,
      (unsigned long long)events_seen, (unsigned long long)rows_checked);
  pkv_pool_destroy(pool);
}

}  // namespace
