// Every fallible C function on its error paths: NULL, out of range, stale
// ids. Each case checks the status, that the message names the function and
// the argument, and that the pool's observable state did not change. Linked
// against libpagedkv.so, exactly as a user would be.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

struct Snapshot {
  pkv_pool_stats stats;
  std::vector<int32_t> table;
  uint64_t tokens = 0;
  bool operator==(const Snapshot& o) const {
    return std::memcmp(&stats, &o.stats, sizeof stats) == 0 && table == o.table &&
           tokens == o.tokens;
  }
};

class ErrorPaths : public ::testing::Test {
 protected:
  void SetUp() override {
    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.block_size = 4;
    o.num_blocks = 16;
    o.num_layers = 2;
    o.num_kv_heads = 2;
    o.head_dim = 8;
    o.dtype = PKV_DTYPE_F32;
    o.num_threads = 1;
    o.enable_events = 1;
    ASSERT_EQ(pkv_pool_create(&o, &pool), PKV_OK) << pkv_last_error_message();
    pkv_pool_options_init(&o);
    o.block_size = 4;
    o.num_blocks = 16;
    ASSERT_EQ(pkv_pool_create(&o, &manager), PKV_OK);
    ASSERT_EQ(pkv_seq_create(pool, nullptr, &live), PKV_OK);
    int32_t t[6] = {1, 2, 3, 4, 5, 6};
    ASSERT_EQ(pkv_seq_append(pool, live, t, 6, 0), PKV_OK);
    ASSERT_EQ(pkv_seq_create(pool, nullptr, &stale), PKV_OK);
    ASSERT_EQ(pkv_seq_free(pool, stale), PKV_OK);
    uint32_t q = 6;
    ASSERT_EQ(pkv_batch_prepare(pool, &live, &q, 1, nullptr, &batch), PKV_OK);
    k.assign(6 * 2 * 8, 0.5f);
    q_buf.assign(6 * 4 * 8, 0.25f);
    out_buf.assign(6 * 4 * 8, 0.f);
    lse_buf.assign(6 * 4, 0.f);
    kt = tensor(k.data(), {6, 2, 8});
    qt = tensor(q_buf.data(), {6, 4, 8});
    ot = tensor(out_buf.data(), {6, 4, 8});
    lt = tensor(lse_buf.data(), {6, 4});
  }
  void TearDown() override {
    pkv_batch_destroy(batch);
    pkv_pool_destroy(pool);
    pkv_pool_destroy(manager);
  }
  static pkv_tensor tensor(void* data, std::vector<int64_t> shape, uint32_t dtype = PKV_DTYPE_F32) {
    pkv_tensor t;
    EXPECT_EQ(
        pkv_tensor_init(data, dtype, PKV_DEVICE_CPU, 0, int32_t(shape.size()), shape.data(), &t),
        PKV_OK);
    return t;
  }
  Snapshot snap() {
    Snapshot s;
    pkv_pool_stats_init(&s.stats);
    EXPECT_EQ(pkv_pool_get_stats(pool, &s.stats), PKV_OK);
    uint64_t len = 0;
    s.table.resize(16);
    EXPECT_EQ(pkv_seq_get_block_table(pool, live, s.table.data(), 16, &len), PKV_OK);
    s.table.resize(len);
    pkv_seq_info info;
    pkv_seq_info_init(&info);
    EXPECT_EQ(pkv_seq_get_info(pool, live, &info), PKV_OK);
    s.tokens = info.num_tokens;
    return s;
  }
  // status == want; message starts with the function's name and mentions
  // needle; the pool looks exactly as before.
  void check(const char* call, pkv_status got, pkv_status want, const char* needle,
             const Snapshot& before) {
    std::string msg = pkv_last_error_message();
    std::string fn(call, std::strchr(call, '('));
    EXPECT_EQ(got, want) << call << ": " << msg;
    EXPECT_EQ(msg.rfind(fn + ": ", 0), 0u) << call << ": message \"" << msg << "\"";
    EXPECT_NE(msg.find(needle), std::string::npos)
        << call << ": message \"" << msg << "\" lacks \"" << needle << "\"";
    EXPECT_TRUE(before == snap()) << call << " changed the pool";
  }

  pkv_pool* pool = nullptr;
  pkv_pool* manager = nullptr;
  pkv_seq_id live = 0, stale = 0;
  pkv_batch* batch = nullptr;
  std::vector<float> k, q_buf, out_buf, lse_buf;
  pkv_tensor kt, qt, ot, lt;
};

