// The public headers' promises, sentence by sentence (common.h, pool.h,
// batch.h, groups.h, tiers.h, events.h, hash.h): limits at and one past
// their bounds, defaults of _init, out-parameters left alone on failure,
// idempotency, ordering and what a stat counts. Linked against libpagedkv.so
// as users link it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "assert_ok.h"
#include "pagedkv/pagedkv.h"

namespace {

pkv_pool* make_pool(uint32_t block_size, uint64_t num_blocks, uint32_t num_layers = 0,
                    uint32_t enable_events = 0) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = block_size;
  o.num_blocks = num_blocks;
  o.enable_events = enable_events;
  if (num_layers) {
    o.num_layers = num_layers;
    o.num_kv_heads = 1;
    o.head_dim = 4;
    o.dtype = PKV_DTYPE_F32;
    o.num_threads = 1;
  }
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

// The options of an MLA pool of blocks of 4 tokens, one CPU thread.
pkv_pool_options mla_options(uint64_t num_blocks, uint32_t num_layers, uint32_t kv_lora_rank,
                             uint32_t qk_rope_head_dim, uint32_t dtype) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = num_blocks;
  o.num_layers = num_layers;
  o.kv_layout = PKV_KV_LAYOUT_MLA;
  o.kv_lora_rank = kv_lora_rank;
  o.qk_rope_head_dim = qk_rope_head_dim;
  o.dtype = dtype;
  o.num_threads = 1;
  return o;
}

pkv_pool* make_mla_pool(uint64_t num_blocks, uint32_t num_layers, uint32_t kv_lora_rank,
                        uint32_t qk_rope_head_dim, uint32_t dtype) {
  pkv_pool_options o = mla_options(num_blocks, num_layers, kv_lora_rank, qk_rope_head_dim, dtype);
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

pkv_pool* make_groups_pool() {
  pkv_pool_options base;
  pkv_pool_options_init(&base);
  base.block_size = 4;
  base.num_blocks = 32;
  pkv_kv_group_spec g[2];
  pkv_kv_group_spec_init(&g[0]);
  pkv_kv_group_spec_init(&g[1]);
  g[0].num_kv_heads = 1;
  g[0].head_dim = 8;
  g[1].kind = PKV_GROUP_SLIDING_WINDOW;
  g[1].num_kv_heads = 1;
  g[1].head_dim = 8;
  g[1].sliding_window = 8;
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create_groups(&base, g, 2, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

pkv_pool_stats stats_of(const pkv_pool* p) {
  pkv_pool_stats s;
  pkv_pool_stats_init_sized(&s, sizeof s);
  EXPECT_EQ(pkv_pool_get_stats(p, &s), PKV_OK);
  return s;
}

std::vector<int32_t> iota_tokens(size_t n, int32_t first = 1) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = first + static_cast<int32_t>(i);
  return t;
}

}  // namespace

// ------------------------------------------------------------------ common.h

TEST(Contract, StatusStringsAreNeverNullAndNameTheCode) {
  EXPECT_EQ(std::string(pkv_status_string(PKV_E_OUT_OF_BLOCKS)).rfind("PKV_E_OUT_OF_BLOCKS", 0),
            0u);
  for (pkv_status s : {1, 12345, -11, -1000, INT32_MIN, INT32_MAX})
    EXPECT_NE(pkv_status_string(s), nullptr) << s;
}

TEST(Contract, LastErrorIsEmptyAfterASuccessfulCallAndCopiesTruncate) {
  pkv_pool* p = make_pool(4, 8);
  pkv_pool_stats s;
  EXPECT_EQ(pkv_pool_get_stats(p, nullptr), PKV_E_INVALID_ARGUMENT);
  std::string msg = pkv_last_error_message();
  ASSERT_FALSE(msg.empty());
  char small[5];
  std::memset(small, 'x', sizeof small);
  EXPECT_EQ(pkv_last_error_copy(small, sizeof small), msg.size());
  EXPECT_EQ(std::string(small), msg.substr(0, 4));
  char none = 'x';
  EXPECT_EQ(pkv_last_error_copy(&none, 0), msg.size());
  EXPECT_EQ(none, 'x');
  pkv_pool_stats_init(&s);
  EXPECT_EQ(pkv_pool_get_stats(p, &s), PKV_OK);
  EXPECT_STREQ(pkv_last_error_message(), "");
  EXPECT_EQ(pkv_last_error_copy(small, sizeof small), 0u);
  EXPECT_STREQ(small, "");
  pkv_pool_destroy(p);
}

TEST(Contract, VersionsFeaturesAndDtypeSizes) {
  EXPECT_EQ(pkv_version_number(), static_cast<uint32_t>(PKV_VERSION_NUMBER));
  EXPECT_STREQ(pkv_version_string(), PKV_VERSION_STRING);
  EXPECT_EQ(pkv_abi_version(), static_cast<uint32_t>(PKV_ABI_VERSION));
  if (!(pkv_features() & PKV_FEATURE_CUDA)) EXPECT_EQ(pkv_cuda_device_count(), 0);
  EXPECT_GE(pkv_cuda_device_count(), 0);
  EXPECT_EQ(pkv_dtype_size(PKV_DTYPE_F32), 4u);
  EXPECT_EQ(pkv_dtype_size(PKV_DTYPE_F16), 2u);
  EXPECT_EQ(pkv_dtype_size(PKV_DTYPE_BF16), 2u);
  EXPECT_EQ(pkv_dtype_size(PKV_DTYPE_I32), 4u);
  EXPECT_EQ(pkv_dtype_size(PKV_DTYPE_I64), 8u);
  EXPECT_EQ(pkv_dtype_size(PKV_DTYPE_FP8_E4M3), 1u);
  EXPECT_EQ(pkv_dtype_size(PKV_DTYPE_FP8_E5M2), 1u);
  EXPECT_EQ(pkv_dtype_size(0), 0u);
  EXPECT_EQ(pkv_dtype_size(8), 0u);
  EXPECT_EQ(pkv_hash_size(PKV_HASH_SHA256_CBOR), 32u);
  EXPECT_EQ(pkv_hash_size(PKV_HASH_XXH3_128), 16u);
  EXPECT_EQ(pkv_hash_size(0), 0u);
  EXPECT_EQ(pkv_hash_size(3), 0u);
}

TEST(Contract, TensorInitLimitsAndNoWriteOnFailure) {
  int64_t shape[PKV_TENSOR_MAX_DIMS + 1] = {2, 3, 1, 1, 1, 1, 1};
  float data[6];
  pkv_tensor t;
  EXPECT_EQ(pkv_tensor_init(data, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, PKV_TENSOR_MAX_DIMS, shape, &t),
            PKV_OK);
  EXPECT_EQ(pkv_tensor_init(data, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 1, shape, &t), PKV_OK);
  EXPECT_EQ(t.ndim, 1);
  EXPECT_EQ(t.shape[0], 2);
  pkv_tensor sentinel;
  std::memset(&sentinel, 0xAB, sizeof sentinel);
  auto refused = [&](uint32_t dtype, int32_t dev, int32_t ndim, const int64_t* s) {
    pkv_tensor out = sentinel;
    pkv_status st = pkv_tensor_init(data, dtype, dev, 0, ndim, s, &out);
    EXPECT_EQ(st, PKV_E_INVALID_ARGUMENT) << dtype << " " << dev << " " << ndim;
    EXPECT_EQ(std::memcmp(&out, &sentinel, sizeof out), 0) << "written on failure";
  };
  refused(PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, shape);
  refused(PKV_DTYPE_F32, PKV_DEVICE_CPU, PKV_TENSOR_MAX_DIMS + 1, shape);
  refused(99, PKV_DEVICE_CPU, 2, shape);
  refused(PKV_DTYPE_F32, 7, 2, shape);
  int64_t neg[2] = {2, -1};
  refused(PKV_DTYPE_F32, PKV_DEVICE_CPU, 2, neg);
  int64_t big[2] = {INT64_C(1) << 32, INT64_C(1) << 32};
  refused(PKV_DTYPE_F32, PKV_DEVICE_CPU, 2, big);
}

// ------------------------------------------------------------------ pool.h

TEST(Contract, PoolOptionDefaults) {
  pkv_pool_options o;
  std::memset(&o, 0x5A, sizeof o);
  pkv_pool_options_init_sized(&o, sizeof o);
  EXPECT_EQ(o.struct_size, sizeof o);
  EXPECT_EQ(o.block_size, 16u);
  EXPECT_EQ(o.num_blocks, 0u);
  EXPECT_EQ(o.hash_algo, static_cast<uint32_t>(PKV_HASH_SHA256_CBOR));
  EXPECT_EQ(o.enable_prefix_caching, 1u);
  ASSERT_NE(o.hash_seed, nullptr);
  EXPECT_STREQ(o.hash_seed, "");
  EXPECT_EQ(o.sliding_window, 0u);
  EXPECT_EQ(o.enable_events, 0u);
  EXPECT_EQ(o.max_events, 65536u);
  EXPECT_EQ(o.num_layers, 0u);
  EXPECT_EQ(o.dtype, static_cast<uint32_t>(PKV_DTYPE_BF16));
  EXPECT_EQ(o.device_type, PKV_DEVICE_CPU);
  EXPECT_EQ(o.device_id, 0);
  EXPECT_EQ(o.num_threads, 0u);
  EXPECT_EQ(o.strict_key_domains, static_cast<uint32_t>(PKV_KEY_DOMAINS_VLLM));
  EXPECT_EQ(o.kv_scale_granularity, static_cast<uint32_t>(PKV_KV_SCALE_PER_TENSOR));
  EXPECT_EQ(o.num_kv_scales, 0u);
  EXPECT_EQ(o.k_scales, nullptr);
  EXPECT_EQ(o.v_scales, nullptr);
  EXPECT_EQ(o.enable_partial_reuse, 0u);
  EXPECT_EQ(o.enable_retention, 0u);
  EXPECT_EQ(o.max_pinned_blocks, 0u);
  EXPECT_EQ(o.kv_layout, static_cast<uint32_t>(PKV_KV_LAYOUT_MHA));
  EXPECT_EQ(o.kv_lora_rank, 0u);
  EXPECT_EQ(o.qk_rope_head_dim, 0u);

  pkv_seq_options so;
  pkv_seq_options_init_sized(&so, sizeof so);
  EXPECT_EQ(so.priority, 0);
  EXPECT_EQ(so.lora_id, 0u);
  EXPECT_EQ(so.num_mm_items, 0u);
  pkv_attention_params ap;
  pkv_attention_params_init_sized(&ap, sizeof ap);
  EXPECT_EQ(ap.softmax_scale, 0.f);
  EXPECT_EQ(ap.sliding_window, 0u);
  EXPECT_EQ(ap.logit_softcap, 0.f);
  pkv_hash_options ho;
  pkv_hash_options_init_sized(&ho, sizeof ho);
  EXPECT_EQ(ho.algo, static_cast<uint32_t>(PKV_HASH_SHA256_CBOR));
  EXPECT_EQ(ho.block_size, 16u);
  ASSERT_NE(ho.seed, nullptr);
  EXPECT_STREQ(ho.seed, "");
  pkv_kv_group_spec gs;
  pkv_kv_group_spec_init_sized(&gs, sizeof gs);
  EXPECT_EQ(gs.kind, static_cast<uint32_t>(PKV_GROUP_FULL));
  EXPECT_EQ(gs.num_layers, 1u);
  EXPECT_EQ(gs.dtype, static_cast<uint32_t>(PKV_DTYPE_BF16));
  EXPECT_EQ(gs.flags, 0u);
  pkv_event_publisher_options po;
  pkv_event_publisher_options_init_sized(&po, sizeof po);
  EXPECT_EQ(po.data_parallel_rank, 0u);
  ASSERT_NE(po.topic, nullptr);
  EXPECT_STREQ(po.topic, "");
  EXPECT_EQ(po.buffer_steps, 10000u);
  EXPECT_EQ(po.hwm, 100000);
  EXPECT_EQ(po.event_encoding, static_cast<uint32_t>(PKV_EVENTS_ENCODING_MAP));
  EXPECT_EQ(po.hash_encoding, static_cast<uint32_t>(PKV_EVENTS_HASH_INT));
  EXPECT_EQ(po.device_medium, nullptr);
}

TEST(Contract, PoolOptionLimitsAtAndPastTheirBounds) {
  auto create = [](void (*edit)(pkv_pool_options&)) {
    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.block_size = 4;
    o.num_blocks = 4;
    edit(o);
    pkv_pool* p = reinterpret_cast<pkv_pool*>(uintptr_t{0x1234});
    pkv_status st = pkv_pool_create(&o, &p);
    if (st == PKV_OK) {
      pkv_pool_destroy(p);
    } else {
      EXPECT_EQ(p, reinterpret_cast<pkv_pool*>(uintptr_t{0x1234})) << "out written on failure";
    }
    return st;
  };
  EXPECT_EQ(create([](pkv_pool_options& o) { o.block_size = 0; }), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(create([](pkv_pool_options& o) { o.block_size = 1; }), PKV_OK);
  EXPECT_EQ(create([](pkv_pool_options& o) { o.block_size = 1024; }), PKV_OK);
  EXPECT_EQ(create([](pkv_pool_options& o) { o.block_size = 1025; }), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(create([](pkv_pool_options& o) { o.num_blocks = 1; }), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(create([](pkv_pool_options& o) { o.num_blocks = 2; }), PKV_OK);
  // head_dim 1..4096 on a CPU pool
  auto storage = [](pkv_pool_options& o, uint32_t hd) {
    o.num_layers = 1;
    o.num_kv_heads = 1;
    o.head_dim = hd;
    o.dtype = PKV_DTYPE_F16;
    o.num_threads = 1;
  };
  static void (*s)(pkv_pool_options&, uint32_t) = storage;
  EXPECT_EQ(create([](pkv_pool_options& o) { s(o, 1); }), PKV_OK);
  EXPECT_EQ(create([](pkv_pool_options& o) { s(o, 4096); }), PKV_OK);
  EXPECT_EQ(create([](pkv_pool_options& o) { s(o, 4097); }), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(create([](pkv_pool_options& o) { s(o, 0); }), PKV_E_INVALID_ARGUMENT);
  // max_pinned_blocks below num_blocks - 1
  EXPECT_EQ(create([](pkv_pool_options& o) {
              o.enable_retention = 1;
              o.max_pinned_blocks = 2;
            }),
            PKV_OK);
  EXPECT_EQ(create([](pkv_pool_options& o) {
              o.enable_retention = 1;
              o.max_pinned_blocks = 3;
            }),
            PKV_E_INVALID_ARGUMENT);
  // partial reuse without prefix caching: accepted
  EXPECT_EQ(create([](pkv_pool_options& o) {
              o.enable_prefix_caching = 0;
              o.enable_partial_reuse = 1;
            }),
            PKV_OK);
  // MLA: kv_lora_rank 1..4096, qk_rope_head_dim 0..1024
  auto mla = [](pkv_pool_options& o, uint32_t rank, uint32_t rope) {
    o.num_layers = 1;
    o.kv_layout = PKV_KV_LAYOUT_MLA;
    o.kv_lora_rank = rank;
    o.qk_rope_head_dim = rope;
    o.dtype = PKV_DTYPE_F16;
    o.num_threads = 1;
  };
  static void (*m)(pkv_pool_options&, uint32_t, uint32_t) = mla;
  EXPECT_EQ(create([](pkv_pool_options& o) { m(o, 4096, 0); }), PKV_OK);
  EXPECT_EQ(create([](pkv_pool_options& o) { m(o, 4097, 0); }), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(create([](pkv_pool_options& o) { m(o, 0, 64); }), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(create([](pkv_pool_options& o) { m(o, 512, 1024); }), PKV_OK);
  EXPECT_EQ(create([](pkv_pool_options& o) { m(o, 512, 1025); }), PKV_E_INVALID_ARGUMENT);
}

TEST(Contract, GetOptionsReturnsNumThreadsAsGivenAndTheSeedCopy) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 4;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = 4;
  o.num_threads = 5000;
  std::string seed = "seed-x";
  o.hash_seed = seed.c_str();
  pkv_pool* p = nullptr;
  PKV_ASSERT_OK(pkv_pool_create(&o, &p));
  seed = "changed";
  pkv_pool_options got;
  pkv_pool_options_init_sized(&got, sizeof got);
  PKV_ASSERT_OK(pkv_pool_get_options(p, &got));
  EXPECT_EQ(got.num_threads, 5000u);
  EXPECT_STREQ(got.hash_seed, "seed-x");
  EXPECT_EQ(got.num_blocks, 4u);
  pkv_pool_destroy(p);
  pkv_pool_destroy(nullptr);
}

TEST(Contract, MatchPrefixLeavesOneTokenToComputeAndCountsStats) {
  pkv_pool* p = make_pool(4, 16);
  auto t = iota_tokens(8);
  pkv_seq_id a = 0;
  uint64_t cached = 99;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 8, 0, &a, &cached));
  EXPECT_EQ(cached, 0u);
  uint32_t q = 8;
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &a, &q, 1, nullptr, &b));
  PKV_ASSERT_OK(pkv_batch_commit(b));
  pkv_batch_destroy(b);
  pkv_pool_stats before = stats_of(p);
  pkv_seq_id s = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s));
  PKV_ASSERT_OK(pkv_seq_match_prefix(p, s, t.data(), 8, &cached));
  EXPECT_EQ(cached, 4u);  // both blocks cached, but one token must be left
  pkv_pool_stats after = stats_of(p);
  EXPECT_EQ(after.prefix_query_tokens - before.prefix_query_tokens, 8u);
  EXPECT_EQ(after.prefix_hit_tokens - before.prefix_hit_tokens, 4u);
  // a sequence that is not empty: refused, nothing changes
  uint64_t c2 = 77;
  EXPECT_NE(pkv_seq_match_prefix(p, s, t.data(), 8, &c2), PKV_OK);
  EXPECT_EQ(c2, 77u);
  pkv_pool_stats again = stats_of(p);
  EXPECT_EQ(std::memcmp(&again, &after, sizeof again), 0);
  pkv_pool_destroy(p);
}

