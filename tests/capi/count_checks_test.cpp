// Counts the library can check against other arguments (or its limits) are
// checked before a caller array is read: each caller array here ends at a
// PROT_NONE page, so a read past it crashes the test instead of passing
// unnoticed. Also: arithmetic on such counts cannot overflow, and a failed
// call leaves its outputs as they were. Linked against libpagedkv.so.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

// `bytes` of zeroed memory that end exactly where an inaccessible page
// begins: a read one byte past them faults.
class Guarded {
 public:
  explicit Guarded(size_t bytes) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    pages_ = (bytes + page - 1) / page + 1;
    len_ = pages_ * page;
    base_ = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(base_, MAP_FAILED);
    char* guard = static_cast<char*>(base_) + len_ - page;
    EXPECT_EQ(mprotect(guard, page, PROT_NONE), 0);
    data_ = guard - bytes;
  }
  ~Guarded() { munmap(base_, len_); }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }

 private:
  void* base_ = nullptr;
  size_t pages_ = 0, len_ = 0;
  char* data_ = nullptr;
};

void expect_error(pkv_status got, pkv_status want, const char* fn, const char* needle) {
  const std::string msg = pkv_last_error_message();
  EXPECT_EQ(got, want) << msg;
  EXPECT_EQ(msg.rfind(std::string(fn) + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << "message \"" << msg << "\" lacks " << needle;
}

pkv_pool_options manager_opts() {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 64;
  return o;
}

pkv_kv_group_spec full_spec() {
  pkv_kv_group_spec g;
  pkv_kv_group_spec_init(&g);
  g.num_kv_heads = 1;
  g.head_dim = 8;
  return g;
}

TEST(CountChecks, CreateGroupsRefusesNumGroupsBeyond64BeforeReadingThem) {
  const pkv_pool_options base = manager_opts();
  Guarded mem(2 * sizeof(pkv_kv_group_spec));
  pkv_kv_group_spec* specs = mem.as<pkv_kv_group_spec>();
  specs[0] = specs[1] = full_spec();
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create_groups(&base, specs, 2, &p), PKV_OK) << pkv_last_error_message();
  pkv_pool_destroy(p);
  p = nullptr;
  // groups[2] lies past the caller's array: 100 groups must be refused
  // before any of them is read.
  for (uint32_t n : {65u, 100u, 0xffffffffu}) {
    expect_error(pkv_pool_create_groups(&base, specs, n, &p), PKV_E_INVALID_ARGUMENT,
                 "pkv_pool_create_groups", "num_groups");
    EXPECT_EQ(p, nullptr);
  }
}

TEST(CountChecks, CreateGroupsRefusesNumLayersBeyondTheLimitBeforeReadingLayerIds) {
  const pkv_pool_options base = manager_opts();
  Guarded mem(sizeof(uint32_t));
  mem.as<uint32_t>()[0] = 0;
  pkv_kv_group_spec g = full_spec();
  g.layer_ids = mem.as<uint32_t>();
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create_groups(&base, &g, 1, &p), PKV_OK) << pkv_last_error_message();
  pkv_pool_destroy(p);
  p = nullptr;
  for (uint32_t n : {65537u, 0xffffffffu}) {
    g.num_layers = n;
    expect_error(pkv_pool_create_groups(&base, &g, 1, &p), PKV_E_INVALID_ARGUMENT,
                 "pkv_pool_create_groups", "groups[0].num_layers");
    EXPECT_EQ(p, nullptr);
  }
}

TEST(CountChecks, CreateGroupsBlockBytesCannotWrap) {
  // state_bytes 2^34 times 2^30 layers was 2^64: a block of 0 bytes, and
  // memory_budget_bytes / 0 killed the process (SIGFPE).
  pkv_pool_options base = manager_opts();
  base.num_blocks = 0;
  base.memory_budget_bytes = uint64_t(1) << 40;
  pkv_kv_group_spec g;
  pkv_kv_group_spec_init(&g);
  g.kind = PKV_GROUP_RECURRENT;
  g.state_bytes = uint64_t(1) << 34;
  g.num_layers = 1u << 30;
  pkv_pool* p = nullptr;
  expect_error(pkv_pool_create_groups(&base, &g, 1, &p), PKV_E_INVALID_ARGUMENT,
               "pkv_pool_create_groups", "num_layers");
  EXPECT_EQ(p, nullptr);
  // Within the limits, a block and the arena stay inside 64 bits or are
  // refused: the largest recurrent page (2^34 * 2^16 bytes) times 2^30
  // blocks overflows.
  g.num_layers = 65536;
  base.num_blocks = uint64_t(1) << 30;
  base.memory_budget_bytes = 0;
  expect_error(pkv_pool_create_groups(&base, &g, 1, &p), PKV_E_INVALID_ARGUMENT,
               "pkv_pool_create_groups", "overflows");
  EXPECT_EQ(p, nullptr);
}