#define FAILS(call, want, needle)              \
  do {                                         \
    Snapshot before_ = snap();                 \
    pkv_status got_ = (call);                  \
    check(#call, got_, want, needle, before_); \
  } while (0)

constexpr pkv_status BAD = PKV_E_INVALID_ARGUMENT;

TEST_F(ErrorPaths, TensorInit) {
  pkv_tensor t;
  int64_t shape[3] = {2, -1, 3};
  float x;
  FAILS(pkv_tensor_init(&x, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, nullptr), BAD, "out");
  FAILS(pkv_tensor_init(&x, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 0, shape, &t), BAD, "ndim 0");
  FAILS(pkv_tensor_init(&x, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 7, shape, &t), BAD, "ndim 7");
  FAILS(pkv_tensor_init(&x, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, nullptr, &t), BAD, "shape");
  FAILS(pkv_tensor_init(&x, 99, PKV_DEVICE_CPU, 0, 1, shape, &t), BAD, "dtype 99");
  FAILS(pkv_tensor_init(&x, PKV_DTYPE_F32, 5, 0, 1, shape, &t), BAD, "device_type 5");
  FAILS(pkv_tensor_init(&x, PKV_DTYPE_F32, PKV_DEVICE_CPU, -1, 1, shape, &t), BAD, "device_id");
  FAILS(pkv_tensor_init(&x, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &t), BAD, "shape[1]");
}

TEST_F(ErrorPaths, Hashing) {
  pkv_hash_options ho;
  pkv_hash_options_init(&ho);
  int32_t tok[8] = {};
  pkv_block_hash h[2];
  uint64_t n = 0;
  FAILS(pkv_hash_prefix(nullptr, tok, 8, h, 2, &n), BAD, "opts is NULL");
  ho.struct_size = 3;
  FAILS(pkv_hash_prefix(&ho, tok, 8, h, 2, &n), BAD, "opts->struct_size");
  pkv_hash_options_init(&ho);
  ho.algo = 9;
  FAILS(pkv_hash_prefix(&ho, tok, 8, h, 2, &n), BAD, "opts->algo");
  pkv_hash_options_init(&ho);
  ho.block_size = 0;
  FAILS(pkv_hash_prefix(&ho, tok, 8, h, 2, &n), BAD, "opts->block_size");
  pkv_hash_options_init(&ho);
  ho.block_size = 4;
  FAILS(pkv_hash_prefix(&ho, nullptr, 8, h, 2, &n), BAD, "tokens is NULL");
  FAILS(pkv_hash_prefix(&ho, tok, 8, h, 2, nullptr), BAD, "out_num_blocks");
  FAILS(pkv_hash_prefix(&ho, tok, 8, nullptr, 2, &n), BAD, "out_hashes");
  FAILS(pkv_hash_prefix(&ho, tok, 8, h, 1, &n), PKV_E_BUFFER_TOO_SMALL, "out_hashes");
  EXPECT_EQ(n, 2u);
  ho.num_mm_items = 1;
  FAILS(pkv_hash_prefix(&ho, tok, 8, h, 2, &n), BAD, "opts->mm_items");
  FAILS(pkv_hash_root(9, "", h), BAD, "algo 9");
  FAILS(pkv_hash_root(PKV_HASH_XXH3_128, "", nullptr), BAD, "out");
  // A version-1 struct (no lora_name) is accepted and lora_name, past its
  // struct_size, is never read: garbage there changes nothing.
  pkv_hash_options_init(&ho);
  ho.block_size = 4;
  pkv_block_hash plain[2], v1[2], named[2];
  ASSERT_EQ(pkv_hash_prefix(&ho, tok, 8, plain, 2, &n), PKV_OK);
  ho.lora_name = "adapter";
  ASSERT_EQ(pkv_hash_prefix(&ho, tok, 8, named, 2, &n), PKV_OK);
  EXPECT_NE(0, std::memcmp(plain, named, sizeof plain));
  ho.struct_size = uint32_t(offsetof(pkv_hash_options, lora_name));
  ho.lora_name = reinterpret_cast<const char*>(uintptr_t(1));  // would crash if read
  ASSERT_EQ(pkv_hash_prefix(&ho, tok, 8, v1, 2, &n), PKV_OK) << pkv_last_error_message();
  EXPECT_EQ(0, std::memcmp(plain, v1, sizeof plain));
}

TEST_F(ErrorPaths, PoolCreateAndOptions) {
  pkv_pool_options o;
  pkv_pool* p = nullptr;
  auto fresh = [&] {
    pkv_pool_options_init(&o);
    o.num_blocks = 8;
  };
  fresh();
  FAILS(pkv_pool_create(nullptr, &p), BAD, "opts is NULL");
  FAILS(pkv_pool_create(&o, nullptr), BAD, "out is NULL");
  o.struct_size = 8;
  FAILS(pkv_pool_create(&o, &p), BAD, "opts->struct_size");
  fresh();
  o.block_size = 2000;
  FAILS(pkv_pool_create(&o, &p), BAD, "opts->block_size");
  fresh();
  o.num_blocks = 1;
  FAILS(pkv_pool_create(&o, &p), BAD, "opts->num_blocks");
  fresh();
  o.hash_algo = 5;
  FAILS(pkv_pool_create(&o, &p), BAD, "opts->hash_algo");
  fresh();
  o.enable_prefix_caching = 2;
  FAILS(pkv_pool_create(&o, &p), BAD, "opts->enable_prefix_caching");
  fresh();
  o.strict_key_domains = 3;  // past PKV_KEY_DOMAINS_VLLM_TAGGED
  FAILS(pkv_pool_create(&o, &p), BAD, "opts->strict_key_domains");
  fresh();
  o.enable_events = 7;
  FAILS(pkv_pool_create(&o, &p), BAD, "opts->enable_events");
  fresh();
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = 8;
  o.dtype = PKV_DTYPE_I64;
  FAILS(pkv_pool_create(&o, &p), BAD, "opts->dtype");
  fresh();
  // num_blocks derived from a budget too big for block ids: the message
  // names the field the caller set.
  o.num_blocks = 0;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = 8;
  o.dtype = PKV_DTYPE_F32;
  o.memory_budget_bytes = uint64_t(1) << 41;  // 2^31 blocks of 1 KiB
  FAILS(pkv_pool_create(&o, &p), BAD, "opts->memory_budget_bytes");
  EXPECT_EQ(p, nullptr);
  fresh();
  o.device_type = 3;
  FAILS(pkv_pool_create(&o, &p), BAD, "opts->device_type");
  EXPECT_EQ(p, nullptr);
  fresh();
  o.device_type = PKV_DEVICE_CUDA;
  if (pkv_cuda_device_count() == 0) {
    pkv_status st = pkv_pool_create(&o, &p);
    EXPECT_TRUE(st == PKV_E_UNSUPPORTED || st == PKV_E_CUDA) << st;
    EXPECT_GT(std::strlen(pkv_last_error_message()), 0u);
    EXPECT_EQ(p, nullptr);
  }
  // Head dims: the CUDA kernels are compiled for five (checked before any
  // device is touched); the CPU kernels take any, and any block size.
  fresh();
  o.device_type = PKV_DEVICE_CUDA;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = 48;
  o.dtype = PKV_DTYPE_F16;
  FAILS(pkv_pool_create(&o, &p), BAD, "opts->head_dim 48");
  FAILS(pkv_pool_create(&o, &p), BAD, "(allowed on a CUDA pool: 64, 80, 96, 128, 256)");
  EXPECT_EQ(p, nullptr);
  for (uint32_t hd : {48u, 320u, 7u}) {
    for (uint32_t bs : {17u, 128u, 1u}) {
      fresh();
      o.num_layers = 1;
      o.num_kv_heads = 1;
      o.head_dim = hd;
      o.block_size = bs;
      o.dtype = PKV_DTYPE_F32;
      ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK)
          << hd << " " << bs << ": " << pkv_last_error_message();
      pkv_pool_destroy(p);
      p = nullptr;
    }
  }

  FAILS(pkv_pool_get_options(nullptr, &o), BAD, "pool is NULL");
  FAILS(pkv_pool_get_options(pool, nullptr), BAD, "out is NULL");
  o.struct_size = 1;
  FAILS(pkv_pool_get_options(pool, &o), BAD, "out->struct_size");
  uint64_t bpb;
  FAILS(pkv_pool_bytes_per_block(nullptr, &bpb), BAD, "pool is NULL");
  FAILS(pkv_pool_bytes_per_block(pool, nullptr), BAD, "out is NULL");
}