TEST(Contract, OutParametersAreNotWrittenOnFailure) {
  pkv_pool* p = make_pool(4, 4);  // 3 usable blocks
  auto t = iota_tokens(64);
  pkv_seq_id s = 0xDEAD;
  uint64_t n = 0xDEAD;
  EXPECT_EQ(pkv_seq_admit(p, nullptr, t.data(), 64, 0, &s, &n), PKV_E_OUT_OF_BLOCKS);
  EXPECT_EQ(s, 0xDEADu);
  EXPECT_EQ(n, 0xDEADu);
  EXPECT_EQ(stats_of(p).num_seqs, 0u);
  pkv_seq_id live = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &live));
  pkv_seq_id gone = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &gone));
  PKV_ASSERT_OK(pkv_seq_free(p, gone));
  n = 0xDEAD;
  EXPECT_EQ(pkv_seq_blocks_needed(p, gone, 4, 0, &n), PKV_E_NOT_FOUND);
  EXPECT_EQ(n, 0xDEADu);
  EXPECT_EQ(pkv_seq_match_prefix(p, gone, t.data(), 8, &n), PKV_E_NOT_FOUND);
  EXPECT_EQ(n, 0xDEADu);
  pkv_seq_id child = 0xDEAD;
  EXPECT_EQ(pkv_seq_fork(p, gone, &child), PKV_E_NOT_FOUND);
  EXPECT_EQ(child, 0xDEADu);
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  info.num_tokens = 0xDEAD;
  EXPECT_EQ(pkv_seq_get_info(p, gone, &info), PKV_E_NOT_FOUND);
  EXPECT_EQ(info.num_tokens, 0xDEADu);
  pkv_batch* b = reinterpret_cast<pkv_batch*>(uintptr_t{0xDEAD});
  uint32_t q = 1;
  EXPECT_EQ(pkv_batch_prepare(p, &gone, &q, 1, nullptr, &b), PKV_E_NOT_FOUND);
  EXPECT_EQ(b, reinterpret_cast<pkv_batch*>(uintptr_t{0xDEAD}));
  EXPECT_EQ(pkv_batch_prepare_decode(p, &gone, t.data(), 1, 0, nullptr, &b), PKV_E_NOT_FOUND);
  EXPECT_EQ(b, reinterpret_cast<pkv_batch*>(uintptr_t{0xDEAD}));
  uint64_t bpb = 0xDEAD;
  EXPECT_EQ(pkv_pool_bytes_per_block(nullptr, &bpb), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(bpb, 0xDEADu);
  uint32_t ng = 0xDEAD;
  EXPECT_EQ(pkv_pool_num_groups(nullptr, &ng), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(ng, 0xDEADu);
  pkv_pool_destroy(p);
}

TEST(Contract, ReserveLimits) {
  pkv_pool* p = make_pool(4, 8);
  pkv_seq_id s = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s));
  EXPECT_EQ(pkv_seq_reserve(p, s, (uint64_t{1} << 31)), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(pkv_seq_reserve(p, s, UINT64_MAX), PKV_E_INVALID_ARGUMENT);
  PKV_ASSERT_OK(pkv_seq_reserve(p, s, (uint64_t{1} << 31) - 1));
  PKV_ASSERT_OK(pkv_seq_reserve(p, s, 0));
  pkv_pool_destroy(p);
}

TEST(Contract, BatchedCallsAreAllOrNothing) {
  pkv_pool* p = make_pool(4, 8);
  pkv_seq_id a = 0, b = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &a));
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &b));
  EXPECT_EQ(pkv_seq_append_batch(p, nullptr, nullptr, 0), PKV_OK);
  EXPECT_EQ(pkv_seq_free_batch(p, nullptr, 0), PKV_OK);
  pkv_seq_id twice[2] = {a, a};
  int32_t tok[2] = {1, 2};
  EXPECT_EQ(pkv_seq_append_batch(p, twice, tok, 2), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(pkv_seq_free_batch(p, twice, 2), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(stats_of(p).num_seqs, 2u);
  EXPECT_EQ(stats_of(p).num_tokens, 0u);
  pkv_seq_id gone = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &gone));
  PKV_ASSERT_OK(pkv_seq_free(p, gone));
  pkv_seq_id with_stale[2] = {a, gone};
  EXPECT_EQ(pkv_seq_append_batch(p, with_stale, tok, 2), PKV_E_NOT_FOUND);
  EXPECT_EQ(pkv_seq_free_batch(p, with_stale, 2), PKV_E_NOT_FOUND);
  EXPECT_EQ(stats_of(p).num_seqs, 2u);
  EXPECT_EQ(stats_of(p).num_tokens, 0u);
  pkv_seq_id both[2] = {a, b};
  PKV_ASSERT_OK(pkv_seq_free_batch(p, both, 2));
  EXPECT_EQ(stats_of(p).num_seqs, 0u);
  pkv_pool_destroy(p);
}

TEST(Contract, PriorityCountsAndRetentionErrors) {
  pkv_pool* p = make_pool(4, 8);
  auto t = iota_tokens(9);
  pkv_seq_id s = 0;
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 9, 0, &s, &cached));
  uint64_t counts[PKV_PRIORITY_MAX + 1];
  uint64_t len = 0;
  EXPECT_EQ(pkv_pool_get_priority_counts(p, counts, PKV_PRIORITY_MAX, &len),
            PKV_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(len, static_cast<uint64_t>(PKV_PRIORITY_MAX + 1));
  len = 0;
  PKV_ASSERT_OK(pkv_pool_get_priority_counts(p, counts, PKV_PRIORITY_MAX + 1, &len));
  EXPECT_EQ(len, static_cast<uint64_t>(PKV_PRIORITY_MAX + 1));
  uint64_t total = 0;
  for (int i = 0; i <= PKV_PRIORITY_MAX; ++i)
    if (i != PKV_PRIORITY_DEFAULT) total += counts[i];
  EXPECT_EQ(total, 0u);
  EXPECT_EQ(counts[PKV_PRIORITY_DEFAULT], stats_of(p).num_cached_blocks);
  EXPECT_EQ(counts[PKV_PRIORITY_DEFAULT], 2u);
  pkv_retention_range r{0, PKV_TOKEN_END, 50, 0, 0};
  EXPECT_EQ(pkv_seq_set_retention(p, s, &r, 1), PKV_E_INVALID_STATE);
  pkv_pool_destroy(p);

  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 8;
  o.enable_retention = 1;
  PKV_ASSERT_OK(pkv_pool_create(&o, &p));
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s));
  std::vector<pkv_retention_range> many(PKV_RETENTION_MAX_RANGES + 1, r);
  EXPECT_EQ(pkv_seq_set_retention(p, s, many.data(), many.size()), PKV_E_INVALID_ARGUMENT);
  PKV_ASSERT_OK(pkv_seq_set_retention(p, s, many.data(), PKV_RETENTION_MAX_RANGES));
  pkv_retention_range bad = r;
  bad.priority = PKV_PRIORITY_MAX + 1;
  EXPECT_EQ(pkv_seq_set_retention(p, s, &bad, 1), PKV_E_INVALID_ARGUMENT);
  bad = r;
  bad.reserved = 1;
  EXPECT_EQ(pkv_seq_set_retention(p, s, &bad, 1), PKV_E_INVALID_ARGUMENT);
  PKV_ASSERT_OK(pkv_seq_set_retention(p, s, nullptr, 0));
  PKV_ASSERT_OK(pkv_pool_set_clock(p, 1000));
  PKV_ASSERT_OK(pkv_pool_set_clock(p, 10));  // below the last: taken as the last
  pkv_pool_destroy(p);
}

// ------------------------------------------------------------------ events

TEST(Contract, EventsAreDrainedOldestFirstWithGapFreeNumbers) {
  pkv_pool* p = make_pool(4, 16, 0, 1);
  auto t = iota_tokens(13);
  pkv_seq_id s = 0;
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 13, 0, &s, &cached));
  PKV_ASSERT_OK(pkv_pool_reset_prefix_cache(p));
  pkv_event ev[8];
  uint64_t n = 0;
  PKV_ASSERT_OK(pkv_pool_drain_events(p, ev, 2, &n));
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(ev[0].seq_no, 1u);
  EXPECT_EQ(ev[1].seq_no, 2u);
  EXPECT_EQ(ev[0].type, static_cast<uint32_t>(PKV_EVENT_BLOCK_STORED));
  EXPECT_EQ(ev[0].has_parent, 0u);
  EXPECT_EQ(ev[1].has_parent, 1u);
  EXPECT_EQ(std::memcmp(&ev[1].parent_hash, &ev[0].block_hash, sizeof ev[0].block_hash), 0);
  EXPECT_EQ(ev[0].num_tokens, 4u);
  PKV_ASSERT_OK(pkv_pool_drain_events(p, ev, 8, &n));
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(ev[0].seq_no, 3u);
  EXPECT_EQ(ev[0].type, static_cast<uint32_t>(PKV_EVENT_BLOCK_STORED));
  EXPECT_EQ(ev[1].seq_no, 4u);
  EXPECT_EQ(ev[1].type, static_cast<uint32_t>(PKV_EVENT_ALL_CLEARED));
  PKV_ASSERT_OK(pkv_pool_drain_events(p, ev, 8, &n));
  EXPECT_EQ(n, 0u);
  pkv_pool_destroy(p);
}

TEST(Contract, MaxEventsDropsTheOldestAndCountsThem) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 16;
  o.enable_events = 1;
  o.max_events = 2;
  pkv_pool* p = nullptr;
  PKV_ASSERT_OK(pkv_pool_create(&o, &p));
  auto t = iota_tokens(13);
  pkv_seq_id s = 0;
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 13, 0, &s, &cached));  // 3 stored
  PKV_ASSERT_OK(pkv_pool_reset_prefix_cache(p));                           // 1 cleared
  EXPECT_EQ(stats_of(p).num_events_dropped, 2u);
  pkv_event ev[4];
  uint64_t n = 0;
  PKV_ASSERT_OK(pkv_pool_drain_events(p, ev, 4, &n));
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(ev[0].seq_no, 3u);
  EXPECT_EQ(ev[1].seq_no, 4u);
  EXPECT_EQ(ev[1].type, static_cast<uint32_t>(PKV_EVENT_ALL_CLEARED));
  pkv_pool_destroy(p);
}

TEST(Contract, DrainV2StopsBeforeAnEventWhoseIdsDoNotFit) {
  pkv_pool* p = make_pool(4, 16, 0, 1);
  auto t = iota_tokens(9);
  pkv_seq_id s = 0;
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 9, 0, &s, &cached));  // 2 stored
  pkv_event_v2 ev[4];
  for (auto& e : ev) {
    std::memset(&e, 0, sizeof e);
    e.struct_size = sizeof e;
  }
  int32_t ids[8];
  uint64_t n = 99;
  EXPECT_EQ(pkv_pool_drain_events_v2(p, ev, 4, nullptr, 0, &n), PKV_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(pkv_pool_drain_events_v2(p, ev, 4, ids, 3, &n), PKV_E_BUFFER_TOO_SMALL);
  PKV_ASSERT_OK(pkv_pool_drain_events_v2(p, ev, 4, ids, 6, &n));
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(ev[0].seq_no, 1u);
  EXPECT_EQ(ev[0].num_token_ids, 4u);
  EXPECT_EQ(ev[0].token_offset, 0u);
  EXPECT_EQ(ev[0].block_size, 4u);
  EXPECT_EQ(ev[0].medium, static_cast<uint32_t>(PKV_MEDIUM_DEVICE));
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[3], 4);
  PKV_ASSERT_OK(pkv_pool_drain_events_v2(p, ev, 4, ids, 8, &n));
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(ev[0].seq_no, 2u);
  EXPECT_EQ(ids[0], 5);
  PKV_ASSERT_OK(pkv_pool_reset_prefix_cache(p));
  PKV_ASSERT_OK(pkv_pool_drain_events_v2(p, ev, 4, nullptr, 0, &n));
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(ev[0].type, static_cast<uint32_t>(PKV_EVENT_ALL_CLEARED));
  EXPECT_EQ(ev[0].num_token_ids, 0u);
  pkv_pool_destroy(p);
}

// ------------------------------------------------------------------ batch.h

TEST(Contract, CommitAbortIdempotencyAndDestroyNull) {
  pkv_pool* p = make_pool(4, 8);
  auto t = iota_tokens(5);
  pkv_seq_id s = 0;
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 5, 0, &s, &cached));
  uint32_t q = 5;
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
  PKV_ASSERT_OK(pkv_batch_commit(b));
  PKV_ASSERT_OK(pkv_batch_commit(b));
  EXPECT_EQ(pkv_batch_abort(b), PKV_E_INVALID_STATE);
  pkv_batch_destroy(b);
  int32_t more = 6;
  PKV_ASSERT_OK(pkv_seq_append(p, s, &more, 1, 0));
  q = 1;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
  PKV_ASSERT_OK(pkv_batch_abort(b));
  PKV_ASSERT_OK(pkv_batch_abort(b));
  EXPECT_EQ(pkv_batch_commit(b), PKV_E_INVALID_STATE);
  pkv_batch_destroy(b);
  pkv_batch_destroy(nullptr);
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, s, &info));
  EXPECT_EQ(info.num_computed_tokens, 5u);
  EXPECT_EQ(info.num_tokens, 6u);
  pkv_pool_destroy(p);
}

TEST(Contract, PlanOfADestroyedPoolStaysReadableAndAborts) {
  pkv_pool* p = make_pool(4, 8);
  auto t = iota_tokens(5);
  pkv_seq_id s = 0;
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 5, 0, &s, &cached));
  uint32_t q = 5;
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
  pkv_pool_destroy(p);
  EXPECT_EQ(pkv_batch_commit(b), PKV_E_INVALID_STATE);
  pkv_batch_info info;
  pkv_batch_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_batch_get_info(b, &info));
  EXPECT_EQ(info.num_tokens, 5u);
  pkv_tensor pos;
  PKV_ASSERT_OK(pkv_batch_token_positions(b, &pos));
  PKV_ASSERT_OK(pkv_batch_abort(b));
  pkv_batch_destroy(b);
}

TEST(Contract, PlanInfoPositionsAndLastRows) {
  pkv_pool* p = make_pool(4, 16);
  auto t = iota_tokens(6);
  pkv_seq_id s[2] = {0, 0};
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 6, 0, &s[0], &cached));
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 3, 0, &s[1], &cached));
  uint32_t q[2] = {6, 3};
  pkv_batch* b = nullptr;
  EXPECT_EQ(pkv_batch_prepare_ex(p, s, q, 2, 0x2u, nullptr, &b), PKV_E_INVALID_ARGUMENT);
  PKV_ASSERT_OK(pkv_batch_prepare_ex(p, s, q, 2, 0, nullptr, &b));
  pkv_batch_info info;
  pkv_batch_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_batch_get_info(b, &info));
  EXPECT_EQ(info.num_seqs, 2u);
  EXPECT_EQ(info.num_tokens, 9u);
  EXPECT_EQ(info.num_pages, 3u);
  EXPECT_EQ(info.max_context, 6u);
  EXPECT_EQ(info.max_query, 6u);
  EXPECT_EQ(info.block_size, 4u);
  pkv_tensor pos, last;
  PKV_ASSERT_OK(pkv_batch_token_positions(b, &pos));
  PKV_ASSERT_OK(pkv_batch_last_token_indices(b, &last));
  ASSERT_EQ(pos.dtype, static_cast<uint32_t>(PKV_DTYPE_I64));
  ASSERT_EQ(pos.shape[0], 9);
  const int64_t* pp = static_cast<const int64_t*>(pos.data);
  std::vector<int64_t> want_pos = {0, 1, 2, 3, 4, 5, 0, 1, 2};
  EXPECT_EQ(std::vector<int64_t>(pp, pp + 9), want_pos);
  ASSERT_EQ(last.shape[0], 2);
  const int64_t* lp = static_cast<const int64_t*>(last.data);
  EXPECT_EQ(lp[0], 5);
  EXPECT_EQ(lp[1], 8);
  pkv_tensor bad;
  EXPECT_EQ(pkv_batch_plan_tensor(b, 6, &bad), PKV_E_INVALID_ARGUMENT);
  pkv_tensor g1;
  EXPECT_EQ(pkv_batch_plan_tensor_group(b, 1, PKV_PLAN_SLOT_MAPPING, &g1), PKV_E_INVALID_ARGUMENT);
  pkv_tensor g0, direct;
  PKV_ASSERT_OK(pkv_batch_plan_tensor_group(b, 0, PKV_PLAN_PAGE_INDICES, &g0));
  PKV_ASSERT_OK(pkv_batch_plan_tensor(b, PKV_PLAN_PAGE_INDICES, &direct));
  EXPECT_EQ(g0.shape[0], direct.shape[0]);
  EXPECT_EQ(std::memcmp(g0.data, direct.data, sizeof(int32_t) * g0.shape[0]), 0);
  pkv_batch_destroy(b);
  pkv_pool_destroy(p);
}

TEST(Contract, PrepareDecodeIsAllOrNothing) {
  pkv_pool* p = make_pool(4, 3);  // 2 usable blocks
  auto t = iota_tokens(4);
  pkv_seq_id s[2] = {0, 0};
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 4, 0, &s[0], &cached));
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 4, 0, &s[1], &cached));
  uint32_t q[2] = {4, 4};
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, s, q, 2, nullptr, &b));
  PKV_ASSERT_OK(pkv_batch_commit(b));
  pkv_batch_destroy(b);
  int32_t next[2] = {5, 6};
  pkv_pool_stats before = stats_of(p);
  EXPECT_EQ(pkv_batch_prepare_decode(p, s, next, 2, 0, nullptr, &b), PKV_E_OUT_OF_BLOCKS);
  pkv_pool_stats after = stats_of(p);
  EXPECT_EQ(std::memcmp(&before, &after, sizeof before), 0);
  pkv_pool_destroy(p);
}

// ------------------------------------------------------------------ groups.h

