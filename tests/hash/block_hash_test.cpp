// Block hashing: pinned vectors from Python (gen_vectors.py: cbor2 canonical,
// hashlib, xxhash) and behavioural properties of the chain and extra keys.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "error.h"
#include "hash/block_hash.h"
#include "hash/cbor_tokens.h"
#include "hash/cbor_writer.h"
#include "hex.h"
#include "pagedkv/pagedkv.h"

namespace pagedkv {
namespace {

struct TokenSpec {
  std::vector<int32_t> list;  // used when count == 0
  uint64_t count;
  uint64_t seed;
  int64_t lo, hi;
};

struct TextSpec {
  const char* unit_hex;  // UTF-8, repeated `repeat` times
  int repeat;
};

struct ExtraSpec {
  bool is_text;
  uint64_t uint_value;
  TextSpec text;
  bool is_mm = false;  // [text, mm_offset]: vLLM's (mm hash, offset - block start)
  int64_t mm_offset = 0;
};

struct BlockVector {
  const char* name;
  uint32_t algo;
  const char* parent_hex;
  TokenSpec tokens;
  bool extra_null;
  std::vector<ExtraSpec> extra;
  size_t cbor_size;
  const char* cbor_hex;  // "" when too long to inline
  const char* digest_hex;
};

struct RootVector {
  const char* name;
  uint32_t algo;
  TextSpec seed;
  size_t cbor_size;
  const char* cbor_hex;
  const char* digest_hex;
};

struct MmSpec {
  uint64_t offset, length;
  const char* hash_hex;
};

struct PrefixVector {
  const char* name;
  uint32_t algo;
  uint32_t block_size;
  const char* seed_hex;
  uint64_t lora_id;
  const char* salt_hex;
  std::vector<MmSpec> mm;
  TokenSpec tokens;
  std::vector<const char*> digests;
  const char* lora_name_hex;
};

#include "vectors.inc"

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

using test::hex;
std::string hex(const std::vector<uint8_t>& v) { return hex(v.data(), v.size()); }

// Same LCG as pyref.lcg_tokens.
std::vector<int32_t> expand(const TokenSpec& t) {
  if (t.count == 0) return t.list;
  std::vector<int32_t> out;
  uint64_t x = t.seed;
  const uint64_t span = static_cast<uint64_t>(t.hi - t.lo) + 1;
  for (uint64_t i = 0; i < t.count; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out.push_back(static_cast<int32_t>(t.lo + static_cast<int64_t>((x >> 11) % span)));
  }
  return out;
}

std::string expand(const TextSpec& t) {
  std::string unit = unhex(t.unit_hex), out;
  for (int i = 0; i < t.repeat; ++i) out += unit;
  return out;
}

ExtraKey extra_of(const ExtraSpec& e) {
  if (e.is_mm) return ExtraKey::mm(expand(e.text), e.mm_offset);
  return e.is_text ? ExtraKey::str(expand(e.text)) : ExtraKey::uint(e.uint_value);
}

BlockHash from_hex(const std::string& h) {
  BlockHash b;
  std::string raw = unhex(h);
  std::copy(raw.begin(), raw.end(), b.bytes.begin());
  b.size = static_cast<uint8_t>(raw.size());
  return b;
}

TEST(HashVectors, Blocks) {
  for (const BlockVector& v : kBlockVectors) {
    SCOPED_TRACE(v.name);
    const HashAlgo algo = static_cast<HashAlgo>(v.algo);
    const BlockHash parent = from_hex(v.parent_hex);
    const std::vector<int32_t> tokens = expand(v.tokens);
    std::vector<ExtraKey> extra;
    for (const ExtraSpec& e : v.extra) extra.push_back(extra_of(e));
    ASSERT_EQ(v.extra_null, extra.empty());

    const std::vector<uint8_t> bytes =
        encode_block_cbor(parent, tokens.data(), tokens.size(), extra);
    EXPECT_EQ(bytes.size(), v.cbor_size);
    if (*v.cbor_hex) {
      EXPECT_EQ(hex(bytes), v.cbor_hex);
    }

    const BlockHash h = hash_block(algo, parent, tokens.data(), tokens.size(), extra);
    EXPECT_EQ(hex(h), v.digest_hex);
    EXPECT_EQ(h.size, hash_digest_size(algo));
    for (size_t i = h.size; i < h.bytes.size(); ++i) EXPECT_EQ(h.bytes[i], 0) << "padding";
  }
}

TEST(HashVectors, BlockHasherReuseMatchesOneShot) {
  // One hasher per algo, fed every vector in turn (buffer grows and shrinks).
  BlockHasher sha(HashAlgo::kSha256Cbor), xxh(HashAlgo::kXxh3_128);
  for (int round = 0; round < 2; ++round) {
    for (const BlockVector& v : kBlockVectors) {
      SCOPED_TRACE(v.name);
      BlockHasher& hasher = v.algo == 1 ? sha : xxh;
      EXPECT_EQ(hasher.algo(), static_cast<HashAlgo>(v.algo));
      const std::vector<int32_t> tokens = expand(v.tokens);
      std::vector<ExtraKey> extra;
      for (const ExtraSpec& e : v.extra) extra.push_back(extra_of(e));
      EXPECT_EQ(hex(hasher.hash(from_hex(v.parent_hex), tokens.data(), tokens.size(), extra)),
                v.digest_hex);
    }
  }
}

TEST(HashVectors, Roots) {
  for (const RootVector& v : kRootVectors) {
    SCOPED_TRACE(v.name);
    const std::string seed = expand(v.seed);
    const std::vector<uint8_t> bytes = encode_seed_cbor(seed);
    EXPECT_EQ(bytes.size(), v.cbor_size);
    if (*v.cbor_hex) {
      EXPECT_EQ(hex(bytes), v.cbor_hex);
    }
    EXPECT_EQ(hex(hash_root(static_cast<HashAlgo>(v.algo), seed)), v.digest_hex);
  }
}

HashContext context_of(const PrefixVector& v) {
  HashContext ctx;
  ctx.algo = static_cast<HashAlgo>(v.algo);
  ctx.block_size = v.block_size;
  ctx.lora_id = v.lora_id;
  ctx.lora_name = unhex(v.lora_name_hex);
  ctx.cache_salt = unhex(v.salt_hex);
  for (const MmSpec& m : v.mm) ctx.mm_items.push_back({m.offset, m.length, unhex(m.hash_hex)});
  return ctx;
}

TEST(HashVectors, Prefixes) {
  for (const PrefixVector& v : kPrefixVectors) {
    SCOPED_TRACE(v.name);
    const HashContext ctx = context_of(v);
    const std::vector<int32_t> tokens = expand(v.tokens);
    const BlockHash root = hash_root(ctx.algo, unhex(v.seed_hex));
    const std::vector<BlockHash> got = hash_prefix(ctx, root, tokens.data(), tokens.size());
    ASSERT_EQ(got.size(), v.digests.size());
    ASSERT_EQ(got.size(), tokens.size() / v.block_size);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(hex(got[i]), v.digests[i]) << "block " << i;

    // The same chain built block by block from the public pieces.
    BlockHasher hasher(ctx.algo);
    BlockHash parent = root;
    for (size_t i = 0; i < got.size(); ++i) {
      const uint64_t start = i * v.block_size, end = start + v.block_size;
      const int32_t* block = tokens.data() + start;
      const BlockHash a =
          hash_block(ctx.algo, parent, block, v.block_size, block_extra_keys(ctx, start, end));
      const BlockHash b = hasher.hash(parent, block, v.block_size, ctx, start);
      EXPECT_EQ(a, got[i]) << "block " << i;
      EXPECT_EQ(b, got[i]) << "block " << i;
      parent = got[i];
    }
  }
}

// A pool reaches the vectors through the C ABI as an engine drives it: the
// prompt appended in chunks, then one decode token per step (vLLM hashes the
// prompt's blocks at once and each later block when decode completes it),
// with the LoRA name and mm items given as sequence options.
TEST(HashVectors, PoolSequencesMatchThePrefixVectors) {
  int checked = 0;
  for (const PrefixVector& v : kPrefixVectors) {
    const std::string name = v.name;
    if (name.find("lora_name") == std::string::npos && name.find("mm_") == std::string::npos)
      continue;
    SCOPED_TRACE(v.name);
    pkv_pool_options po;
    pkv_pool_options_init(&po);
    po.block_size = v.block_size;
    po.num_blocks = 64;
    po.hash_algo = v.algo;
    const std::string seed = unhex(v.seed_hex), salt = unhex(v.salt_hex);
    const std::string lora_name = unhex(v.lora_name_hex);
    po.hash_seed = seed.c_str();
    pkv_pool* pool = nullptr;
    ASSERT_EQ(pkv_pool_create(&po, &pool), PKV_OK) << pkv_last_error_message();
    std::vector<std::string> mm_hashes;
    for (const MmSpec& m : v.mm) mm_hashes.push_back(unhex(m.hash_hex));
    std::vector<pkv_mm_item> mm;
    for (size_t i = 0; i < v.mm.size(); ++i)
      mm.push_back({v.mm[i].offset, v.mm[i].length, mm_hashes[i].c_str()});
    pkv_seq_options so;
    pkv_seq_options_init(&so);
    so.lora_id = v.lora_id;
    so.lora_name = lora_name.c_str();
    so.cache_salt = salt.c_str();
    so.mm_items = mm.data();
    so.num_mm_items = uint32_t(mm.size());
    pkv_seq_id seq;
    ASSERT_EQ(pkv_seq_create(pool, &so, &seq), PKV_OK) << pkv_last_error_message();
    const std::vector<int32_t> tokens = expand(v.tokens);
    const uint64_t prompt = tokens.size() * 3 / 4, chunk = v.block_size + 1;
    for (uint64_t i = 0; i < prompt; i += chunk)
      ASSERT_EQ(pkv_seq_append(pool, seq, tokens.data() + i, std::min(chunk, prompt - i), 0),
                PKV_OK);
    for (uint64_t i = prompt; i < tokens.size(); ++i)
      ASSERT_EQ(pkv_seq_append(pool, seq, tokens.data() + i, 1, 0), PKV_OK);
    std::vector<pkv_block_hash> got(v.digests.size() + 1);
    uint64_t n = 0;
    ASSERT_EQ(pkv_seq_get_block_hashes(pool, seq, got.data(), got.size(), &n), PKV_OK);
    ASSERT_EQ(n, v.digests.size());
    for (size_t i = 0; i < n; ++i)
      EXPECT_EQ(test::hex(got[i].bytes, pkv_hash_size(v.algo)), v.digests[i]) << "block " << i;
    pkv_pool_destroy(pool);
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

HashContext rich_context() {
  HashContext ctx;
  ctx.block_size = 16;
  ctx.lora_id = 7;
  ctx.cache_salt = "salt";
  ctx.mm_items = {{10, 30, "A"}, {40, 8, "B"}, {48, 16, "C"}, {70, 1, "D"}};
  return ctx;
}

std::vector<std::string> describe(const std::vector<ExtraKey>& keys) {
  std::vector<std::string> out;
  for (const ExtraKey& k : keys)
    out.push_back(k.kind == ExtraKey::Kind::kUint ? "u" + std::to_string(k.uint_value)
                  : k.kind == ExtraKey::Kind::kText
                      ? "s" + k.text
                      : "m" + k.text + "@" + std::to_string(k.offset));
  return out;
}

using Keys = std::vector<std::string>;

// The branch-free token encoder equals the head encoder (shortest form) at
// every argument-size boundary and on random ids of every size, and never
// writes past its kMaxInt32Size bytes.
TEST(HashCbor, TokenEncodingMatchesTheHeadEncoder) {
  std::vector<int64_t> vals = {0,     1,     23,    24,       25,        255,    256,
                               65535, 65536, 65537, 16777216, INT32_MAX, -1,     -24,
                               -25,   -256,  -257,  -65536,   -65537,    -65538, INT32_MIN};
  std::mt19937 rng(17);
  for (int i = 0; i < 20000; ++i) vals.push_back(int32_t(rng()) >> (rng() % 32));
  for (int64_t x : vals) {
    const int32_t t = int32_t(x);
    uint8_t got[16], want[16];
    std::memset(got, 0xAB, sizeof got);
    std::memset(want, 0xAB, sizeof want);
    const uint8_t* g = cbor::put_int32(got, t);
    const uint8_t* w = t >= 0 ? cbor::put_head(want, cbor::kMajorUint, uint64_t(t))
                              : cbor::put_head(want, cbor::kMajorNegInt, uint64_t(-1 - int64_t(t)));
    ASSERT_EQ(g - got, w - want) << t;
    ASSERT_EQ(0, std::memcmp(got, want, size_t(w - want))) << t;
    for (size_t i = cbor::kMaxInt32Size; i < sizeof got; ++i) ASSERT_EQ(got[i], 0xAB) << t;
  }
}

// A run encoder against put_int32 of each token: every length 0..40,
// sizes and signs mixed at random, or all of one size class (a prompt in
// one script's range of the vocabulary); and its whole-word stores stay
// within the room it asks for.
void expect_run_encoder_matches(cbor::PutInt32s encode) {
  std::mt19937 rng(29);
  for (int round = 0; round < 4000; ++round) {
    const size_t n = size_t(round % 41);
    std::vector<int32_t> t(n);
    const uint32_t one_shift = round % 5 == 0 ? rng() % 32 : 32;  // 32: mixed
    for (auto& x : t) x = int32_t(rng()) >> (one_shift < 32 ? one_shift : rng() % 32);
    if (n && round % 7 == 0) t[rng() % n] = INT32_MIN;
    if (n && round % 11 == 0) t[rng() % n] = INT32_MAX;
    std::vector<uint8_t> got(n * cbor::kMaxInt32Size + 16, 0xAB), want(got);
    uint8_t* w = want.data();
    for (int32_t x : t) w = cbor::put_int32(w, x);
    const uint8_t* g = encode(got.data(), t.data(), n);
    ASSERT_EQ(g - got.data(), w - want.data()) << n;
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), size_t(w - want.data()))) << n;
    for (size_t i = n * cbor::kMaxInt32Size + cbor::kInt32sSlack; i < got.size(); ++i)
      ASSERT_EQ(got[i], 0xAB) << n << " " << i;
  }
}

// The batched encoder of the baseline (four tokens at a time).
TEST(HashCbor, TokenRunEncodingMatchesOneByOne) { expect_run_encoder_matches(cbor::put_int32s); }

// The AVX2 encoder (eight at a time), and the one block hashes use.
TEST(HashCbor, WideTokenRunEncodingMatchesOneByOne) {
  expect_run_encoder_matches(cbor::put_tokens);
  const cbor::PutInt32s avx2 = cbor::avx2_put_int32s();
  if (avx2 == nullptr) GTEST_SKIP() << "no AVX2 on this CPU: only the baseline encoder ran";
  expect_run_encoder_matches(avx2);
}

TEST(HashExtraKeys, OrderLoraMmSalt) {
  const HashContext ctx = rich_context();
  EXPECT_EQ(describe(block_extra_keys(ctx, 0, 16)), (Keys{"u7", "mA@10", "ssalt"}));
  EXPECT_EQ(describe(block_extra_keys(ctx, 16, 32)), (Keys{"u7", "mA@-6"}));
  // A ends at 40, B is [40, 48): half-open ranges.
  EXPECT_EQ(describe(block_extra_keys(ctx, 32, 48)), (Keys{"u7", "mA@-22", "mB@8"}));
  EXPECT_EQ(describe(block_extra_keys(ctx, 40, 48)), (Keys{"u7", "mB@0"}));
  EXPECT_EQ(describe(block_extra_keys(ctx, 48, 64)), (Keys{"u7", "mC@0"}));
  EXPECT_EQ(describe(block_extra_keys(ctx, 64, 80)), (Keys{"u7", "mD@6"}));
  EXPECT_EQ(describe(block_extra_keys(ctx, 80, 96)), (Keys{"u7"}));
  // The LoRA name follows the id (vLLM keys only the name; set one).
  HashContext named = ctx;
  named.lora_id = 0;
  named.lora_name = "sql";
  EXPECT_EQ(describe(block_extra_keys(named, 0, 16)), (Keys{"ssql", "mA@10", "ssalt"}));
  named.lora_id = 7;
  EXPECT_EQ(describe(block_extra_keys(named, 80, 96)), (Keys{"u7", "ssql"}));
}

TEST(HashExtraKeys, NoneGivesEmptyAndNull) {
  HashContext ctx;
  EXPECT_TRUE(block_extra_keys(ctx, 0, 16).empty());
  ctx.cache_salt = "s";
  EXPECT_EQ(describe(block_extra_keys(ctx, 0, 16)), (Keys{"ss"}));
  EXPECT_TRUE(block_extra_keys(ctx, 16, 32).empty());
  const int32_t t[2] = {1, 2};
  const std::vector<uint8_t> bytes = encode_block_cbor(BlockHash{}, t, 2, {});
  EXPECT_EQ(bytes.back(), 0xf6);  // CBOR null
}

TEST(HashExtraKeys, ZeroLengthAndSaturatingItems) {
  HashContext ctx;
  ctx.mm_items = {{5, 0, "empty"}, {20, UINT64_MAX, "huge"}};
  EXPECT_TRUE(block_extra_keys(ctx, 0, 16).empty());
  EXPECT_EQ(describe(block_extra_keys(ctx, 16, 32)), (Keys{"mhuge@4"}));
  EXPECT_EQ(describe(block_extra_keys(ctx, 1u << 30, (1u << 30) + 16)),
            (Keys{"mhuge@" + std::to_string(20 - (int64_t(1) << 30))}));
}

TEST(HashChain, ChangesPropagateForwardOnly) {
  std::mt19937 rng(12345);
  std::vector<int32_t> tokens(16 * 20);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 150000);
  for (HashAlgo algo : {HashAlgo::kSha256Cbor, HashAlgo::kXxh3_128}) {
    HashContext ctx;
    ctx.algo = algo;
    const BlockHash root = hash_root(algo, "seed");
    const auto base = hash_prefix(ctx, root, tokens.data(), tokens.size());
    ASSERT_EQ(base.size(), 20u);
    std::unordered_set<BlockHash, BlockHashHasher> distinct(base.begin(), base.end());
    EXPECT_EQ(distinct.size(), base.size());

    auto changed = tokens;
    changed[16 * 7 + 3] ^= 1;
    const auto alt = hash_prefix(ctx, root, changed.data(), changed.size());
    for (size_t i = 0; i < base.size(); ++i) EXPECT_EQ(base[i] == alt[i], i < 7) << i;

    // Another seed, LoRA, or salt changes every block.
    const auto other_seed =
        hash_prefix(ctx, hash_root(algo, "seed2"), tokens.data(), tokens.size());
    HashContext lora = ctx, salt = ctx;
    lora.lora_id = 1;
    salt.cache_salt = "t";
    const auto with_lora = hash_prefix(lora, root, tokens.data(), tokens.size());
    const auto with_salt = hash_prefix(salt, root, tokens.data(), tokens.size());
    for (size_t i = 0; i < base.size(); ++i) {
      EXPECT_NE(base[i], other_seed[i]);
      EXPECT_NE(base[i], with_lora[i]);
      EXPECT_NE(base[i], with_salt[i]);
    }
    // A partial tail block is not hashed.
    EXPECT_EQ(hash_prefix(ctx, root, tokens.data(), tokens.size() - 1).size(), 19u);
    EXPECT_TRUE(hash_prefix(ctx, root, tokens.data(), 15).empty());
    EXPECT_TRUE(hash_prefix(ctx, root, nullptr, 0).empty());
  }
}