TEST_F(ErrorPaths, SeqCreate) {
  pkv_seq_id id;
  pkv_seq_options so;
  pkv_seq_options_init(&so);
  FAILS(pkv_seq_create(nullptr, &so, &id), BAD, "pool is NULL");
  FAILS(pkv_seq_create(pool, &so, nullptr), BAD, "out is NULL");
  so.struct_size = 2;
  FAILS(pkv_seq_create(pool, &so, &id), BAD, "opts->struct_size");
  pkv_seq_options_init(&so);
  so.num_mm_items = 2;
  FAILS(pkv_seq_create(pool, &so, &id), BAD, "opts->mm_items is NULL");
  pkv_mm_item items[2] = {{0, 4, "img-a"}, {2, 4, "img-b"}};
  so.mm_items = items;
  FAILS(pkv_seq_create(pool, &so, &id), BAD, "opts->mm_items[1]");
  items[1].offset = 8;
  items[1].hash = nullptr;
  FAILS(pkv_seq_create(pool, &so, &id), BAD, "opts->mm_items[1].hash");
  items[1].hash = "";
  FAILS(pkv_seq_create(pool, &so, &id), BAD, "opts->mm_items[1].hash is empty");
  items[1].hash = "img-b";
  items[0].length = 0;
  FAILS(pkv_seq_create(pool, &so, &id), BAD, "opts->mm_items[0].length");
  // Version-1 size: lora_name is past struct_size and never read.
  pkv_seq_options_init(&so);
  so.struct_size = uint32_t(offsetof(pkv_seq_options, lora_name));
  so.lora_name = reinterpret_cast<const char*>(uintptr_t(1));  // would crash if read
  ASSERT_EQ(pkv_seq_create(pool, &so, &id), PKV_OK) << pkv_last_error_message();
  EXPECT_EQ(pkv_seq_free(pool, id), PKV_OK);
}

TEST_F(ErrorPaths, SeqOperations) {
  int32_t t[4] = {1, 2, 3, 4};
  uint64_t n;
  pkv_seq_id child;
  FAILS(pkv_seq_match_prefix(nullptr, live, t, 4, &n), BAD, "pool is NULL");
  FAILS(pkv_seq_match_prefix(pool, stale, t, 4, &n), PKV_E_NOT_FOUND, "stale or unknown");
  FAILS(pkv_seq_match_prefix(pool, live, nullptr, 4, &n), BAD, "tokens is NULL");
  FAILS(pkv_seq_match_prefix(pool, live, t, 4, nullptr), BAD, "out_num_cached");
  FAILS(pkv_seq_match_prefix(pool, live, t, 4, &n), PKV_E_INVALID_STATE, "empty sequence");

  FAILS(pkv_seq_append(nullptr, live, t, 4, 0), BAD, "pool is NULL");
  FAILS(pkv_seq_append(pool, stale, t, 4, 0), PKV_E_NOT_FOUND, "stale or unknown");
  FAILS(pkv_seq_append(pool, 0, t, 4, 0), PKV_E_NOT_FOUND, "0x0000000000000000");
  FAILS(pkv_seq_append(pool, live, nullptr, 4, 0), BAD, "tokens is NULL but num_tokens is 4");
  FAILS(pkv_seq_append(pool, live, t, 0, 4000000000u), BAD, "2^31");
  FAILS(pkv_seq_append(pool, live, t, 4, 60), PKV_E_OUT_OF_BLOCKS, "are free");

  FAILS(pkv_seq_blocks_needed(nullptr, live, 1, 0, &n), BAD, "pool is NULL");
  FAILS(pkv_seq_blocks_needed(pool, stale, 1, 0, &n), PKV_E_NOT_FOUND, "stale");
  FAILS(pkv_seq_blocks_needed(pool, live, 1, 0, nullptr), BAD, "out_blocks");

  FAILS(pkv_seq_fork(nullptr, live, &child), BAD, "pool is NULL");
  FAILS(pkv_seq_fork(pool, stale, &child), PKV_E_NOT_FOUND, "stale");
  FAILS(pkv_seq_fork(pool, live, nullptr), BAD, "out_child");

  FAILS(pkv_seq_truncate(nullptr, live, 1), BAD, "pool is NULL");
  FAILS(pkv_seq_truncate(pool, stale, 1), PKV_E_NOT_FOUND, "stale");
  FAILS(pkv_seq_truncate(pool, live, 7), BAD, "num_tokens 7");

  FAILS(pkv_seq_free(nullptr, live), BAD, "pool is NULL");
  FAILS(pkv_seq_free(pool, stale), PKV_E_NOT_FOUND, "stale");
  FAILS(pkv_seq_free(manager, live), PKV_E_NOT_FOUND, "stale");  // another pool's id
}

