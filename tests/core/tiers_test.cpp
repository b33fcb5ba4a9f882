// Offload tiers (issue 20): the tier level's LRU and index, and end to end
// on a CPU pool with storage: random K/V written, evicted, offloaded to the
// host (and file) tier, matched, loaded back byte for byte, attention equal
// to the original; checksum mismatches and I/O errors become misses that
// are counted and never served; salts keep tenants apart; stats, events.
#include <unistd.h>

#include <cstring>
#include <map>

#include <xxhash.h>

#include <random>

#include "test_util.h"
#include "tier/slot_hash.h"
#include "tier/tier_level.h"

namespace pagedkv {
namespace {

using test::iota_tokens;
using test::random_floats;

constexpr uint32_t kBs = 4, kLayers = 2, kHeads = 2, kDim = 8;
constexpr size_t kPlane = size_t(kBs) * kHeads * kDim * sizeof(float);
constexpr size_t kBlockBytes = kPlane * 2 * kLayers;

BlockHash key(uint8_t b) {
  BlockHash h;
  h.size = 32;
  h.bytes[0] = b;
  h.bytes[31] = uint8_t(b * 7 + 1);
  return h;
}

TEST(TierLevel, LruIndexAndPins) {
  auto l = TierLevel::host(3, 64);
  EXPECT_EQ(l->capacity(), 3u);
  for (uint8_t i = 0; i < 3; ++i) {
    const int32_t s = l->take_free();
    ASSERT_GE(s, 0);
    l->publish(s, key(i), 100 + i, 0);
  }
  EXPECT_EQ(l->take_free(), -1);
  EXPECT_EQ(l->num_ready(), 3u);
  const int32_t s0 = l->find(key(0)), s1 = l->find(key(1));
  EXPECT_EQ(l->checksum(s1), 101u);
  EXPECT_EQ(l->lru_victim(), s0);  // oldest first
  l->touch(s0);
  EXPECT_EQ(l->lru_victim(), s1);
  l->pin(s1);  // pinned entries are skipped
  EXPECT_EQ(l->lru_victim(), l->find(key(2)));
  l->unpin(s1);
  l->unpublish(s1);
  EXPECT_EQ(l->find(key(1)), -1);
  EXPECT_EQ(l->check(), "");
  l->release(s1);
  EXPECT_EQ(l->take_free(), s1);
  l->release(s1);
  l->clear();
  EXPECT_EQ(l->num_ready(), 0u);
  EXPECT_EQ(l->find(key(0)), -1);
  EXPECT_EQ(l->check(), "");
}

TEST(TierLevel, FileRoundTripPartialReadsAndInjectedFailure) {
  auto l = TierLevel::file(::testing::TempDir(), 2, 64);
  std::vector<char> a(64), b(64, 0);
  for (int i = 0; i < 64; ++i) a[i] = char(i * 3 + 1);
  struct iovec wa {
    a.data(), 64
  }, rb{b.data(), 64};
  ASSERT_TRUE(l->write(1, 0, &wa, 1));
  ASSERT_TRUE(l->read(1, 0, &rb, 1));
  EXPECT_EQ(a, b);
  // A part of a slot, scattered (file loads read a block in groups of planes).
  std::vector<char> part(40, 0);
  struct iovec rp[2] = {{part.data(), 16}, {part.data() + 16, 24}};
  ASSERT_TRUE(l->read(1, 20, rp, 2));
  EXPECT_EQ(std::vector<char>(a.begin() + 20, a.begin() + 60), part);
  EXPECT_FALSE(l->read(1, 30, rp, 2)) << "past the end of the slot";
  l->fail_io_for_testing(true);
  EXPECT_FALSE(l->read(1, 0, &rb, 1));
  EXPECT_THROW(TierLevel::file("/nonexistent-dir-for-pagedkv", 2, 64), Error);
}

// The tiers' streamed checksum is XXH3_64bits of the concatenation, in
// whichever implementation (AVX2 build or the system library) this CPU runs.
TEST(SlotHash, EqualsXxh3OfTheConcatenationForAnySplit) {
  std::mt19937_64 rng(2026);
  std::vector<unsigned char> data(3 << 20);
  for (auto& c : data) c = (unsigned char)rng();
  for (int round = 0; round < 40; ++round) {
    const size_t n = round == 0 ? 0 : size_t(rng() % data.size());
    const size_t off = size_t(rng() % 64);
    const unsigned char* p = data.data() + std::min(off, data.size() - n);
    SlotHash h;
    for (size_t at = 0; at < n;) {
      const size_t len =
          std::min<size_t>(n - at, round % 3 == 0 ? 1 + rng() % 300 : rng() % (n + 1));
      h.update(p + at, len);
      at += len;
    }
    ASSERT_EQ(h.digest(), XXH3_64bits(p, n)) << "round " << round << ", " << n << " bytes";
  }
  const bool cpu_avx2 = __builtin_cpu_supports("avx2");
  EXPECT_EQ(SlotHash::avx2(), cpu_avx2);
}

// ------------------------------------------------------------- end to end

struct Fixture {
  std::shared_ptr<Pool> pool;
  // K/V rows [tokens][heads][dim] per layer as written for the first
  // sequence, and what attention over it gave.
  std::vector<std::vector<float>> k, v;
  std::vector<float> q;
  std::vector<std::vector<float>> ref_out;
  std::vector<int32_t> tokens = iota_tokens(17);
  SeqId a = 0;
  // Bytes of each of a's full blocks (all planes), by block index.
  std::vector<std::vector<char>> block_bytes;
};

TensorArg rows(std::vector<float>& v, int64_t n) { return test::rows(v, n, kHeads, kDim); }

std::vector<char> bytes_of(Pool& p, int32_t block, size_t plane = kPlane) {
  std::vector<char> out;
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t w = 0; w < 2; ++w) {
      const char* base = static_cast<const char*>(p.kv_tensor(l, w).data) + size_t(block) * plane;
      out.insert(out.end(), base, base + plane);
    }
  return out;
}

std::vector<std::vector<float>> attend_last(const std::shared_ptr<Pool>& p, SeqId s,
                                            std::vector<float>& q, Fixture* write_from = nullptr) {
  const uint32_t one = 1;
  auto b = Batch::prepare(p, &s, &one, 1, nullptr);
  std::vector<std::vector<float>> outs;
  for (uint32_t l = 0; l < kLayers; ++l) {
    if (write_from) {  // the last token's K/V, as the first sequence had it
      std::vector<float> kr(write_from->k[l].end() - kHeads * kDim, write_from->k[l].end());
      std::vector<float> vr(write_from->v[l].end() - kHeads * kDim, write_from->v[l].end());
      TensorArg kt = rows(kr, 1), vt = rows(vr, 1);
      b->write(l, &kt, &vt, nullptr);
    }
    std::vector<float> out(kHeads * kDim, 0);
    TensorArg qt = rows(q, 1), ot = rows(out, 1);
    b->attend(l, &qt, &ot, nullptr, AttentionParams{}, nullptr);
    outs.push_back(out);
  }
  if (!write_from) b->abort();
  return outs;
}

// A pool of 5 usable blocks; sequence a (17 tokens: 4 full blocks) written
// with random K/V, then freed and evicted by a second sequence of other
// tokens, which offloads a's blocks to the tiers.
PoolOptions f32_pool(uint32_t heads, uint32_t dim) {
  PoolOptions o = test::manager_options(kBs, 6);
  o.num_layers = kLayers;
  o.num_kv_heads = heads;
  o.head_dim = dim;
  o.dtype = DType::kF32;
  o.num_threads = 1;
  return o;
}

// host_blocks 0 (with file_blocks): a file tier alone. fail_writes: every
// file write fails from the start.
Fixture offloaded(uint64_t host_blocks, uint64_t file_blocks, bool events = false,
                  bool fail_writes = false) {
  Fixture f;
  PoolOptions o = f32_pool(kHeads, kDim);
  o.enable_events = events;
  f.pool = Pool::create(o);
  TierOptions t;
  t.host_bytes = host_blocks ? host_blocks * kBlockBytes + kBlockBytes / 2 : 0;  // part unused
  if (file_blocks) {
    t.file_dir = ::testing::TempDir();
    t.file_bytes = file_blocks * kBlockBytes;
  }
  f.pool->attach_tiers(t);
  if (fail_writes) f.pool->tiers_for_testing()->fail_io_for_testing(true);
  Pool& p = *f.pool;
  f.a = p.seq_create({});
  p.append(f.a, f.tokens.data(), f.tokens.size(), 0);
  const uint32_t n = 17;
  {
    auto b = Batch::prepare(f.pool, &f.a, &n, 1, nullptr);
    for (uint32_t l = 0; l < kLayers; ++l) {
      f.k.push_back(random_floats(n * kHeads * kDim, 10 + l));
      f.v.push_back(random_floats(n * kHeads * kDim, 20 + l));
      TensorArg kt = rows(f.k[l], n), vt = rows(f.v[l], n);
      b->write(l, &kt, &vt, nullptr);
    }
    EXPECT_TRUE(b->committed());
  }
  f.q = random_floats(kHeads * kDim, 77);
  f.ref_out = attend_last(f.pool, f.a, f.q);
  for (int32_t blk : test::table(p, f.a)) f.block_bytes.push_back(bytes_of(p, blk));
  p.free(f.a);
  // Five blocks of other tokens: every block of a is evicted.
  SeqId other = p.seq_create({});
  const auto t2 = iota_tokens(20, 1000);
  p.append(other, t2.data(), t2.size(), 0);
  test::step_rest(f.pool, other);  // a storage pool: destroyed unwritten, nothing counts
  p.free(other);
  p.flush_tiers();
  EXPECT_EQ(p.validate(), "");
  return f;
}

TEST(Tiers, HostTierHitsLoadBackByteExactAndAttentionMatches) {
  Fixture f = offloaded(4, 0);
  Pool& p = *f.pool;
  TierStats hs = p.tier_stats(1);
  EXPECT_EQ(hs.num_stored, 4u);
  EXPECT_EQ(hs.num_blocks, 4u);
  EXPECT_EQ(hs.bytes_stored, 4 * kBlockBytes);
  EXPECT_EQ(hs.capacity_blocks, 4u);

  SeqId c = p.seq_create({});
  const TieredMatch m = p.match_prefix_tiered(c, f.tokens.data(), f.tokens.size());
  EXPECT_EQ(m.device, 0u);
  EXPECT_EQ(m.host, 16u);
  EXPECT_EQ(m.file, 0u);
  EXPECT_EQ(p.seq_info(c).num_cached_tokens, 16u);
  EXPECT_EQ(p.seq_info(c).num_computed_tokens, 0u);  // not loaded yet
  EXPECT_EQ(p.validate(), "");
  p.append(c, f.tokens.data() + 16, 1, 0);
  const auto out = attend_last(f.pool, c, f.q, &f);  // the plan loads, then attends
  for (uint32_t l = 0; l < kLayers; ++l)
    for (size_t i = 0; i < out[l].size(); ++i)
      ASSERT_EQ(out[l][i], f.ref_out[l][i]) << "layer " << l << " element " << i;
  const auto tab = test::table(p, c);
  for (size_t j = 0; j < 4; ++j) EXPECT_EQ(bytes_of(p, tab[j]), f.block_bytes[j]) << "block " << j;
  EXPECT_EQ(p.seq_info(c).num_computed_tokens, 17u);
  hs = p.tier_stats(1);
  EXPECT_EQ(hs.num_hits, 4u);
  EXPECT_EQ(hs.num_loaded, 4u);
  EXPECT_EQ(hs.bytes_loaded, 4 * kBlockBytes);
  EXPECT_EQ(hs.num_checksum_failures, 0u);
  EXPECT_EQ(p.validate(), "");
  // Loaded blocks are written blocks: a device hit for the next request.
  p.free(c);
  SeqId d = p.seq_create({});
  EXPECT_EQ(p.match_prefix(d, f.tokens.data(), f.tokens.size()), 16u);
  EXPECT_EQ(p.seq_info(d).num_computed_tokens, 16u);
  EXPECT_EQ(p.validate(), "");
}

// Planes larger than the tiers' copy chunk (128 KiB): the host copies go
// chunk by chunk and file loads plane by plane (several preadv calls per
// slot), each hashed as it goes; every byte comes back.
TEST(Tiers, LargePlanesRoundTripThroughBothTiers) {
  constexpr uint32_t heads = 4, dim = 4096;  // plane: 4 tokens x 4 heads x 4096 x f32 = 256 KiB
  constexpr size_t plane = size_t(kBs) * heads * dim * sizeof(float);
  auto pool = Pool::create(f32_pool(heads, dim));
  Pool& p = *pool;
  TierOptions t;
  t.host_bytes = 2 * plane * 2 * kLayers;
  t.file_dir = ::testing::TempDir();
  t.file_bytes = 4 * plane * 2 * kLayers;
  p.attach_tiers(t);
  auto bytes = [&](int32_t block) { return bytes_of(p, block, plane); };
  const auto tokens = iota_tokens(17);
  SeqId a = p.seq_create({});
  p.append(a, tokens.data(), tokens.size(), 0);
  const uint32_t n = 17;
  {
    auto b = Batch::prepare(pool, &a, &n, 1, nullptr);
    for (uint32_t l = 0; l < kLayers; ++l) {
      auto k = random_floats(n * heads * dim, 30 + l), v = random_floats(n * heads * dim, 40 + l);
      TensorArg kt = test::rows(k, n, heads, dim), vt = test::rows(v, n, heads, dim);
      b->write(l, &kt, &vt, nullptr);
    }
    ASSERT_TRUE(b->committed());
  }
  std::vector<std::vector<char>> want;
  for (int32_t blk : test::table(p, a)) want.push_back(bytes(blk));
  p.free(a);
  SeqId other = p.seq_create({});
  const auto t2 = iota_tokens(20, 1000);
  p.append(other, t2.data(), t2.size(), 0);
  test::step_rest(pool, other);
  p.free(other);
  p.flush_tiers();
  SeqId c = p.seq_create({});
  const TieredMatch m = p.match_prefix_tiered(c, tokens.data(), tokens.size());
  EXPECT_EQ(m.host, 8u);
  EXPECT_EQ(m.file, 8u);
  p.flush_tiers();  // runs the loads
  EXPECT_EQ(p.seq_info(c).num_computed_tokens, 16u);
  const auto tab = test::table(p, c);
  for (size_t j = 0; j < 4; ++j) EXPECT_TRUE(bytes(tab[j]) == want[j]) << "block " << j;
  EXPECT_EQ(p.tier_stats(1).num_loaded, 2u);
  EXPECT_EQ(p.tier_stats(2).num_loaded, 2u);
  EXPECT_EQ(p.tier_stats(2).num_checksum_failures + p.tier_stats(1).num_checksum_failures, 0u);
  EXPECT_EQ(p.validate(), "");
}

TEST(Tiers, FullHostTierDemotesToTheFileTier) {
  Fixture f = offloaded(3, 2);
  Pool& p = *f.pool;
  EXPECT_EQ(p.tier_stats(1).num_blocks, 3u);
  EXPECT_EQ(p.tier_stats(1).num_removed, 1u);
  EXPECT_EQ(p.tier_stats(2).num_stored, 1u);
  EXPECT_EQ(p.tier_stats(2).num_blocks, 1u);
  SeqId c = p.seq_create({});
  const TieredMatch m = p.match_prefix_tiered(c, f.tokens.data(), f.tokens.size());
  // a's blocks were evicted tail first (3, 2, 1, 0): block 3, the oldest
  // in the host tier, went down to the file.
  EXPECT_EQ(m.host, 12u);
  EXPECT_EQ(m.file, 4u);
  p.append(c, f.tokens.data() + 16, 1, 0);
  const auto out = attend_last(f.pool, c, f.q, &f);
  for (uint32_t l = 0; l < kLayers; ++l) EXPECT_EQ(out[l], f.ref_out[l]);
  const auto tab = test::table(p, c);
  for (size_t j = 0; j < 4; ++j) EXPECT_EQ(bytes_of(p, tab[j]), f.block_bytes[j]) << "block " << j;
  EXPECT_EQ(p.tier_stats(2).num_loaded, 1u);
  EXPECT_EQ(p.validate(), "");
}

TEST(Tiers, WithoutAFileTierTheOldestHostEntryIsDropped) {
  Fixture f = offloaded(3, 0);
  Pool& p = *f.pool;
  SeqId c = p.seq_create({});
  const TieredMatch m = p.match_prefix_tiered(c, f.tokens.data(), f.tokens.size());
  EXPECT_EQ(m.host, 12u);
  EXPECT_EQ(m.file, 0u);
  EXPECT_EQ(p.validate(), "");
}

// The hashes of the first n blocks of tokens in p (a probe sequence, freed).
std::vector<BlockHash> block_hashes_of(Pool& p, const std::vector<int32_t>& tokens, size_t n) {
  SeqId probe = p.seq_create({});
  p.append(probe, tokens.data(), n * kBs, 0);
  std::vector<BlockHash> hs(n);
  p.block_hashes(probe, hs.data(), n);
  p.free(probe);
  return hs;
}

// A corrupted entry: the hit becomes a miss at load, counted; the plan
// that would read it fails naming the tokens to compute; nothing of it is
// served, and computing them works.
TEST(Tiers, ChecksumMismatchIsAMissNeverServed) {
  Fixture f = offloaded(4, 0);
  Pool& p = *f.pool;
  const std::vector<BlockHash> hs = block_hashes_of(p, f.tokens, 2);
  ASSERT_TRUE(p.tiers_for_testing()->corrupt_for_testing(hs[1]));
  SeqId c = p.seq_create({});
  EXPECT_EQ(p.match_prefix_tiered(c, f.tokens.data(), 17).host, 16u);
  p.append(c, f.tokens.data() + 16, 1, 0);
  const uint32_t one = 1;
  try {
    Batch::prepare(f.pool, &c, &one, 1, nullptr);
    FAIL() << "a plan over a corrupted block was prepared";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidState);
    EXPECT_NE(std::string(e.what()).find("tokens [4, 16)"), std::string::npos) << e.what();
  }
  const TierStats s = p.tier_stats(1);
  EXPECT_EQ(s.num_checksum_failures, 1u);
  EXPECT_EQ(s.num_loaded, 3u);  // the good ones
  EXPECT_EQ(s.num_blocks, 3u);  // the bad entry is gone
  EXPECT_EQ(p.seq_info(c).num_computed_tokens, 4u);
  EXPECT_EQ(p.validate(), "");
  // The bad block is no longer in the prefix cache: nobody else hits it.
  SeqId d = p.seq_create({});
  EXPECT_EQ(p.match_prefix(d, f.tokens.data(), 17), 4u);
  p.free(d);
  // The engine computes tokens [4, 17); then everything is written.
  const uint32_t rest = 13;
  auto b = Batch::prepare(f.pool, &c, &rest, 1, nullptr);
  b->commit();
  EXPECT_EQ(p.seq_info(c).num_computed_tokens, 17u);
  EXPECT_EQ(p.validate(), "");
}