TEST(HashApi, DigestSizesAndHasher) {
  EXPECT_EQ(hash_digest_size(HashAlgo::kSha256Cbor), 32u);
  EXPECT_EQ(hash_digest_size(HashAlgo::kXxh3_128), 16u);
  EXPECT_EQ(hash_digest_size(static_cast<HashAlgo>(0)), 0u);
  EXPECT_EQ(hash_digest_size(static_cast<HashAlgo>(3)), 0u);
  const BlockHash h = hash_root(HashAlgo::kSha256Cbor, "x");
  BlockHashHasher hasher;
  EXPECT_EQ(hasher(h), hasher(hash_root(HashAlgo::kSha256Cbor, "x")));
  EXPECT_NE(hasher(h), hasher(hash_root(HashAlgo::kSha256Cbor, "y")));
  EXPECT_TRUE(BlockHash{}.empty());
  EXPECT_FALSE(h.empty());
}

template <typename F>
void expect_error(Errc code, const std::string& needle, F&& f) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(HashApi, BadArguments) {
  const HashAlgo bad = static_cast<HashAlgo>(9);
  expect_error(Errc::kInvalidArgument, "algo", [&] { hash_root(bad, ""); });
  expect_error(Errc::kInvalidArgument, "algo", [&] { BlockHasher h(bad); });
  const int32_t t[4] = {1, 2, 3, 4};
  expect_error(Errc::kInvalidArgument, "algo", [&] { hash_block(bad, BlockHash{}, t, 4, {}); });
  HashContext ctx;
  const BlockHash root = hash_root(ctx.algo, "");
  ctx.block_size = 0;
  expect_error(Errc::kInvalidArgument, "block_size", [&] { hash_prefix(ctx, root, t, 4); });
  ctx.block_size = 2;
  expect_error(Errc::kInvalidArgument, "tokens", [&] { hash_prefix(ctx, root, nullptr, 4); });
  expect_error(Errc::kInvalidArgument, "root",
               [&] { hash_prefix(ctx, hash_root(HashAlgo::kXxh3_128, ""), t, 4); });
  BlockHash oversized;
  oversized.size = 33;
  expect_error(Errc::kInvalidArgument, "parent",
               [&] { hash_block(HashAlgo::kSha256Cbor, oversized, t, 4, {}); });
  BlockHasher hasher(HashAlgo::kXxh3_128);
  expect_error(Errc::kInvalidArgument, "parent", [&] { hasher.hash(oversized, t, 4, {}); });
  expect_error(Errc::kInvalidArgument, "parent", [&] { hasher.hash(oversized, t, 4, ctx, 0); });
  ctx.algo = bad;
  expect_error(Errc::kInvalidArgument, "algo", [&] { hash_prefix(ctx, root, t, 4); });
}

}  // namespace
}  // namespace pagedkv