TEST_F(ErrorPaths, BatchedCalls) {
  int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  pkv_block_hash h[2];
  std::memset(h, 0, sizeof h);
  pkv_seq_id id = 0, twice[2] = {live, live}, ids[2] = {live, stale};
  uint64_t n = 0;
  pkv_batch* b = nullptr;
  FAILS(pkv_seq_append_batch(pool, ids, t, 2), PKV_E_NOT_FOUND, "seqs[1]");
  FAILS(pkv_seq_append_batch(pool, twice, t, 2), BAD, "appears twice");
  FAILS(pkv_seq_free_batch(pool, ids, 2), PKV_E_NOT_FOUND, "seqs[1]");
  FAILS(pkv_batch_prepare_decode(pool, twice, t, 2, 0, nullptr, &b), BAD, "appears twice");
  // pkv_seq_admit's messages named pkv_seq_admit_hashes, which it called.
  FAILS(pkv_seq_admit(pool, nullptr, t, 8, 0, nullptr, &n), BAD, "out_seq");
  FAILS(pkv_seq_admit(pool, nullptr, t, 8, 60, &id, &n), PKV_E_OUT_OF_BLOCKS, "are free");
  // A count of hashes beyond the prompt's full blocks is refused before
  // hashes[] is read: a huge one was PKV_E_OUT_OF_MEMORY (and one past the
  // caller's array read past it).
  FAILS(pkv_seq_admit_hashes(pool, nullptr, t, 8, h, uint64_t(1) << 40, 0, &id, &n), BAD,
        "num_hashes 1099511627776 exceeds the 2 full blocks");
  FAILS(pkv_seq_match_prefix_hashes(pool, live, t, 8, h, uint64_t(1) << 40, &n), BAD,
        "num_hashes 1099511627776 exceeds");
  FAILS(pkv_seq_admit_hashes(pool, nullptr, t, 8, h, 2, 0, &id, &n), BAD, "hashes[0]");
}

TEST_F(ErrorPaths, SeqQueries) {
  pkv_seq_info info;
  pkv_seq_info_init(&info);
  FAILS(pkv_seq_get_info(nullptr, live, &info), BAD, "pool is NULL");
  FAILS(pkv_seq_get_info(pool, stale, &info), PKV_E_NOT_FOUND, "stale");
  FAILS(pkv_seq_get_info(pool, live, nullptr), BAD, "out is NULL");
  info.struct_size = 0;
  FAILS(pkv_seq_get_info(pool, live, &info), BAD, "out->struct_size");

  int32_t tb[4];
  uint64_t len = 77;
  FAILS(pkv_seq_get_block_table(nullptr, live, tb, 4, &len), BAD, "pool is NULL");
  FAILS(pkv_seq_get_block_table(pool, stale, tb, 4, &len), PKV_E_NOT_FOUND, "stale");
  FAILS(pkv_seq_get_block_table(pool, live, nullptr, 4, &len), BAD, "out_blocks");
  FAILS(pkv_seq_get_block_table(pool, live, tb, 4, nullptr), BAD, "out_len");
  FAILS(pkv_seq_get_block_table(pool, live, tb, 1, &len), PKV_E_BUFFER_TOO_SMALL, "out_blocks");
  EXPECT_EQ(len, 2u);

  pkv_block_hash hs[1];
  FAILS(pkv_seq_get_block_hashes(nullptr, live, hs, 1, &len), BAD, "pool is NULL");
  FAILS(pkv_seq_get_block_hashes(pool, stale, hs, 1, &len), PKV_E_NOT_FOUND, "stale");
  FAILS(pkv_seq_get_block_hashes(pool, live, nullptr, 1, &len), BAD, "out_hashes");
  FAILS(pkv_seq_get_block_hashes(pool, live, hs, 1, nullptr), BAD, "out_len");
  FAILS(pkv_seq_get_block_hashes(pool, live, hs, 0, &len), PKV_E_BUFFER_TOO_SMALL, "out_hashes");
  EXPECT_EQ(len, 1u);
}