TEST(Tiers, FileIoErrorIsAMiss) {
  Fixture f = offloaded(3, 2);
  Pool& p = *f.pool;
  p.tiers_for_testing()->fail_io_for_testing(true);
  SeqId c = p.seq_create({});
  const TieredMatch m = p.match_prefix_tiered(c, f.tokens.data(), 17);
  EXPECT_EQ(m.file, 4u);
  p.flush_tiers();
  EXPECT_EQ(p.tier_stats(2).num_io_errors, 1u);
  EXPECT_EQ(p.tier_stats(2).num_blocks, 0u);
  EXPECT_EQ(p.seq_info(c).num_computed_tokens, 12u);
  EXPECT_EQ(p.validate(), "");
}

TEST(Tiers, FileCorruptionIsCaught) {
  Fixture f = offloaded(3, 2);
  Pool& p = *f.pool;
  const std::vector<BlockHash> hs = block_hashes_of(p, f.tokens, 4);
  ASSERT_TRUE(p.tiers_for_testing()->corrupt_for_testing(hs[3]));  // in the file
  SeqId c = p.seq_create({});
  EXPECT_EQ(p.match_prefix_tiered(c, f.tokens.data(), 17).file, 4u);
  p.flush_tiers();
  EXPECT_EQ(p.tier_stats(2).num_checksum_failures, 1u);
  EXPECT_EQ(p.seq_info(c).num_computed_tokens, 12u);
  EXPECT_EQ(p.validate(), "");
}

