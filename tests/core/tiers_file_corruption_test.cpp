// The file tier's slots corrupted arbitrarily, through the C ABI only: random
// bytes, runs of garbage, zeroed ranges, one slot's bytes copied over
// another's (another prefix's K/V, with a valid layout), the file cut short or
// grown. Every tiered hit must then load exactly the K/V written for that
// prefix or be a miss (num_computed_tokens stops before it); never another
// prefix's data, never a crash; the pool validates. The tier file is found
// through /proc/self/fd (it is unlinked at creation). PKV_TIER_FUZZ_ROUNDS
// (default 40) and PKV_TIER_FUZZ_SEED set the run's length and seed.
#include <dirent.h>
#include <gtest/gtest.h>
#include <pagedkv/pagedkv.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr uint32_t kBs = 4, kDim = 8, kPrompts = 6, kTokens = 8;  // 2 blocks a prompt

void ok(pkv_status s) { ASSERT_EQ(s, PKV_OK) << pkv_last_error_message(); }

int tier_fd() {
  int found = -1;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent* e = readdir(d)) {
    char target[512];
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = 0;
    if (std::strstr(target, "pagedkv-tier-")) found = std::atoi(e->d_name);
  }
  closedir(d);
  return found;
}

float kv(uint32_t prompt, uint32_t pos, uint32_t d, int w) {
  return (w ? -1.f : 1.f) * (float(prompt * 64 + pos) + 0.125f * float(d));
}

std::vector<int32_t> prompt_tokens(uint32_t prompt) {
  std::vector<int32_t> t(kTokens);
  for (uint32_t i = 0; i < kTokens; ++i) t[i] = int32_t(1000 * (prompt + 1) + i);
  return t;
}

void write_step(pkv_pool* p, pkv_seq_id s, uint32_t prompt, uint32_t from, uint32_t n) {
  const uint32_t q = n;
  pkv_batch* b = nullptr;
  ok(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
  std::vector<float> k(size_t(n) * kDim), v(k.size());
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t d = 0; d < kDim; ++d) {
      k[i * kDim + d] = kv(prompt, from + i, d, 0);
      v[i * kDim + d] = kv(prompt, from + i, d, 1);
    }
  const int64_t shape[3] = {int64_t(n), 1, kDim};
  pkv_tensor tk, tv;
  ok(pkv_tensor_init(k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &tk));
  ok(pkv_tensor_init(v.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &tv));
  ok(pkv_cache_write(b, 0, &tk, &tv, nullptr));
  pkv_batch_destroy(b);
}