TEST_F(ErrorPaths, StatsEventsValidation) {
  pkv_pool_stats s;
  pkv_pool_stats_init(&s);
  FAILS(pkv_pool_get_stats(nullptr, &s), BAD, "pool is NULL");
  FAILS(pkv_pool_get_stats(pool, nullptr), BAD, "out is NULL");
  s.struct_size = 16;
  FAILS(pkv_pool_get_stats(pool, &s), BAD, "out->struct_size");
  pkv_event ev[2];
  uint64_t n;
  FAILS(pkv_pool_drain_events(nullptr, ev, 2, &n), BAD, "pool is NULL");
  FAILS(pkv_pool_drain_events(pool, nullptr, 2, &n), BAD, "out is NULL");
  FAILS(pkv_pool_drain_events(pool, ev, 2, nullptr), BAD, "out_count");
  pkv_event_v2 ev2[2] = {};
  ev2[0].struct_size = sizeof ev2[0];
  int32_t ids[64];
  FAILS(pkv_pool_drain_events_v2(nullptr, ev2, 2, ids, 64, &n), BAD, "pool is NULL");
  FAILS(pkv_pool_drain_events_v2(pool, nullptr, 2, ids, 64, &n), BAD, "out is NULL");
  FAILS(pkv_pool_drain_events_v2(pool, ev2, 2, nullptr, 64, &n), BAD, "token_buf is NULL");
  FAILS(pkv_pool_drain_events_v2(pool, ev2, 2, ids, 64, nullptr), BAD, "out_count");
  ev2[0].struct_size = 8;
  FAILS(pkv_pool_drain_events_v2(pool, ev2, 2, ids, 64, &n), BAD, "out[0]->struct_size");
  pkv_event_publisher* pub = nullptr;
  pkv_event_publisher_options po;
  pkv_event_publisher_options_init(&po);
  FAILS(pkv_event_publisher_create(nullptr, "inproc://e", nullptr, &po, &pub), BAD, "pool is NULL");
  FAILS(pkv_event_publisher_create(pool, nullptr, nullptr, &po, &pub), BAD, "endpoint is NULL");
  FAILS(pkv_event_publisher_create(pool, "inproc://e", nullptr, &po, nullptr), BAD, "out is NULL");
  FAILS(pkv_event_publisher_create(pool, "inproc://e", "", &po, &pub), BAD, "replay_endpoint");
  po.reserved = 1;
  FAILS(pkv_event_publisher_create(pool, "inproc://e", nullptr, &po, &pub), BAD, "reserved");
  FAILS(pkv_event_publisher_publish(nullptr, &n), BAD, "pub is NULL");
  FAILS(pkv_event_publisher_get_stats(nullptr, nullptr), BAD, "pub is NULL");
  char buf[8];
  FAILS(pkv_event_publisher_endpoint(nullptr, 0, buf, sizeof buf, &n), BAD, "pub is NULL");
  EXPECT_EQ(pub, nullptr);
  pkv_event_publisher_destroy(nullptr);
  FAILS(pkv_pool_reset_prefix_cache(nullptr), BAD, "pool is NULL");
  FAILS(pkv_pool_validate(nullptr), BAD, "pool is NULL");
}

TEST_F(ErrorPaths, Storage) {
  pkv_tensor t;
  FAILS(pkv_pool_kv_tensor(nullptr, 0, PKV_KV_KEY, &t), BAD, "pool is NULL");
  FAILS(pkv_pool_kv_tensor(pool, 2, PKV_KV_KEY, &t), BAD, "layer 2");
  FAILS(pkv_pool_kv_tensor(pool, 0, 2, &t), BAD, "which 2");
  FAILS(pkv_pool_kv_tensor(pool, 0, PKV_KV_KEY, nullptr), BAD, "out is NULL");
  FAILS(pkv_pool_kv_tensor(manager, 0, PKV_KV_KEY, &t), PKV_E_INVALID_STATE, "no KV storage");

  int32_t ok[1] = {3}, zero[1] = {0}, big[1] = {16};
  FAILS(pkv_pool_copy_blocks(nullptr, ok, ok, 1, nullptr), BAD, "pool is NULL");
  FAILS(pkv_pool_copy_blocks(pool, nullptr, ok, 1, nullptr), BAD, "src is NULL");
  FAILS(pkv_pool_copy_blocks(pool, ok, nullptr, 1, nullptr), BAD, "dst is NULL");
  FAILS(pkv_pool_copy_blocks(pool, zero, ok, 1, nullptr), BAD, "src[0] = 0");
  FAILS(pkv_pool_copy_blocks(pool, ok, big, 1, nullptr), BAD, "dst[0] = 16");
  FAILS(pkv_pool_copy_blocks(manager, ok, ok, 1, nullptr), PKV_E_INVALID_STATE, "no KV storage");
  int32_t chain_src[2] = {1, 2}, chain_dst[2] = {2, 3}, twice_dst[2] = {3, 3};
  FAILS(pkv_pool_copy_blocks(pool, chain_src, chain_dst, 2, nullptr), BAD,
        "src[1] = 2 is also dst[0]");
  FAILS(pkv_pool_copy_blocks(pool, chain_src, twice_dst, 2, nullptr), BAD,
        "dst[0] and dst[1] are both block 3");

  uint64_t bpb = 0;
  ASSERT_EQ(pkv_pool_bytes_per_block(pool, &bpb), PKV_OK);
  std::vector<char> host(bpb);
  FAILS(pkv_pool_swap_blocks(nullptr, ok, 1, host.data(), bpb, PKV_SWAP_OUT, nullptr), BAD,
        "pool is NULL");
  FAILS(pkv_pool_swap_blocks(pool, nullptr, 1, host.data(), bpb, PKV_SWAP_OUT, nullptr), BAD,
        "blocks is NULL");
  FAILS(pkv_pool_swap_blocks(pool, ok, 1, nullptr, bpb, PKV_SWAP_OUT, nullptr), BAD,
        "host_buffer is NULL");
  FAILS(pkv_pool_swap_blocks(pool, ok, 1, host.data(), bpb, 2, nullptr), BAD, "direction 2");
  FAILS(pkv_pool_swap_blocks(pool, ok, 1, host.data(), bpb - 1, PKV_SWAP_IN, nullptr), BAD,
        "host_bytes");
  FAILS(pkv_pool_swap_blocks(pool, big, 1, host.data(), bpb, PKV_SWAP_IN, nullptr), BAD,
        "blocks[0] = 16");
  FAILS(pkv_pool_swap_blocks(manager, ok, 1, host.data(), bpb, PKV_SWAP_IN, nullptr),
        PKV_E_INVALID_STATE, "no KV storage");
}