TEST(Tiers, CacheSaltsKeepTenantsApartInTheTiers) {
  Fixture f = offloaded(4, 0);
  Pool& p = *f.pool;
  SeqOptions other;
  other.cache_salt = "tenant-b";
  SeqId c = p.seq_create(other);
  const TieredMatch m = p.match_prefix_tiered(c, f.tokens.data(), 17);
  EXPECT_EQ(m.device + m.host + m.file, 0u);
  EXPECT_EQ(p.tier_stats(1).num_hits, 0u);
}

TEST(Tiers, EventsCarryTheirMediumAndResetClearsTheTiers) {
  Fixture f = offloaded(3, 2, true);
  Pool& p = *f.pool;
  std::map<std::pair<uint32_t, uint32_t>, int> count;  // (medium, type) -> events
  for (const Event& e : test::drain(p)) ++count[{e.medium, uint32_t(e.type)}];
  EXPECT_EQ((count[{1, uint32_t(EventType::kStored)}]), 4);
  EXPECT_EQ((count[{1, uint32_t(EventType::kRemoved)}]), 1);
  EXPECT_EQ((count[{2, uint32_t(EventType::kStored)}]), 1);
  p.reset_prefix_cache();
  EXPECT_EQ(p.tier_stats(1).num_blocks, 0u);
  EXPECT_EQ(p.tier_stats(2).num_blocks, 0u);
  SeqId c = p.seq_create({});
  const TieredMatch m = p.match_prefix_tiered(c, f.tokens.data(), 17);
  EXPECT_EQ(m.host + m.file, 0u);
  count.clear();
  for (const Event& e : test::drain(p)) ++count[{e.medium, uint32_t(e.type)}];
  EXPECT_EQ((count[{1, uint32_t(EventType::kAllCleared)}]), 1);
  EXPECT_EQ((count[{2, uint32_t(EventType::kAllCleared)}]), 1);
  EXPECT_EQ(p.validate(), "");
}