TEST(Contract, GroupCreationLimits) {
  pkv_pool_options base;
  pkv_pool_options_init(&base);
  base.block_size = 4;
  base.num_blocks = 16;
  std::vector<pkv_kv_group_spec> g(65);
  for (auto& s : g) {
    pkv_kv_group_spec_init(&s);
    s.num_kv_heads = 1;
    s.head_dim = 8;
  }
  pkv_pool* p = reinterpret_cast<pkv_pool*>(uintptr_t{0xDEAD});
  EXPECT_EQ(pkv_pool_create_groups(&base, g.data(), 0, &p), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(pkv_pool_create_groups(&base, g.data(), 65, &p), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(p, reinterpret_cast<pkv_pool*>(uintptr_t{0xDEAD}));
  PKV_ASSERT_OK(pkv_pool_create_groups(&base, g.data(), 64, &p));
  pkv_pool_destroy(p);
  g[0].num_layers = 65536;
  PKV_ASSERT_OK(pkv_pool_create_groups(&base, g.data(), 1, &p));
  pkv_pool_destroy(p);
  g[0].num_layers = 65537;
  EXPECT_EQ(pkv_pool_create_groups(&base, g.data(), 1, &p), PKV_E_INVALID_ARGUMENT);
  g[0].num_layers = 0;
  EXPECT_EQ(pkv_pool_create_groups(&base, g.data(), 1, &p), PKV_E_INVALID_ARGUMENT);
  g[0].num_layers = 1;
  pkv_pool_options b2 = base;
  b2.num_layers = 1;  // manager only: storage is unsupported there
  EXPECT_EQ(pkv_pool_create_groups(&b2, g.data(), 1, &p), PKV_E_UNSUPPORTED);
  EXPECT_NE(std::string(pkv_last_error_message()).find("base->num_layers"), std::string::npos);
  b2 = base;
  b2.sliding_window = 8;
  EXPECT_EQ(pkv_pool_create_groups(&b2, g.data(), 1, &p), PKV_E_INVALID_ARGUMENT);
  b2 = base;
  b2.enable_events = 1;
  EXPECT_EQ(pkv_pool_create_groups(&b2, g.data(), 1, &p), PKV_E_UNSUPPORTED);
  b2 = base;
  b2.enable_partial_reuse = 1;
  EXPECT_EQ(pkv_pool_create_groups(&b2, g.data(), 1, &p), PKV_E_UNSUPPORTED);
  b2 = base;
  b2.enable_retention = 1;
  EXPECT_EQ(pkv_pool_create_groups(&b2, g.data(), 1, &p), PKV_E_UNSUPPORTED);
  g[0].flags = PKV_GROUP_SNAPSHOT_EVERY_BLOCK;
  p = reinterpret_cast<pkv_pool*>(uintptr_t{0xDEAD});
  EXPECT_EQ(pkv_pool_create_groups(&base, g.data(), 1, &p), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(p, reinterpret_cast<pkv_pool*>(uintptr_t{0xDEAD}));
}

TEST(Contract, GroupQueriesOnSingleAndMultiGroupPools) {
  pkv_pool* single = make_pool(4, 8, 3);
  uint32_t n = 0, grp = 77, idx = 77;
  PKV_ASSERT_OK(pkv_pool_num_groups(single, &n));
  EXPECT_EQ(n, 1u);
  PKV_ASSERT_OK(pkv_pool_group_of_layer(single, 2, &grp, &idx));
  EXPECT_EQ(grp, 0u);
  EXPECT_EQ(idx, 2u);
  grp = idx = 77;
  EXPECT_EQ(pkv_pool_group_of_layer(single, 3, &grp, &idx), PKV_E_NOT_FOUND);
  EXPECT_EQ(grp, 77u);
  EXPECT_EQ(idx, 77u);
  pkv_group_stats gs;
  pkv_group_stats_init_sized(&gs, sizeof gs);
  EXPECT_EQ(pkv_pool_group_stats(single, 0, &gs), PKV_E_UNSUPPORTED);
  pkv_seq_id s = 0;
  auto t = iota_tokens(6);
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(single, nullptr, t.data(), 6, 0, &s, &cached));
  int32_t a[4], b[4];
  uint64_t la = 0, lb = 0;
  PKV_ASSERT_OK(pkv_seq_group_block_table(single, s, 0, a, 4, &la));
  PKV_ASSERT_OK(pkv_seq_get_block_table(single, s, b, 4, &lb));
  ASSERT_EQ(la, lb);
  EXPECT_EQ(std::vector<int32_t>(a, a + la), std::vector<int32_t>(b, b + lb));
  EXPECT_NE(pkv_seq_group_block_table(single, s, 1, a, 4, &la), PKV_OK);
  lb = 0;
  EXPECT_EQ(pkv_seq_get_block_table(single, s, b, 1, &lb), PKV_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(lb, 2u);
  pkv_pool_destroy(single);

  pkv_pool* multi = make_groups_pool();
  PKV_ASSERT_OK(pkv_pool_num_groups(multi, &n));
  EXPECT_EQ(n, 2u);
  PKV_ASSERT_OK(pkv_pool_group_of_layer(multi, 1, &grp, &idx));
  EXPECT_EQ(grp, 1u);
  EXPECT_EQ(idx, 0u);
  grp = idx = 77;
  EXPECT_EQ(pkv_pool_group_of_layer(multi, 2, &grp, &idx), PKV_E_NOT_FOUND);
  EXPECT_EQ(grp, 77u);
  EXPECT_EQ(idx, 77u);
  PKV_ASSERT_OK(pkv_pool_group_stats(multi, 1, &gs));
  EXPECT_EQ(gs.kind, static_cast<uint32_t>(PKV_GROUP_SLIDING_WINDOW));
  EXPECT_NE(pkv_pool_group_stats(multi, 2, &gs), PKV_OK);
  pkv_pool_destroy(multi);
}

TEST(Contract, CallsNotListedForMultiGroupPoolsAreUnsupported) {
  pkv_pool* p = make_groups_pool();
  pkv_seq_id s = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s));
  auto t = iota_tokens(8);
  PKV_ASSERT_OK(pkv_seq_append(p, s, t.data(), 8, 0));
  pkv_pool_stats before = stats_of(p);
  std::vector<std::pair<const char*, pkv_status>> got;
  pkv_prefix_match pm;
  pkv_prefix_match_init_sized(&pm, sizeof pm);
  pkv_seq_id s2 = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s2));
  got.emplace_back("match_prefix_partial", pkv_seq_match_prefix_partial(p, s2, t.data(), 8, &pm));
  pkv_retention_range r{0, PKV_TOKEN_END, 50, 0, 0};
  got.emplace_back("set_retention", pkv_seq_set_retention(p, s, &r, 1));
  got.emplace_back("set_clock", pkv_pool_set_clock(p, 5));
  uint64_t counts[PKV_PRIORITY_MAX + 1];
  uint64_t len = 0;
  got.emplace_back("get_priority_counts",
                   pkv_pool_get_priority_counts(p, counts, PKV_PRIORITY_MAX + 1, &len));
  pkv_event ev[2];
  got.emplace_back("drain_events", pkv_pool_drain_events(p, ev, 2, &len));
  pkv_tensor kv;
  got.emplace_back("kv_tensor", pkv_pool_kv_tensor(p, 0, PKV_KV_KEY, &kv));
  int32_t one = 1, two = 2;
  got.emplace_back("copy_blocks", pkv_pool_copy_blocks(p, &one, &two, 1, nullptr));
  float scales[1] = {1.f};
  got.emplace_back("set_kv_scales", pkv_pool_set_kv_scales(p, scales, scales, 1));
  pkv_tier_options to;
  pkv_tier_options_init(&to);
  to.host_bytes = 1 << 20;
  got.emplace_back("attach_tiers", pkv_pool_attach_tiers(p, &to));
  pkv_block_hash h[2];
  got.emplace_back("get_block_hashes", pkv_seq_get_block_hashes(p, s, h, 2, &len));
  for (auto& [name, st] : got) EXPECT_EQ(st, PKV_E_UNSUPPORTED) << name;
  // listed in groups.h as working on every group: a capacity hint, nothing observable
  PKV_ASSERT_OK(pkv_seq_reserve(p, s, 1024));
  EXPECT_EQ(pkv_seq_reserve(p, s, uint64_t{1} << 31), PKV_E_INVALID_ARGUMENT);
  pkv_pool_stats after = stats_of(p);
  after.num_seqs -= 1;  // s2
  EXPECT_EQ(std::memcmp(&before, &after, sizeof before), 0);
  pkv_pool_destroy(p);
}

TEST(Contract, TakeCopiesTooSmallForgetsNothing) {
  pkv_pool* p = make_groups_pool();
  pkv_seq_id s = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s));
  auto t = iota_tokens(6);
  PKV_ASSERT_OK(pkv_seq_append(p, s, t.data(), 6, 0));
  pkv_seq_id c1 = 0, c2 = 0;
  PKV_ASSERT_OK(pkv_seq_fork(p, s, &c1));
  PKV_ASSERT_OK(pkv_seq_fork(p, s, &c2));
  int32_t x = 7;
  PKV_ASSERT_OK(pkv_seq_append(p, c1, &x, 1, 0));
  PKV_ASSERT_OK(pkv_seq_append(p, c2, &x, 1, 0));
  int32_t src[4], dst[4];
  uint64_t len = 0;
  EXPECT_EQ(pkv_pool_group_take_copies(p, 0, src, dst, 1, &len), PKV_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(len, 2u);
  len = 0;
  PKV_ASSERT_OK(pkv_pool_group_take_copies(p, 0, src, dst, 4, &len));
  EXPECT_EQ(len, 2u);
  PKV_ASSERT_OK(pkv_pool_group_take_copies(p, 0, src, dst, 4, &len));
  EXPECT_EQ(len, 0u);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

TEST(Contract, PrepareDecodeIsUnsupportedOnMultiGroupPools) {
  pkv_pool* p = make_groups_pool();
  pkv_seq_id s = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s));
  auto t = iota_tokens(4);
  PKV_ASSERT_OK(pkv_seq_append(p, s, t.data(), 4, 0));
  pkv_batch* b = nullptr;
  int32_t x = 5;
  EXPECT_EQ(pkv_batch_prepare_decode(p, &s, &x, 1, 0, nullptr, &b), PKV_E_UNSUPPORTED);
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, s, &info));
  EXPECT_EQ(info.num_tokens, 4u);
  pkv_pool_destroy(p);
}

// ------------------------------------------------------------------ tiers.h

TEST(Contract, TierAttachRules) {
  pkv_tier_options to;
  pkv_tier_options_init_sized(&to, sizeof to);
  EXPECT_EQ(to.flags, 0u);
  EXPECT_EQ(to.host_bytes, 0u);
  EXPECT_EQ(to.file_dir, nullptr);
  to.host_bytes = 1 << 20;
  pkv_pool* manager = make_pool(4, 8);
  EXPECT_EQ(pkv_pool_attach_tiers(manager, &to), PKV_E_INVALID_STATE);
  pkv_pool_destroy(manager);
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 8;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = 4;
  o.num_threads = 1;
  o.enable_prefix_caching = 0;
  pkv_pool* p = nullptr;
  PKV_ASSERT_OK(pkv_pool_create(&o, &p));
  EXPECT_EQ(pkv_pool_attach_tiers(p, &to), PKV_E_INVALID_STATE);
  pkv_pool_destroy(p);
  p = make_pool(4, 8, 1);
  pkv_tier_stats ts;
  pkv_tier_stats_init_sized(&ts, sizeof ts);
  EXPECT_EQ(pkv_pool_get_tier_stats(p, PKV_MEDIUM_HOST, &ts), PKV_E_INVALID_STATE);
  pkv_tier_options bad = to;
  bad.flags = 1;
  EXPECT_EQ(pkv_pool_attach_tiers(p, &bad), PKV_E_INVALID_ARGUMENT);
  bad = to;
  bad.host_bytes = 1;  // less than one block
  EXPECT_EQ(pkv_pool_attach_tiers(p, &bad), PKV_E_INVALID_ARGUMENT);
  PKV_ASSERT_OK(pkv_pool_attach_tiers(p, &to));
  EXPECT_NE(pkv_pool_attach_tiers(p, &to), PKV_OK);  // once
  PKV_ASSERT_OK(pkv_pool_get_tier_stats(p, PKV_MEDIUM_HOST, &ts));
  EXPECT_EQ(ts.medium, static_cast<uint32_t>(PKV_MEDIUM_HOST));
  EXPECT_EQ(pkv_pool_get_tier_stats(p, PKV_MEDIUM_FILE, &ts), PKV_E_INVALID_STATE);
  pkv_pool_destroy(p);
}

TEST(Contract, TieredMatchWithoutTiersEqualsMatchPrefix) {
  pkv_pool* p = make_pool(4, 16, 1);
  auto t = iota_tokens(9);
  pkv_seq_id a = 0;
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 9, 0, &a, &cached));
  uint32_t q = 9;
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &a, &q, 1, nullptr, &b));
  PKV_ASSERT_OK(pkv_batch_commit(b));
  pkv_batch_destroy(b);
  pkv_seq_id s = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s));
  pkv_tier_match tm;
  pkv_tier_match_init_sized(&tm, sizeof tm);
  PKV_ASSERT_OK(pkv_seq_match_prefix_tiered(p, s, t.data(), 9, &tm));
  EXPECT_EQ(tm.num_cached, 8u);
  EXPECT_EQ(tm.device_tokens, 8u);
  EXPECT_EQ(tm.host_tokens, 0u);
  EXPECT_EQ(tm.file_tokens, 0u);
  pkv_pool_destroy(p);
}

// ------------------------------------------------------------------ hash.h

TEST(Contract, HashPrefixReportsTheCountNeeded) {
  pkv_hash_options ho;
  pkv_hash_options_init(&ho);
  ho.block_size = 4;
  auto t = iota_tokens(11);
  pkv_block_hash h[2];
  uint64_t n = 0;
  EXPECT_EQ(pkv_hash_prefix(&ho, t.data(), 11, h, 1, &n), PKV_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, 2u);
  PKV_ASSERT_OK(pkv_hash_prefix(&ho, t.data(), 11, h, 2, &n));
  EXPECT_EQ(n, 2u);
  pkv_block_hash root;
  PKV_ASSERT_OK(pkv_hash_root(PKV_HASH_XXH3_128, "", &root));
  for (int i = 16; i < PKV_HASH_MAX_BYTES; ++i) EXPECT_EQ(root.bytes[i], 0) << i;
  EXPECT_EQ(pkv_hash_root(9, "", &root), PKV_E_INVALID_ARGUMENT);
  // the pool's hashes are these
  pkv_pool* p = make_pool(4, 8);
  pkv_seq_id s = 0;
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 11, 0, &s, &cached));
  pkv_block_hash ph[2];
  PKV_ASSERT_OK(pkv_seq_get_block_hashes(p, s, ph, 2, &n));
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(std::memcmp(ph, h, sizeof ph), 0);
  EXPECT_EQ(pkv_seq_get_block_hashes(p, s, ph, 1, &n), PKV_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, 2u);
  pkv_pool_destroy(p);
}

// ------------------------------------------------------------------ events.h