TEST(FileTierCorruption, CorruptedSlotsAreMissesNeverOtherPrefixesData) {
  const char* r = std::getenv("PKV_TIER_FUZZ_ROUNDS");
  const char* sd = std::getenv("PKV_TIER_FUZZ_SEED");
  const int rounds = r ? std::atoi(r) : 40;
  std::mt19937_64 rng(sd ? std::strtoull(sd, nullptr, 10) : 7);
  uint64_t served = 0, missed = 0;
  for (int round = 0; round < rounds; ++round) {
    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.num_layers = 1, o.num_kv_heads = 1, o.head_dim = kDim, o.block_size = kBs;
    o.dtype = PKV_DTYPE_F32, o.num_blocks = 6, o.num_threads = 1;
    pkv_pool* p = nullptr;
    ok(pkv_pool_create(&o, &p));
    uint64_t bpb = 0;
    ok(pkv_pool_bytes_per_block(p, &bpb));
    pkv_tier_options t;
    pkv_tier_options_init(&t);
    t.host_bytes = 0;
    const char* dir = std::getenv("TMPDIR");
    t.file_dir = dir && *dir ? dir : "/tmp";
    t.file_bytes = 16 * bpb;
    ok(pkv_pool_attach_tiers(p, &t));
    // Every prompt computed, freed, and pushed out of the device by fillers.
    for (uint32_t pr = 0; pr < kPrompts; ++pr) {
      pkv_seq_id s = 0;
      ok(pkv_seq_create(p, nullptr, &s));
      const auto toks = prompt_tokens(pr);
      ok(pkv_seq_append(p, s, toks.data(), toks.size(), 0));
      write_step(p, s, pr, 0, kTokens);
      ok(pkv_seq_free(p, s));
    }
    for (uint32_t f = 0; f < 2; ++f) {
      pkv_seq_id s = 0;
      ok(pkv_seq_create(p, nullptr, &s));
      std::vector<int32_t> filler(5 * kBs);
      for (size_t i = 0; i < filler.size(); ++i) filler[i] = int32_t(900000 + 100 * f + i);
      ok(pkv_seq_append(p, s, filler.data(), filler.size(), 0));
      ok(pkv_seq_free(p, s));
    }
    ok(pkv_pool_flush_tiers(p));
    const int fd = tier_fd();
    ASSERT_GE(fd, 0) << "no pagedkv-tier- file among this process's descriptors";
    // 1-4 corruptions of the file.
    const int n = 1 + int(rng() % 4);
    for (int c = 0; c < n; ++c) {
      const off_t size = lseek(fd, 0, SEEK_END);  // an earlier cut shortened it
      if (size < off_t(bpb)) break;
      const off_t at = off_t(rng() % uint64_t(size));
      switch (rng() % 6) {
        case 0: {  // one byte
          const uint8_t b = uint8_t(rng());
          ASSERT_EQ(pwrite(fd, &b, 1, at), 1);
          break;
        }
        case 1: {  // a run of garbage
          std::vector<uint8_t> g(1 + rng() % (2 * bpb));
          for (auto& x : g) x = uint8_t(rng());
          ASSERT_GE(pwrite(fd, g.data(), g.size(), at), 0);
          break;
        }
        case 2: {  // zeros
          std::vector<uint8_t> z(1 + rng() % bpb, 0);
          ASSERT_GE(pwrite(fd, z.data(), z.size(), at), 0);
          break;
        }
        case 3: {  // one slot's bytes (another prefix's K/V) over another slot
          const uint64_t slots = uint64_t(size) / bpb;
          std::vector<uint8_t> s(bpb);
          const uint64_t from = rng() % slots, to = rng() % slots;
          if (pread(fd, s.data(), bpb, off_t(from * bpb)) != ssize_t(bpb)) break;
          ASSERT_EQ(pwrite(fd, s.data(), bpb, off_t(to * bpb)), ssize_t(bpb));
          break;
        }
        case 4:  // cut short
          ASSERT_EQ(ftruncate(fd, at), 0);
          break;
        case 5:  // grown
          ASSERT_EQ(ftruncate(fd, size + off_t(rng() % (4 * bpb))), 0);
          break;
      }
    }
    // Every prompt: what loads is exactly its K/V, or a miss.
    for (uint32_t pr = 0; pr < kPrompts; ++pr) {
      pkv_seq_id s = 0;
      ok(pkv_seq_create(p, nullptr, &s));
      const auto toks = prompt_tokens(pr);
      pkv_tier_match m;
      pkv_tier_match_init(&m);
      ok(pkv_seq_match_prefix_tiered(p, s, toks.data(), toks.size(), &m));
      ok(pkv_pool_flush_tiers(p));
      pkv_seq_info info;
      pkv_seq_info_init(&info);
      ok(pkv_seq_get_info(p, s, &info));
      int32_t table[8];
      uint64_t len = 0;
      ok(pkv_seq_get_block_table(p, s, table, 8, &len));
      pkv_tensor planes[2];
      ok(pkv_pool_kv_tensor(p, 0, 0, &planes[0]));
      ok(pkv_pool_kv_tensor(p, 0, 1, &planes[1]));
      for (uint64_t pos = 0; pos < info.num_computed_tokens; ++pos)
        for (int w = 0; w < 2; ++w) {
          const float* base = reinterpret_cast<const float*>(
              static_cast<const char*>(planes[w].data) + planes[w].byte_offset);
          const float* row = base + (size_t(table[pos / kBs]) * kBs + pos % kBs) * kDim;
          for (uint32_t d = 0; d < kDim; ++d)
            ASSERT_EQ(row[d], kv(pr, uint32_t(pos), d, w))
                << "round " << round << " prompt " << pr << " token " << pos
                << ": a corrupted slot was served";
        }
      served += info.num_computed_tokens;
      missed += m.num_cached - info.num_computed_tokens;
      ASSERT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
      ok(pkv_seq_free(p, s));
    }
    pkv_tier_stats ts;
    pkv_tier_stats_init(&ts);
    ok(pkv_pool_get_tier_stats(p, PKV_MEDIUM_FILE, &ts));
    pkv_pool_destroy(p);
  }
  std::printf("file tier corruption: %d rounds, %llu tokens served byte-exact, %llu refused\n",
              rounds, (unsigned long long)served, (unsigned long long)missed);
}

}  // namespace