// The sequence that took a tier hit goes before its load: the entry is
// unpinned, the block is not loaded, nothing leaks.
TEST(Tiers, FreedBeforeTheLoadNothingLeaks) {
  Fixture f = offloaded(4, 0);
  Pool& p = *f.pool;
  SeqId c = p.seq_create({});
  EXPECT_EQ(p.match_prefix_tiered(c, f.tokens.data(), 17).host, 16u);
  p.free(c);
  p.flush_tiers();
  EXPECT_EQ(p.tier_stats(1).num_loaded, 0u);
  EXPECT_EQ(p.tier_stats(1).num_blocks, 4u);
  EXPECT_EQ(p.validate(), "");
  SeqId d = p.seq_create({});
  EXPECT_EQ(p.match_prefix_tiered(d, f.tokens.data(), 17).host, 16u);
  EXPECT_EQ(p.validate(), "");
}

// -------------------------------------------- a file tier alone (one pass)

// host_bytes 0 with a file tier: each block goes straight from the pool's
// planes into a file slot, hashed as it is written; it comes back exactly.
TEST(FileOnlyTier, OffloadsInOnePassAndLoadsBackByteExact) {
  Fixture f = offloaded(0, 4);
  Pool& p = *f.pool;
  EXPECT_EQ(test::code_of([&] { p.tier_stats(1); }), Errc::kInvalidState);  // no host tier
  const TierStats fs = p.tier_stats(2);
  EXPECT_EQ(fs.num_stored, 4u);
  EXPECT_EQ(fs.num_blocks, 4u);
  EXPECT_EQ(fs.bytes_stored, 4 * kBlockBytes);
  SeqId c = p.seq_create({});
  const TieredMatch m = p.match_prefix_tiered(c, f.tokens.data(), f.tokens.size());
  EXPECT_EQ(m.host, 0u);
  EXPECT_EQ(m.file, 16u);
  p.append(c, f.tokens.data() + 16, 1, 0);
  const auto out = attend_last(f.pool, c, f.q, &f);
  for (uint32_t l = 0; l < kLayers; ++l) EXPECT_EQ(out[l], f.ref_out[l]) << "layer " << l;
  const auto tab = test::table(p, c);
  for (size_t j = 0; j < 4; ++j) EXPECT_EQ(bytes_of(p, tab[j]), f.block_bytes[j]) << "block " << j;
  EXPECT_EQ(p.tier_stats(2).num_loaded, 4u);
  EXPECT_EQ(p.tier_stats(2).num_checksum_failures, 0u);
  EXPECT_EQ(p.validate(), "");
}