TEST(Contract, PublisherRules) {
  pkv_event_publisher_destroy(nullptr);
  pkv_pool* no_events = make_pool(4, 8);
  pkv_event_publisher* pub = reinterpret_cast<pkv_event_publisher*>(uintptr_t{0xDEAD});
  pkv_status st =
      pkv_event_publisher_create(no_events, "inproc://contract-a", nullptr, nullptr, &pub);
  if (st == PKV_E_UNSUPPORTED) {
    pkv_pool_destroy(no_events);
    GTEST_SKIP() << "built without PAGEDKV_EVENTS";
  }
  EXPECT_NE(st, PKV_OK);
  EXPECT_EQ(pub, reinterpret_cast<pkv_event_publisher*>(uintptr_t{0xDEAD}));
  pkv_pool_destroy(no_events);
  pkv_pool* p = make_pool(4, 8, 0, 1);
  EXPECT_EQ(pkv_event_publisher_create(p, "epgm://eth0;239.1.1.1:5555", nullptr, nullptr, &pub),
            PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(pkv_event_publisher_create(p, "inproc://contract-b", "norm://1", nullptr, &pub),
            PKV_E_INVALID_ARGUMENT);
  PKV_ASSERT_OK(pkv_event_publisher_create(p, "inproc://contract-b", nullptr, nullptr, &pub));
  uint64_t n = 99;
  PKV_ASSERT_OK(pkv_event_publisher_publish(pub, &n));
  EXPECT_EQ(n, 0u);
  PKV_ASSERT_OK(pkv_event_publisher_publish(pub, nullptr));
  pkv_event_publisher_stats ps;
  pkv_event_publisher_stats_init_sized(&ps, sizeof ps);
  PKV_ASSERT_OK(pkv_event_publisher_get_stats(pub, &ps));
  EXPECT_EQ(ps.batches_published, 0u);  // nothing is sent when no event is pending
  char buf[4];
  uint64_t len = 0;
  EXPECT_EQ(pkv_event_publisher_endpoint(pub, 0, buf, sizeof buf, &len), PKV_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(len, std::strlen("inproc://contract-b"));
  std::vector<char> full(len + 1);
  PKV_ASSERT_OK(pkv_event_publisher_endpoint(pub, 0, full.data(), full.size(), &len));
  EXPECT_STREQ(full.data(), "inproc://contract-b");
  pkv_event_publisher_destroy(pub);
  pkv_pool_destroy(p);
}

// ------------------------------------------------------- orders and stats

namespace {

pkv_pool* make_retention_pool(uint64_t num_blocks, uint64_t max_pinned, uint32_t events = 1) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = num_blocks;
  o.enable_retention = 1;
  o.max_pinned_blocks = max_pinned;
  o.enable_events = events;
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

// Admits tokens and commits a step over all of them (manager-only pool).
pkv_seq_id computed_seq(pkv_pool* p, const std::vector<int32_t>& t,
                        const pkv_retention_range* r = nullptr, uint64_t nr = 0) {
  pkv_seq_id s = 0;
  EXPECT_EQ(pkv_seq_create(p, nullptr, &s), PKV_OK);
  if (nr) EXPECT_EQ(pkv_seq_set_retention(p, s, r, nr), PKV_OK) << pkv_last_error_message();
  EXPECT_EQ(pkv_seq_append(p, s, t.data(), t.size(), 0), PKV_OK) << pkv_last_error_message();
  uint32_t q = uint32_t(t.size());
  pkv_batch* b = nullptr;
  EXPECT_EQ(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b), PKV_OK) << pkv_last_error_message();
  EXPECT_EQ(pkv_batch_commit(b), PKV_OK);
  pkv_batch_destroy(b);
  return s;
}

std::vector<int32_t> table_of(const pkv_pool* p, pkv_seq_id s) {
  std::vector<int32_t> t(64);
  uint64_t n = 0;
  EXPECT_EQ(pkv_seq_get_block_table(p, s, t.data(), t.size(), &n), PKV_OK);
  t.resize(n);
  return t;
}

std::vector<pkv_event> drain(pkv_pool* p) {
  std::vector<pkv_event> ev(256);
  uint64_t n = 0;
  EXPECT_EQ(pkv_pool_drain_events(p, ev.data(), ev.size(), &n), PKV_OK);
  ev.resize(n);
  return ev;
}

}  // namespace

TEST(Contract, PinsBeyondTheBudgetFailAndChangeNothingAndPinnedBlocksAreNotFree) {
  pkv_pool* p = make_retention_pool(8, 2);
  pkv_seq_id s = computed_seq(p, iota_tokens(13));  // 3 full blocks cached
  drain(p);
  pkv_pool_stats before = stats_of(p);
  uint64_t counts_before[PKV_PRIORITY_MAX + 1], counts[PKV_PRIORITY_MAX + 1], len = 0;
  PKV_ASSERT_OK(pkv_pool_get_priority_counts(p, counts_before, PKV_PRIORITY_MAX + 1, &len));
  pkv_retention_range all{0, PKV_TOKEN_END, PKV_PRIORITY_PINNED, 0, 0};
  EXPECT_EQ(pkv_seq_set_retention(p, s, &all, 1), PKV_E_OUT_OF_BLOCKS);
  PKV_ASSERT_OK(pkv_pool_get_priority_counts(p, counts, PKV_PRIORITY_MAX + 1, &len));
  EXPECT_EQ(std::memcmp(counts, counts_before, sizeof counts), 0);
  pkv_pool_stats after = stats_of(p);
  EXPECT_EQ(std::memcmp(&before, &after, sizeof before), 0);
  EXPECT_TRUE(drain(p).empty());
  pkv_retention_range two{0, 8, PKV_PRIORITY_PINNED, 0, 0};
  PKV_ASSERT_OK(pkv_seq_set_retention(p, s, &two, 1));
  EXPECT_EQ(stats_of(p).num_pinned_blocks, 2u);
  auto ev = drain(p);
  ASSERT_EQ(ev.size(), 2u);
  for (auto& e : ev) {
    EXPECT_EQ(e.type, static_cast<uint32_t>(PKV_EVENT_BLOCK_PRIORITY));
    EXPECT_EQ(e.num_tokens, static_cast<uint32_t>(PKV_PRIORITY_PINNED));
  }
  PKV_ASSERT_OK(pkv_seq_free(p, s));
  pkv_pool_stats st = stats_of(p);
  EXPECT_EQ(st.num_free_blocks, 7u - 2u);  // usable 7, the 2 pinned excluded
  EXPECT_EQ(st.num_used_blocks, 0u);
  EXPECT_EQ(st.num_cached_blocks, 3u);
  EXPECT_EQ(st.usage, 0.0);
  pkv_pool_destroy(p);
}

TEST(Contract, EvictionTakesTheLowestPriorityFirstThenLeastRecentlyUsed) {
  pkv_pool* p = make_retention_pool(8, 0);
  pkv_retention_range low{0, PKV_TOKEN_END, 10, 0, 0};
  pkv_retention_range high{0, PKV_TOKEN_END, 60, 0, 0};
  pkv_seq_id a = computed_seq(p, iota_tokens(4, 100), &high, 1);  // block A (60)
  pkv_seq_id b = computed_seq(p, iota_tokens(4, 200), &low, 1);   // block B (10)
  pkv_seq_id c = computed_seq(p, iota_tokens(4, 300));            // block C (35)
  pkv_seq_id d = computed_seq(p, iota_tokens(4, 400));            // block D (35)
  const int32_t A = table_of(p, a)[0], B = table_of(p, b)[0], C = table_of(p, c)[0],
                D = table_of(p, d)[0];
  PKV_ASSERT_OK(pkv_seq_free(p, a));
  PKV_ASSERT_OK(pkv_seq_free(p, d));
  PKV_ASSERT_OK(pkv_seq_free(p, c));
  PKV_ASSERT_OK(pkv_seq_free(p, b));
  drain(p);
  // 7 usable: the 4 cached ones last, after the 3 never-used blocks
  pkv_seq_id big = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &big));
  auto t = iota_tokens(4 * 7, 1000);
  PKV_ASSERT_OK(pkv_seq_append(p, big, t.data(), 4 * 3, 0));
  const uint64_t ev0 = stats_of(p).num_evictions;
  EXPECT_EQ(ev0, 0u);
  std::vector<int32_t> order;
  for (int i = 0; i < 4; ++i) {
    PKV_ASSERT_OK(pkv_seq_append(p, big, t.data() + 12 + 4 * i, 4, 0));
    order.push_back(table_of(p, big).back());
  }
  EXPECT_EQ(order, (std::vector<int32_t>{B, D, C, A}));
  EXPECT_EQ(stats_of(p).num_evictions, 4u);
  auto ev = drain(p);
  std::vector<int32_t> removed;
  for (auto& e : ev)
    if (e.type == PKV_EVENT_BLOCK_REMOVED) removed.push_back(e.block_id);
  EXPECT_EQ(removed, (std::vector<int32_t>{B, D, C, A}));
  pkv_pool_destroy(p);
}

TEST(Contract, ClockBelowTheLastIsTheLastAndExpiryFallsBackWithAnEvent) {
  pkv_pool* p = make_retention_pool(8, 0);
  PKV_ASSERT_OK(pkv_pool_set_clock(p, 1000));
  pkv_retention_range r{0, PKV_TOKEN_END, 80, 0, 100};
  pkv_seq_id s = computed_seq(p, iota_tokens(5), &r, 1);
  PKV_ASSERT_OK(pkv_seq_free(p, s));  // free at 1000: expires at 1100
  drain(p);
  uint64_t counts[PKV_PRIORITY_MAX + 1], len = 0;
  PKV_ASSERT_OK(pkv_pool_set_clock(p, 1099));
  PKV_ASSERT_OK(pkv_pool_get_priority_counts(p, counts, PKV_PRIORITY_MAX + 1, &len));
  EXPECT_EQ(counts[80], 1u);
  PKV_ASSERT_OK(pkv_pool_set_clock(p, 5));  // taken as 1099
  PKV_ASSERT_OK(pkv_pool_get_priority_counts(p, counts, PKV_PRIORITY_MAX + 1, &len));
  EXPECT_EQ(counts[80], 1u);
  EXPECT_TRUE(drain(p).empty());
  PKV_ASSERT_OK(pkv_pool_set_clock(p, 1100));
  PKV_ASSERT_OK(pkv_pool_get_priority_counts(p, counts, PKV_PRIORITY_MAX + 1, &len));
  EXPECT_EQ(counts[80], 0u);
  EXPECT_EQ(counts[PKV_PRIORITY_DEFAULT], 1u);
  auto ev = drain(p);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, static_cast<uint32_t>(PKV_EVENT_BLOCK_PRIORITY));
  EXPECT_EQ(ev[0].num_tokens, static_cast<uint32_t>(PKV_PRIORITY_DEFAULT));
  pkv_pool_destroy(p);
}

TEST(Contract, ForksInheritRetentionRanges) {
  pkv_pool* p = make_retention_pool(16, 0);
  pkv_retention_range r{0, PKV_TOKEN_END, 70, 0, 0};
  pkv_seq_id s = computed_seq(p, iota_tokens(3), &r, 1);
  pkv_seq_id c = 0;
  PKV_ASSERT_OK(pkv_seq_fork(p, s, &c));
  PKV_ASSERT_OK(pkv_seq_free(p, s));
  int32_t more[5] = {50, 51, 52, 53, 54};
  PKV_ASSERT_OK(pkv_seq_append(p, c, more, 5, 0));
  uint32_t q = 5;
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &c, &q, 1, nullptr, &b));
  PKV_ASSERT_OK(pkv_batch_commit(b));
  pkv_batch_destroy(b);
  uint64_t counts[PKV_PRIORITY_MAX + 1], len = 0;
  PKV_ASSERT_OK(pkv_pool_get_priority_counts(p, counts, PKV_PRIORITY_MAX + 1, &len));
  EXPECT_EQ(counts[70], 2u);
  pkv_pool_destroy(p);
}

TEST(Contract, UsageCowCountsAndComputedTokensOfForks) {
  pkv_pool* p = make_pool(4, 9);  // 8 usable
  pkv_seq_id s = computed_seq(p, iota_tokens(6));
  pkv_pool_stats st = stats_of(p);
  EXPECT_EQ(st.num_used_blocks, 2u);
  EXPECT_DOUBLE_EQ(st.usage, 2.0 / 8.0);
  EXPECT_EQ(st.num_tokens, 6u);
  pkv_seq_id c = 0;
  PKV_ASSERT_OK(pkv_seq_fork(p, s, &c));
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, c, &info));
  EXPECT_EQ(info.num_computed_tokens, 6u);
  EXPECT_EQ(info.num_tokens, 6u);
  EXPECT_EQ(info.num_blocks, 2u);
  EXPECT_EQ(info.num_slots, 8u);
  st = stats_of(p);
  EXPECT_EQ(st.num_used_blocks, 2u);
  EXPECT_EQ(st.num_tokens, 12u);
  int32_t x = 9;
  uint64_t need = 0;
  PKV_ASSERT_OK(pkv_seq_blocks_needed(p, c, 1, 0, &need));
  EXPECT_EQ(need, 1u);  // the copy of the shared partial block
  PKV_ASSERT_OK(pkv_seq_append(p, c, &x, 1, 0));
  st = stats_of(p);
  EXPECT_EQ(st.num_cow_copies, 1u);
  EXPECT_EQ(st.num_used_blocks, 3u);
  pkv_pool_destroy(p);
}

// pool.h, pkv_seq_fork: tokens the parent appended before the fork are the
// child's too; the parent's step, prepared before or after the fork, writes
// them once into the block both hold and both count them as computed.
TEST(Contract, AForkBetweenTheParentsAppendAndItsStepSharesThatStep) {
  for (bool fork_first : {true, false}) {
    SCOPED_TRACE(fork_first ? "fork, then prepare" : "prepare, then fork");
    pkv_pool* p = make_pool(4, 9);
    pkv_seq_id s = computed_seq(p, iota_tokens(5));
    int32_t x = 6;
    PKV_ASSERT_OK(pkv_seq_append(p, s, &x, 1, 0));
    pkv_seq_id c = 0;
    if (fork_first) PKV_ASSERT_OK(pkv_seq_fork(p, s, &c));
    const uint32_t q = 1;
    pkv_batch* b = nullptr;
    PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
    if (!fork_first) PKV_ASSERT_OK(pkv_seq_fork(p, s, &c));
    PKV_ASSERT_OK(pkv_batch_commit(b));
    pkv_batch_destroy(b);
    for (pkv_seq_id id : {s, c}) {
      pkv_seq_info info;
      pkv_seq_info_init_sized(&info, sizeof info);
      PKV_ASSERT_OK(pkv_seq_get_info(p, id, &info));
      EXPECT_EQ(info.num_tokens, 6u);
      EXPECT_EQ(info.num_computed_tokens, 6u);
    }
    EXPECT_EQ(stats_of(p).num_used_blocks, 2u);  // no copy: the block is shared
    EXPECT_EQ(pkv_pool_validate(p), PKV_OK);
    pkv_pool_destroy(p);
  }
}

TEST(Contract, AStepPreparedBeforeATruncateDoesNotCountForItsSequence) {
  pkv_pool* p = make_pool(4, 8);
  pkv_seq_id s = 0;
  auto t = iota_tokens(6);
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 6, 0, &s, &cached));
  uint32_t q = 6;
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
  PKV_ASSERT_OK(pkv_seq_truncate(p, s, 5));
  EXPECT_EQ(pkv_batch_commit(b), PKV_OK);
  pkv_batch_destroy(b);
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, s, &info));
  EXPECT_EQ(info.num_tokens, 5u);
  EXPECT_EQ(info.num_computed_tokens, 0u);
  // a new prompt of the same tokens finds nothing written
  pkv_seq_id s2 = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 6, 0, &s2, &cached));
  EXPECT_EQ(cached, 0u);
  pkv_pool_destroy(p);
}

TEST(Contract, HitsLeaveTheFreeQueueAndAFailedAppendsHitsGoBackToTheTail) {
  pkv_pool* p = make_pool(4, 6);  // 5 usable
  pkv_seq_id a = computed_seq(p, iota_tokens(9));
  const auto ta = table_of(p, a);
  PKV_ASSERT_OK(pkv_seq_free(p, a));
  EXPECT_EQ(stats_of(p).num_free_blocks, 5u);
  pkv_seq_id s = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s));
  auto t = iota_tokens(40);
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_match_prefix(p, s, t.data(), 40, &cached));
  EXPECT_EQ(cached, 8u);
  EXPECT_EQ(stats_of(p).num_free_blocks, 3u);
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, s, &info));
  EXPECT_EQ(info.num_cached_tokens, 8u);
  EXPECT_EQ(info.num_computed_tokens, 8u);
  EXPECT_EQ(pkv_seq_append(p, s, t.data() + 8, 32, 0), PKV_E_OUT_OF_BLOCKS);
  PKV_ASSERT_OK(pkv_seq_free(p, s));
  // the 3 never-used blocks come first, then the hits, as most recently used
  pkv_seq_id big = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &big));
  auto u = iota_tokens(20, 500);
  PKV_ASSERT_OK(pkv_seq_append(p, big, u.data(), 20, 0));
  auto tb = table_of(p, big);
  ASSERT_EQ(tb.size(), 5u);
  EXPECT_EQ(tb[3], ta[1]);  // released tail first: the deeper block is evicted first
  EXPECT_EQ(tb[4], ta[0]);
  pkv_pool_destroy(p);
}

TEST(Contract, CopyBlocksOfABlockOntoItselfChangesNothing) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 8;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = 4;
  o.dtype = PKV_DTYPE_F32;
  o.num_threads = 1;
  o.enable_events = 1;
  pkv_pool* p = nullptr;
  PKV_ASSERT_OK(pkv_pool_create(&o, &p));
  pkv_seq_id s = 0;
  auto t = iota_tokens(5);
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 5, 0, &s, &cached));
  uint32_t q = 5;
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
  PKV_ASSERT_OK(pkv_batch_commit(b));
  pkv_batch_destroy(b);
  drain(p);
  const auto tab = table_of(p, s);
  pkv_pool_stats before = stats_of(p);
  PKV_ASSERT_OK(pkv_pool_copy_blocks(p, &tab[0], &tab[0], 1, nullptr));
  pkv_pool_stats after = stats_of(p);
  EXPECT_EQ(std::memcmp(&before, &after, sizeof before), 0);
  EXPECT_TRUE(drain(p).empty());
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, s, &info));
  EXPECT_EQ(info.num_computed_tokens, 5u);
  pkv_tensor kv;
  EXPECT_EQ(pkv_pool_kv_tensor(p, 1, PKV_KV_KEY, &kv), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(pkv_pool_kv_tensor(p, 0, 2, &kv), PKV_E_INVALID_ARGUMENT);
  PKV_ASSERT_OK(pkv_pool_kv_tensor(p, 0, PKV_KV_VALUE, &kv));
  EXPECT_EQ(kv.ndim, 4);
  EXPECT_EQ(kv.shape[0], 8);
  EXPECT_EQ(kv.shape[1], 1);
  EXPECT_EQ(kv.shape[2], 4);
  EXPECT_EQ(kv.shape[3], 4);
  float sc[1] = {1.f};
  uint64_t len = 0;
  EXPECT_EQ(pkv_pool_set_kv_scales(p, sc, sc, 1), PKV_E_INVALID_STATE);
  EXPECT_EQ(pkv_pool_get_kv_scales(p, sc, sc, 1, &len), PKV_E_INVALID_STATE);
  uint64_t bpb = 0;
  PKV_ASSERT_OK(pkv_pool_bytes_per_block(p, &bpb));
  EXPECT_EQ(bpb, 2u * 4 * 4 * 4);
  pkv_pool_destroy(p);
}

// ------------------------------------------------------- multi-group pools

TEST(Contract, GroupPoolOptionsBytesAndPerGroupStats) {
  pkv_pool_options base;
  pkv_pool_options_init(&base);
  base.block_size = 4;
  pkv_kv_group_spec g[4];
  for (auto& s : g) pkv_kv_group_spec_init(&s);
  g[0].num_layers = 2;  // full: 2 * 2 layers * 2 heads * 8 * 4 slots * 2 bytes = 512
  g[0].num_kv_heads = 2;
  g[0].head_dim = 8;
  g[1].kind = PKV_GROUP_SLIDING_WINDOW;  // 2 * 1 * 1 * 8 * 4 * 2 = 128
  g[1].num_kv_heads = 1;
  g[1].head_dim = 8;
  g[1].sliding_window = 4;
  g[2].kind = PKV_GROUP_MLA;  // 3 layers * (16 + 4) * 4 * 2 = 480
  g[2].num_layers = 3;
  g[2].kv_lora_rank = 16;
  g[2].rope_dim = 4;
  g[3].kind = PKV_GROUP_RECURRENT;  // 2 layers * 100 = 200
  g[3].num_layers = 2;
  g[3].state_bytes = 100;
  base.memory_budget_bytes = 512 * 10;
  pkv_pool* p = nullptr;
  PKV_ASSERT_OK(pkv_pool_create_groups(&base, g, 4, &p));
  pkv_pool_options got;
  pkv_pool_options_init_sized(&got, sizeof got);
  PKV_ASSERT_OK(pkv_pool_get_options(p, &got));
  EXPECT_EQ(got.num_blocks, 10u);
  EXPECT_EQ(got.block_size, 4u);
  uint64_t bpb = 0;
  PKV_ASSERT_OK(pkv_pool_bytes_per_block(p, &bpb));
  EXPECT_EQ(bpb, 512u);
  const uint64_t want[4] = {512, 128, 480, 200};
  for (uint32_t i = 0; i < 4; ++i) {
    pkv_group_stats gs;
    pkv_group_stats_init_sized(&gs, sizeof gs);
    PKV_ASSERT_OK(pkv_pool_group_stats(p, i, &gs));
    EXPECT_EQ(gs.kind, g[i].kind) << i;
    EXPECT_EQ(gs.bytes_per_block, want[i]) << i;
  }
  pkv_pool_stats st = stats_of(p);
  EXPECT_EQ(st.kv_bytes_per_block, 512u);
  EXPECT_EQ(st.num_blocks, 10u);
  // layers numbered through the groups in order
  uint32_t grp = 0, idx = 0;
  PKV_ASSERT_OK(pkv_pool_group_of_layer(p, 4, &grp, &idx));
  EXPECT_EQ(grp, 2u);
  EXPECT_EQ(idx, 1u);
  PKV_ASSERT_OK(pkv_pool_group_of_layer(p, 7, &grp, &idx));
  EXPECT_EQ(grp, 3u);
  EXPECT_EQ(idx, 1u);
  EXPECT_EQ(pkv_pool_group_of_layer(p, 8, &grp, &idx), PKV_E_NOT_FOUND);
  pkv_pool_destroy(p);
}

