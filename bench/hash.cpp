// Prefix hashing throughput: 8k-token prompts, block size 16, one thread.
// Tokens are uniform over a 152k vocabulary (most CBOR-encode to 5 bytes,
// the rest to 3), so a block is ~100 bytes of CBOR.
//
// Rows per algorithm:
//   prefix        hash_prefix (the C ABI's path): encode + digest + output
//   prefix_extra  the same with LoRA id and cache salt (extra-key path)
//   hasher        BlockHasher::hash in a loop, no output vector
//   digest_only   ceiling: the digest alone over the same blocks pre-encoded
// Compare the tokens/s counter of each row with digest_only of the same algo.
#include <benchmark/benchmark.h>

#include <openssl/evp.h>
#include <xxhash.h>

#include <random>
#include <vector>

#include "hash/block_hash.h"

namespace {

using pagedkv::BlockHash;
using pagedkv::HashAlgo;

constexpr size_t kPromptTokens = 8192;
constexpr uint32_t kBlockSize = 16;

const std::vector<int32_t>& prompt() {
  static const std::vector<int32_t> tokens = [] {
    std::mt19937 rng(42);
    std::uniform_int_distribution<int32_t> dist(0, 152063);
    std::vector<int32_t> t(kPromptTokens);
    for (int32_t& v : t) v = dist(rng);
    return t;
  }();
  return tokens;
}

void set_rate(benchmark::State& state) {
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * kPromptTokens, benchmark::Counter::kIsRate);
}

void BM_prefix(benchmark::State& state, HashAlgo algo, bool extra) {
  pagedkv::HashContext ctx;
  ctx.algo = algo;
  ctx.block_size = kBlockSize;
  if (extra) {
    ctx.lora_id = 3;
    ctx.cache_salt = "tenant-1234";
  }
  const BlockHash root = pagedkv::hash_root(algo, "0");
  const std::vector<int32_t>& tokens = prompt();
  for (auto _ : state) {
    auto hashes = pagedkv::hash_prefix(ctx, root, tokens.data(), tokens.size());
    benchmark::DoNotOptimize(hashes.data());
  }
  set_rate(state);
}

void BM_hasher(benchmark::State& state, HashAlgo algo) {
  pagedkv::BlockHasher hasher(algo);
  const BlockHash root = pagedkv::hash_root(algo, "0");
  const std::vector<int32_t>& tokens = prompt();
  static const std::vector<pagedkv::ExtraKey> none;
  for (auto _ : state) {
    BlockHash parent = root;
    for (size_t i = 0; i + kBlockSize <= tokens.size(); i += kBlockSize)
      parent = hasher.hash(parent, tokens.data() + i, kBlockSize, none);
    benchmark::DoNotOptimize(parent);
  }
  set_rate(state);
}

// The digest primitive alone over the exact bytes the library hashes.
void BM_digest_only(benchmark::State& state, HashAlgo algo) {
  const BlockHash root = pagedkv::hash_root(algo, "0");
  const std::vector<int32_t>& tokens = prompt();
  std::vector<std::vector<uint8_t>> blocks;
  for (size_t i = 0; i + kBlockSize <= tokens.size(); i += kBlockSize)
    blocks.push_back(pagedkv::encode_block_cbor(root, tokens.data() + i, kBlockSize, {}));
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  EVP_DigestInit_ex2(ctx, md, nullptr);
  uint8_t out[32];
  unsigned int len = 0;
  for (auto _ : state) {
    for (const auto& b : blocks) {
      if (algo == HashAlgo::kXxh3_128) {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits(b.data(), b.size()));
        benchmark::DoNotOptimize(c);
      } else {
        EVP_DigestInit_ex2(ctx, nullptr, nullptr);
        EVP_DigestUpdate(ctx, b.data(), b.size());
        EVP_DigestFinal_ex(ctx, out, &len);
        benchmark::DoNotOptimize(out);
      }
    }
  }
  EVP_MD_free(md);
  EVP_MD_CTX_free(ctx);
  set_rate(state);
  size_t bytes = 0;
  for (const auto& b : blocks) bytes += b.size();
  state.counters["cbor_bytes/block"] = static_cast<double>(bytes) / blocks.size();
}

// clang-format off
BENCHMARK_CAPTURE(BM_prefix, sha256_cbor/prefix, HashAlgo::kSha256Cbor, false);
BENCHMARK_CAPTURE(BM_prefix, sha256_cbor/prefix_extra, HashAlgo::kSha256Cbor, true);
BENCHMARK_CAPTURE(BM_hasher, sha256_cbor/hasher, HashAlgo::kSha256Cbor);
BENCHMARK_CAPTURE(BM_digest_only, sha256_cbor/digest_only, HashAlgo::kSha256Cbor);
BENCHMARK_CAPTURE(BM_prefix, xxh3_128/prefix, HashAlgo::kXxh3_128, false);
BENCHMARK_CAPTURE(BM_prefix, xxh3_128/prefix_extra, HashAlgo::kXxh3_128, true);
BENCHMARK_CAPTURE(BM_hasher, xxh3_128/hasher, HashAlgo::kXxh3_128);
BENCHMARK_CAPTURE(BM_digest_only, xxh3_128/digest_only, HashAlgo::kXxh3_128);
// clang-format on

}  // namespace

BENCHMARK_MAIN();