// Planes larger than the chunk: one plane a pwritev, each hashed first.
TEST(FileOnlyTier, LargePlanesRoundTrip) {
  constexpr uint32_t heads = 4, dim = 4096;  // 256 KiB planes
  constexpr size_t plane = size_t(kBs) * heads * dim * sizeof(float);
  auto pool = Pool::create(f32_pool(heads, dim));
  Pool& p = *pool;
  TierOptions t;
  t.file_dir = ::testing::TempDir();
  t.file_bytes = 4 * plane * 2 * kLayers;
  p.attach_tiers(t);
  const auto tokens = iota_tokens(17);
  SeqId a = p.seq_create({});
  p.append(a, tokens.data(), tokens.size(), 0);
  const uint32_t n = 17;
  {
    auto b = Batch::prepare(pool, &a, &n, 1, nullptr);
    for (uint32_t l = 0; l < kLayers; ++l) {
      auto k = random_floats(n * heads * dim, 70 + l), v = random_floats(n * heads * dim, 80 + l);
      TensorArg kt = test::rows(k, n, heads, dim), vt = test::rows(v, n, heads, dim);
      b->write(l, &kt, &vt, nullptr);
    }
    ASSERT_TRUE(b->committed());
  }
  std::vector<std::vector<char>> want;
  for (int32_t blk : test::table(p, a)) want.push_back(bytes_of(p, blk, plane));
  p.free(a);
  SeqId other = p.seq_create({});
  const auto t2 = iota_tokens(20, 1000);
  p.append(other, t2.data(), t2.size(), 0);
  p.free(other);
  p.flush_tiers();
  SeqId c = p.seq_create({});
  EXPECT_EQ(p.match_prefix_tiered(c, tokens.data(), tokens.size()).file, 16u);
  p.flush_tiers();
  EXPECT_EQ(p.seq_info(c).num_computed_tokens, 16u);
  const auto tab = test::table(p, c);
  for (size_t j = 0; j < 4; ++j) EXPECT_TRUE(bytes_of(p, tab[j], plane) == want[j]) << j;
  EXPECT_EQ(p.validate(), "");
}

TEST(FileOnlyTier, FullTierDropsItsOldestEntry) {
  Fixture f = offloaded(0, 3);
  Pool& p = *f.pool;
  EXPECT_EQ(p.tier_stats(2).num_stored, 4u);
  EXPECT_EQ(p.tier_stats(2).num_removed, 1u);  // block 3, evicted first
  SeqId c = p.seq_create({});
  EXPECT_EQ(p.match_prefix_tiered(c, f.tokens.data(), 17).file, 12u);
  EXPECT_EQ(p.validate(), "");
}

TEST(FileOnlyTier, WriteErrorsAreCountedAndStoreNothing) {
  Fixture f = offloaded(0, 4, false, true);
  Pool& p = *f.pool;
  const TierStats s = p.tier_stats(2);
  EXPECT_EQ(s.num_io_errors, 4u);
  EXPECT_EQ(s.num_stored, 0u);
  EXPECT_EQ(s.num_blocks, 0u);
  SeqId c = p.seq_create({});
  EXPECT_EQ(p.match_prefix_tiered(c, f.tokens.data(), 17).file, 0u);
  EXPECT_EQ(p.validate(), "");
}

TEST(FileOnlyTier, CorruptionAndReadErrorsAreMisses) {
  Fixture f = offloaded(0, 4);
  Pool& p = *f.pool;
  const std::vector<BlockHash> hs = block_hashes_of(p, f.tokens, 4);
  ASSERT_TRUE(p.tiers_for_testing()->corrupt_for_testing(hs[2]));
  SeqId c = p.seq_create({});
  EXPECT_EQ(p.match_prefix_tiered(c, f.tokens.data(), 17).file, 16u);
  p.flush_tiers();
  EXPECT_EQ(p.tier_stats(2).num_checksum_failures, 1u);
  EXPECT_EQ(p.seq_info(c).num_computed_tokens, 8u);
  EXPECT_EQ(p.validate(), "");
  // Read errors: every load fails, is counted, and serves nothing.
  Fixture g = offloaded(0, 4);
  Pool& q = *g.pool;
  q.tiers_for_testing()->fail_io_for_testing(true);
  SeqId d = q.seq_create({});
  EXPECT_EQ(q.match_prefix_tiered(d, g.tokens.data(), 17).file, 16u);
  q.flush_tiers();
  EXPECT_EQ(q.tier_stats(2).num_io_errors, 4u);
  EXPECT_EQ(q.tier_stats(2).num_loaded, 0u);
  EXPECT_EQ(q.seq_info(d).num_computed_tokens, 0u);
  EXPECT_EQ(q.validate(), "");
}