TEST(Contract, GroupPoolSeqInfoTablesAndWindowNulls) {
  pkv_pool* p = make_groups_pool();  // full + window 8, block 4
  pkv_seq_id s = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s));
  auto t = iota_tokens(9);
  uint64_t need = 0;
  PKV_ASSERT_OK(pkv_seq_blocks_needed(p, s, 9, 0, &need));
  EXPECT_EQ(need, 6u);  // 3 per group
  PKV_ASSERT_OK(pkv_seq_append(p, s, t.data(), 9, 0));
  uint32_t q = 9;
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
  PKV_ASSERT_OK(pkv_batch_commit(b));
  pkv_batch_destroy(b);
  auto more = iota_tokens(8, 100);
  PKV_ASSERT_OK(pkv_seq_append(p, s, more.data(), 8, 0));  // 17 tokens
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, s, &info));
  EXPECT_EQ(info.num_tokens, 17u);
  int32_t g0[8], g1[8], direct[8];
  uint64_t n0 = 0, n1 = 0, nd = 0;
  PKV_ASSERT_OK(pkv_seq_group_block_table(p, s, 0, g0, 8, &n0));
  PKV_ASSERT_OK(pkv_seq_group_block_table(p, s, 1, g1, 8, &n1));
  PKV_ASSERT_OK(pkv_seq_get_block_table(p, s, direct, 8, &nd));
  EXPECT_EQ(std::vector<int32_t>(g0, g0 + n0), std::vector<int32_t>(direct, direct + nd));
  EXPECT_EQ(n0, 5u);
  EXPECT_EQ(n1, 5u);
  uint64_t held = 0, nulls = 0;
  for (uint64_t i = 0; i < n1; ++i) nulls += g1[i] == PKV_NULL_BLOCK;
  held = n0 + n1 - nulls;
  EXPECT_EQ(info.num_blocks, held);
  pkv_group_stats gs;
  pkv_group_stats_init_sized(&gs, sizeof gs);
  PKV_ASSERT_OK(pkv_pool_group_stats(p, 1, &gs));
  EXPECT_EQ(gs.num_null_entries, nulls);
  EXPECT_EQ(gs.num_used_blocks, n1 - nulls);
  PKV_ASSERT_OK(pkv_pool_group_stats(p, 0, &gs));
  EXPECT_EQ(gs.num_used_blocks, n0);
  EXPECT_EQ(gs.num_null_entries, 0u);
  EXPECT_EQ(stats_of(p).num_used_blocks, held);
  pkv_pool_destroy(p);
}

// ------------------------------------------------------- persistent tables, decode

namespace {
std::vector<int32_t> i32_array(const pkv_batch* b, uint32_t which) {
  pkv_tensor t;
  EXPECT_EQ(pkv_batch_plan_tensor(b, which, &t), PKV_OK) << pkv_last_error_message();
  const int32_t* d =
      reinterpret_cast<const int32_t*>(static_cast<const char*>(t.data) + t.byte_offset);
  return std::vector<int32_t>(d, d + t.shape[0]);
}
}  // namespace

TEST(Contract, PersistentTableRowsArePaddedAndALivePlansArraysNeverChange) {
  pkv_pool* p = make_pool(4, 32);
  pkv_seq_id s[2] = {computed_seq(p, iota_tokens(7)), computed_seq(p, iota_tokens(2, 50))};
  int32_t tok[2] = {8, 52};
  pkv_batch* b1 = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare_decode(p, s, tok, 2, PKV_PREPARE_PERSISTENT_TABLE, nullptr, &b1));
  const auto indptr = i32_array(b1, PKV_PLAN_PAGE_INDPTR);
  const auto pages = i32_array(b1, PKV_PLAN_PAGE_INDICES);
  ASSERT_EQ(indptr.size(), 3u);
  const int32_t stride = indptr[1];
  EXPECT_EQ(indptr[0], 0);
  EXPECT_EQ(indptr[2], 2 * stride);
  ASSERT_EQ(pages.size(), size_t(2 * stride));
  pkv_batch_info info;
  pkv_batch_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_batch_get_info(b1, &info));
  EXPECT_EQ(info.num_pages, uint64_t(2 * stride));
  const auto t0 = table_of(p, s[0]), t1 = table_of(p, s[1]);
  ASSERT_GE(stride, 2);
  EXPECT_EQ(pages[0], t0[0]);
  EXPECT_EQ(pages[1], t0[1]);
  for (int32_t j = 2; j < stride; ++j) EXPECT_EQ(pages[j], 0) << j;
  EXPECT_EQ(pages[stride], t1[0]);
  for (int32_t j = 1; j < stride; ++j) EXPECT_EQ(pages[stride + j], 0) << j;
  PKV_ASSERT_OK(pkv_batch_commit(b1));
  // b1 stays alive: the next plans must not change its arrays
  pkv_batch* b2 = nullptr;
  int32_t tok2[2] = {9, 53};
  PKV_ASSERT_OK(
      pkv_batch_prepare_decode(p, s, tok2, 2, PKV_PREPARE_PERSISTENT_TABLE, nullptr, &b2));
  PKV_ASSERT_OK(pkv_batch_commit(b2));
  pkv_batch_destroy(b2);
  for (int i = 0; i < 8; ++i) {
    int32_t more[2] = {100 + i, 200 + i};
    PKV_ASSERT_OK(
        pkv_batch_prepare_decode(p, s, more, 2, PKV_PREPARE_PERSISTENT_TABLE, nullptr, &b2));
    PKV_ASSERT_OK(pkv_batch_commit(b2));
    pkv_batch_destroy(b2);
  }
  EXPECT_EQ(i32_array(b1, PKV_PLAN_PAGE_INDICES), pages);
  EXPECT_EQ(i32_array(b1, PKV_PLAN_PAGE_INDPTR), indptr);
  pkv_batch_destroy(b1);
  pkv_pool_destroy(p);
}

TEST(Contract, PrepareDecodeOfTheSameSeqsAfterAFreeBatchFindsTheFreedId) {
  pkv_pool* p = make_pool(4, 32);
  pkv_seq_id s[2] = {computed_seq(p, iota_tokens(3)), computed_seq(p, iota_tokens(3, 50))};
  int32_t tok[2] = {8, 52};
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare_decode(p, s, tok, 2, 0, nullptr, &b));
  PKV_ASSERT_OK(pkv_batch_commit(b));
  pkv_batch_destroy(b);
  PKV_ASSERT_OK(pkv_seq_free_batch(p, &s[1], 1));
  b = nullptr;
  EXPECT_EQ(pkv_batch_prepare_decode(p, s, tok, 2, 0, nullptr, &b), PKV_E_NOT_FOUND);
  EXPECT_EQ(b, nullptr);
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, s[0], &info));
  EXPECT_EQ(info.num_tokens, 4u);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

// ------------------------------------------------------- MLA and FP8 pools

TEST(Contract, MlaPoolReportsOneHeadOfTheLatentWidthAndOneTensorPerLayer) {
  pkv_pool_options o = mla_options(6, 2, 16, 8, PKV_DTYPE_F16);
  pkv_pool* p = nullptr;
  PKV_ASSERT_OK(pkv_pool_create(&o, &p));
  pkv_pool_options got;
  pkv_pool_options_init_sized(&got, sizeof got);
  PKV_ASSERT_OK(pkv_pool_get_options(p, &got));
  EXPECT_EQ(got.num_kv_heads, 1u);
  EXPECT_EQ(got.head_dim, 24u);
  EXPECT_EQ(got.kv_layout, static_cast<uint32_t>(PKV_KV_LAYOUT_MLA));
  EXPECT_EQ(got.kv_lora_rank, 16u);
  EXPECT_EQ(got.qk_rope_head_dim, 8u);
  uint64_t bpb = 0;
  PKV_ASSERT_OK(pkv_pool_bytes_per_block(p, &bpb));
  EXPECT_EQ(bpb, 2u * 4 * 24 * 2);  // layers * slots * width * f16
  pkv_tensor kv;
  PKV_ASSERT_OK(pkv_pool_kv_tensor(p, 1, PKV_KV_KEY, &kv));
  ASSERT_EQ(kv.ndim, 3);
  EXPECT_EQ(kv.shape[0], 6);
  EXPECT_EQ(kv.shape[1], 4);
  EXPECT_EQ(kv.shape[2], 24);
  EXPECT_EQ(kv.dtype, static_cast<uint32_t>(PKV_DTYPE_F16));
  EXPECT_EQ(pkv_pool_kv_tensor(p, 0, PKV_KV_VALUE, &kv), PKV_E_INVALID_ARGUMENT);
  pkv_pool_stats st = stats_of(p);
  EXPECT_EQ(st.kv_bytes_per_block, bpb);
  EXPECT_EQ(st.kv_bytes_allocated, bpb * 6);
  pkv_pool_destroy(p);
  // num_kv_heads 0 or 1, head_dim 0 or the sum; anything else is refused
  o.num_kv_heads = 2;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_E_INVALID_ARGUMENT);
  o.num_kv_heads = 1;
  o.head_dim = 24;
  PKV_ASSERT_OK(pkv_pool_create(&o, &p));
  pkv_pool_destroy(p);
  o.head_dim = 23;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_E_INVALID_ARGUMENT);
}

TEST(Contract, Fp8ScalesRoundTripAndAreNotReturnedByGetOptions) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 4;
  o.num_layers = 2;
  o.num_kv_heads = 2;
  o.head_dim = 8;
  o.dtype = PKV_DTYPE_FP8_E4M3;
  o.num_threads = 1;
  o.kv_scale_granularity = PKV_KV_SCALE_PER_HEAD;
  float k[4] = {1, 2, 3, 4}, v[4] = {5, 6, 7, 8};
  o.num_kv_scales = 4;
  o.k_scales = k;
  o.v_scales = v;
  pkv_pool* p = nullptr;
  PKV_ASSERT_OK(pkv_pool_create(&o, &p));
  pkv_pool_options got;
  pkv_pool_options_init_sized(&got, sizeof got);
  PKV_ASSERT_OK(pkv_pool_get_options(p, &got));
  EXPECT_EQ(got.k_scales, nullptr);
  EXPECT_EQ(got.v_scales, nullptr);
  EXPECT_EQ(got.num_kv_scales, 4u);
  EXPECT_EQ(got.kv_scale_granularity, static_cast<uint32_t>(PKV_KV_SCALE_PER_HEAD));
  float ko[4], vo[4];
  uint64_t len = 0;
  EXPECT_EQ(pkv_pool_get_kv_scales(p, ko, vo, 3, &len), PKV_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(len, 4u);
  PKV_ASSERT_OK(pkv_pool_get_kv_scales(p, ko, vo, 4, &len));
  EXPECT_EQ(std::vector<float>(ko, ko + 4), std::vector<float>(k, k + 4));
  EXPECT_EQ(std::vector<float>(vo, vo + 4), std::vector<float>(v, v + 4));
  float bad[4] = {1, 2, 0, 4};
  EXPECT_EQ(pkv_pool_set_kv_scales(p, bad, v, 4), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(pkv_pool_set_kv_scales(p, k, v, 2), PKV_E_INVALID_ARGUMENT);
  PKV_ASSERT_OK(pkv_pool_get_kv_scales(p, ko, vo, 4, &len));
  EXPECT_EQ(std::vector<float>(ko, ko + 4), std::vector<float>(k, k + 4));
  PKV_ASSERT_OK(pkv_pool_set_kv_scales(p, v, k, 4));
  PKV_ASSERT_OK(pkv_pool_get_kv_scales(p, ko, vo, 4, &len));
  EXPECT_EQ(std::vector<float>(ko, ko + 4), std::vector<float>(v, v + 4));
  pkv_pool_destroy(p);
  // other dtypes take no scales
  o.dtype = PKV_DTYPE_F16;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_E_INVALID_ARGUMENT);
}

// ------------------------------------------------------- partial hits

namespace {
pkv_pool* make_partial_pool(uint64_t num_blocks) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = num_blocks;
  o.enable_partial_reuse = 1;
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  return p;
}
}  // namespace

TEST(Contract, PartialHitsLongestMatchLeaveOneTokenAndCount) {
  pkv_pool* p = make_partial_pool(16);
  computed_seq(p, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  computed_seq(p, {1, 2, 3, 4, 5, 9, 10, 11, 12});
  pkv_pool_stats before = stats_of(p);
  // match_prefix alone never makes partial hits
  pkv_seq_id s0 = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s0));
  std::vector<int32_t> q = {1, 2, 3, 4, 5, 9, 10, 77, 78};
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_match_prefix(p, s0, q.data(), q.size(), &cached));
  EXPECT_EQ(cached, 4u);
  EXPECT_EQ(stats_of(p).num_partial_hits, before.num_partial_hits);
  // the longest partial match wins: [5, 9, 10] of the second prompt's block
  pkv_seq_id s = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s));
  pkv_prefix_match m;
  pkv_prefix_match_init_sized(&m, sizeof m);
  PKV_ASSERT_OK(pkv_seq_match_prefix_partial(p, s, q.data(), q.size(), &m));
  EXPECT_EQ(m.partial_tokens, 3u);
  EXPECT_EQ(m.num_cached, 7u);
  EXPECT_NE(m.copy_src, PKV_NULL_BLOCK);
  EXPECT_NE(m.copy_dst, PKV_NULL_BLOCK);
  EXPECT_EQ(table_of(p, s).back(), m.copy_dst);
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, s, &info));
  EXPECT_EQ(info.num_tokens, 7u);
  EXPECT_EQ(info.num_computed_tokens, 7u);
  pkv_pool_stats after = stats_of(p);
  EXPECT_EQ(after.num_partial_hits - before.num_partial_hits, 1u);
  EXPECT_EQ(after.partial_hit_tokens - before.partial_hit_tokens, 3u);
  EXPECT_EQ(after.prefix_hit_tokens - before.prefix_hit_tokens, 4u + 7u);
  // at least one token left to compute: a prompt of exactly 1, 2, 3, 4, 5, 9, 10
  pkv_seq_id s2 = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s2));
  PKV_ASSERT_OK(pkv_seq_match_prefix_partial(p, s2, q.data(), 7, &m));
  EXPECT_EQ(m.partial_tokens, 2u);
  EXPECT_EQ(m.num_cached, 6u);
  pkv_pool_destroy(p);
}

TEST(Contract, NoPartialHitWithoutAFreeBlock) {
  pkv_pool* p = make_partial_pool(4);                           // 3 usable
  pkv_seq_id a = computed_seq(p, {1, 2, 3, 4, 5, 6, 7, 8, 9});  // takes all 3
  (void)a;
  EXPECT_EQ(stats_of(p).num_free_blocks, 0u);
  pkv_seq_id s = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s));
  std::vector<int32_t> q = {1, 2, 3, 4, 5, 6, 77, 78};
  pkv_prefix_match m;
  pkv_prefix_match_init_sized(&m, sizeof m);
  PKV_ASSERT_OK(pkv_seq_match_prefix_partial(p, s, q.data(), q.size(), &m));
  EXPECT_EQ(m.partial_tokens, 0u);
  EXPECT_EQ(m.num_cached, 4u);
  EXPECT_EQ(m.copy_src, PKV_NULL_BLOCK);
  EXPECT_EQ(m.copy_dst, PKV_NULL_BLOCK);
  EXPECT_EQ(stats_of(p).num_partial_hits, 0u);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

TEST(Contract, SeqOptionsPriorityAndLoraIdAreReportedAndEmptySaltIsNoSalt) {
  pkv_pool* p = make_pool(4, 16, 0, 1);
  pkv_seq_options so;
  pkv_seq_options_init_sized(&so, sizeof so);
  so.priority = -7;
  so.lora_id = 42;
  pkv_seq_id s = 0;
  auto t = iota_tokens(5);
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, &so, t.data(), 5, 0, &s, &cached));
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, s, &info));
  EXPECT_EQ(info.priority, -7);
  EXPECT_EQ(info.lora_id, 42u);
  auto ev = drain(p);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].lora_id, 42u);
  // cache_salt "" is no salt: the same hashes as NULL
  pkv_seq_options a, b;
  pkv_seq_options_init_sized(&a, sizeof a);
  pkv_seq_options_init_sized(&b, sizeof b);
  a.cache_salt = nullptr;
  b.cache_salt = "";
  a.lora_name = nullptr;
  b.lora_name = "";
  pkv_seq_id sa = 0, sb = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, &a, t.data(), 5, 0, &sa, &cached));
  PKV_ASSERT_OK(pkv_seq_admit(p, &b, t.data(), 5, 0, &sb, &cached));
  pkv_block_hash ha, hb;
  uint64_t n = 0;
  PKV_ASSERT_OK(pkv_seq_get_block_hashes(p, sa, &ha, 1, &n));
  PKV_ASSERT_OK(pkv_seq_get_block_hashes(p, sb, &hb, 1, &n));
  EXPECT_EQ(std::memcmp(&ha, &hb, sizeof ha), 0);
  pkv_pool_destroy(p);
}

// ------------------------------------------------------- multi-group plans