TEST_F(ErrorPaths, BatchPrepareAndQueries) {
  pkv_batch* b = nullptr;
  uint32_t q[2] = {1, 1};
  pkv_seq_id two[2] = {live, live};
  FAILS(pkv_batch_prepare(nullptr, &live, q, 1, nullptr, &b), BAD, "pool is NULL");
  FAILS(pkv_batch_prepare(pool, nullptr, q, 1, nullptr, &b), BAD, "seqs is NULL");
  FAILS(pkv_batch_prepare(pool, &live, nullptr, 1, nullptr, &b), BAD, "query_counts is NULL");
  FAILS(pkv_batch_prepare(pool, &live, q, 1, nullptr, nullptr), BAD, "out is NULL");
  FAILS(pkv_batch_prepare(pool, &live, q, 0, nullptr, &b), BAD, "num_seqs is 0");
  FAILS(pkv_batch_prepare(pool, &stale, q, 1, nullptr, &b), PKV_E_NOT_FOUND, "seqs[0]");
  FAILS(pkv_batch_prepare(pool, two, q, 2, nullptr, &b), BAD, "twice");
  uint32_t zero = 0, seven = 7;
  FAILS(pkv_batch_prepare(pool, &live, &zero, 1, nullptr, &b), BAD, "query_counts[0] = 0");
  FAILS(pkv_batch_prepare(pool, &live, &seven, 1, nullptr, &b), BAD, "query_counts[0] = 7");
  EXPECT_EQ(b, nullptr);
  const uint32_t pt = PKV_PREPARE_PERSISTENT_TABLE;
  FAILS(pkv_batch_prepare_ex(nullptr, &live, q, 1, pt, nullptr, &b), BAD, "pool is NULL");
  FAILS(pkv_batch_prepare_ex(pool, &live, q, 1, pt, nullptr, nullptr), BAD, "out is NULL");
  FAILS(pkv_batch_prepare_ex(pool, &live, q, 1, 2, nullptr, &b), BAD, "flags 2");
  FAILS(pkv_batch_prepare_ex(pool, &live, q, 1, pt | 0x80000000u, nullptr, &b), BAD, "flags");
  FAILS(pkv_batch_prepare_ex(pool, &stale, q, 1, pt, nullptr, &b), PKV_E_NOT_FOUND, "seqs[0]");
  FAILS(pkv_batch_prepare_ex(pool, two, q, 2, pt, nullptr, &b), BAD, "twice");
  FAILS(pkv_batch_prepare_ex(pool, &live, &seven, 1, pt, nullptr, &b), BAD, "query_counts[0] = 7");
  EXPECT_EQ(b, nullptr);

  pkv_batch_info info;
  pkv_batch_info_init(&info);
  FAILS(pkv_batch_get_info(nullptr, &info), BAD, "batch is NULL");
  FAILS(pkv_batch_get_info(batch, nullptr), BAD, "out is NULL");
  info.struct_size = 1;
  FAILS(pkv_batch_get_info(batch, &info), BAD, "out->struct_size");
  pkv_tensor t;
  FAILS(pkv_batch_plan_tensor(nullptr, 0, &t), BAD, "batch is NULL");
  FAILS(pkv_batch_plan_tensor(batch, 6, &t), BAD, "which 6");
  FAILS(pkv_batch_plan_tensor(batch, 0, nullptr), BAD, "out is NULL");
  FAILS(pkv_batch_token_positions(nullptr, &t), BAD, "batch is NULL");
  FAILS(pkv_batch_token_positions(batch, nullptr), BAD, "out is NULL");
  FAILS(pkv_batch_last_token_indices(nullptr, &t), BAD, "batch is NULL");
  FAILS(pkv_batch_last_token_indices(batch, nullptr), BAD, "out is NULL");
}

TEST_F(ErrorPaths, CacheWrite) {
  FAILS(pkv_cache_write(nullptr, 0, &kt, &kt, nullptr), BAD, "batch is NULL");
  FAILS(pkv_cache_write(batch, 0, nullptr, &kt, nullptr), BAD, "k is NULL");
  FAILS(pkv_cache_write(batch, 0, &kt, nullptr, nullptr), BAD, "v is NULL");
  FAILS(pkv_cache_write(batch, 2, &kt, &kt, nullptr), BAD, "layer 2");
  pkv_tensor bad = kt;
  bad.dtype = PKV_DTYPE_BF16;
  FAILS(pkv_cache_write(batch, 0, &kt, &bad, nullptr), BAD, "v has dtype bf16");
  bad = kt;
  bad.shape[1] = 3;
  FAILS(pkv_cache_write(batch, 0, &bad, &kt, nullptr), BAD, "k has shape");
  bad = kt;
  bad.ndim = 2;
  FAILS(pkv_cache_write(batch, 0, &bad, &kt, nullptr), BAD, "k has ndim 2");
  bad = kt;
  bad.device_type = PKV_DEVICE_CUDA;
  FAILS(pkv_cache_write(batch, 0, &bad, &kt, nullptr), BAD, "k is on device");
  bad = kt;
  bad.strides[2] = 2;
  FAILS(pkv_cache_write(batch, 0, &bad, &kt, nullptr), BAD, "innermost stride");
  int32_t one = 7;
  ASSERT_EQ(pkv_seq_append(pool, live, &one, 1, 0), PKV_OK);  // the plan is now stale
  FAILS(pkv_cache_write(batch, 0, &kt, &kt, nullptr), PKV_E_INVALID_STATE, "stale");
}