TEST(FileOnlyTier, HostBytesZeroNeedsAFileTier) {
  auto pool = Pool::create(f32_pool(kHeads, kDim));
  TierOptions t;  // host_bytes 0, no file_dir
  EXPECT_EQ(test::code_of([&] { pool->attach_tiers(t); }), Errc::kInvalidArgument);
  EXPECT_EQ(pool->validate(), "");
}

// ------------------------------------- tiered admission and hash lookups

// Both lookups with the engine's hashes follow them through the tiers: a
// fresh pool's hashes of the same tokens (same seed, no salt).
TEST(TiersAdmit, AdmitTieredLoadsFromBothTiersByteExactAndAttentionMatches) {
  for (const bool by_hash : {false, true}) {
    SCOPED_TRACE(by_hash ? "admit with hashes" : "admit");
    Fixture f = offloaded(3, 2);  // blocks 0-2 in the host tier, block 3 in the file
    Pool& p = *f.pool;
    const std::vector<BlockHash> hs = block_hashes_of(p, f.tokens, 4);
    TieredMatch m;
    const Pool::Admitted a = p.admit({}, f.tokens.data(), f.tokens.size(),
                                     by_hash ? hs.data() : nullptr, by_hash ? 4 : 0, 0, &m);
    EXPECT_EQ(a.num_cached, 16u);
    EXPECT_EQ(m.device, 0u);
    EXPECT_EQ(m.host, 12u);
    EXPECT_EQ(m.file, 4u);
    EXPECT_EQ(p.seq_info(a.id).num_tokens, 17u);
    EXPECT_EQ(p.seq_info(a.id).num_cached_tokens, 16u);
    EXPECT_EQ(p.seq_info(a.id).num_computed_tokens, 0u);  // not loaded yet
    EXPECT_EQ(p.validate(), "");
    const auto out = attend_last(f.pool, a.id, f.q, &f);  // the plan loads, then attends
    for (uint32_t l = 0; l < kLayers; ++l) EXPECT_EQ(out[l], f.ref_out[l]) << "layer " << l;
    const auto tab = test::table(p, a.id);
    for (size_t j = 0; j < 4; ++j)
      EXPECT_EQ(bytes_of(p, tab[j]), f.block_bytes[j]) << "block " << j;
    EXPECT_EQ(p.seq_info(a.id).num_computed_tokens, 17u);
    EXPECT_EQ(p.tier_stats(1).num_loaded, 3u);
    EXPECT_EQ(p.tier_stats(2).num_loaded, 1u);
    EXPECT_EQ(p.validate(), "");
  }
}

TEST(TiersAdmit, MatchPrefixHashesTieredContinuesTheDeviceHits) {
  Fixture f = offloaded(4, 0);
  Pool& p = *f.pool;
  const std::vector<BlockHash> hs = block_hashes_of(p, f.tokens, 4);
  // Block 0 comes back to the device first (a one-block tiered match,
  // loaded); then the full lookup hits it there and the rest in the host
  // tier, the chain going on from the device hit's hash.
  SeqId d = p.seq_create({});
  EXPECT_EQ(p.match_prefix_tiered(d, f.tokens.data(), kBs + 1).host, kBs);
  p.flush_tiers();
  p.free(d);
  SeqId c = p.seq_create({});
  const TieredMatch m = p.match_prefix_tiered(c, f.tokens.data(), 17, hs.data(), 4);
  EXPECT_EQ(m.device, 4u);
  EXPECT_EQ(m.host, 12u);
  EXPECT_EQ(m.file, 0u);
  EXPECT_EQ(p.seq_info(c).num_computed_tokens, 4u);
  p.append(c, f.tokens.data() + 16, 1, 0);
  const auto out = attend_last(f.pool, c, f.q, &f);
  for (uint32_t l = 0; l < kLayers; ++l) EXPECT_EQ(out[l], f.ref_out[l]) << "layer " << l;
  const auto tab = test::table(p, c);
  for (size_t j = 0; j < 4; ++j) EXPECT_EQ(bytes_of(p, tab[j]), f.block_bytes[j]) << "block " << j;
  EXPECT_EQ(p.validate(), "");
  // Fewer hashes limit the lookup, in the tiers too.
  p.free(c);
  SeqId e = p.seq_create({});
  const TieredMatch two = p.match_prefix_tiered(e, f.tokens.data(), 17, hs.data(), 2);
  EXPECT_EQ(two.device + two.host + two.file, 8u);
  EXPECT_EQ(p.validate(), "");
}

TEST(TiersAdmit, FileTierThroughTheHashLookup) {
  Fixture f = offloaded(3, 2);
  Pool& p = *f.pool;
  const std::vector<BlockHash> hs = block_hashes_of(p, f.tokens, 4);
  SeqId c = p.seq_create({});
  const TieredMatch m = p.match_prefix_tiered(c, f.tokens.data(), 17, hs.data(), 4);
  EXPECT_EQ(m.host, 12u);
  EXPECT_EQ(m.file, 4u);
  p.append(c, f.tokens.data() + 16, 1, 0);
  const auto out = attend_last(f.pool, c, f.q, &f);
  for (uint32_t l = 0; l < kLayers; ++l) EXPECT_EQ(out[l], f.ref_out[l]) << "layer " << l;
  const auto tab = test::table(p, c);
  for (size_t j = 0; j < 4; ++j) EXPECT_EQ(bytes_of(p, tab[j]), f.block_bytes[j]) << "block " << j;
  EXPECT_EQ(p.tier_stats(2).num_loaded, 1u);
  EXPECT_EQ(p.validate(), "");
}