TEST(Contract, GroupPlanArraysPerKindAndUnsupportedKernels) {
  pkv_pool_options base;
  pkv_pool_options_init(&base);
  base.block_size = 4;
  base.num_blocks = 64;
  pkv_kv_group_spec g[4];
  for (auto& s : g) pkv_kv_group_spec_init(&s);
  g[0].num_kv_heads = 1;
  g[0].head_dim = 8;
  g[1].kind = PKV_GROUP_SLIDING_WINDOW;
  g[1].num_kv_heads = 1;
  g[1].head_dim = 8;
  g[1].sliding_window = 4;
  g[2].kind = PKV_GROUP_RECURRENT;
  g[2].state_bytes = 64;
  g[3].kind = PKV_GROUP_RECURRENT;
  g[3].state_bytes = 64;
  g[3].flags = PKV_GROUP_SNAPSHOT_EVERY_BLOCK;
  pkv_pool* p = nullptr;
  PKV_ASSERT_OK(pkv_pool_create_groups(&base, g, 4, &p));
  pkv_seq_id s[2] = {0, 0};
  auto t = iota_tokens(10);
  for (auto& id : s) {
    PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &id));
  }
  PKV_ASSERT_OK(pkv_seq_append(p, s[0], t.data(), 10, 0));
  PKV_ASSERT_OK(pkv_seq_append(p, s[1], t.data() + 1, 5, 0));
  uint32_t q[2] = {10, 5};
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, s, q, 2, nullptr, &b));
  auto arr = [&](uint32_t group, uint32_t which) {
    pkv_tensor x;
    EXPECT_EQ(pkv_batch_plan_tensor_group(b, group, which, &x), PKV_OK)
        << group << " " << which << " " << pkv_last_error_message();
    std::vector<int64_t> v(size_t(x.shape[0]));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = x.dtype == PKV_DTYPE_I64 ? static_cast<const int64_t*>(x.data)[i]
                                      : static_cast<const int32_t*>(x.data)[i];
    return v;
  };
  for (uint32_t gi = 1; gi < 4; ++gi) {
    EXPECT_EQ(arr(gi, PKV_PLAN_QUERY_INDPTR), arr(0, PKV_PLAN_QUERY_INDPTR)) << gi;
    EXPECT_EQ(arr(gi, PKV_PLAN_CONTEXT_LENS), arr(0, PKV_PLAN_CONTEXT_LENS)) << gi;
  }
  EXPECT_EQ(arr(0, PKV_PLAN_CONTEXT_LENS), (std::vector<int64_t>{10, 5}));
  EXPECT_EQ(arr(0, PKV_PLAN_PAGE_INDPTR), (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(arr(0, PKV_PLAN_LAST_PAGE_LEN), (std::vector<int64_t>{2, 1}));
  pkv_batch_info info;
  pkv_batch_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_batch_get_info(b, &info));
  EXPECT_EQ(info.num_pages, 5u);
  EXPECT_EQ(info.num_tokens, 15u);
  pkv_tensor direct;
  PKV_ASSERT_OK(pkv_batch_plan_tensor(b, PKV_PLAN_PAGE_INDICES, &direct));
  EXPECT_EQ(direct.shape[0], 5);
  for (uint32_t gi : {2u, 3u}) {
    EXPECT_EQ(arr(gi, PKV_PLAN_PAGE_INDPTR), (std::vector<int64_t>{0, 1, 2})) << gi;
    EXPECT_EQ(arr(gi, PKV_PLAN_LAST_PAGE_LEN), (std::vector<int64_t>{1, 1})) << gi;
    auto slots = arr(gi, PKV_PLAN_SLOT_MAPPING);
    EXPECT_EQ(slots.size(), 2u) << gi;
    EXPECT_EQ(slots, arr(gi, PKV_PLAN_PAGE_INDICES)) << gi;
    int32_t tab[4];
    uint64_t n = 0;
    PKV_ASSERT_OK(pkv_seq_group_block_table(p, s[0], gi, tab, 4, &n));
    EXPECT_EQ(n, 1u);
    EXPECT_EQ(slots[0], tab[0]);
  }
  // snapshots: none without the flag; with it, each boundary in (start, context]
  EXPECT_EQ(arr(2, PKV_PLAN_SNAPSHOT_INDPTR), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(arr(3, PKV_PLAN_SNAPSHOT_INDPTR), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(arr(3, PKV_PLAN_SNAPSHOT_ROWS), (std::vector<int64_t>{3, 7, 13}));
  pkv_tensor x;
  EXPECT_EQ(pkv_batch_plan_tensor_group(b, 0, PKV_PLAN_SNAPSHOT_INDPTR, &x),
            PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(pkv_batch_plan_tensor_group(b, 4, PKV_PLAN_SLOT_MAPPING, &x), PKV_E_INVALID_ARGUMENT);
  // kernels are the engine's on a multi-group pool
  std::vector<float> buf(15 * 8);
  pkv_tensor k;
  int64_t shape[3] = {15, 1, 8};
  PKV_ASSERT_OK(pkv_tensor_init(buf.data(), PKV_DTYPE_BF16, PKV_DEVICE_CPU, 0, 3, shape, &k));
  EXPECT_EQ(pkv_cache_write(b, 0, &k, &k, nullptr), PKV_E_UNSUPPORTED);
  EXPECT_EQ(pkv_attention_forward(b, 0, &k, &k, nullptr, nullptr, nullptr), PKV_E_UNSUPPORTED);
  PKV_ASSERT_OK(pkv_batch_commit(b));
  pkv_batch_destroy(b);
  // a recurrent state cannot be rolled back
  EXPECT_EQ(pkv_seq_truncate(p, s[0], 9), PKV_E_INVALID_ARGUMENT);
  PKV_ASSERT_OK(pkv_seq_truncate(p, s[0], 10));
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

TEST(Contract, APublisherKeepsItsPoolAlive) {
  pkv_pool* p = make_pool(4, 8, 0, 1);
  pkv_event_publisher* pub = nullptr;
  pkv_status st = pkv_event_publisher_create(p, "inproc://contract-alive", nullptr, nullptr, &pub);
  if (st == PKV_E_UNSUPPORTED) {
    pkv_pool_destroy(p);
    GTEST_SKIP() << "built without PAGEDKV_EVENTS";
  }
  PKV_ASSERT_OK(st);
  pkv_seq_id s = 0;
  auto t = iota_tokens(5);
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 5, 0, &s, &cached));  // one stored block
  pkv_pool_destroy(p);
  uint64_t n = 0;
  PKV_ASSERT_OK(pkv_event_publisher_publish(pub, &n));
  EXPECT_GE(n, 1u);
  pkv_event_publisher_stats ps;
  pkv_event_publisher_stats_init_sized(&ps, sizeof ps);
  PKV_ASSERT_OK(pkv_event_publisher_get_stats(pub, &ps));
  EXPECT_EQ(ps.batches_published, 1u);
  EXPECT_EQ(ps.pool_events_published, n);
  char buf[64];
  uint64_t len = 0;
  EXPECT_EQ(pkv_event_publisher_endpoint(pub, 2, buf, sizeof buf, &len), PKV_E_INVALID_ARGUMENT);
  pkv_event_publisher_destroy(pub);
}

TEST(Contract, SlidingWindowReleasesOnlyBehindTheFirstUncomputedToken) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 5;  // 4 usable
  o.sliding_window = 4;
  pkv_pool* p = nullptr;
  PKV_ASSERT_OK(pkv_pool_create(&o, &p));
  pkv_seq_id s = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s));
  auto t = iota_tokens(20);
  PKV_ASSERT_OK(pkv_seq_append(p, s, t.data(), 9, 0));
  // not computed yet: appending more releases nothing
  PKV_ASSERT_OK(pkv_seq_append(p, s, t.data() + 9, 1, 0));
  auto tab = table_of(p, s);
  ASSERT_EQ(tab.size(), 3u);
  EXPECT_NE(tab[0], PKV_NULL_BLOCK);
  uint32_t q = 10;
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
  PKV_ASSERT_OK(pkv_batch_commit(b));
  pkv_batch_destroy(b);
  // first uncomputed token 10: its window is 7..10, block 0 (0..3) wholly outside
  uint64_t need = 99;
  PKV_ASSERT_OK(pkv_seq_blocks_needed(p, s, 3, 0, &need));  // to 13 tokens: block 3, minus block 0
  EXPECT_EQ(need, 0u);
  const uint64_t free_before = stats_of(p).num_free_blocks;
  EXPECT_EQ(free_before, 1u);
  PKV_ASSERT_OK(pkv_seq_append(p, s, t.data() + 10, 3, 0));
  tab = table_of(p, s);
  ASSERT_EQ(tab.size(), 4u);
  EXPECT_EQ(tab[0], PKV_NULL_BLOCK);
  EXPECT_NE(tab[1], PKV_NULL_BLOCK);
  EXPECT_EQ(stats_of(p).num_used_blocks, 3u);
  // a plan whose first query needs released keys is refused
  q = 13;
  EXPECT_EQ(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b), PKV_E_INVALID_ARGUMENT);
  q = 3;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
  pkv_batch_destroy(b);
  // a truncate whose next token would need released keys is refused
  EXPECT_EQ(pkv_seq_truncate(p, s, 4), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(pkv_seq_truncate(p, s, 14), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(table_of(p, s).size(), 4u);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

namespace {
std::vector<uint64_t> prio_counts(const pkv_pool* p) {
  std::vector<uint64_t> c(PKV_PRIORITY_MAX + 1);
  uint64_t len = 0;
  EXPECT_EQ(pkv_pool_get_priority_counts(p, c.data(), c.size(), &len), PKV_OK);
  return c;
}
}  // namespace

TEST(Contract, PinsPastTheBudgetDegradeAndSharedBlocksOnlyRise) {
  pkv_pool* p = make_retention_pool(16, 2);
  pkv_retention_range pin{0, PKV_TOKEN_END, PKV_PRIORITY_PINNED, 0, 0};
  pkv_seq_id a = computed_seq(p, iota_tokens(13), &pin, 1);  // 3 blocks, budget 2
  auto c = prio_counts(p);
  EXPECT_EQ(c[PKV_PRIORITY_PINNED], 2u);
  EXPECT_EQ(c[PKV_PRIORITY_PINNED - 1], 1u);
  pkv_pool_stats st = stats_of(p);
  EXPECT_EQ(st.num_pinned_blocks, 2u);
  EXPECT_EQ(st.num_pins_degraded, 1u);
  // the same ranges again would pin the third block too: past the budget
  EXPECT_EQ(pkv_seq_set_retention(p, a, &pin, 1), PKV_E_OUT_OF_BLOCKS);
  // the pins this sequence holds alone count as left: moving them is fine
  pkv_retention_range two{4, PKV_TOKEN_END, PKV_PRIORITY_PINNED, 0, 0};
  PKV_ASSERT_OK(pkv_seq_set_retention(p, a, &two, 1));
  c = prio_counts(p);
  EXPECT_EQ(c[PKV_PRIORITY_PINNED], 2u);
  EXPECT_EQ(c[PKV_PRIORITY_DEFAULT], 1u);
  PKV_ASSERT_OK(pkv_seq_free(p, a));
  // a hit with a lower range leaves a higher priority; a higher one raises it
  pkv_retention_range mid{0, PKV_TOKEN_END, 60, 0, 0};
  pkv_seq_id b = computed_seq(p, iota_tokens(5, 100), &mid, 1);
  PKV_ASSERT_OK(pkv_seq_free(p, b));
  pkv_retention_range low{0, PKV_TOKEN_END, 20, 0, 0}, high{0, PKV_TOKEN_END, 90, 0, 0};
  auto t = iota_tokens(5, 100);
  pkv_seq_id h = 0;
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &h));
  PKV_ASSERT_OK(pkv_seq_set_retention(p, h, &low, 1));
  PKV_ASSERT_OK(pkv_seq_match_prefix(p, h, t.data(), 5, &cached));
  EXPECT_EQ(cached, 4u);
  EXPECT_EQ(prio_counts(p)[60], 1u);
  EXPECT_EQ(prio_counts(p)[20], 0u);
  PKV_ASSERT_OK(pkv_seq_set_retention(p, h, &high, 1));
  EXPECT_EQ(prio_counts(p)[60], 0u);
  EXPECT_EQ(prio_counts(p)[90], 1u);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

// ------------------------------------------------------- tiers

TEST(Contract, TierOffloadHitLoadStatsAndEvents) {
  pkv_pool* p = make_pool(4, 4, 1, 1);  // 3 usable, f32 1 layer 1 head dim 4
  uint64_t bpb = 0;
  PKV_ASSERT_OK(pkv_pool_bytes_per_block(p, &bpb));
  ASSERT_EQ(bpb, 128u);
  pkv_tier_options to;
  pkv_tier_options_init_sized(&to, sizeof to);
  to.host_bytes = 2 * bpb + 7;
  PKV_ASSERT_OK(pkv_pool_attach_tiers(p, &to));
  pkv_tier_stats ts;
  pkv_tier_stats_init_sized(&ts, sizeof ts);
  PKV_ASSERT_OK(pkv_pool_get_tier_stats(p, PKV_MEDIUM_HOST, &ts));
  EXPECT_EQ(ts.capacity_blocks, 2u);
  EXPECT_EQ(ts.num_blocks, 0u);
  auto ta = iota_tokens(9);
  auto commit_all = [&](pkv_seq_id s, uint32_t q) {
    pkv_batch* b = nullptr;
    PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
    PKV_ASSERT_OK(pkv_batch_commit(b));
    pkv_batch_destroy(b);
  };
  pkv_seq_id a = 0;
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, ta.data(), 9, 0, &a, &cached));
  commit_all(a, 9);
  PKV_ASSERT_OK(pkv_seq_free(p, a));
  auto tb = iota_tokens(12, 500);
  pkv_seq_id b = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, tb.data(), 12, 0, &b, &cached));  // evicts A's two
  PKV_ASSERT_OK(pkv_pool_flush_tiers(p));
  PKV_ASSERT_OK(pkv_pool_get_tier_stats(p, PKV_MEDIUM_HOST, &ts));
  EXPECT_EQ(ts.num_blocks, 2u);
  EXPECT_EQ(ts.num_stored, 2u);
  EXPECT_EQ(ts.bytes, 2 * bpb);
  EXPECT_EQ(ts.bytes_stored, 2 * bpb);
  PKV_ASSERT_OK(pkv_seq_free(p, b));
  pkv_seq_id c = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &c));
  pkv_tier_match m;
  pkv_tier_match_init_sized(&m, sizeof m);
  PKV_ASSERT_OK(pkv_seq_match_prefix_tiered(p, c, ta.data(), 9, &m));
  EXPECT_EQ(m.device_tokens, 0u);
  EXPECT_EQ(m.host_tokens, 8u);
  EXPECT_EQ(m.file_tokens, 0u);
  EXPECT_EQ(m.num_cached, 8u);
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, c, &info));
  EXPECT_EQ(info.num_tokens, 8u);
  EXPECT_EQ(info.num_cached_tokens, 8u);
  EXPECT_EQ(info.num_computed_tokens, 0u);  // not written until the next prepare
  PKV_ASSERT_OK(pkv_seq_append(p, c, ta.data() + 8, 1, 0));
  commit_all(c, 1);
  PKV_ASSERT_OK(pkv_seq_get_info(p, c, &info));
  EXPECT_EQ(info.num_computed_tokens, 9u);
  PKV_ASSERT_OK(pkv_pool_get_tier_stats(p, PKV_MEDIUM_HOST, &ts));
  EXPECT_EQ(ts.num_hits, 2u);
  EXPECT_EQ(ts.num_loaded, 2u);
  EXPECT_EQ(ts.bytes_loaded, 2 * bpb);
  EXPECT_EQ(ts.num_checksum_failures, 0u);
  // v1 drains device events only, gap-free
  pkv_event ev[32];
  uint64_t n = 0;
  PKV_ASSERT_OK(pkv_pool_drain_events(p, ev, 32, &n));
  ASSERT_GT(n, 0u);
  for (uint64_t i = 0; i < n; ++i) EXPECT_EQ(ev[i].seq_no, i + 1) << i;
  // reset clears the tiers too
  PKV_ASSERT_OK(pkv_pool_reset_prefix_cache(p));
  PKV_ASSERT_OK(pkv_pool_get_tier_stats(p, PKV_MEDIUM_HOST, &ts));
  EXPECT_EQ(ts.num_blocks, 0u);
  EXPECT_EQ(ts.bytes, 0u);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

TEST(Contract, TierEventsCountInTheirOwnSequence) {
  pkv_pool* p = make_pool(4, 4, 1, 1);
  pkv_tier_options to;
  pkv_tier_options_init_sized(&to, sizeof to);
  to.host_bytes = 1 << 16;
  PKV_ASSERT_OK(pkv_pool_attach_tiers(p, &to));
  auto ta = iota_tokens(9), tb = iota_tokens(12, 500);
  pkv_seq_id a = 0, b = 0;
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, ta.data(), 9, 0, &a, &cached));
  uint32_t q = 9;
  pkv_batch* bt = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &a, &q, 1, nullptr, &bt));
  PKV_ASSERT_OK(pkv_batch_commit(bt));
  pkv_batch_destroy(bt);
  PKV_ASSERT_OK(pkv_seq_free(p, a));
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, tb.data(), 12, 0, &b, &cached));
  PKV_ASSERT_OK(pkv_pool_flush_tiers(p));
  std::vector<pkv_event_v2> ev(32);
  for (auto& e : ev) {
    std::memset(&e, 0, sizeof e);
    e.struct_size = sizeof e;
  }
  std::vector<int32_t> ids(32 * 4);
  uint64_t n = 0;
  PKV_ASSERT_OK(pkv_pool_drain_events_v2(p, ev.data(), ev.size(), ids.data(), ids.size(), &n));
  uint64_t dev = 0, tier = 0;
  int host_stored = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (ev[i].medium == PKV_MEDIUM_DEVICE) {
      EXPECT_EQ(ev[i].seq_no, ++dev) << i;
    } else {
      EXPECT_EQ(ev[i].medium, static_cast<uint32_t>(PKV_MEDIUM_HOST));
      EXPECT_EQ(ev[i].seq_no, ++tier) << i;
      if (ev[i].type == PKV_EVENT_BLOCK_STORED) {
        ++host_stored;
        EXPECT_EQ(ev[i].num_token_ids, 0u);  // tier events carry no token ids (as vLLM's)
      }
    }
  }
  EXPECT_EQ(host_stored, 2);
  pkv_pool_destroy(p);
}

// ------------------------------------------------------- hash.h against the pool