// pkv_seq_blocks_needed of a count the sequence could never hold: a
// multi-group pool summed n0 + num_tokens + num_lookahead in 64 bits and
// answered PKV_OK with the wrapped count (2^64 - 2^32 + 4 tokens and
// 2^32 - 1 lookahead slots "needed" 1 block, an append that is refused),
// where a single-group pool and the append itself answer
// PKV_E_INVALID_ARGUMENT.
TEST(CountChecks, GroupBlocksNeededRefusesCountsBeyondTheSlotLimit) {
  const pkv_pool_options base = manager_opts();
  const pkv_kv_group_spec g = full_spec();
  pkv_pool* pools[2] = {nullptr, nullptr};
  ASSERT_EQ(pkv_pool_create(&base, &pools[0]), PKV_OK) << pkv_last_error_message();
  ASSERT_EQ(pkv_pool_create_groups(&base, &g, 1, &pools[1]), PKV_OK) << pkv_last_error_message();
  for (pkv_pool* p : pools) {
    pkv_seq_id s = 0;
    ASSERT_EQ(pkv_seq_create(p, nullptr, &s), PKV_OK);
    const int32_t tokens[2] = {1, 2};
    ASSERT_EQ(pkv_seq_append(p, s, tokens, 2, 0), PKV_OK);
    const struct {
      uint64_t n;
      uint32_t lookahead;
    } cases[] = {{(uint64_t(0) - (uint64_t(1) << 32)) + 4, UINT32_MAX},
                 {UINT64_MAX, UINT32_MAX},
                 {uint64_t(1) << 40, 0},
                 {0, UINT32_MAX}};
    for (const auto& c : cases) {
      uint64_t need = 12345;
      expect_error(pkv_seq_blocks_needed(p, s, c.n, c.lookahead, &need), PKV_E_INVALID_ARGUMENT,
                   "pkv_seq_blocks_needed", "more than 2^31 - 1");
      EXPECT_EQ(need, 12345u);
    }
    uint64_t need = 0;
    ASSERT_EQ(pkv_seq_blocks_needed(p, s, 7, 0, &need), PKV_OK);
    EXPECT_EQ(need, 2u);  // tokens 2..8 of blocks of 4: blocks 1 and 2
    pkv_pool_destroy(p);
  }
}

TEST(CountChecks, GroupBlockTableTooSmallLeavesTheBufferAlone) {
  const pkv_pool_options base = manager_opts();
  const pkv_kv_group_spec g = full_spec();
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create_groups(&base, &g, 1, &p), PKV_OK) << pkv_last_error_message();
  pkv_seq_id s = 0;
  ASSERT_EQ(pkv_seq_create(p, nullptr, &s), PKV_OK);
  const int32_t tokens[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  ASSERT_EQ(pkv_seq_append(p, s, tokens, 10, 0), PKV_OK);  // 3 blocks
  int32_t out[4] = {-7, -7, -7, -7};
  uint64_t len = 0;
  expect_error(pkv_seq_group_block_table(p, s, 0, out, 2, &len), PKV_E_BUFFER_TOO_SMALL,
               "pkv_seq_group_block_table", "out_blocks");
  EXPECT_EQ(len, 3u);
  expect_error(pkv_seq_get_block_table(p, s, out, 2, &len), PKV_E_BUFFER_TOO_SMALL,
               "pkv_seq_get_block_table", "out_blocks");
  EXPECT_EQ(len, 3u);
  for (int32_t v : out) EXPECT_EQ(v, -7);
  ASSERT_EQ(pkv_seq_group_block_table(p, s, 0, out, 4, &len), PKV_OK);
  EXPECT_EQ(len, 3u);
  EXPECT_GT(out[0], 0);
  EXPECT_EQ(out[3], -7);
  pkv_pool_destroy(p);
}

pkv_pool_options fp8_opts() {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 8;
  o.num_layers = 1;
  o.num_kv_heads = 2;
  o.head_dim = 8;
  o.dtype = PKV_DTYPE_FP8_E4M3;
  o.num_threads = 1;
  return o;
}