// Corruption in either tier: the hit taken through the new calls becomes a
// counted miss at load; the plan fails naming the tokens to compute.
TEST(TiersAdmit, CorruptionIsACountedMissNeverServed) {
  for (const bool in_file : {false, true}) {
    SCOPED_TRACE(in_file ? "file tier" : "host tier");
    Fixture f = offloaded(3, 2);
    Pool& p = *f.pool;
    const std::vector<BlockHash> hs = block_hashes_of(p, f.tokens, 4);
    // Block 1 is in the host tier, block 3 in the file.
    ASSERT_TRUE(p.tiers_for_testing()->corrupt_for_testing(hs[in_file ? 3 : 1]));
    TieredMatch m;
    const Pool::Admitted a = p.admit({}, f.tokens.data(), 17, hs.data(), 4, 0, &m);
    EXPECT_EQ(m.host + m.file, 16u);
    const uint32_t one = 1;
    try {
      Batch::prepare(f.pool, &a.id, &one, 1, nullptr);
      FAIL() << "a plan over a corrupted block was prepared";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidState);
      const std::string want = in_file ? "tokens [12, 16)" : "tokens [4, 16)";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    const TierStats s = p.tier_stats(in_file ? 2 : 1);
    EXPECT_EQ(s.num_checksum_failures, 1u);
    EXPECT_EQ(s.num_blocks, 0u + (in_file ? 0 : 2));  // the bad entry is gone
    EXPECT_EQ(p.seq_info(a.id).num_computed_tokens, in_file ? 12u : 4u);
    EXPECT_EQ(p.validate(), "");
    // Nobody else hits the bad block: it left the prefix cache.
    SeqId d = p.seq_create({});
    EXPECT_EQ(p.match_prefix(d, f.tokens.data(), 17), in_file ? 12u : 4u);
    p.free(d);
    // The engine computes the rest; then everything is written.
    const uint32_t rest = in_file ? 5 : 13;
    auto b = Batch::prepare(f.pool, &a.id, &rest, 1, nullptr);
    b->commit();
    EXPECT_EQ(p.seq_info(a.id).num_computed_tokens, 17u);
    EXPECT_EQ(p.validate(), "");
  }
}

TEST(TiersAdmit, SaltsKeepTenantsApart) {
  Fixture f = offloaded(4, 0);
  Pool& p = *f.pool;
  SeqOptions other;
  other.cache_salt = "tenant-b";
  // The other tenant's own hashes of the same tokens: no hit in any tier.
  SeqId probe = p.seq_create(other);
  p.append(probe, f.tokens.data(), 16, 0);
  std::vector<BlockHash> salted(4);
  p.block_hashes(probe, salted.data(), 4);
  p.free(probe);
  TieredMatch m;
  const Pool::Admitted a = p.admit(other, f.tokens.data(), 17, nullptr, 0, 0, &m);
  EXPECT_EQ(m.device + m.host + m.file, 0u);
  p.free(a.id);
  const Pool::Admitted b = p.admit(other, f.tokens.data(), 17, salted.data(), 4, 0, &m);
  EXPECT_EQ(m.device + m.host + m.file, 0u);
  p.free(b.id);
  SeqId c = p.seq_create(other);
  m = p.match_prefix_tiered(c, f.tokens.data(), 17, salted.data(), 4);
  EXPECT_EQ(m.device + m.host + m.file, 0u);
  EXPECT_EQ(p.tier_stats(1).num_hits, 0u);
  // The unsalted hashes under the salted sequence are refused, not looked up.
  const std::vector<BlockHash> plain = block_hashes_of(p, f.tokens, 4);
  p.free(c);
  c = p.seq_create(other);
  EXPECT_EQ(test::code_of([&] { p.match_prefix_tiered(c, f.tokens.data(), 17, plain.data(), 4); }),
            Errc::kInvalidArgument);
  EXPECT_EQ(test::code_of([&] { p.admit(other, f.tokens.data(), 17, plain.data(), 4, 0, &m); }),
            Errc::kInvalidArgument);
  EXPECT_EQ(p.tier_stats(1).num_hits, 0u);
  EXPECT_EQ(p.validate(), "");
}

// All or nothing: a prompt that does not fit takes no tier entry and
// creates no sequence; one that fits takes every tier hit.
TEST(TiersAdmit, OutOfBlocksChangesNothing) {
  Fixture f = offloaded(4, 0);
  Pool& p = *f.pool;
  const PoolStats before = p.stats();
  TieredMatch m;
  EXPECT_EQ(test::code_of([&] { p.admit({}, f.tokens.data(), 17, nullptr, 0, 8, &m); }),
            Errc::kOutOfBlocks);
  const PoolStats after = p.stats();
  EXPECT_EQ(after.num_seqs, before.num_seqs);
  EXPECT_EQ(after.num_free_blocks, before.num_free_blocks);
  EXPECT_EQ(p.tier_stats(1).num_hits, 0u);
  EXPECT_EQ(p.validate(), "");
  const Pool::Admitted a = p.admit({}, f.tokens.data(), 17, nullptr, 0, 3, &m);
  EXPECT_EQ(m.host, 16u);
  EXPECT_EQ(p.seq_info(a.id).num_slots, 20u);
  p.flush_tiers();
  EXPECT_EQ(p.seq_info(a.id).num_computed_tokens, 16u);
  EXPECT_EQ(p.validate(), "");
}

// A sliding-window pool: the window releases device hits only (tier hits
// are not computed until their load), and the loaded blocks then serve.
TEST(TiersAdmit, SlidingWindowPool) {
  PoolOptions o = f32_pool(1, kDim);
  o.num_layers = 1;
  o.num_blocks = 12;
  o.sliding_window = 6;
  auto pool = Pool::create(o);
  Pool& p = *pool;
  TierOptions t;
  t.host_bytes = 1 << 20;
  p.attach_tiers(t);
  const auto tokens = iota_tokens(25);
  SeqId a = p.seq_create({});
  p.append(a, tokens.data(), 25, 0);
  const uint32_t n = 25;
  {
    auto b = Batch::prepare(pool, &a, &n, 1, nullptr);
    auto k = random_floats(n * kDim, 91), v = random_floats(n * kDim, 92);
    TensorArg kt = test::rows(k, n, 1, kDim), vt = test::rows(v, n, 1, kDim);
    b->write(0, &kt, &vt, nullptr);
    ASSERT_TRUE(b->committed());
  }
  p.free(a);
  SeqId other = p.seq_create({});
  const auto t2 = iota_tokens(44, 1000);
  p.append(other, t2.data(), t2.size(), 0);  // evicts a's cached blocks
  p.free(other);
  p.flush_tiers();
  TieredMatch m;
  const Pool::Admitted b = p.admit({}, tokens.data(), 25, nullptr, 0, 0, &m);
  EXPECT_EQ(m.device + m.host, 24u);
  EXPECT_GT(m.host, 0u);
  EXPECT_EQ(p.validate(), "");
  p.flush_tiers();
  EXPECT_EQ(p.seq_info(b.id).num_computed_tokens, 24u);
  const uint32_t one = 1;
  Batch::prepare(pool, &b.id, &one, 1, nullptr)->abort();
  EXPECT_EQ(p.validate(), "");
}