TEST(Contract, HashPrefixEqualsThePoolsHashesForEveryKeyMode) {
  const pkv_mm_item items[2] = {{2, 3, "img-a"}, {9, 4, "img-b"}};
  auto t = iota_tokens(17);
  for (uint32_t algo : {PKV_HASH_SHA256_CBOR, PKV_HASH_XXH3_128}) {
    for (uint32_t mode :
         {PKV_KEY_DOMAINS_VLLM, PKV_KEY_DOMAINS_STRICT, PKV_KEY_DOMAINS_VLLM_TAGGED}) {
      for (int variant = 0; variant < 4; ++variant) {
        pkv_pool_options o;
        pkv_pool_options_init(&o);
        o.block_size = 4;
        o.num_blocks = 16;
        o.hash_algo = algo;
        o.hash_seed = "s33d";
        o.strict_key_domains = mode;
        pkv_pool* p = nullptr;
        PKV_ASSERT_OK(pkv_pool_create(&o, &p));
        pkv_seq_options so;
        pkv_seq_options_init_sized(&so, sizeof so);
        pkv_hash_options ho;
        pkv_hash_options_init_sized(&ho, sizeof ho);
        ho.algo = algo;
        ho.block_size = 4;
        ho.seed = "s33d";
        ho.strict_key_domains = mode;
        if (variant & 1) {
          so.cache_salt = ho.cache_salt = "salt";
          so.mm_items = ho.mm_items = items;
          so.num_mm_items = ho.num_mm_items = 2;
        }
        if (variant == 1) so.lora_id = ho.lora_id = 7;
        if (variant >= 2) {
          so.lora_name = ho.lora_name = "adapter";
          so.lora_path = ho.lora_path = "/models/adapter";
        }
        pkv_seq_id s = 0;
        uint64_t cached = 0;
        PKV_ASSERT_OK(pkv_seq_admit(p, &so, t.data(), t.size(), 0, &s, &cached));
        pkv_block_hash pool_h[4], lib_h[4];
        uint64_t n1 = 0, n2 = 0;
        PKV_ASSERT_OK(pkv_seq_get_block_hashes(p, s, pool_h, 4, &n1));
        PKV_ASSERT_OK(pkv_hash_prefix(&ho, t.data(), t.size(), lib_h, 4, &n2));
        ASSERT_EQ(n1, 4u);
        ASSERT_EQ(n2, 4u);
        EXPECT_EQ(std::memcmp(pool_h, lib_h, sizeof pool_h), 0)
            << "algo " << algo << " mode " << mode << " variant " << variant;
        // and the hash path accepts them
        pkv_seq_id s2 = 0;
        PKV_ASSERT_OK(pkv_seq_create(p, &so, &s2));
        PKV_ASSERT_OK(pkv_seq_match_prefix_hashes(p, s2, t.data(), t.size(), lib_h, 4, &cached));
        pkv_pool_destroy(p);
      }
    }
  }
}

// ------------------------------------------------------- commits by cache writes

TEST(Contract, CacheWritesOfEveryLayerCommitAndAStalePlanRefusesKernels) {
  pkv_pool* p = make_pool(4, 16, 2);  // f32, 1 head, dim 4, 2 layers
  auto t = iota_tokens(6);
  pkv_seq_id s = 0;
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 6, 0, &s, &cached));
  std::vector<float> kv(6 * 4, 0.5f);
  int64_t shape[3] = {6, 1, 4};
  pkv_tensor k;
  PKV_ASSERT_OK(pkv_tensor_init(kv.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &k));
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  // one layer of two, then destroyed: aborted
  uint32_t q = 6;
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
  PKV_ASSERT_OK(pkv_cache_write(b, 0, &k, &k, nullptr));
  pkv_batch_destroy(b);
  PKV_ASSERT_OK(pkv_seq_get_info(p, s, &info));
  EXPECT_EQ(info.num_computed_tokens, 0u);
  // every layer: committed by the last write, abort is then refused
  PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
  PKV_ASSERT_OK(pkv_cache_write(b, 1, &k, &k, nullptr));
  PKV_ASSERT_OK(pkv_cache_write(b, 0, &k, &k, nullptr));
  PKV_ASSERT_OK(pkv_seq_get_info(p, s, &info));
  EXPECT_EQ(info.num_computed_tokens, 6u);
  EXPECT_EQ(pkv_batch_abort(b), PKV_E_INVALID_STATE);
  PKV_ASSERT_OK(pkv_batch_commit(b));
  pkv_batch_destroy(b);
  // stale: the sequence was appended to after prepare
  int32_t x = 7;
  PKV_ASSERT_OK(pkv_seq_append(p, s, &x, 1, 0));
  q = 1;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
  PKV_ASSERT_OK(pkv_seq_append(p, s, &x, 1, 0));
  int64_t one[3] = {1, 1, 4};
  PKV_ASSERT_OK(pkv_tensor_init(kv.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, one, &k));
  EXPECT_EQ(pkv_cache_write(b, 0, &k, &k, nullptr), PKV_E_INVALID_STATE);
  std::vector<float> qb(4), ob(4);
  pkv_tensor qt, ot;
  PKV_ASSERT_OK(pkv_tensor_init(qb.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, one, &qt));
  PKV_ASSERT_OK(pkv_tensor_init(ob.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, one, &ot));
  EXPECT_EQ(pkv_attention_forward(b, 0, &qt, &ot, nullptr, nullptr, nullptr), PKV_E_INVALID_STATE);
  EXPECT_EQ(pkv_mla_cache_write(b, 0, &k, &k, nullptr), PKV_E_INVALID_STATE);
  pkv_batch_info bi;
  pkv_batch_info_init_sized(&bi, sizeof bi);
  PKV_ASSERT_OK(pkv_batch_get_info(b, &bi));
  pkv_batch_destroy(b);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

TEST(Contract, MlaAttentionNeedsParamsAndRefusesWindowsAndSoftcaps) {
  pkv_pool* p = make_mla_pool(8, 1, 8, 4, PKV_DTYPE_F32);
  ASSERT_NE(p, nullptr);
  pkv_seq_id s = 0;
  auto t = iota_tokens(3);
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 3, 0, &s, &cached));
  uint32_t q = 3;
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
  std::vector<float> c(3 * 8, 0.1f), pe(3 * 4, 0.1f), ql(3 * 2 * 8, 0.1f), qp(3 * 2 * 4, 0.1f),
      out(3 * 2 * 8);
  int64_t sc[2] = {3, 8}, sp[2] = {3, 4}, sql[3] = {3, 2, 8}, sqp[3] = {3, 2, 4};
  pkv_tensor kc, kp, tql, tqp, tout;
  PKV_ASSERT_OK(pkv_tensor_init(c.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 2, sc, &kc));
  PKV_ASSERT_OK(pkv_tensor_init(pe.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 2, sp, &kp));
  PKV_ASSERT_OK(pkv_tensor_init(ql.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, sql, &tql));
  PKV_ASSERT_OK(pkv_tensor_init(qp.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, sqp, &tqp));
  PKV_ASSERT_OK(pkv_tensor_init(out.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, sql, &tout));
  EXPECT_EQ(pkv_cache_write(b, 0, &kc, &kc, nullptr), PKV_E_INVALID_STATE);
  PKV_ASSERT_OK(pkv_mla_cache_write(b, 0, &kc, &kp, nullptr));
  EXPECT_EQ(pkv_mla_attention(b, 0, &tql, &tqp, &tout, nullptr, nullptr, nullptr),
            PKV_E_INVALID_ARGUMENT);
  pkv_attention_params ap;
  pkv_attention_params_init(&ap);
  EXPECT_EQ(pkv_mla_attention(b, 0, &tql, &tqp, &tout, nullptr, &ap, nullptr),
            PKV_E_INVALID_ARGUMENT);  // softmax_scale must be > 0
  ap.softmax_scale = 0.5f;
  ap.sliding_window = 2;
  EXPECT_EQ(pkv_mla_attention(b, 0, &tql, &tqp, &tout, nullptr, &ap, nullptr), PKV_E_UNSUPPORTED);
  ap.sliding_window = 0;
  ap.logit_softcap = 30.f;
  EXPECT_EQ(pkv_mla_attention(b, 0, &tql, &tqp, &tout, nullptr, &ap, nullptr), PKV_E_UNSUPPORTED);
  ap.logit_softcap = 0;
  PKV_ASSERT_OK(pkv_mla_attention(b, 0, &tql, &tqp, &tout, nullptr, &ap, nullptr));
  pkv_batch_destroy(b);
  pkv_pool_destroy(p);
}

TEST(Contract, FreeingUnwrittenBlocksPutsThemAtTheHeadTailFirstWithRemovedEvents) {
  pkv_pool* p = make_pool(4, 16, 0, 1);
  pkv_seq_id a = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &a));
  auto t = iota_tokens(9);
  PKV_ASSERT_OK(pkv_seq_append(p, a, t.data(), 9, 0));  // 2 full (cached, unwritten) + 1
  const auto ta = table_of(p, a);
  ASSERT_EQ(ta.size(), 3u);
  EXPECT_EQ(stats_of(p).num_cached_blocks, 2u);
  drain(p);
  PKV_ASSERT_OK(pkv_seq_free(p, a));
  auto ev = drain(p);
  ASSERT_EQ(ev.size(), 2u);
  std::vector<int32_t> removed = {ev[0].block_id, ev[1].block_id};
  for (auto& e : ev) EXPECT_EQ(e.type, static_cast<uint32_t>(PKV_EVENT_BLOCK_REMOVED));
  std::sort(removed.begin(), removed.end());
  std::vector<int32_t> full = {ta[0], ta[1]};
  std::sort(full.begin(), full.end());
  EXPECT_EQ(removed, full);
  EXPECT_EQ(stats_of(p).num_cached_blocks, 0u);
  pkv_seq_id b = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &b));
  auto u = iota_tokens(12, 100);
  PKV_ASSERT_OK(pkv_seq_append(p, b, u.data(), 12, 0));
  EXPECT_EQ(table_of(p, b), (std::vector<int32_t>{ta[2], ta[1], ta[0]}));
  pkv_pool_destroy(p);
}

TEST(Contract, CopyOntoACachedBlockOfOtherTokensRemovesIt) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 8;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = 4;
  o.dtype = PKV_DTYPE_F32;
  o.num_threads = 1;
  o.enable_events = 1;
  pkv_pool* p = nullptr;
  PKV_ASSERT_OK(pkv_pool_create(&o, &p));
  pkv_seq_id a = computed_seq(p, iota_tokens(5, 1));
  pkv_seq_id b = computed_seq(p, iota_tokens(5, 100));
  const int32_t A = table_of(p, a)[0], B = table_of(p, b)[0];
  drain(p);
  const uint64_t cached_before = stats_of(p).num_cached_blocks;
  PKV_ASSERT_OK(pkv_pool_copy_blocks(p, &A, &B, 1, nullptr));
  auto ev = drain(p);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, static_cast<uint32_t>(PKV_EVENT_BLOCK_REMOVED));
  EXPECT_EQ(ev[0].block_id, B);
  EXPECT_EQ(stats_of(p).num_cached_blocks, cached_before - 1);
  // B's tokens no longer hit
  pkv_seq_id c = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &c));
  auto t = iota_tokens(5, 100);
  uint64_t cached = 9;
  PKV_ASSERT_OK(pkv_seq_match_prefix(p, c, t.data(), 5, &cached));
  EXPECT_EQ(cached, 0u);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

TEST(Contract, PrepareDecodeOverAnUnwrittenContextAppendsNothing) {
  pkv_pool* p = make_pool(4, 16, 0, 1);
  auto t = iota_tokens(6);
  pkv_seq_id s[2] = {computed_seq(p, t), 0};
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data() + 1, 5, 0, &s[1], &cached));  // never computed
  drain(p);
  pkv_pool_stats before = stats_of(p);
  int32_t tok[2] = {7, 8};
  pkv_batch* b = nullptr;
  EXPECT_EQ(pkv_batch_prepare_decode(p, s, tok, 2, 0, nullptr, &b), PKV_E_INVALID_STATE);
  const std::string msg = pkv_last_error_message();
  EXPECT_NE(msg.find("seqs[1]"), std::string::npos) << msg;
  EXPECT_EQ(b, nullptr);
  pkv_pool_stats after = stats_of(p);
  EXPECT_EQ(std::memcmp(&before, &after, sizeof before), 0);
  EXPECT_TRUE(drain(p).empty());
  // a repeated id: nothing appended either
  pkv_seq_id twice[2] = {s[0], s[0]};
  EXPECT_EQ(pkv_batch_prepare_decode(p, twice, tok, 2, 0, nullptr, &b), PKV_E_INVALID_ARGUMENT);
  after = stats_of(p);
  EXPECT_EQ(std::memcmp(&before, &after, sizeof before), 0);
  EXPECT_EQ(pkv_batch_prepare_decode(p, s, tok, 2, 0x80u, nullptr, &b), PKV_E_INVALID_ARGUMENT);
  pkv_pool_destroy(p);
}

TEST(Contract, TruncateLeavingAFullBlockPartialUncachesIt) {
  pkv_pool* p = make_pool(4, 16, 0, 1);
  auto t = iota_tokens(9);
  pkv_seq_id s = computed_seq(p, t);
  const auto tab = table_of(p, s);
  drain(p);
  EXPECT_EQ(pkv_seq_truncate(p, s, 10), PKV_E_INVALID_ARGUMENT);
  PKV_ASSERT_OK(pkv_seq_truncate(p, s, 9));
  EXPECT_TRUE(drain(p).empty());
  PKV_ASSERT_OK(pkv_seq_truncate(p, s, 6));
  auto ev = drain(p);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, static_cast<uint32_t>(PKV_EVENT_BLOCK_REMOVED));
  EXPECT_EQ(ev[0].block_id, tab[1]);
  EXPECT_EQ(table_of(p, s), (std::vector<int32_t>{tab[0], tab[1]}));
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, s, &info));
  EXPECT_EQ(info.num_tokens, 6u);
  EXPECT_EQ(info.num_computed_tokens, 6u);
  pkv_seq_id s2 = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s2));
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_match_prefix(p, s2, t.data(), 9, &cached));
  EXPECT_EQ(cached, 4u);
  // the released partial block (no hash) is reused first
  pkv_seq_id s3 = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s3));
  int32_t x = 999;
  PKV_ASSERT_OK(pkv_seq_append(p, s3, &x, 1, 0));
  EXPECT_EQ(table_of(p, s3)[0], tab[2]);
  pkv_pool_destroy(p);
}

TEST(Contract, KvBytesUsedCountsASharedBlockWithItsFullestHolder) {
  pkv_pool* p = make_pool(4, 16, 1);  // 128 bytes a block, 32 a slot
  auto t = iota_tokens(6);
  pkv_seq_id a = 0;
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, t.data(), 6, 0, &a, &cached));
  pkv_pool_stats st = stats_of(p);
  EXPECT_EQ(st.kv_bytes_used, 6u * 32);
  EXPECT_EQ(st.kv_bytes_wasted, 2u * 32);
  pkv_seq_id b = 0;
  PKV_ASSERT_OK(pkv_seq_fork(p, a, &b));
  st = stats_of(p);
  EXPECT_EQ(st.kv_bytes_used, 6u * 32);
  EXPECT_EQ(st.kv_bytes_wasted, 2u * 32);
  PKV_ASSERT_OK(pkv_seq_truncate(p, b, 5));
  st = stats_of(p);
  EXPECT_EQ(st.kv_bytes_used, 6u * 32);  // a keeps the block's fill
  PKV_ASSERT_OK(pkv_seq_free(p, a));
  st = stats_of(p);
  EXPECT_EQ(st.kv_bytes_used, 6u * 32);  // a's fill stays until b writes or truncates
  EXPECT_EQ(st.kv_bytes_wasted, 2u * 32);
  PKV_ASSERT_OK(pkv_seq_truncate(p, b, 5));  // the last holder: settled
  st = stats_of(p);
  EXPECT_EQ(st.kv_bytes_used, 5u * 32);
  EXPECT_EQ(st.kv_bytes_wasted, 3u * 32);
  PKV_ASSERT_OK(pkv_seq_truncate(p, b, 4));
  st = stats_of(p);
  EXPECT_EQ(st.kv_bytes_used, 4u * 32);
  EXPECT_EQ(st.kv_bytes_wasted, 0u);
  int32_t x = 1;
  PKV_ASSERT_OK(pkv_seq_append(p, b, &x, 1, 3));  // lookahead slots are waste
  st = stats_of(p);
  EXPECT_EQ(st.kv_bytes_used, 5u * 32);
  EXPECT_EQ(st.kv_bytes_wasted, 3u * 32);
  EXPECT_EQ(st.kv_bytes_allocated, 16u * 128);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

TEST(Contract, ResetUnpinsAndFreesPinnedBlocksAndForgetsPriorities) {
  pkv_pool* p = make_retention_pool(8, 3);
  pkv_retention_range pin{0, 4, PKV_PRIORITY_PINNED, 0, 0};
  pkv_retention_range rest{4, PKV_TOKEN_END, 70, 0, 1000};
  pkv_retention_range both[2] = {pin, rest};
  pkv_seq_id s = computed_seq(p, iota_tokens(9), both, 2);
  pkv_seq_id live = computed_seq(p, iota_tokens(5, 100), &pin, 1);
  PKV_ASSERT_OK(pkv_seq_free(p, s));
  pkv_pool_stats st = stats_of(p);
  EXPECT_EQ(st.num_pinned_blocks, 2u);
  EXPECT_EQ(st.num_free_blocks, 7u - 2u - 1u);  // live holds 2, s's pinned block excluded
  drain(p);
  PKV_ASSERT_OK(pkv_pool_reset_prefix_cache(p));
  st = stats_of(p);
  EXPECT_EQ(st.num_pinned_blocks, 0u);
  EXPECT_EQ(st.num_cached_blocks, 0u);
  EXPECT_EQ(st.num_free_blocks, 7u - 2u);
  auto c = prio_counts(p);
  uint64_t total = 0;
  for (auto v : c) total += v;
  EXPECT_EQ(total, 0u);
  auto ev = drain(p);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, static_cast<uint32_t>(PKV_EVENT_ALL_CLEARED));
  PKV_ASSERT_OK(pkv_pool_validate(p));
  // every free block can be allocated
  pkv_seq_id big = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &big));
  auto t = iota_tokens(20, 1000);
  PKV_ASSERT_OK(pkv_seq_append(p, big, t.data(), 20, 0));
  EXPECT_EQ(stats_of(p).num_free_blocks, 0u);
  PKV_ASSERT_OK(pkv_pool_set_clock(p, uint64_t{1} << 40));
  PKV_ASSERT_OK(pkv_pool_validate(p));
  (void)live;
  pkv_pool_destroy(p);
}