TEST(CountChecks, PoolCreateChecksNumKvScalesBeforeReadingTheScales) {
  Guarded k(sizeof(float)), v(sizeof(float));
  k.as<float>()[0] = 1.0f;
  v.as<float>()[0] = 2.0f;
  pkv_pool_options o = fp8_opts();
  o.k_scales = k.as<float>();
  o.v_scales = v.as<float>();
  o.num_kv_scales = 1;  // per tensor, one layer
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  pkv_pool_destroy(p);
  p = nullptr;
  for (uint32_t n : {2u, 1u << 20, 0xffffffffu}) {
    o.num_kv_scales = n;
    expect_error(pkv_pool_create(&o, &p), PKV_E_INVALID_ARGUMENT, "pkv_pool_create",
                 "num_kv_scales");
    EXPECT_EQ(p, nullptr);
  }
  // Per head: num_layers * num_kv_heads = 2 scales.
  o.kv_scale_granularity = PKV_KV_SCALE_PER_HEAD;
  for (uint32_t n : {1u, 3u}) {
    o.num_kv_scales = n;
    expect_error(pkv_pool_create(&o, &p), PKV_E_INVALID_ARGUMENT, "pkv_pool_create", "expected 2");
  }
  // A granularity that is no PKV_KV_SCALE_* is named before any scale is read.
  o.kv_scale_granularity = 7;
  o.num_kv_scales = 1000;
  expect_error(pkv_pool_create(&o, &p), PKV_E_INVALID_ARGUMENT, "pkv_pool_create",
               "kv_scale_granularity");
  // A dtype that takes no scales: named as before, nothing read.
  o = fp8_opts();
  o.dtype = PKV_DTYPE_BF16;
  o.k_scales = k.as<float>();
  o.v_scales = v.as<float>();
  o.num_kv_scales = 1000;
  expect_error(pkv_pool_create(&o, &p), PKV_E_INVALID_ARGUMENT, "pkv_pool_create",
               "fp8 pools only");
  EXPECT_EQ(p, nullptr);
}

TEST(CountChecks, SwapBlocksChecksHostBytesBeforeReadingBlocks) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 16;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = 4;
  o.dtype = PKV_DTYPE_F32;
  o.num_threads = 1;
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  uint64_t bpb = 0;
  ASSERT_EQ(pkv_pool_bytes_per_block(p, &bpb), PKV_OK);
  std::vector<uint8_t> host(bpb);
  Guarded ids(sizeof(int32_t));
  ids.as<int32_t>()[0] = 1;
  ASSERT_EQ(pkv_pool_swap_blocks(p, ids.as<int32_t>(), 1, host.data(), bpb, PKV_SWAP_OUT, nullptr),
            PKV_OK)
      << pkv_last_error_message();
  // host_bytes holds one block: num_blocks 2 (or a count whose bytes wrap)
  // is refused before blocks[1], past the caller's array, is read.
  for (uint64_t n : {uint64_t(2), uint64_t(1) << 62, ~uint64_t(0)}) {
    expect_error(
        pkv_pool_swap_blocks(p, ids.as<int32_t>(), n, host.data(), bpb, PKV_SWAP_IN, nullptr),
        PKV_E_INVALID_ARGUMENT, "pkv_pool_swap_blocks", "host_bytes");
  }
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK);
  pkv_pool_destroy(p);
}

TEST(CountChecks, TensorInitRefusesShapesWhoseElementCountOverflows) {
  pkv_tensor t;
  std::memset(&t, 0x5a, sizeof t);
  pkv_tensor before = t;
  float x = 0;
  const int64_t big[3] = {int64_t(1) << 40, int64_t(1) << 40, int64_t(1) << 40};
  expect_error(pkv_tensor_init(&x, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, big, &t),
               PKV_E_INVALID_ARGUMENT, "pkv_tensor_init", "int64");
  EXPECT_EQ(std::memcmp(&t, &before, sizeof t), 0);  // out not written
  const int64_t max2[2] = {2, INT64_MAX};
  expect_error(pkv_tensor_init(&x, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 2, max2, &t),
               PKV_E_INVALID_ARGUMENT, "pkv_tensor_init", "shape[0]");
  // The largest that fits, and zero extents, are fine.
  const int64_t fits[2] = {1, INT64_MAX};
  ASSERT_EQ(pkv_tensor_init(&x, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 2, fits, &t), PKV_OK);
  EXPECT_EQ(t.strides[0], INT64_MAX);
  const int64_t empty[3] = {0, int64_t(1) << 40, int64_t(1) << 20};
  ASSERT_EQ(pkv_tensor_init(&x, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, empty, &t), PKV_OK);
  EXPECT_EQ(t.strides[0], int64_t(1) << 60);
}

}  // namespace