// Without tiers the tiered admit is admit: the same sequence, the device
// hits in TieredMatch::device.
TEST(TiersAdmit, WithoutTiersItIsAdmit) {
  auto pool = Pool::create(f32_pool(kHeads, kDim));
  Pool& p = *pool;
  const auto tokens = iota_tokens(17);
  SeqId a = p.seq_create({});
  p.append(a, tokens.data(), 17, 0);
  const uint32_t n = 17;
  {
    auto b = Batch::prepare(pool, &a, &n, 1, nullptr);
    for (uint32_t l = 0; l < kLayers; ++l) {
      auto k = random_floats(n * kHeads * kDim, 50 + l),
           v = random_floats(n * kHeads * kDim, 60 + l);
      TensorArg kt = rows(k, n), vt = rows(v, n);
      b->write(l, &kt, &vt, nullptr);
    }
    ASSERT_TRUE(b->committed());
  }
  const auto want = test::table(p, a);
  p.free(a);
  TieredMatch m;
  const Pool::Admitted b = p.admit({}, tokens.data(), 17, nullptr, 0, 0, &m);
  EXPECT_EQ(b.num_cached, 16u);
  EXPECT_EQ(m.device, 16u);
  EXPECT_EQ(m.host + m.file, 0u);
  EXPECT_EQ(p.seq_info(b.id).num_computed_tokens, 16u);
  const auto got = test::table(p, b.id);
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + 4),
            std::vector<int32_t>(want.begin(), want.begin() + 4));
  EXPECT_EQ(p.validate(), "");
}

// An import (pkv_transfer_import) writes its fresh blocks outside every
// lock, from the transport's progress. Those blocks may have just been
// evicted from the prefix cache, their offloads only queued: the copy
// thread read them while the import's reads landed, and the tier then
// held the imported bytes under the evicted block's hash and a checksum
// of them, served as that block by a later tiered hit. import_begin now
// waits for the queued offloads before the reads are posted. (The copy
// thread is slowed here so that it is still copying when import_begin
// returns.)
TEST(Tiers, ImportWaitsForTheOffloadsOfTheBlocksItTakes) {
  auto pool = Pool::create(f32_pool(kHeads, kDim));
  Pool& p = *pool;
  TierOptions t;
  t.host_bytes = 8 * kBlockBytes;
  p.attach_tiers(t);
  const auto ta = iota_tokens(17);
  SeqId a = p.seq_create({});
  p.append(a, ta.data(), ta.size(), 0);
  {
    const uint32_t n = 17;
    auto b = Batch::prepare(pool, &a, &n, 1, nullptr);
    for (uint32_t l = 0; l < kLayers; ++l) {
      std::vector<float> k = random_floats(n * kHeads * kDim, 30 + l), v = k;
      TensorArg kt = rows(k, n), vt = rows(v, n);
      b->write(l, &kt, &vt, nullptr);
    }
    ASSERT_TRUE(b->committed());
  }
  p.free(a);  // 4 cached, written blocks
  p.flush_tiers();
  EXPECT_EQ(p.tier_stats(1).num_stored, 0u);
  p.tiers_for_testing()->delay_offloads_for_testing(50);
  const auto tb = iota_tokens(20, 1000);
  const SeqId imp = p.import_begin({}, tb.data(), tb.size());  // evicts a's 4 blocks
  // Every block the import took is in the tier already: nothing reads
  // them any more when the import writes them.
  EXPECT_EQ(p.tier_stats(1).num_stored, 4u);
  p.tiers_for_testing()->delay_offloads_for_testing(0);
  p.import_commit(imp);
  p.free(imp);
  EXPECT_EQ(p.validate(), "");
}

TEST(Tiers, AttachChecksItsArguments) {
  PoolOptions mo = test::manager_options(4, 8);
  auto manager = Pool::create(mo);
  TierOptions t;
  t.host_bytes = 1 << 20;
  EXPECT_EQ(test::code_of([&] { manager->attach_tiers(t); }), Errc::kInvalidState);
  PoolOptions so = test::storage_options(4, 8, 8);
  auto pool = Pool::create(so);
  TierOptions tiny;
  tiny.host_bytes = 1;  // below one block
  EXPECT_EQ(test::code_of([&] { pool->attach_tiers(tiny); }), Errc::kInvalidArgument);
  TierOptions nodir = t;
  nodir.file_bytes = 1 << 20;
  EXPECT_EQ(test::code_of([&] { pool->attach_tiers(nodir); }), Errc::kInvalidArgument);
  TierOptions baddir = t;
  baddir.file_dir = "/nonexistent-dir-for-pagedkv";
  baddir.file_bytes = 1 << 20;
  EXPECT_EQ(test::code_of([&] { pool->attach_tiers(baddir); }), Errc::kInvalidArgument);
  EXPECT_EQ(test::code_of([&] { pool->tier_stats(1); }), Errc::kInvalidState);
  pool->attach_tiers(t);
  EXPECT_EQ(test::code_of([&] { pool->attach_tiers(t); }), Errc::kInvalidState);
  EXPECT_EQ(test::code_of([&] { pool->tier_stats(0); }), Errc::kInvalidArgument);
  EXPECT_EQ(test::code_of([&] { pool->tier_stats(2); }), Errc::kInvalidState);
  EXPECT_EQ(pool->validate(), "");
}

}  // namespace
}  // namespace pagedkv