TEST(Contract, PartialHitsKeepTenantsApart) {
  pkv_pool* p = make_partial_pool(32);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const pkv_mm_item img_a[1] = {{1, 2, "img-a"}}, img_b[1] = {{1, 2, "img-b"}};
  auto admit_computed = [&](const pkv_seq_options* so) {
    pkv_seq_id s = 0;
    uint64_t cached = 0;
    EXPECT_EQ(pkv_seq_admit(p, so, prompt.data(), prompt.size(), 0, &s, &cached), PKV_OK);
    uint32_t q = uint32_t(prompt.size() - cached);
    pkv_batch* b = nullptr;
    EXPECT_EQ(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b), PKV_OK) << pkv_last_error_message();
    EXPECT_EQ(pkv_batch_commit(b), PKV_OK);
    pkv_batch_destroy(b);
  };
  pkv_seq_options salted, lora, mm_a, mm_b, plain;
  for (auto* so : {&salted, &lora, &mm_a, &mm_b, &plain})
    pkv_seq_options_init_sized(so, sizeof *so);
  salted.cache_salt = "tenant-a";
  lora.lora_name = "adapter";
  mm_a.mm_items = img_a;
  mm_a.num_mm_items = 1;
  mm_b.mm_items = img_b;
  mm_b.num_mm_items = 1;
  admit_computed(&salted);
  admit_computed(&lora);
  admit_computed(&mm_a);
  const std::vector<int32_t> q = {1, 2, 3, 77, 78};
  for (const pkv_seq_options* so : {&plain, &mm_b}) {
    pkv_seq_id s = 0;
    PKV_ASSERT_OK(pkv_seq_create(p, so, &s));
    pkv_prefix_match m;
    pkv_prefix_match_init_sized(&m, sizeof m);
    PKV_ASSERT_OK(pkv_seq_match_prefix_partial(p, s, q.data(), q.size(), &m));
    EXPECT_EQ(m.partial_tokens, 0u) << (so == &plain ? "plain" : "mm_b");
    EXPECT_EQ(m.num_cached, 0u);
  }
  // the same tenant does hit
  for (const pkv_seq_options* so : {&salted, &lora, &mm_a}) {
    pkv_seq_id s = 0;
    PKV_ASSERT_OK(pkv_seq_create(p, so, &s));
    pkv_prefix_match m;
    pkv_prefix_match_init_sized(&m, sizeof m);
    PKV_ASSERT_OK(pkv_seq_match_prefix_partial(p, s, q.data(), q.size(), &m));
    EXPECT_EQ(m.partial_tokens, 3u);
  }
  pkv_pool_destroy(p);
}

TEST(Contract, GroupPoolCountsAppendsComputedUntilItsFirstPlan) {
  pkv_pool* p = make_groups_pool();
  auto t = iota_tokens(9);
  pkv_seq_id a = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &a));
  PKV_ASSERT_OK(pkv_seq_append(p, a, t.data(), 9, 0));
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, a, &info));
  EXPECT_EQ(info.num_computed_tokens, 9u);  // no plan yet: manager calls alone
  auto lookup = [&]() {
    pkv_seq_id s = 0;
    EXPECT_EQ(pkv_seq_create(p, nullptr, &s), PKV_OK);
    uint64_t cached = 99;
    EXPECT_EQ(pkv_seq_match_prefix(p, s, t.data(), 9, &cached), PKV_OK);
    EXPECT_EQ(pkv_seq_free(p, s), PKV_OK);
    return cached;
  };
  EXPECT_EQ(lookup(), 8u);
  uint32_t q = 9;
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &a, &q, 1, nullptr, &b));
  PKV_ASSERT_OK(pkv_seq_get_info(p, a, &info));
  EXPECT_EQ(info.num_computed_tokens, 0u);  // taken back from its first query on
  EXPECT_EQ(lookup(), 0u);
  PKV_ASSERT_OK(pkv_batch_abort(b));
  pkv_batch_destroy(b);
  EXPECT_EQ(lookup(), 0u);
  PKV_ASSERT_OK(pkv_batch_prepare(p, &a, &q, 1, nullptr, &b));
  pkv_batch_destroy(b);  // neither commit nor abort: committed (ABI 1)
  PKV_ASSERT_OK(pkv_seq_get_info(p, a, &info));
  EXPECT_EQ(info.num_computed_tokens, 9u);
  EXPECT_EQ(lookup(), 8u);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

// hash.h's formula, bytes computed by hand: h_-1 = sha256(cbor("s33d")),
// h_0 = sha256(cbor([h_-1, [1, 2, 3, 4], null])), and with a salt
// extra = ["x"] (values from Python's hashlib over the CBOR written out).
TEST(Contract, Sha256CborHashesAreTheDocumentedEncoding) {
  auto hex = [](const pkv_block_hash& h) {
    static const char* d = "0123456789abcdef";
    std::string s;
    for (int i = 0; i < 32; ++i) {
      s += d[h.bytes[i] >> 4];
      s += d[h.bytes[i] & 15];
    }
    return s;
  };
  pkv_block_hash root;
  PKV_ASSERT_OK(pkv_hash_root(PKV_HASH_SHA256_CBOR, "s33d", &root));
  EXPECT_EQ(hex(root), "68fd7ac7ca3897c21da7a1a8e6161b184f54475d5c7e12ec51aa9f7c36bf1f45");
  pkv_hash_options o;
  pkv_hash_options_init_sized(&o, sizeof o);
  o.block_size = 4;
  o.seed = "s33d";
  const int32_t t[5] = {1, 2, 3, 4, 5};
  pkv_block_hash h;
  uint64_t n = 0;
  PKV_ASSERT_OK(pkv_hash_prefix(&o, t, 5, &h, 1, &n));
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(hex(h), "7892b418767e2b7434486ec68f4038bb2feb2868c339a75bc841b2572b44d418");
  o.cache_salt = "x";
  PKV_ASSERT_OK(pkv_hash_prefix(&o, t, 5, &h, 1, &n));
  EXPECT_EQ(hex(h), "08c1f7ac6a9130bb316ec0a79e5748d76603892383e3ddea4358c72c6cb44c12");
}

TEST(Contract, APendingStoredEventKeepsItsTokensAfterTheBlockIsReused) {
  pkv_pool* p = make_pool(4, 3, 0, 1);  // 2 usable
  pkv_seq_id a = 0, b = 0;
  auto ta = iota_tokens(5, 1), tb = iota_tokens(5, 100);
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, ta.data(), 5, 0, &a, &cached));
  const int32_t block = table_of(p, a)[0];
  PKV_ASSERT_OK(pkv_seq_free(p, a));  // unwritten: removed
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, tb.data(), 5, 0, &b, &cached));
  std::vector<pkv_event_v2> ev(8);
  for (auto& e : ev) {
    std::memset(&e, 0, sizeof e);
    e.struct_size = sizeof e;
  }
  std::vector<int32_t> ids(32, -1);
  uint64_t n = 0;
  PKV_ASSERT_OK(pkv_pool_drain_events_v2(p, ev.data(), ev.size(), ids.data(), ids.size(), &n));
  ASSERT_EQ(n, 3u);
  EXPECT_EQ(ev[0].type, static_cast<uint32_t>(PKV_EVENT_BLOCK_STORED));
  EXPECT_EQ(ev[1].type, static_cast<uint32_t>(PKV_EVENT_BLOCK_REMOVED));
  EXPECT_EQ(ev[2].type, static_cast<uint32_t>(PKV_EVENT_BLOCK_STORED));
  EXPECT_EQ(ev[0].block_id, block);
  EXPECT_EQ(ev[1].block_id, block);
  auto at = [&](const pkv_event_v2& e) {
    return std::vector<int32_t>(ids.begin() + e.token_offset,
                                ids.begin() + e.token_offset + e.num_token_ids);
  };
  EXPECT_EQ(at(ev[0]), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(at(ev[2]), (std::vector<int32_t>{100, 101, 102, 103}));
  EXPECT_EQ(ev[1].num_token_ids, 0u);
  pkv_pool_destroy(p);
}

TEST(Contract, PersistentTableRowsFollowEveryTableChange) {
  pkv_pool* p = make_pool(4, 64);
  auto check = [&](std::vector<pkv_seq_id> seqs, const char* what) {
    std::vector<uint32_t> q(seqs.size(), 1);
    pkv_batch* b = nullptr;
    ASSERT_EQ(pkv_batch_prepare_ex(p, seqs.data(), q.data(), uint32_t(seqs.size()),
                                   PKV_PREPARE_PERSISTENT_TABLE, nullptr, &b),
              PKV_OK)
        << what << ": " << pkv_last_error_message();
    const auto indptr = i32_array(b, PKV_PLAN_PAGE_INDPTR);
    const auto pages = i32_array(b, PKV_PLAN_PAGE_INDICES);
    const int32_t stride = indptr[1];
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto want = table_of(p, seqs[i]);
      for (int32_t j = 0; j < stride; ++j)
        EXPECT_EQ(pages[i * stride + j], size_t(j) < want.size() ? want[j] : 0)
            << what << ": row " << i << " page " << j;
    }
    EXPECT_EQ(pkv_batch_commit(b), PKV_OK);
    pkv_batch_destroy(b);
  };
  pkv_seq_id a = computed_seq(p, iota_tokens(6, 1));
  pkv_seq_id b = computed_seq(p, iota_tokens(6, 100));
  check({a, b}, "first");
  check({b, a}, "swapped");
  check({a}, "fewer");
  pkv_seq_id c = 0;
  PKV_ASSERT_OK(pkv_seq_fork(p, a, &c));
  int32_t x = 7;
  PKV_ASSERT_OK(pkv_seq_append(p, a, &x, 1, 0));  // copy-on-write of a's block 1
  check({a, b}, "after a copy-on-write");
  PKV_ASSERT_OK(pkv_seq_truncate(p, b, 3));
  auto more = iota_tokens(4, 300);
  PKV_ASSERT_OK(pkv_seq_append(p, b, more.data(), 4, 0));
  uint32_t q = 4;
  pkv_batch* bt = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &b, &q, 1, nullptr, &bt));
  PKV_ASSERT_OK(pkv_batch_commit(bt));
  pkv_batch_destroy(bt);
  check({a, b}, "after truncate and append");
  PKV_ASSERT_OK(pkv_seq_free(p, a));
  pkv_seq_id d = computed_seq(p, iota_tokens(7, 500));
  check({d, b}, "a new sequence in row 0");
  check({c, b, d}, "the fork child first");
  auto grow = iota_tokens(40, 900);
  PKV_ASSERT_OK(pkv_seq_append(p, d, grow.data(), 40, 0));
  q = 40;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &d, &q, 1, nullptr, &bt));
  PKV_ASSERT_OK(pkv_batch_commit(bt));
  pkv_batch_destroy(bt);
  check({c, b, d}, "a row outgrowing the stride");
  pkv_pool_destroy(p);
}

TEST(Contract, GroupPersistentTableRowsFollowEveryTableChange) {
  pkv_pool* p = make_groups_pool();  // full + window 8, block 4, 32 blocks
  auto step = [&](pkv_seq_id s, uint32_t q) {
    pkv_batch* bt = nullptr;
    ASSERT_EQ(pkv_batch_prepare(p, &s, &q, 1, nullptr, &bt), PKV_OK) << pkv_last_error_message();
    ASSERT_EQ(pkv_batch_commit(bt), PKV_OK);
    pkv_batch_destroy(bt);
  };
  auto check = [&](std::vector<pkv_seq_id> seqs, const char* what) {
    std::vector<uint32_t> q(seqs.size(), 1);
    pkv_batch* b = nullptr;
    ASSERT_EQ(pkv_batch_prepare_ex(p, seqs.data(), q.data(), uint32_t(seqs.size()),
                                   PKV_PREPARE_PERSISTENT_TABLE, nullptr, &b),
              PKV_OK)
        << what << ": " << pkv_last_error_message();
    for (uint32_t g = 0; g < 2; ++g) {
      pkv_tensor ip, pg;
      ASSERT_EQ(pkv_batch_plan_tensor_group(b, g, PKV_PLAN_PAGE_INDPTR, &ip), PKV_OK);
      ASSERT_EQ(pkv_batch_plan_tensor_group(b, g, PKV_PLAN_PAGE_INDICES, &pg), PKV_OK);
      const int32_t stride = static_cast<const int32_t*>(ip.data)[1];
      const int32_t* pages = static_cast<const int32_t*>(pg.data);
      for (size_t i = 0; i < seqs.size(); ++i) {
        int32_t tab[64];
        uint64_t n = 0;
        ASSERT_EQ(pkv_seq_group_block_table(p, seqs[i], g, tab, 64, &n), PKV_OK);
        for (int32_t j = 0; j < stride; ++j)
          EXPECT_EQ(pages[i * stride + j], uint64_t(j) < n ? tab[j] : 0)
              << what << ": group " << g << " row " << i << " page " << j;
      }
    }
    EXPECT_EQ(pkv_batch_commit(b), PKV_OK);
    pkv_batch_destroy(b);
  };
  pkv_seq_id a = 0, b = 0;
  auto ta = iota_tokens(6, 1), tb = iota_tokens(6, 100);
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &a));
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &b));
  PKV_ASSERT_OK(pkv_seq_append(p, a, ta.data(), 6, 0));
  PKV_ASSERT_OK(pkv_seq_append(p, b, tb.data(), 6, 0));
  step(a, 6);
  step(b, 6);
  check({a, b}, "first");
  check({b, a}, "swapped");
  auto more = iota_tokens(12, 200);
  PKV_ASSERT_OK(pkv_seq_append(p, a, more.data(), 12, 0));  // the window releases pages
  step(a, 12);
  int32_t x = 5;
  PKV_ASSERT_OK(pkv_seq_append(p, a, &x, 1, 0));
  check({b, a}, "after window releases");
  pkv_seq_id c = 0;
  PKV_ASSERT_OK(pkv_seq_fork(p, b, &c));
  PKV_ASSERT_OK(pkv_seq_append(p, b, &x, 1, 0));  // copy-on-write
  int32_t src[8], dst[8];
  uint64_t nc = 0;
  PKV_ASSERT_OK(pkv_pool_group_take_copies(p, 0, src, dst, 8, &nc));
  PKV_ASSERT_OK(pkv_pool_group_take_copies(p, 1, src, dst, 8, &nc));
  check({b, a}, "after a copy-on-write");
  // back into what the window released: refused, nothing changes
  EXPECT_EQ(pkv_seq_truncate(p, a, 5), PKV_E_INVALID_ARGUMENT);
  PKV_ASSERT_OK(pkv_seq_truncate(p, a, 17));
  check({c, a, b}, "after a truncate");
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

TEST(Contract, GroupCopiesHoldBothBlocksUntilTaken) {
  pkv_pool* p = make_groups_pool();
  pkv_seq_id a = 0, c = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &a));
  auto t = iota_tokens(6);
  PKV_ASSERT_OK(pkv_seq_append(p, a, t.data(), 6, 0));
  PKV_ASSERT_OK(pkv_seq_fork(p, a, &c));
  int32_t x = 9;
  PKV_ASSERT_OK(pkv_seq_append(p, c, &x, 1, 0));  // copies the shared tail in both groups
  PKV_ASSERT_OK(pkv_seq_free(p, a));
  PKV_ASSERT_OK(pkv_seq_free(p, c));
  pkv_group_stats gs;
  pkv_group_stats_init_sized(&gs, sizeof gs);
  PKV_ASSERT_OK(pkv_pool_group_stats(p, 0, &gs));
  EXPECT_EQ(gs.num_used_blocks, 2u);  // the copy's source and destination
  const uint64_t used = stats_of(p).num_used_blocks;
  EXPECT_GE(used, 2u);
  int32_t src[4], dst[4];
  uint64_t n = 0;
  PKV_ASSERT_OK(pkv_pool_group_take_copies(p, 0, src, dst, 4, &n));
  ASSERT_EQ(n, 1u);
  EXPECT_NE(src[0], dst[0]);
  PKV_ASSERT_OK(pkv_pool_group_stats(p, 0, &gs));
  EXPECT_EQ(gs.num_used_blocks, 0u);
  PKV_ASSERT_OK(pkv_pool_group_take_copies(p, 1, src, dst, 4, &n));
  EXPECT_EQ(stats_of(p).num_used_blocks, 0u);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

TEST(Contract, TieredCallsWithoutTiersAreTheirDeviceOnlyCalls) {
  pkv_pool* p = make_pool(4, 16);  // manager-only: tiers cannot even be attached
  auto t = iota_tokens(9);
  pkv_seq_id a = computed_seq(p, t);
  (void)a;
  pkv_seq_id s = 0;
  pkv_tier_match m;
  pkv_tier_match_init_sized(&m, sizeof m);
  PKV_ASSERT_OK(pkv_seq_admit_tiered(p, nullptr, t.data(), 9, nullptr, 0, 2, &s, &m));
  EXPECT_EQ(m.device_tokens, 8u);
  EXPECT_EQ(m.num_cached, 8u);
  EXPECT_EQ(m.host_tokens + m.file_tokens, 0u);
  pkv_seq_info info;
  pkv_seq_info_init_sized(&info, sizeof info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, s, &info));
  EXPECT_EQ(info.num_tokens, 9u);
  EXPECT_EQ(info.num_slots, 12u);  // + 2 lookahead slots
  pkv_hash_options ho;
  pkv_hash_options_init_sized(&ho, sizeof ho);
  ho.block_size = 4;
  pkv_block_hash h[2];
  uint64_t n = 0;
  PKV_ASSERT_OK(pkv_hash_prefix(&ho, t.data(), 9, h, 2, &n));
  pkv_seq_id s2 = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s2));
  PKV_ASSERT_OK(pkv_seq_match_prefix_hashes_tiered(p, s2, t.data(), 9, h, 2, &m));
  EXPECT_EQ(m.device_tokens, 8u);
  EXPECT_EQ(m.num_cached, 8u);
  // all or nothing: a wrong hash attaches nothing
  pkv_seq_id s3 = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &s3));
  h[1].bytes[0] ^= 1;
  pkv_pool_stats before = stats_of(p);
  EXPECT_EQ(pkv_seq_match_prefix_hashes_tiered(p, s3, t.data(), 9, h, 2, &m),
            PKV_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pkv_last_error_message()).find("hashes[1]"), std::string::npos)
      << pkv_last_error_message();
  pkv_pool_stats after = stats_of(p);
  EXPECT_EQ(std::memcmp(&before, &after, sizeof before), 0);
  PKV_ASSERT_OK(pkv_seq_get_info(p, s3, &info));
  EXPECT_EQ(info.num_tokens, 0u);
  pkv_pool_destroy(p);
}