TEST_F(ErrorPaths, Attention) {
  pkv_attention_params p;
  pkv_attention_params_init(&p);
  FAILS(pkv_attention_forward(nullptr, 0, &qt, &ot, nullptr, &p, nullptr), BAD, "batch is NULL");
  FAILS(pkv_attention_forward(batch, 0, nullptr, &ot, nullptr, &p, nullptr), BAD, "q is NULL");
  FAILS(pkv_attention_forward(batch, 0, &qt, nullptr, nullptr, &p, nullptr), BAD, "out is NULL");
  FAILS(pkv_attention_forward(batch, 2, &qt, &ot, nullptr, &p, nullptr), BAD, "layer 2");
  p.struct_size = 3;
  FAILS(pkv_attention_forward(batch, 0, &qt, &ot, nullptr, &p, nullptr), BAD,
        "params->struct_size");
  pkv_attention_params_init(&p);
  p.softmax_scale = -2.f;
  FAILS(pkv_attention_forward(batch, 0, &qt, &ot, nullptr, &p, nullptr), BAD, "softmax_scale");
  pkv_attention_params_init(&p);
  p.logit_softcap = -1.f;
  FAILS(pkv_attention_forward(batch, 0, &qt, &ot, nullptr, &p, nullptr), BAD, "logit_softcap");
  pkv_tensor bad = qt;
  bad.shape[1] = 3;  // not a multiple of 2 kv heads
  FAILS(pkv_attention_forward(batch, 0, &bad, &ot, nullptr, nullptr, nullptr), BAD, "q has shape");
  bad = ot;
  bad.shape[1] = 2;
  FAILS(pkv_attention_forward(batch, 0, &qt, &bad, nullptr, nullptr, nullptr), BAD,
        "out has shape");
  bad = lt;
  bad.dtype = PKV_DTYPE_F16;
  FAILS(pkv_attention_forward(batch, 0, &qt, &ot, &bad, nullptr, nullptr), BAD, "lse has dtype");
  bad = lt;
  bad.shape[1] = 2;
  FAILS(pkv_attention_forward(batch, 0, &qt, &ot, &bad, nullptr, nullptr), BAD, "lse has shape");
  int32_t one = 7;
  ASSERT_EQ(pkv_seq_append(pool, live, &one, 1, 0), PKV_OK);
  FAILS(pkv_attention_forward(batch, 0, &qt, &ot, &lt, nullptr, nullptr), PKV_E_INVALID_STATE,
        "stale");
}

// MLA calls (issue 19): NULLs and a pool that is not MLA (this fixture's);
// MLA pools' own argument errors are in mla_test.cpp and the bad-input
// matrix.
TEST_F(ErrorPaths, MlaCalls) {
  pkv_attention_params p;
  pkv_attention_params_init(&p);
  p.softmax_scale = 0.1f;
  FAILS(pkv_mla_cache_write(nullptr, 0, &kt, &kt, nullptr), BAD, "batch is NULL");
  FAILS(pkv_mla_cache_write(batch, 0, nullptr, &kt, nullptr), BAD, "kv_c is NULL");
  FAILS(pkv_mla_cache_write(batch, 0, &kt, &kt, nullptr), PKV_E_INVALID_STATE, "needs an MLA pool");
  FAILS(pkv_mla_attention(nullptr, 0, &qt, &qt, &ot, nullptr, &p, nullptr), BAD, "batch is NULL");
  FAILS(pkv_mla_attention(batch, 0, nullptr, &qt, &ot, nullptr, &p, nullptr), BAD,
        "q_latent is NULL");
  FAILS(pkv_mla_attention(batch, 0, &qt, &qt, nullptr, nullptr, &p, nullptr), BAD, "out is NULL");
  FAILS(pkv_mla_attention(batch, 0, &qt, &qt, &ot, nullptr, nullptr, nullptr), BAD,
        "params is NULL");
  FAILS(pkv_mla_attention(batch, 0, &qt, &qt, &ot, nullptr, &p, nullptr), PKV_E_INVALID_STATE,
        "needs an MLA pool");
}

// Partial-block hits and retention priorities (issue 22).
TEST_F(ErrorPaths, PartialHitsAndRetention) {
  int32_t t[4] = {1, 2, 3, 4};
  pkv_prefix_match m;
  pkv_prefix_match_init(&m);
  FAILS(pkv_seq_match_prefix_partial(nullptr, live, t, 4, &m), BAD, "pool is NULL");
  FAILS(pkv_seq_match_prefix_partial(pool, stale, t, 4, &m), PKV_E_NOT_FOUND, "stale");
  FAILS(pkv_seq_match_prefix_partial(pool, live, nullptr, 4, &m), BAD, "tokens is NULL");
  FAILS(pkv_seq_match_prefix_partial(pool, live, t, 4, nullptr), BAD, "out is NULL");
  m.struct_size = 3;
  FAILS(pkv_seq_match_prefix_partial(pool, live, t, 4, &m), BAD, "struct_size");
  pkv_prefix_match_init(&m);
  FAILS(pkv_seq_match_prefix_partial(pool, live, t, 4, &m), PKV_E_INVALID_STATE, "empty sequence");

  pkv_retention_range r = {0, 4, 50, 0, 0};
  FAILS(pkv_seq_set_retention(nullptr, live, &r, 1), BAD, "pool is NULL");
  FAILS(pkv_seq_set_retention(pool, live, nullptr, 1), BAD, "ranges is NULL");
  FAILS(pkv_seq_set_retention(pool, stale, &r, 1), PKV_E_NOT_FOUND, "stale");
  FAILS(pkv_seq_set_retention(pool, live, &r, 1), PKV_E_INVALID_STATE, "enable_retention");
  r.reserved = 2;
  FAILS(pkv_seq_set_retention(pool, live, &r, 1), BAD, "ranges[0].reserved");
  // An unknown sequence is named before what is wrong with its ranges.
  FAILS(pkv_seq_set_retention(pool, stale, &r, 1), PKV_E_NOT_FOUND, "stale");
  std::vector<pkv_retention_range> many(PKV_RETENTION_MAX_RANGES + 1,
                                        pkv_retention_range{0, 4, 50, 0, 0});
  FAILS(pkv_seq_set_retention(pool, live, many.data(), many.size()), BAD, "num_ranges");
  FAILS(pkv_seq_set_retention(pool, stale, many.data(), many.size()), PKV_E_NOT_FOUND, "stale");

  uint64_t counts[PKV_PRIORITY_MAX + 1], len = 0;
  FAILS(pkv_pool_set_clock(nullptr, 1), BAD, "pool is NULL");
  FAILS(pkv_pool_get_priority_counts(nullptr, counts, 101, &len), BAD, "pool is NULL");
  FAILS(pkv_pool_get_priority_counts(pool, nullptr, 101, &len), BAD, "out_counts is NULL");
  FAILS(pkv_pool_get_priority_counts(pool, counts, 101, nullptr), BAD, "out_len is NULL");
  FAILS(pkv_pool_get_priority_counts(pool, counts, 100, &len), PKV_E_BUFFER_TOO_SMALL, "101");
  EXPECT_EQ(len, 101u);
}

