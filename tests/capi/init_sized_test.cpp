// pkv_X_init and pkv_X_init_sized of every versioned struct, against
// libpagedkv.so as users link it (docs/conventions.md, "Versioned structs"):
// _init writes the struct's frozen size and not a byte more; _init_sized
// writes exactly the size it is given (the defaults, zeros past the fields
// the library knows) or, for a bad size or NULL, fails and writes nothing;
// structs of the first released size are taken by the calls that read or
// fill them.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "assert_ok.h"
#include "pagedkv/pagedkv.h"

namespace {

constexpr size_t kMaxStructSize = size_t(1) << 16;  // capi/src/capi_util.h

constexpr size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// One versioned struct: its size in this header, the size its _init writes
// forever (through the last field it had when _init_sized was added: stated
// here on its own, so that a change of the library's frozen size fails), the
// first released size, and its two initialisers.
struct Versioned {
  const char* name;
  size_t size;
  size_t frozen;
  size_t v1;
  void (*init)(void*);
  pkv_status (*init_sized)(void*, size_t);
};

#define PKV_VERSIONED(T, last, v1)                                                            \
  Versioned {                                                                                 \
#T, sizeof(T), round_up(offsetof(T, last) + sizeof(T::last), alignof(T)), v1,               \
        [](void* p) { T##_init(static_cast<T*>(p)); },                                           \
        [](void* p, size_t n) { return T##_init_sized(static_cast<T*>(p), n); } \
  }

const std::vector<Versioned>& structs() {
  static const std::vector<Versioned> all = {
      PKV_VERSIONED(pkv_pool_options, qk_rope_head_dim,
                    offsetof(pkv_pool_options, strict_key_domains)),
      PKV_VERSIONED(pkv_seq_options, lora_path, offsetof(pkv_seq_options, lora_name)),
      PKV_VERSIONED(pkv_seq_info, num_computed_tokens, offsetof(pkv_seq_info, num_computed_tokens)),
      PKV_VERSIONED(pkv_prefix_match, copy_dst, sizeof(pkv_prefix_match)),
      PKV_VERSIONED(pkv_pool_stats, num_pins_degraded, offsetof(pkv_pool_stats, num_partial_hits)),
      PKV_VERSIONED(pkv_hash_options, lora_path, offsetof(pkv_hash_options, lora_name)),
      PKV_VERSIONED(pkv_batch_info, block_size, sizeof(pkv_batch_info)),
      PKV_VERSIONED(pkv_attention_params, logit_softcap, sizeof(pkv_attention_params)),
      PKV_VERSIONED(pkv_tier_options, file_bytes, sizeof(pkv_tier_options)),
      PKV_VERSIONED(pkv_tier_match, file_tokens, sizeof(pkv_tier_match)),
      PKV_VERSIONED(pkv_tier_stats, num_dropped, sizeof(pkv_tier_stats)),
      PKV_VERSIONED(pkv_event_publisher_options, device_medium,
                    offsetof(pkv_event_publisher_options, replay_with_topic)),
      PKV_VERSIONED(pkv_event_publisher_stats, replay_requests, sizeof(pkv_event_publisher_stats)),
      PKV_VERSIONED(pkv_kv_group_spec, reserved1, offsetof(pkv_kv_group_spec, flags)),
      PKV_VERSIONED(pkv_group_stats, bytes_per_block, sizeof(pkv_group_stats)),
      PKV_VERSIONED(pkv_transfer_options, reserved0, sizeof(pkv_transfer_options)),
  };
  return all;
}

// A caller's struct of `room` bytes inside canaries: kLead bytes before it
// and kTail after, every byte `fill` to begin with.
constexpr size_t kLead = 16, kTail = 64;

struct Buffer {
  std::vector<unsigned char> bytes;
  explicit Buffer(size_t room, unsigned char fill) : bytes(kLead + room + kTail, fill) {}
  unsigned char* at() { return bytes.data() + kLead; }  // 16-aligned: new's alignment
  uint32_t struct_size() const {
    uint32_t s;
    std::memcpy(&s, bytes.data() + kLead, sizeof s);
    return s;
  }
};

// Indices (relative to the struct) of the bytes of b that are not `fill`
// outside [0, written): what a call wrote where it must not.
std::string stray_writes(const Buffer& b, size_t written, unsigned char fill) {
  std::string out;
  for (size_t i = 0; i < b.bytes.size(); ++i) {
    const long rel = long(i) - long(kLead);
    if (rel >= 0 && size_t(rel) < written) continue;
    if (b.bytes[i] != fill) out += " " + std::to_string(rel);
  }
  return out;
}

// The defaults as plain _init writes them, in a struct of its own size.
std::vector<unsigned char> reference(const Versioned& v) {
  Buffer b(v.size, 0);
  v.init(b.at());
  return std::vector<unsigned char>(b.at(), b.at() + v.size);
}

const unsigned char kFillA = 0xCD, kFillB = 0x32;

TEST(CapiInitSized, InitWritesExactlyTheFrozenSize) {
  for (const Versioned& v : structs()) {
    SCOPED_TRACE(v.name);
    ASSERT_LE(v.frozen, v.size);
    ASSERT_GE(v.frozen, v.v1);
    Buffer a(v.size, kFillA), b(v.size, kFillB);
    v.init(a.at());
    v.init(b.at());
    EXPECT_EQ(a.struct_size(), v.frozen);
    EXPECT_EQ(stray_writes(a, v.frozen, kFillA), "") << "bytes written past the frozen size";
    EXPECT_EQ(stray_writes(b, v.frozen, kFillB), "");
    // Every byte of [0, frozen) is written (the two fills agree there).
    EXPECT_EQ(std::memcmp(a.at(), b.at(), v.frozen), 0) << "bytes of the struct left unwritten";
    v.init(nullptr);  // a no-op
  }
}

TEST(CapiInitSized, WritesExactlySizeBytes) {
  for (const Versioned& v : structs()) {
    const std::vector<unsigned char> ref = reference(v);
    std::vector<size_t> sizes = {v.v1, v.size, v.size + 64};
    if (v.size - 8 > v.v1) sizes.push_back(v.size - 8);
    for (size_t size : sizes) {
      SCOPED_TRACE(std::string(v.name) + " size " + std::to_string(size) + " (sizeof " +
                   std::to_string(v.size) + ", v1 " + std::to_string(v.v1) + ")");
      Buffer a(v.size + 64, kFillA), b(v.size + 64, kFillB);
      ASSERT_EQ(v.init_sized(a.at(), size), PKV_OK) << pkv_last_error_message();
      ASSERT_EQ(v.init_sized(b.at(), size), PKV_OK) << pkv_last_error_message();
      EXPECT_STREQ(pkv_last_error_message(), "");
      EXPECT_EQ(a.struct_size(), size);
      EXPECT_EQ(stray_writes(a, size, kFillA), "") << "bytes written past size";
      EXPECT_EQ(stray_writes(b, size, kFillB), "");
      EXPECT_EQ(std::memcmp(a.at(), b.at(), size), 0) << "bytes of [0, size) left unwritten";
      // The bytes the library knows: what _init writes (struct_size aside).
      const size_t known = std::min(size, v.frozen);
      EXPECT_EQ(std::memcmp(a.at() + 4, ref.data() + 4, known - 4), 0) << "not _init's defaults";
      // A newer header's fields: zero.
      for (size_t i = v.size; i < size; ++i) ASSERT_EQ(a.at()[i], 0) << "byte " << i;
    }
  }
}

TEST(CapiInitSized, BadSizeOrNullFailsAndWritesNothing) {
  for (const Versioned& v : structs()) {
    SCOPED_TRACE(v.name);
    const size_t room = kMaxStructSize + 64;
    for (size_t size : {size_t(0), size_t(4), v.v1 - 1, kMaxStructSize + 1, ~size_t(0)}) {
      SCOPED_TRACE("size " + std::to_string(size));
      Buffer b(room, kFillA);
      EXPECT_EQ(v.init_sized(b.at(), size), PKV_E_INVALID_ARGUMENT);
      const std::string msg = pkv_last_error_message();
      EXPECT_NE(msg.find("size is"), std::string::npos) << msg;
      EXPECT_NE(msg.find(v.name), std::string::npos) << msg;
      EXPECT_EQ(stray_writes(b, 0, kFillA), "") << "a failed call wrote";
    }
    EXPECT_EQ(v.init_sized(nullptr, v.size), PKV_E_INVALID_ARGUMENT);
    EXPECT_NE(std::string(pkv_last_error_message()).find("is NULL"), std::string::npos)
        << pkv_last_error_message();
    // The largest size is fine.
    Buffer b(kMaxStructSize, kFillA);
    EXPECT_EQ(v.init_sized(b.at(), kMaxStructSize), PKV_OK) << pkv_last_error_message();
    EXPECT_EQ(stray_writes(b, kMaxStructSize, kFillA), "");
  }
}

// Structs of the first released size, as an old binary's _init_sized makes
// them, are taken by the calls that read them (fields past their
// struct_size are not read) and filled by the calls that write them (no
// byte past it is written).
TEST(CapiInitSized, FirstReleasedSizesAreTakenByTheApi) {
  const size_t v1 = offsetof(pkv_pool_options, strict_key_domains);
  pkv_pool_options o;
  PKV_ASSERT_OK(pkv_pool_options_init_sized(&o, v1));
  EXPECT_EQ(o.struct_size, v1);
  o.block_size = 4;
  o.num_blocks = 16;
  o.enable_prefix_caching = 1;
  // Past struct_size: not the caller's, never read (each would be refused).
  std::memset(reinterpret_cast<unsigned char*>(&o) + v1, 0xFF, sizeof o - v1);
  pkv_pool* pool = nullptr;
  PKV_ASSERT_OK(pkv_pool_create(&o, &pool));

  // Options read back into a v1-sized struct: nothing past it written.
  Buffer ob(sizeof(pkv_pool_options), kFillA);
  PKV_ASSERT_OK(pkv_pool_options_init_sized(reinterpret_cast<pkv_pool_options*>(ob.at()), v1));
  PKV_ASSERT_OK(pkv_pool_get_options(pool, reinterpret_cast<pkv_pool_options*>(ob.at())));
  EXPECT_EQ(ob.struct_size(), v1);
  EXPECT_EQ(stray_writes(ob, v1, kFillA), "");
  EXPECT_EQ(reinterpret_cast<pkv_pool_options*>(ob.at())->block_size, 4u);

  const size_t seq_v1 = offsetof(pkv_seq_options, lora_name);
  pkv_seq_options so;
  PKV_ASSERT_OK(pkv_seq_options_init_sized(&so, seq_v1));
  std::memset(reinterpret_cast<unsigned char*>(&so) + seq_v1, 0xFF, sizeof so - seq_v1);
  so.lora_id = 7;
  pkv_seq_id s = 0;
  PKV_ASSERT_OK(pkv_seq_create(pool, &so, &s));
  const int32_t toks[6] = {1, 2, 3, 4, 5, 6};
  PKV_ASSERT_OK(pkv_seq_append(pool, s, toks, 6, 0));

  const size_t stats_v1 = offsetof(pkv_pool_stats, num_partial_hits);
  Buffer sb(sizeof(pkv_pool_stats), kFillA);
  PKV_ASSERT_OK(pkv_pool_stats_init_sized(reinterpret_cast<pkv_pool_stats*>(sb.at()), stats_v1));
  PKV_ASSERT_OK(pkv_pool_get_stats(pool, reinterpret_cast<pkv_pool_stats*>(sb.at())));
  EXPECT_EQ(sb.struct_size(), stats_v1);
  EXPECT_EQ(stray_writes(sb, stats_v1, kFillA), "");
  const pkv_pool_stats* st = reinterpret_cast<const pkv_pool_stats*>(sb.at());
  EXPECT_EQ(st->num_blocks, 16u);
  EXPECT_EQ(st->num_seqs, 1u);
  EXPECT_EQ(st->num_tokens, 6u);

  const size_t info_v1 = offsetof(pkv_seq_info, num_computed_tokens);
  Buffer ib(sizeof(pkv_seq_info), kFillA);
  PKV_ASSERT_OK(pkv_seq_info_init_sized(reinterpret_cast<pkv_seq_info*>(ib.at()), info_v1));
  PKV_ASSERT_OK(pkv_seq_get_info(pool, s, reinterpret_cast<pkv_seq_info*>(ib.at())));
  EXPECT_EQ(stray_writes(ib, info_v1, kFillA), "");
  EXPECT_EQ(reinterpret_cast<const pkv_seq_info*>(ib.at())->num_tokens, 6u);
  EXPECT_EQ(reinterpret_cast<const pkv_seq_info*>(ib.at())->lora_id, 7u);

  const size_t hash_v1 = offsetof(pkv_hash_options, lora_name);
  pkv_hash_options ho;
  PKV_ASSERT_OK(pkv_hash_options_init_sized(&ho, hash_v1));
  std::memset(reinterpret_cast<unsigned char*>(&ho) + hash_v1, 0xFF, sizeof ho - hash_v1);
  ho.block_size = 4;
  pkv_block_hash h[1];
  uint64_t n = 0;
  PKV_ASSERT_OK(pkv_hash_prefix(&ho, toks, 6, h, 1, &n));
  EXPECT_EQ(n, 1u);

  pkv_pool_destroy(pool);
}

// A struct of a newer header (larger, zeros past the fields this library
// knows) is taken as well, and result structs keep their unknown tail.
TEST(CapiInitSized, NewerHeaderSizesAreTakenByTheApi) {
  const size_t big = sizeof(pkv_pool_options) + 64;
  Buffer ob(big, kFillA);
  auto* o = reinterpret_cast<pkv_pool_options*>(ob.at());
  PKV_ASSERT_OK(pkv_pool_options_init_sized(o, big));
  o->block_size = 4;
  o->num_blocks = 16;
  pkv_pool* pool = nullptr;
  PKV_ASSERT_OK(pkv_pool_create(o, &pool));

  const size_t sbig = sizeof(pkv_pool_stats) + 64;
  Buffer sb(sbig, kFillA);
  auto* st = reinterpret_cast<pkv_pool_stats*>(sb.at());
  PKV_ASSERT_OK(pkv_pool_stats_init_sized(st, sbig));
  PKV_ASSERT_OK(pkv_pool_get_stats(pool, st));
  EXPECT_EQ(sb.struct_size(), sbig);
  EXPECT_EQ(st->num_blocks, 16u);
  EXPECT_EQ(stray_writes(sb, sbig, kFillA), "");
  for (size_t i = sizeof(pkv_pool_stats); i < sbig; ++i) ASSERT_EQ(sb.at()[i], 0) << "byte " << i;
  pkv_pool_destroy(pool);
}

}  // namespace