// Offload tiers (issue 20).
TEST_F(ErrorPaths, Tiers) {
  pkv_tier_options o;
  pkv_tier_options_init(&o);
  o.host_bytes = 1 << 20;
  FAILS(pkv_pool_attach_tiers(nullptr, &o), BAD, "pool is NULL");
  FAILS(pkv_pool_attach_tiers(pool, nullptr), BAD, "opts is NULL");
  FAILS(pkv_pool_attach_tiers(manager, &o), PKV_E_INVALID_STATE, "manager-only");
  o.struct_size = 3;
  FAILS(pkv_pool_attach_tiers(pool, &o), BAD, "struct_size");
  pkv_tier_options_init(&o);
  o.host_bytes = 1;
  FAILS(pkv_pool_attach_tiers(pool, &o), BAD, "opts->host_bytes");
  o.host_bytes = 1 << 20;
  o.file_bytes = 1 << 20;
  FAILS(pkv_pool_attach_tiers(pool, &o), BAD, "opts->file_bytes");
  o.file_dir = "/nonexistent-pagedkv-dir";
  FAILS(pkv_pool_attach_tiers(pool, &o), BAD, "opts->file_dir");
  pkv_tier_stats st;
  pkv_tier_stats_init(&st);
  FAILS(pkv_pool_get_tier_stats(pool, PKV_MEDIUM_HOST, &st), PKV_E_INVALID_STATE, "no host tier");
  pkv_tier_options_init(&o);
  o.host_bytes = 1 << 20;
  ASSERT_EQ(pkv_pool_attach_tiers(pool, &o), PKV_OK) << pkv_last_error_message();
  FAILS(pkv_pool_attach_tiers(pool, &o), PKV_E_INVALID_STATE, "already");
  FAILS(pkv_pool_get_tier_stats(nullptr, PKV_MEDIUM_HOST, &st), BAD, "pool is NULL");
  FAILS(pkv_pool_get_tier_stats(pool, PKV_MEDIUM_HOST, nullptr), BAD, "out is NULL");
  FAILS(pkv_pool_get_tier_stats(pool, PKV_MEDIUM_DEVICE, &st), BAD, "medium");
  FAILS(pkv_pool_get_tier_stats(pool, PKV_MEDIUM_FILE, &st), PKV_E_INVALID_STATE, "no file tier");
  ASSERT_EQ(pkv_pool_get_tier_stats(pool, PKV_MEDIUM_HOST, &st), PKV_OK);
  EXPECT_EQ(st.capacity_blocks, (1u << 20) / (4 * 2 * 8 * 4 * 2 * 2));

  int32_t t[4] = {1, 2, 3, 4};
  pkv_tier_match m;
  pkv_tier_match_init(&m);
  FAILS(pkv_seq_match_prefix_tiered(nullptr, live, t, 4, &m), BAD, "pool is NULL");
  FAILS(pkv_seq_match_prefix_tiered(pool, stale, t, 4, &m), PKV_E_NOT_FOUND, "stale");
  FAILS(pkv_seq_match_prefix_tiered(pool, live, nullptr, 4, &m), BAD, "tokens is NULL");
  FAILS(pkv_seq_match_prefix_tiered(pool, live, t, 4, nullptr), BAD, "out is NULL");
  m.struct_size = 3;
  FAILS(pkv_seq_match_prefix_tiered(pool, live, t, 4, &m), BAD, "struct_size");
  pkv_tier_match_init(&m);
  FAILS(pkv_seq_match_prefix_tiered(pool, live, t, 4, &m), PKV_E_INVALID_STATE, "empty sequence");
  FAILS(pkv_pool_flush_tiers(nullptr), BAD, "pool is NULL");
  EXPECT_EQ(pkv_pool_flush_tiers(pool), PKV_OK);
  EXPECT_EQ(pkv_pool_validate(pool), PKV_OK);
}

TEST(NonFallible, NullArgumentsAreHarmless) {
  pkv_pool_options_init(nullptr);
  pkv_seq_options_init(nullptr);
  pkv_seq_info_init(nullptr);
  pkv_pool_stats_init(nullptr);
  pkv_batch_info_init(nullptr);
  pkv_attention_params_init(nullptr);
  pkv_hash_options_init(nullptr);
  pkv_pool_destroy(nullptr);
  pkv_batch_destroy(nullptr);
  EXPECT_EQ(pkv_last_error_copy(nullptr, 10), std::strlen(pkv_last_error_message()));
  EXPECT_STREQ(pkv_status_string(-99), "unknown pkv_status");
  EXPECT_EQ(pkv_dtype_size(0), 0u);
  EXPECT_EQ(pkv_hash_size(0), 0u);
}

TEST(NonFallible, MessagesAreThreadLocal) {
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(nullptr, &p), PKV_E_INVALID_ARGUMENT);
  std::string mine = pkv_last_error_message();
  std::string theirs = "unset";
  std::thread([&] { theirs = pkv_last_error_message(); }).join();
  EXPECT_EQ(theirs, "");
  EXPECT_EQ(mine, pkv_last_error_message());
}

}  // namespace
