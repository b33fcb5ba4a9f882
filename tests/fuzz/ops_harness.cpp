// Decodes fuzzer bytes into random operation sequences on one pool and checks
// every result against a small reference model of what the C ABI promises
// (DESIGN.md §3, pagedkv/pool.h, pagedkv/batch.h):
//  - per sequence: its tokens, its block table (as last observed and
//    checked), which full blocks were hashed in the current cache epoch;
//  - per block: how many tables reference it (free = referenced by none);
//  - per storage slot: a fingerprint of the KV this harness wrote there (a
//    mirror of the arena for storage pools, written through
//    pkv_cache_write; for manager-only pools, what a step the harness
//    committed claims to have written), or 0 once a new token was appended
//    into the slot, its block was newly taken from the free queue, or a
//    step wrote it only partly. A slot is readable for a sequence when its
//    fingerprint is that of the sequence's own token there. The library
//    must never attach, hit or accept a plan over a slot the model says is
//    not readable (nor refuse one whose context is), and its
//    num_computed_tokens must equal the model's readable prefix. The model
//    follows the harness's own calls, never the library's bookkeeping.
// Pools with partial-block hits and retention priorities (issue 22): a
// partial hit must give a block that was free whose first k slots hold the
// K/V the harness wrote for exactly those tokens, positions and keys (copied
// from a cached block of the same LoRA and salt), the rest unwritten;
// retention ranges and the clock may only change which cached block an
// allocation evicts, never what a hit serves.
// Statuses are predicted, not observed: OUT_OF_BLOCKS exactly when the
// blocks an append needs exceed the free ones, NOT_FOUND for stale ids, and
// so on. After every operation pkv_pool_validate must pass and the pool's
// stats, infos and tables must equal the model's. Any disagreement prints
// what broke and aborts, which libFuzzer reports as a crash.
#include "ops_harness.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace pkv_fuzz {
namespace {

Counters g_counters;
// PKV_FUZZ_TRACE=1 prints every operation (for reproducing a failure).
const bool g_trace = std::getenv("PKV_FUZZ_TRACE") != nullptr;

void trace(const char* f, ...) {
  if (!g_trace) return;
  va_list ap;
  va_start(ap, f);
  std::vfprintf(stderr, f, ap);
  va_end(ap);
}

[[noreturn]] void die(int line, const char* cond, const std::string& what) {
  std::fprintf(stderr, "pkv_fuzz: check failed at ops_harness.cpp:%d: %s\n  %s\n  last error: %s\n",
               line, cond, what.c_str(), pkv_last_error_message());
  std::fflush(stderr);
  std::abort();
}

std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

#define CHECK(cond, ...)                                 \
  do {                                                   \
    if (!(cond)) die(__LINE__, #cond, fmt(__VA_ARGS__)); \
  } while (0)

// A call that must end with `want`; failures must carry a message.
#define EXPECT_STATUS(call, want)                                                               \
  do {                                                                                          \
    pkv_status got_ = (call);                                                                   \
    pkv_status want_ = (want);                                                                  \
    CHECK(got_ == want_, "%s returned %d, the model expects %d", #call, int(got_), int(want_)); \
    if (got_ != PKV_OK) {                                                                       \
      CHECK(pkv_last_error_message()[0] != '\0', "%s failed without a message", #call);         \
      ++g_counters.failed_calls;                                                                \
    } else {                                                                                    \
      CHECK(pkv_last_error_message()[0] == '\0', "%s succeeded but left a message", #call);     \
    }                                                                                           \
  } while (0)

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Bytes {
 public:
  Bytes(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool empty() const { return i_ >= n_; }
  uint8_t u8() { return i_ < n_ ? p_[i_++] : 0; }
  uint32_t below(uint32_t m) { return m ? u8() % m : 0; }
  uint32_t u16() { return uint32_t(u8()) | uint32_t(u8()) << 8; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t i_ = 0;
};

// ---------------------------------------------------------------- halves

float bf16_to_f(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f_to_bf16(float f) {  // exact for the values used here
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}
float f16_to_f(uint16_t h) {
  uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
  float v;
  if (exp == 0)
    v = std::ldexp(float(man), -24);
  else if (exp == 31)
    v = man ? NAN : INFINITY;
  else
    v = std::ldexp(float(man | 1024), int(exp) - 25);
  return sign ? -v : v;
}
uint16_t f_to_f16(float f) {  // exact for multiples of 1/64 in [-4, 4]
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  f = std::fabs(f);
  if (f == 0) return sign;
  int e;
  float m = std::frexp(f, &e);  // f = m * 2^e, m in [0.5, 1)
  uint32_t man = uint32_t(std::lround(m * 2048)) - 1024;
  return uint16_t(sign | uint16_t((e + 14) << 10) | uint16_t(man));
}

// ---------------------------------------------------------------- model

struct Config {
  uint32_t block_size = 4;
  uint64_t num_blocks = 8;
  bool caching = true;
  bool events = false;
  uint32_t max_events = 8;
  uint32_t window = 0;
  uint32_t algo = PKV_HASH_SHA256_CBOR;
  bool storage = false;
  uint32_t dtype = PKV_DTYPE_F32;
  uint32_t layers = 0, kv_heads = 0, head_dim = 0, group = 1;
  // Partial-block hits and retention priorities (no pinning budget) on.
  bool reuse = false;
};

struct MSeq {
  pkv_seq_id id = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> table;        // as last observed; checked after every op
  std::vector<uint64_t> hash_epoch;  // per full block: cache epoch it was hashed in
  uint64_t lora = 0;
  int salt = 0;  // 0 none, 1 "a", 2 "b"
  int family = 0;
  uint64_t num_cached = 0;
  uint64_t committed = 0;  // end of the tokens a step the harness committed covered (or hits)

  uint64_t num_null() const {
    uint64_t k = 0;
    while (k < table.size() && table[k] == PKV_NULL_BLOCK) ++k;
    return k;
  }
};

const char* salt_str(int s) { return s == 1 ? "a" : s == 2 ? "b" : nullptr; }

int32_t family_token(int family, uint64_t pos) {
  return int32_t((uint64_t(family) * 131 + pos * 17) % 251);
}

// Identity of a full block's content: everything its chained hash covers.
uint64_t prefix_key(uint64_t lora, int salt, const int32_t* tokens, uint64_t n) {
  uint64_t k = mix(lora * 3 + uint64_t(salt) + 1);
  for (uint64_t i = 0; i < n; ++i) k = mix(k ^ uint64_t(uint32_t(tokens[i])));
  return k;
}

// The KV a position holds: a function of what the block hash covers for
// that slot (position, token, LoRA), so equal cached blocks hold equal KV.
// The keys a block's content was hashed under, apart from its tokens.
uint64_t key_domain(uint64_t lora, int salt) { return mix(lora * 3 + uint64_t(salt) + 1); }

uint64_t slot_fp(uint64_t pos, int32_t tok, uint64_t lora) {
  return mix(mix(pos + 1) ^ (uint64_t(uint32_t(tok)) << 20) ^ (lora << 40)) | 1;
}
float kv_value(uint64_t fp, uint32_t layer, uint32_t which, uint32_t head, uint32_t d) {
  uint64_t h =
      mix(fp ^ (uint64_t(layer) << 56) ^ (uint64_t(which) << 48) ^ (uint64_t(head) << 32) ^ d);
  return float(int(h % 129) - 64) / 32.0f;  // k/32 in [-2, 2]: exact in f16 and bf16
}

class Harness {
 public:
  explicit Harness(Bytes& in) : in_(in) {}
  ~Harness() {
    pkv_pool_destroy(pool_);  // every sequence and block goes with it
  }

  void run() {
    if (!create_pool()) return;
    check_all();
    for (int step = 0; step < 400 && !in_.empty(); ++step) {
      op();
      ++g_counters.ops;
      check_all();
    }
  }

 private:
  // ------------------------------------------------------------ pool
  bool create_pool() {
    uint8_t b0 = in_.u8(), b1 = in_.u8(), b2 = in_.u8(), b3 = in_.u8();
    cfg_.storage = b0 & 1;
    cfg_.caching = ((b0 >> 1) & 1) != 0;  // half the pools: off is where fills matter most
    cfg_.events = b0 & 8;
    cfg_.algo = (b0 & 16) ? PKV_HASH_XXH3_128 : PKV_HASH_SHA256_CBOR;
    cfg_.num_blocks = 2 + b1 % 32;
    if (cfg_.storage) {
      static const uint32_t kBs[] = {8, 16};
      cfg_.block_size = kBs[b2 % 2];
      static const uint32_t kDt[] = {PKV_DTYPE_F32, PKV_DTYPE_F16, PKV_DTYPE_BF16};
      cfg_.dtype = kDt[b3 % 3];
      cfg_.kv_heads = 1 + (b3 >> 2) % 2;
      cfg_.layers = 1 + (b3 >> 3) % 2;
      cfg_.group = 1 + (b3 >> 4) % 2;
      cfg_.head_dim = (b3 & 0x20) ? 64 : 80;
    } else {
      static const uint32_t kBs[] = {1, 2, 3, 4, 8, 16};
      cfg_.block_size = kBs[b2 % 6];
    }
    if (((b0 >> 5) & 3) == 3) cfg_.window = 1 + (b2 >> 3) % (3 * cfg_.block_size);
    cfg_.max_events = 4 + b1 / 32;
    cfg_.reuse = (b0 & 4) != 0 && cfg_.caching;

    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.block_size = cfg_.block_size;
    o.num_blocks = cfg_.num_blocks;
    o.hash_algo = cfg_.algo;
    o.enable_prefix_caching = cfg_.caching;
    o.hash_seed = "fuzz";
    o.sliding_window = cfg_.window;
    o.enable_events = cfg_.events;
    o.max_events = cfg_.max_events;
    o.num_threads = 1;
    o.enable_partial_reuse = cfg_.reuse;
    o.enable_retention = cfg_.reuse;
    if (cfg_.storage) {
      o.num_layers = cfg_.layers;
      o.num_kv_heads = cfg_.kv_heads;
      o.head_dim = cfg_.head_dim;
      o.dtype = cfg_.dtype;
    }
    if (b0 & 0x80) {  // first a broken variant: must fail cleanly, out untouched
      pkv_pool_options bad = o;
      switch (b3 % 6) {
        case 0:
          bad.block_size = 0;
          break;
        case 1:
          bad.num_blocks = 1;
          break;
        case 2:
          bad.hash_algo = 77;
          break;
        case 3:
          bad.enable_prefix_caching = 2;
          break;
        case 4:
          bad.struct_size = 3;
          break;
        default:
          bad.device_type = 9;
          break;
      }
      pkv_pool* sentinel = reinterpret_cast<pkv_pool*>(&bad);
      pkv_pool* out = sentinel;
      EXPECT_STATUS(pkv_pool_create(&bad, &out), PKV_E_INVALID_ARGUMENT);
      CHECK(out == sentinel, "a failed pkv_pool_create wrote its out-parameter");
    }
    EXPECT_STATUS(pkv_pool_create(&o, &pool_), PKV_OK);
    trace("pool: bs %u blocks %llu caching %d window %u storage %d reuse %d\n", cfg_.block_size,
          (unsigned long long)cfg_.num_blocks, int(cfg_.caching), cfg_.window, int(cfg_.storage),
          int(cfg_.reuse));
    bs_ = cfg_.block_size;
    if (cfg_.storage) poison_arena();
    ckey_.assign(cfg_.num_blocks, 0);
    cdom_.assign(cfg_.num_blocks, 0);
    fp_.assign(cfg_.num_blocks * bs_, 0);
    return true;
  }

  // Every slot starts as a poison value instead of uninitialised memory, so
  // runs are deterministic. The default, 1024, is finite: a kernel that reads
  // a slot it must not use inside a query's window gets a result far from the
  // reference. PKV_FUZZ_NAN_POISON=1 poisons with NaN instead, which also
  // catches masked keys (outside the window, past the query) whose values
  // would reach the output as 0 * NaN (fixed; see AttentionRegression in
  // tests/reliability/attention_regression_test.cpp).
  void poison_arena() {
    static const bool nan_poison = std::getenv("PKV_FUZZ_NAN_POISON") != nullptr;
    for (uint32_t layer = 0; layer < cfg_.layers; ++layer)
      for (uint32_t which = 0; which < 2; ++which) {
        pkv_tensor t;
        EXPECT_STATUS(pkv_pool_kv_tensor(pool_, layer, which, &t), PKV_OK);
        CHECK(t.ndim == 4 && t.dtype == cfg_.dtype, "kv tensor of layer %u", layer);
        const size_t n = size_t(t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3]);
        if (cfg_.dtype == PKV_DTYPE_F32) {
          std::fill_n(static_cast<float*>(t.data), n, nan_poison ? NAN : 1024.0f);
        } else {
          const uint16_t v = cfg_.dtype == PKV_DTYPE_F16
                                 ? (nan_poison ? 0x7e00 : f_to_f16(1024.0f))
                                 : (nan_poison ? 0x7fc0 : f_to_bf16(1024.0f));
          std::fill_n(static_cast<uint16_t*>(t.data), n, v);
        }
      }
  }

  // ------------------------------------------------------------ model views
  std::map<int32_t, int> refs() const {
    std::map<int32_t, int> r;
    for (const MSeq& s : seqs_)
      for (int32_t b : s.table)
        if (b != PKV_NULL_BLOCK) ++r[b];
    return r;
  }
  uint64_t free_blocks() const { return cfg_.num_blocks - 1 - refs().size(); }

  MSeq* pick() { return seqs_.empty() ? nullptr : &seqs_[in_.below(uint32_t(seqs_.size()))]; }
  // Up to 4 distinct sequences (indexes), in the order drawn.
  std::vector<size_t> pick_distinct() {
    std::vector<size_t> idx;
    const uint32_t k = 1 + in_.below(4);
    for (uint32_t i = 0; i < k && !seqs_.empty(); ++i) {
      size_t j = in_.below(uint32_t(seqs_.size()));
      if (std::find(idx.begin(), idx.end(), j) == idx.end()) idx.push_back(j);
    }
    return idx;
  }

  std::vector<int32_t> observed_table(pkv_seq_id id) {
    uint64_t len = 0;
    pkv_status st = pkv_seq_get_block_table(pool_, id, nullptr, 0, &len);
    CHECK(st == PKV_OK || st == PKV_E_BUFFER_TOO_SMALL, "get_block_table size query: %d", int(st));
    std::vector<int32_t> t(len);
    if (len) EXPECT_STATUS(pkv_seq_get_block_table(pool_, id, t.data(), len, &len), PKV_OK);
    CHECK(len == t.size(), "block table length changed between calls");
    return t;
  }

  // What an append takes and gives back, from the contract: fresh blocks for
  // the new slots, a copy for every shared block it writes into, and the
  // ref-1 blocks that fall wholly out of the sliding window.
  struct Need {
    uint64_t fresh = 0, cow = 0, gain = 0, wfirst = 0, wend = 0;
  };
  Need need_of(const MSeq& s, uint64_t n, uint32_t la) const {
    auto r = refs();
    Need need;
    const uint64_t n0 = s.tokens.size(), len = s.table.size();
    const uint64_t want = (n0 + n + la + bs_ - 1) / bs_;
    need.fresh = want > len ? want - len : 0;
    if (n > 0) {
      const uint64_t last = std::min<uint64_t>(len, (n0 + n + bs_ - 1) / bs_);
      for (uint64_t j = n0 / bs_; j < last; ++j)
        if (r[s.table[j]] > 1) ++need.cow;
    }
    need.wfirst = need.wend = s.num_null();
    // The window releases relative to the first position no committed
    // step covered; lookahead alone releases nothing.
    const uint64_t q0 = std::min(n0, s.committed);
    if (cfg_.window > 0 && n > 0 && q0 + 1 > cfg_.window) {
      const uint64_t end = std::min<uint64_t>(len, (q0 + 1 - cfg_.window) / bs_);
      for (uint64_t j = need.wfirst; j < end; ++j)
        if (r[s.table[j]] == 1) ++need.gain;
      need.wend = std::max(end, need.wfirst);
    }
    return need;
  }

  // ------------------------------------------------------------ operations
  void op() {
    switch (in_.below(19)) {
      case 0:
      case 1:
        op_create();
        break;
      case 2:
        op_match();
        break;
      case 3:
      case 4:
      case 5:
        op_append();
        break;
      case 6:
        op_fork();
        break;
      case 7:
        op_truncate();
        break;
      case 8:
        op_free();
        break;
      case 9:
        op_reset();
        break;
      case 10:
        op_stale();
        break;
      case 11:
        op_hashes();
        break;
      case 12:
        op_events();
        break;
      case 13:
      case 14:
        op_step();
        break;
      case 16:
        op_branch();
        break;
      case 17:
        op_decode_run();
        break;
      case 18:
        op_decode_fused();
        break;
      case 15:
        if (cfg_.reuse) {
          op_retention();
          break;
        }
        op_stale_plan();
        break;
      default:
        op_stale_plan();
        break;
    }
  }

  void op_create() {
    if (seqs_.size() >= 12) return op_free();
    MSeq s;
    uint8_t b = in_.u8();
    s.lora = (b & 3) == 3 ? 7 : 0;
    s.salt = (b >> 2) % 3;
    s.family = (b >> 4) % 4;
    pkv_seq_options so;
    pkv_seq_options_init(&so);
    so.lora_id = s.lora;
    so.cache_salt = salt_str(s.salt);
    so.priority = int32_t(b) - 128;
    const bool defaults = s.lora == 0 && s.salt == 0 && (b & 0x80);
    EXPECT_STATUS(pkv_seq_create(pool_, defaults ? nullptr : &so, &s.id), PKV_OK);
    CHECK(s.id != PKV_SEQ_ID_INVALID, "pkv_seq_create returned the invalid id");
    for (const MSeq& o : seqs_) CHECK(o.id != s.id, "pkv_seq_create reused a live id");
    trace("create %llx lora %llu salt %d family %d\n", (unsigned long long)s.id,
          (unsigned long long)s.lora, s.salt, s.family);
    seqs_.push_back(s);
  }

  std::vector<int32_t> query_tokens(const MSeq& s) {
    const uint64_t n = 1 + in_.below(4 * bs_ + 2);
    const uint8_t d = in_.u8();
    std::vector<int32_t> q(n);
    for (uint64_t i = 0; i < n; ++i) q[i] = family_token(s.family, i);
    if (d & 1) q[(d >> 1) % n] = 300 + (d >> 1);  // diverge somewhere
    return q;
  }

  void op_match() {
    MSeq* s = pick();
    if (!s) return op_create();
    std::vector<int32_t> q = query_tokens(*s);
    const uint64_t n = q.size();
    uint64_t cached = 12345;
    if (!s->tokens.empty() || !s->table.empty()) {
      EXPECT_STATUS(pkv_seq_match_prefix(pool_, s->id, q.data(), n, &cached), PKV_E_INVALID_STATE);
      CHECK(cached == 12345, "failed match_prefix wrote out_num_cached");
      return;
    }
    // Lower bound: a live sequence with the same LoRA and salt holding the
    // same leading full blocks, all hashed since the last reset.
    uint64_t must = 0;
    if (cfg_.caching) {
      for (const MSeq& o : seqs_) {
        if (o.id == s->id || o.lora != s->lora || o.salt != s->salt) continue;
        uint64_t k = 0;
        const uint64_t readable = model_computed(o);
        while (
            k < o.hash_epoch.size() && k < (n - 1) / bs_ && o.table[k] != PKV_NULL_BLOCK &&
            o.hash_epoch[k] == epoch_ && (k + 1) * bs_ <= readable &&
            std::equal(q.begin() + k * bs_, q.begin() + (k + 1) * bs_, o.tokens.begin() + k * bs_))
          ++k;
        must = std::max(must, k * bs_);
      }
    }
    // With partial hits on, half the matches ask for them.
    const bool partial = cfg_.reuse && (in_.u8() & 1);
    pkv_prefix_match pm;
    pkv_prefix_match_init(&pm);
    if (partial) {
      EXPECT_STATUS(pkv_seq_match_prefix_partial(pool_, s->id, q.data(), n, &pm), PKV_OK);
      cached = pm.num_cached - pm.partial_tokens;
    } else {
      EXPECT_STATUS(pkv_seq_match_prefix(pool_, s->id, q.data(), n, &cached), PKV_OK);
    }
    const uint64_t k = pm.partial_tokens;
    trace("match %llx: %llu tokens, hit %llu + %llu partial (at least %llu)\n",
          (unsigned long long)s->id, (unsigned long long)n, (unsigned long long)cached,
          (unsigned long long)k, (unsigned long long)must);
    query_tokens_ += n;
    hit_tokens_ += cached + k;
    CHECK(cached % bs_ == 0, "hit %llu is not whole blocks", (unsigned long long)cached);
    CHECK(cached <= (n - 1) / bs_ * bs_, "hit %llu leaves no token to compute of %llu",
          (unsigned long long)cached, (unsigned long long)n);
    CHECK(cfg_.caching || cached == 0, "hit with prefix caching disabled");
    CHECK(cached >= must, "hit %llu, but a live sequence holds %llu matching cached tokens",
          (unsigned long long)cached, (unsigned long long)must);
    CHECK(k < bs_ && cached + k < n, "partial hit of %llu tokens after %llu of %llu",
          (unsigned long long)k, (unsigned long long)cached, (unsigned long long)n);
    const auto before = refs();
    std::vector<int32_t> t = observed_table(s->id);
    CHECK(t.size() == cached / bs_ + (k ? 1 : 0), "table of %zu blocks after a %llu-token hit",
          t.size(), (unsigned long long)cached);
    for (uint64_t j = 0; j < cached / bs_; ++j) {
      CHECK(t[j] > 0 && uint64_t(t[j]) < cfg_.num_blocks, "hit block %d out of range", t[j]);
      // Soundness: the block's content is exactly this prefix.
      const uint64_t want = prefix_key(s->lora, s->salt, q.data(), (j + 1) * bs_);
      CHECK(ckey_[t[j]] == want, "prefix hit on block %d whose content is another prefix", t[j]);
      // Written: every slot holds the K/V the harness wrote for this token.
      for (uint64_t o = 0; o < bs_; ++o) {
        const uint64_t pos = j * bs_ + o;
        CHECK(fp_[t[j] * bs_ + o] == slot_fp(pos, q[pos], s->lora),
              "prefix hit on block %d whose slot %llu nobody wrote (read of unwritten K/V)", t[j],
              (unsigned long long)o);
      }
    }
    if (k > 0) {
      // The partial block: a block that was free, whose first k slots now
      // hold the K/V the harness wrote for exactly these tokens at these
      // positions under this LoRA, copied from a cached block of the same
      // keys (or that block itself, reused in place); the rest unwritten.
      const int32_t dst = t.back();
      CHECK(dst > 0 && uint64_t(dst) < cfg_.num_blocks && before.count(dst) == 0,
            "partial-hit block %d was not free", dst);
      const bool copied = pm.copy_src != PKV_NULL_BLOCK;
      CHECK(copied == (pm.copy_dst != PKV_NULL_BLOCK) && (!copied || pm.copy_dst == dst),
            "partial hit names copy %d -> %d, the table's block is %d", pm.copy_src, pm.copy_dst,
            dst);
      const int32_t src = copied ? pm.copy_src : dst;
      CHECK(src > 0 && uint64_t(src) < cfg_.num_blocks, "copy source %d out of range", src);
      CHECK(cdom_[src] == key_domain(s->lora, s->salt),
            "partial hit on block %d cached under another LoRA or salt", src);
      for (uint64_t o = 0; o < k; ++o) {
        const uint64_t pos = cached + o;
        CHECK(fp_[src * bs_ + o] == slot_fp(pos, q[pos], s->lora),
              "partial hit on block %d whose slot %llu does not hold this token's K/V", src,
              (unsigned long long)o);
      }
      std::copy_n(fp_.begin() + src * bs_, k, fp_.begin() + dst * bs_);
      std::fill(fp_.begin() + dst * bs_ + k, fp_.begin() + (dst + 1) * bs_, 0);
      ++partial_hits_;
      partial_tokens_ += k;
    }
    s->tokens.assign(q.begin(), q.begin() + cached + k);
    s->table = t;
    s->hash_epoch.assign(cached / bs_, epoch_);
    s->num_cached = s->committed = cached + k;
  }

  // Retention ranges on a sequence (valid, invalid, or a pin the budget of 0
  // refuses) and the pool's clock moving on: priorities only decide which
  // cached block an allocation evicts, which the model never predicts; every
  // hit must stay sound and every invariant hold.
  void op_retention() {
    MSeq* s = pick();
    const uint8_t b = in_.u8();
    if (b & 1) {
      clock_ns_ += uint64_t(in_.u8()) * 1000;
      EXPECT_STATUS(pkv_pool_set_clock(pool_, clock_ns_), PKV_OK);
    }
    if (!s) return;
    pkv_retention_range r[3];
    const uint32_t n = 1 + (b >> 1) % 3;
    pkv_status want = PKV_OK;
    bool pins = false;
    for (uint32_t i = 0; i < n; ++i) {
      const uint8_t c = in_.u8();
      r[i].token_begin = in_.below(4 * uint32_t(bs_));
      r[i].token_end = (c & 1) ? PKV_TOKEN_END : r[i].token_begin + in_.below(4 * uint32_t(bs_));
      r[i].priority = (c & 0x70) == 0x70 ? 100 + (c >> 7) : in_.below(100);
      r[i].reserved = 0;
      r[i].duration_ns = (c & 2) ? uint64_t(in_.u8()) * 1000 : 0;
      if (want == PKV_OK && (r[i].token_begin >= r[i].token_end || r[i].priority > 100))
        want = PKV_E_INVALID_ARGUMENT;
      pins |= r[i].priority == 100;
    }
    if (want == PKV_OK && pins) want = PKV_E_OUT_OF_BLOCKS;  // max_pinned_blocks is 0
    trace("retention %llx: %u ranges, expect %d\n", (unsigned long long)s->id, n, int(want));
    EXPECT_STATUS(pkv_seq_set_retention(pool_, s->id, r, n), want);
  }

  void op_append() {
    MSeq* s = pick();
    if (!s) return op_create();
    const uint8_t b = in_.u8();
    uint64_t n = in_.below(2 * bs_ + 2);
    if (b & 1) n = in_.below(3);  // decode-sized
    const uint32_t la = (b & 6) == 6 ? in_.below(bs_ + 1) : 0;
    append_to(s, n, la, b & 0x80);
  }

  // Appends n tokens of s's family (one foreign token in the middle if
  // `foreign`) with la lookahead slots; returns whether it succeeded.
  bool append_to(MSeq* s, uint64_t n, uint32_t la, bool foreign) {
    std::vector<int32_t> toks(n);
    const uint64_t n0 = s->tokens.size();
    for (uint64_t i = 0; i < n; ++i)
      toks[i] = foreign && i == n / 2 ? 400 + in_.u8() : family_token(s->family, n0 + i);

    const Need need = need_of(*s, n, la);
    const uint64_t take = need.fresh + need.cow, avail = free_blocks() + need.gain;
    uint64_t predicted = 0;
    EXPECT_STATUS(pkv_seq_blocks_needed(pool_, s->id, n, la, &predicted), PKV_OK);
    const uint64_t net = take - std::min(take, need.gain);  // net of what the window gives back
    trace("blocks_needed %llx: %llu tokens + %u lookahead at %llu, committed %llu\n",
          (unsigned long long)s->id, (unsigned long long)n, la, (unsigned long long)n0,
          (unsigned long long)s->committed);
    CHECK(predicted == net, "blocks_needed says %llu, the model %llu",
          (unsigned long long)predicted, (unsigned long long)net);
    const pkv_status want = take > avail ? PKV_E_OUT_OF_BLOCKS : PKV_OK;
    trace(
        "append %llx: %llu tokens + %u lookahead at %llu (table %zu); need %llu fresh %llu cow, "
        "free %llu + %llu window\n",
        (unsigned long long)s->id, (unsigned long long)n, la, (unsigned long long)n0,
        s->table.size(), (unsigned long long)need.fresh, (unsigned long long)need.cow,
        (unsigned long long)free_blocks(), (unsigned long long)need.gain);
    EXPECT_STATUS(pkv_seq_append(pool_, s->id, n ? toks.data() : nullptr, n, la), want);
    if (want != PKV_OK) return false;  // check_all proves nothing changed

    auto before = refs();
    std::set<int32_t> released, fresh;  // blocks the window gave back to the queue
    for (uint64_t j = need.wfirst; j < need.wend; ++j)
      if (before[s->table[j]] == 1) released.insert(s->table[j]);
    expect_appended(s, toks, la, need, before, released, fresh);
    return true;
  }

  // The model's side of an append of toks (+ la lookahead) to s that the
  // library made: the table observed must be the old one with copies of the
  // shared blocks written into, new blocks taken from those free before
  // (before: the references then; released: blocks windows gave back;
  // fresh: blocks already taken by this call, shared across the sequences
  // of one call), and window-released entries null.
  void expect_appended(MSeq* s, const std::vector<int32_t>& toks, uint32_t la, const Need& need,
                       std::map<int32_t, int>& before, const std::set<int32_t>& released,
                       std::set<int32_t>& fresh) {
    const uint64_t n0 = s->tokens.size(), n = toks.size();
    auto was_free = [&](int32_t b2) { return before.count(b2) == 0 || released.count(b2) != 0; };

    std::vector<int32_t> t = observed_table(s->id);
    const uint64_t len = s->table.size();
    const uint64_t want_len = std::max<uint64_t>(len, (n0 + n + la + bs_ - 1) / bs_);
    CHECK(t.size() == want_len, "table has %zu blocks, the model %llu", t.size(),
          (unsigned long long)want_len);
    const uint64_t wlo = n0 / bs_, whi = n ? std::min<uint64_t>(len, (n0 + n + bs_ - 1) / bs_) : 0;
    for (uint64_t j = 0; j < t.size(); ++j) {
      if (j < need.wend) {
        CHECK(t[j] == PKV_NULL_BLOCK, "entry %llu should be released by the window",
              (unsigned long long)j);
        continue;
      }
      CHECK(t[j] > 0 && uint64_t(t[j]) < cfg_.num_blocks, "block %d out of range", t[j]);
      if (j < len) {
        const bool shared = before[s->table[j]] > 1;
        if (j >= wlo && j < whi && shared) {
          CHECK(t[j] != s->table[j], "wrote into shared block %d without copy-on-write", t[j]);
          CHECK(was_free(t[j]) && fresh.insert(t[j]).second, "CoW target %d was not free", t[j]);
          if (j * bs_ < n0) {  // holds our tokens: their KV follows the copy
            ++cow_;
            std::copy_n(fp_.begin() + s->table[j] * bs_, bs_, fp_.begin() + t[j] * bs_);
          } else {
            std::fill_n(fp_.begin() + t[j] * bs_, bs_, 0);
          }
        } else {
          CHECK(t[j] == s->table[j], "entry %llu changed from %d to %d without cause",
                (unsigned long long)j, s->table[j], t[j]);
        }
      } else {
        CHECK(was_free(t[j]) && fresh.insert(t[j]).second, "new block %d was not free", t[j]);
        std::fill_n(fp_.begin() + t[j] * bs_, bs_, 0);  // whatever it held is not ours
      }
    }
    for (uint64_t p = n0; p < n0 + n; ++p) fp_[t[p / bs_] * bs_ + p % bs_] = 0;  // not computed yet
    s->tokens.insert(s->tokens.end(), toks.begin(), toks.end());
    s->table = t;
    s->hash_epoch.resize(std::min<uint64_t>(s->hash_epoch.size(), n0 / bs_));
    while (s->hash_epoch.size() < s->tokens.size() / bs_) s->hash_epoch.push_back(epoch_);
  }

  void op_fork() {
    MSeq* p = pick();
    if (!p) return op_create();
    if (seqs_.size() >= 12) return op_free();
    fork_of(size_t(p - seqs_.data()));
  }

  // Forks seqs_[i]; the child is seqs_.back().
  void fork_of(size_t i) {
    MSeq c = seqs_[i];
    EXPECT_STATUS(pkv_seq_fork(pool_, seqs_[i].id, &c.id), PKV_OK);
    trace("fork %llx -> %llx\n", (unsigned long long)seqs_[i].id, (unsigned long long)c.id);
    CHECK(observed_table(c.id) == seqs_[i].table, "the child's table differs from the parent's");
    seqs_.push_back(c);
  }

  // Beam search and speculative decoding: fork, roll one branch back into
  // a block both share, sometimes drop the other branch, then go on
  // decoding the survivor (with lookahead slots sometimes). Block fills of
  // shared, truncated tails are what this reaches (issue 14 item 3).
  void op_branch() {
    MSeq* p = pick();
    if (!p) return op_create();
    if (seqs_.size() >= 12) return op_free();
    const uint8_t b = in_.u8();
    const size_t parent = size_t(p - seqs_.data());
    fork_of(parent);
    const size_t child = seqs_.size() - 1;
    const size_t rolled = (b & 1) ? parent : child, other = (b & 1) ? child : parent;
    const uint64_t n0 = seqs_[rolled].tokens.size();
    const uint64_t m = n0 ? in_.below(uint32_t(std::min<uint64_t>(n0, 255))) : 0;
    if (truncate_status(seqs_[rolled], m) == PKV_OK) {
      trace("branch: truncate %llx to %llu\n", (unsigned long long)seqs_[rolled].id,
            (unsigned long long)m);
      EXPECT_STATUS(pkv_seq_truncate(pool_, seqs_[rolled].id, m), PKV_OK);
      apply_truncate(seqs_[rolled], m);
    }
    check_all();
    const pkv_seq_id survivor = seqs_[rolled].id;
    if (b & 2) free_at(other);
    MSeq* s = nullptr;
    for (MSeq& q : seqs_)
      if (q.id == survivor) s = &q;
    if (b & 4) {
      if (!append_to(s, 0, 1 + in_.below(bs_), false)) return;
      check_all();
    }
    if (b & 8) decode_run(s);
  }

  // Single-token appends, as a decode loop makes them: up to two blocks'
  // worth, until one does not fit.
  void decode_run(MSeq* s) {
    const uint32_t k = 1 + in_.below(2 * bs_);
    for (uint32_t i = 0; i < k; ++i) {
      if (!append_to(s, 1, 0, false)) return;
      check_all();
    }
  }

  void op_decode_run() {
    MSeq* s = pick();
    if (!s) return op_create();
    decode_run(s);
  }

  // Truncation must keep the last remaining token queryable: beyond the
  // tokens, or into keys the sliding window released, is an invalid argument.
  pkv_status truncate_status(const MSeq& s, uint64_t m) const {
    if (m > s.tokens.size()) return PKV_E_INVALID_ARGUMENT;
    const uint64_t nn = s.num_null();
    if (cfg_.window > 0 && m > 0 && nn > 0) {
      const uint64_t lo = (m > cfg_.window ? m - cfg_.window : 0) / bs_;
      if (lo < nn) return PKV_E_INVALID_ARGUMENT;
    }
    return PKV_OK;
  }

  void op_truncate() {
    MSeq* s = pick();
    if (!s) return op_create();
    const uint64_t n0 = s->tokens.size();
    const uint8_t b = in_.u8();
    uint64_t m = (b & 0x80) ? n0 + 1 + (b & 3) : (n0 ? (b % (n0 + 1)) : 0);
    if ((b & 0x60) == 0x60 && n0) m = n0 - 1;  // speculative rollback of one
    const pkv_status want = truncate_status(*s, m);
    trace("truncate %llx: %llu -> %llu\n", (unsigned long long)s->id, (unsigned long long)n0,
          (unsigned long long)m);
    EXPECT_STATUS(pkv_seq_truncate(pool_, s->id, m), want);
    if (want == PKV_OK) apply_truncate(*s, m);
  }

  // Blocks past the last token (lookahead ones included) are released.
  void apply_truncate(MSeq& s, uint64_t m) {
    const uint64_t keep = std::min<uint64_t>(s.table.size(), (m + bs_ - 1) / bs_);
    s.table.resize(keep);
    s.tokens.resize(m);
    if (s.hash_epoch.size() > m / bs_) s.hash_epoch.resize(m / bs_);
    s.num_cached = std::min(s.num_cached, m);
    s.committed = std::min(s.committed, m);
  }

  void op_free() {
    if (seqs_.empty()) return op_create();
    free_at(in_.below(uint32_t(seqs_.size())));
  }

  void free_at(size_t i) {
    EXPECT_STATUS(pkv_seq_free(pool_, seqs_[i].id), PKV_OK);
    trace("free %llx\n", (unsigned long long)seqs_[i].id);
    dead_.push_back(seqs_[i].id);
    seqs_.erase(seqs_.begin() + i);
  }

  void op_reset() {
    EXPECT_STATUS(pkv_pool_reset_prefix_cache(pool_), PKV_OK);
    trace("reset prefix cache\n");
    ++epoch_;
  }

  // Every sequence call on an id that is freed, never issued or 0.
  void op_stale() {
    const uint8_t b = in_.u8();
    pkv_seq_id id = PKV_SEQ_ID_INVALID;
    if (!dead_.empty() && (b & 1))
      id = dead_[(b >> 1) % dead_.size()];
    else if (b & 2)
      id = (uint64_t(b) << 32) | 0xfff0u;  // a slot never used
    int32_t tok = 1;
    uint64_t u = 7;
    pkv_seq_id child = 99;
    pkv_seq_info info;
    pkv_seq_info_init(&info);
    int32_t tab[4];
    pkv_block_hash hs[2];
    switch ((b >> 4) % 9) {
      case 0:
        EXPECT_STATUS(pkv_seq_match_prefix(pool_, id, &tok, 1, &u), PKV_E_NOT_FOUND);
        break;
      case 1:
        EXPECT_STATUS(pkv_seq_append(pool_, id, &tok, 1, 0), PKV_E_NOT_FOUND);
        break;
      case 2:
        EXPECT_STATUS(pkv_seq_blocks_needed(pool_, id, 1, 0, &u), PKV_E_NOT_FOUND);
        break;
      case 3:
        EXPECT_STATUS(pkv_seq_fork(pool_, id, &child), PKV_E_NOT_FOUND);
        CHECK(child == 99, "failed fork wrote out_child");
        break;
      case 4:
        EXPECT_STATUS(pkv_seq_truncate(pool_, id, 0), PKV_E_NOT_FOUND);
        break;
      case 5:
        EXPECT_STATUS(pkv_seq_free(pool_, id), PKV_E_NOT_FOUND);
        break;
      case 6:
        EXPECT_STATUS(pkv_seq_get_info(pool_, id, &info), PKV_E_NOT_FOUND);
        break;
      case 7:
        EXPECT_STATUS(pkv_seq_get_block_table(pool_, id, tab, 4, &u), PKV_E_NOT_FOUND);
        break;
      default:
        EXPECT_STATUS(pkv_seq_get_block_hashes(pool_, id, hs, 2, &u), PKV_E_NOT_FOUND);
        break;
    }
  }

  // The sequence's hashes equal what pkv_hash_prefix computes for its tokens.
  void op_hashes() {
    MSeq* s = pick();
    if (!s) return op_create();
    const uint64_t full = cfg_.caching ? s->tokens.size() / bs_ : 0;
    uint64_t len = 0;
    if (full > 0) {
      std::vector<pkv_block_hash> small(full - 1);
      EXPECT_STATUS(pkv_seq_get_block_hashes(pool_, s->id, small.data(), full - 1, &len),
                    PKV_E_BUFFER_TOO_SMALL);
      CHECK(len == full, "BUFFER_TOO_SMALL reported %llu hashes, want %llu",
            (unsigned long long)len, (unsigned long long)full);
    }
    std::vector<pkv_block_hash> got(full + 1), want(full + 1);
    EXPECT_STATUS(pkv_seq_get_block_hashes(pool_, s->id, got.data(), full + 1, &len), PKV_OK);
    CHECK(len == full, "%llu hashes, the model has %llu full blocks", (unsigned long long)len,
          (unsigned long long)full);
    if (!full) return;
    pkv_hash_options ho;
    pkv_hash_options_init(&ho);
    ho.algo = cfg_.algo;
    ho.block_size = bs_;
    ho.seed = "fuzz";
    ho.lora_id = s->lora;
    ho.cache_salt = salt_str(s->salt);
    uint64_t nb = 0;
    EXPECT_STATUS(
        pkv_hash_prefix(&ho, s->tokens.data(), s->tokens.size(), want.data(), full + 1, &nb),
        PKV_OK);
    CHECK(nb == full, "pkv_hash_prefix gave %llu hashes", (unsigned long long)nb);
    for (uint64_t j = 0; j < full; ++j)
      CHECK(std::memcmp(got[j].bytes, want[j].bytes, PKV_HASH_MAX_BYTES) == 0,
            "hash of block %llu differs from pkv_hash_prefix", (unsigned long long)j);
  }

  void op_events() {
    const uint64_t cap = in_.below(17);
    std::vector<pkv_event> ev(cap ? cap : 1);
    uint64_t got = 999;
    EXPECT_STATUS(pkv_pool_drain_events(pool_, cap ? ev.data() : nullptr, cap, &got), PKV_OK);
    CHECK(got <= cap, "drained %llu events into %llu", (unsigned long long)got,
          (unsigned long long)cap);
    CHECK(cfg_.events || got == 0, "events recorded although disabled");
    pkv_pool_stats st;
    pkv_pool_stats_init(&st);
    EXPECT_STATUS(pkv_pool_get_stats(pool_, &st), PKV_OK);
    for (uint64_t i = 0; i < got; ++i) {
      const pkv_event& e = ev[i];
      CHECK(e.seq_no > last_event_, "event seq_no %llu after %llu", (unsigned long long)e.seq_no,
            (unsigned long long)last_event_);
      CHECK(e.seq_no - last_event_ - 1 <= st.num_events_dropped, "event gap without drops");
      last_event_ = e.seq_no;
      const uint32_t last_type = cfg_.reuse ? PKV_EVENT_BLOCK_PRIORITY : PKV_EVENT_ALL_CLEARED;
      CHECK(e.type >= PKV_EVENT_BLOCK_STORED && e.type <= last_type, "event type %u", e.type);
      if (e.type == PKV_EVENT_BLOCK_PRIORITY)
        CHECK(e.num_tokens < PKV_PRIORITY_PINNED, "priority event with priority %u", e.num_tokens);
      if (e.type != PKV_EVENT_ALL_CLEARED)
        CHECK(e.block_id > 0 && uint64_t(e.block_id) < cfg_.num_blocks, "event block %d",
              e.block_id);
      if (e.type == PKV_EVENT_BLOCK_STORED)
        CHECK(e.num_tokens == bs_, "stored event with %u tokens", e.num_tokens);
    }
  }

  // ------------------------------------------------------------ steps
  // Readable: the slot of pos holds what the harness wrote for s's token.
  bool readable(const MSeq& s, uint64_t pos) const {
    return fp_at(s, pos) == slot_fp(pos, s.tokens[pos], s.lora);
  }
  // Leading positions whose K/V the harness wrote (window-released ones
  // count: they were computed before the window let them go).
  uint64_t model_computed(const MSeq& s) const {
    uint64_t v = s.num_null() * bs_;
    while (v < s.tokens.size() && readable(s, v)) ++v;
    return std::min<uint64_t>(v, s.tokens.size());
  }

  // Picks up to 4 distinct sequences and query counts: usually from the
  // first position the harness has not written (what an engine schedules),
  // sometimes fewer, in which case a plan over unwritten context must be
  // refused. Then one of the ways a step ends: every layer written (storage:
  // commits), an explicit commit (manager-only: the engine wrote elsewhere),
  // a model that raises before or half-way through its writes (abort or
  // destroy), a sequence preempted before the writes.
  void op_step() {
    std::vector<size_t> idx = pick_distinct();
    if (idx.empty()) return op_create();
    const uint8_t mode = in_.u8();
    const uint8_t end = in_.u8();
    std::vector<pkv_seq_id> ids;
    std::vector<uint32_t> qc;
    pkv_status want = PKV_OK;
    for (size_t j : idx) {
      const MSeq& s = seqs_[j];
      const uint64_t n = s.tokens.size();
      const uint64_t v = model_computed(s);
      uint64_t q = n > v ? n - v : 1;
      if ((mode & 0x60) == 0x60 && n > 0) q = 1 + in_.below(uint32_t(n));  // maybe too few
      // Window pools: sometimes stay within what the window kept, so plans
      // succeed; otherwise the plan must be rejected.
      const uint64_t kept = s.num_null() * bs_ + cfg_.window;  // first query position allowed + 1
      if (cfg_.window && (mode & 16) && n + 1 > kept && q > n + 1 - kept) q = n + 1 - kept;
      if ((mode & 7) == 1) q = n + 1;  // one bad count
      ids.push_back(s.id);
      qc.push_back(uint32_t(q));
      // The first query (position n - q) reads keys from n - q + 1 - window
      // on; none may lie in a block the window released.
      const uint64_t first_key =
          cfg_.window && n - q + 1 > cfg_.window ? n - q + 1 - cfg_.window : 0;
      if (q == 0 || q > n || first_key / bs_ < s.num_null()) want = PKV_E_INVALID_ARGUMENT;
    }
    if ((mode & 7) == 2) {  // a duplicate
      ids.push_back(ids[0]);
      qc.push_back(qc[0]);
      want = PKV_E_INVALID_ARGUMENT;
    }
    if (want == PKV_OK && !context_readable(idx, qc)) want = PKV_E_INVALID_STATE;
    pkv_batch* batch = nullptr;
    for (size_t i = 0; i < ids.size(); ++i)
      trace("%s %llx q %u", i ? "," : "step", (unsigned long long)ids[i], qc[i]);
    trace(" (want %d, end %u)\n", int(want), unsigned(end % 8));
    EXPECT_STATUS(
        pkv_batch_prepare(pool_, ids.data(), qc.data(), uint32_t(ids.size()), nullptr, &batch),
        want);
    if (want != PKV_OK) {
      CHECK(batch == nullptr, "failed prepare wrote out");
      if (want == PKV_E_INVALID_STATE) ++g_counters.unwritten_refused;
      return;
    }
    check_plan(batch, idx, qc);
    end_step(batch, idx, qc, mode, end);
  }

  // The fused decode step (pkv_batch_prepare_decode): one token appended to
  // each sequence and the plan whose queries they are, all or nothing. The
  // batch is usually the previous fused step's sequences again, in their
  // order (the steady path, impl/step_plan_steady.cpp). Accepted, it must
  // be append_to of one token each, in order, then a plan of one query
  // each; refused, with the status the first failing check gives, it
  // changes nothing (check_all).
  void op_decode_fused() {
    std::vector<size_t> idx;
    if (!running_.empty() && in_.below(4) != 0) {
      for (pkv_seq_id id : running_) {
        auto it =
            std::find_if(seqs_.begin(), seqs_.end(), [&](const MSeq& m) { return m.id == id; });
        if (it == seqs_.end()) {
          idx.clear();
          break;
        }
        idx.push_back(size_t(it - seqs_.begin()));
      }
    }
    if (idx.empty()) idx = pick_distinct();
    if (idx.empty()) return op_create();
    const uint8_t mode = in_.u8();
    const uint8_t end = in_.u8();
    std::vector<pkv_seq_id> ids;
    std::vector<int32_t> toks;
    for (size_t j : idx) {
      ids.push_back(seqs_[j].id);
      toks.push_back(family_token(seqs_[j].family, seqs_[j].tokens.size()));
    }
    const bool dup = (mode & 7) == 2;
    if (dup) {
      ids.push_back(ids[0]);
      toks.push_back(toks[0]);
    }
    // The first check that fails, in the library's order: per sequence the
    // window, then the blocks taken so far (counted on the state before
    // the call, copies included); then a repeated id; then every context.
    pkv_status want = PKV_OK;
    const uint64_t free_now = free_blocks();
    uint64_t take = 0, gain = 0;
    for (size_t j : idx) {
      const MSeq& m = seqs_[j];
      const uint64_t n0 = m.tokens.size();
      const uint64_t first_key = cfg_.window && n0 + 1 > cfg_.window ? n0 + 1 - cfg_.window : 0;
      if (first_key / bs_ < m.num_null()) {
        want = PKV_E_INVALID_ARGUMENT;
        break;
      }
      const Need need = need_of(m, 1, 0);
      take += need.fresh + need.cow;
      gain += need.gain;
      if (take > free_now + gain) {
        want = PKV_E_OUT_OF_BLOCKS;
        break;
      }
    }
    if (want == PKV_OK && dup) want = PKV_E_INVALID_ARGUMENT;
    if (want == PKV_OK)
      for (size_t j : idx) {
        const MSeq& m = seqs_[j];
        const uint64_t n0 = m.tokens.size();
        const uint64_t first_key = cfg_.window && n0 + 1 > cfg_.window ? n0 + 1 - cfg_.window : 0;
        for (uint64_t p = std::max<uint64_t>(m.num_null(), first_key / bs_) * bs_; p < n0; ++p)
          if (!readable(m, p)) want = PKV_E_INVALID_STATE;
      }
    for (size_t i = 0; i < ids.size(); ++i)
      trace("%s %llx", i ? "," : "fused decode", (unsigned long long)ids[i]);
    trace(" (want %d, end %u)\n", int(want), unsigned(end % 8));
    pkv_batch* batch = nullptr;
    EXPECT_STATUS(
        pkv_batch_prepare_decode(pool_, ids.data(), toks.data(), uint32_t(ids.size()),
                                 (mode & 8) ? PKV_PREPARE_PERSISTENT_TABLE : 0u, nullptr, &batch),
        want);
    if (want != PKV_OK) {
      CHECK(batch == nullptr, "failed fused decode wrote out");
      if (want == PKV_E_INVALID_STATE) ++g_counters.unwritten_refused;
      return;
    }
    ++g_counters.fused_decodes;
    if (ids == running_) ++g_counters.fused_repeats;
    running_.assign(ids.begin(), ids.end());
    // The appends, in order, each against the model as the previous ones
    // left it (a copy-on-write of one may leave another's block its own).
    std::set<int32_t> fresh;
    for (size_t i = 0; i < idx.size(); ++i) {
      MSeq* m = &seqs_[idx[i]];
      auto before = refs();
      const Need need = need_of(*m, 1, 0);
      std::set<int32_t> released;
      for (uint64_t j = need.wfirst; j < need.wend; ++j)
        if (before[m->table[j]] == 1) released.insert(m->table[j]);
      expect_appended(m, {toks[i]}, 0, need, before, released, fresh);
    }
    const std::vector<uint32_t> qc(idx.size(), 1);
    check_plan(batch, idx, qc, (mode & 8) != 0);
    end_step(batch, idx, qc, mode, end);
  }

  // One of the ways a prepared step ends (end % 8), on the model too:
  // every layer written (storage: commits), an explicit commit, a model
  // that raises before or half-way through its writes, a sequence
  // preempted before the writes. Destroys batch.
  void end_step(pkv_batch* batch, const std::vector<size_t>& idx, const std::vector<uint32_t>& qc,
                uint8_t mode, uint8_t end) {
    // What the step writes, by query position (the model's side of it).
    auto committed_now = [&](const std::vector<size_t>& which) {
      for (size_t i = 0; i < idx.size(); ++i) {
        if (std::find(which.begin(), which.end(), idx[i]) == which.end()) continue;
        MSeq& s = seqs_[idx[i]];
        const uint64_t n = s.tokens.size();
        for (uint64_t p = n - qc[i]; p < n; ++p)
          fp_[s.table[p / bs_] * bs_ + p % bs_] = slot_fp(p, s.tokens[p], s.lora);
        s.committed = std::max(s.committed, n);
      }
    };
    if (!cfg_.storage) {
      pkv_tensor k3;
      std::memset(&k3, 0, sizeof k3);
      EXPECT_STATUS(pkv_cache_write(batch, 0, &k3, &k3, nullptr), PKV_E_INVALID_STATE);
      switch (end % 8) {
        case 0:  // the model raised before any write
          EXPECT_STATUS(pkv_batch_abort(batch), PKV_OK);
          EXPECT_STATUS(pkv_batch_commit(batch), PKV_E_INVALID_STATE);
          break;
        case 1:  // ABI 1: destroyed with neither commit nor abort counts
          committed_now(idx);
          break;
        case 2: {  // a sequence preempted before the step's writes: the rest commit
          const size_t victim = idx[0];
          EXPECT_STATUS(pkv_seq_free(pool_, seqs_[victim].id), PKV_OK);
          std::vector<size_t> rest(idx.begin() + 1, idx.end());
          EXPECT_STATUS(pkv_batch_commit(batch), PKV_OK);
          committed_now(rest);
          dead_.push_back(seqs_[victim].id);
          seqs_.erase(seqs_.begin() + victim);
          pkv_batch_destroy(batch);
          return;  // indexes moved
        }
        default:
          EXPECT_STATUS(pkv_batch_commit(batch), PKV_OK);
          EXPECT_STATUS(pkv_batch_commit(batch), PKV_OK);  // idempotent
          EXPECT_STATUS(pkv_batch_abort(batch), PKV_E_INVALID_STATE);
          committed_now(idx);
          break;
      }
    } else if (end % 8 == 0) {  // the model raised before any write
      EXPECT_STATUS(pkv_batch_abort(batch), PKV_OK);
    } else if (end % 8 == 1 && cfg_.layers > 1) {  // raised after layer 0: destroyed
      write_layers(batch, idx, qc, 1);
      // Slots that held other K/V now hold mixed layers; a slot that held
      // this token's K/V got the same values again (K/V is a function of
      // the prefix), so it stays written, as the library keeps it.
      for (size_t i = 0; i < idx.size(); ++i) {
        const MSeq& s = seqs_[idx[i]];
        for (uint64_t p = s.tokens.size() - qc[i]; p < s.tokens.size(); ++p)
          if (!readable(s, p)) fp_[s.table[p / bs_] * bs_ + p % bs_] = 0;
      }
    } else if (end % 8 == 2) {  // preempted before the writes: they fail, nothing counts
      const size_t victim = idx[0];
      EXPECT_STATUS(pkv_seq_free(pool_, seqs_[victim].id), PKV_OK);
      std::vector<uint8_t> buf(64);
      pkv_tensor t;
      std::memset(&t, 0, sizeof t);
      t.data = buf.data();
      EXPECT_STATUS(pkv_cache_write(batch, 0, &t, &t, nullptr), PKV_E_INVALID_STATE);
      dead_.push_back(seqs_[victim].id);
      seqs_.erase(seqs_.begin() + victim);
      pkv_batch_destroy(batch);
      return;
    } else {
      write_layers(batch, idx, qc, cfg_.layers);  // commits
      committed_now(idx);
      EXPECT_STATUS(pkv_batch_abort(batch), PKV_E_INVALID_STATE);
      if (end & 8) EXPECT_STATUS(pkv_batch_commit(batch), PKV_OK);
      attend_and_check(batch, idx, qc, mode);
    }
    pkv_batch_destroy(batch);
  }

  // Whether every context slot of the plan (before each sequence's queries,
  // from the first block its window reads) is readable or written by a
  // query of this same plan.
  bool context_readable(const std::vector<size_t>& idx, const std::vector<uint32_t>& qc) const {
    std::map<uint64_t, uint64_t> plan;  // slot -> fingerprint this plan writes there
    for (size_t i = 0; i < idx.size(); ++i) {
      const MSeq& s = seqs_[idx[i]];
      for (uint64_t p = s.tokens.size() - qc[i]; p < s.tokens.size(); ++p)
        plan[uint64_t(s.table[p / bs_]) * bs_ + p % bs_] = slot_fp(p, s.tokens[p], s.lora);
    }
    for (size_t i = 0; i < idx.size(); ++i) {
      const MSeq& s = seqs_[idx[i]];
      const uint64_t n = s.tokens.size(), ctx_end = n - qc[i];
      const uint64_t first_key =
          cfg_.window && ctx_end + 1 > cfg_.window ? ctx_end + 1 - cfg_.window : 0;
      for (uint64_t p = std::max<uint64_t>(s.num_null(), first_key / bs_) * bs_; p < ctx_end; ++p) {
        if (readable(s, p)) continue;
        auto it = plan.find(uint64_t(s.table[p / bs_]) * bs_ + p % bs_);
        if (it == plan.end() || it->second != slot_fp(p, s.tokens[p], s.lora)) return false;
      }
    }
    return true;
  }

  uint64_t fp_at(const MSeq& s, uint64_t pos) const {
    const int32_t b = s.table[pos / bs_];
    return b == PKV_NULL_BLOCK ? 0 : fp_[b * bs_ + pos % bs_];
  }

  template <class T>
  std::vector<T> plan_array(pkv_batch* b, uint32_t which, uint32_t dtype) {
    pkv_tensor t;
    EXPECT_STATUS(pkv_batch_plan_tensor(b, which, &t), PKV_OK);
    CHECK(t.dtype == dtype && t.ndim == 1 && t.device_type == PKV_DEVICE_CPU, "plan tensor %u",
          which);
    const T* p = static_cast<const T*>(t.data);
    return std::vector<T>(p, p + t.shape[0]);
  }

  // persistent: a PKV_PREPARE_PERSISTENT_TABLE plan (padded rows of one
  // stride, zeros past each row's pages) instead of CSR.
  void check_plan(pkv_batch* b, const std::vector<size_t>& idx, const std::vector<uint32_t>& qc,
                  bool persistent = false) {
    auto slots = plan_array<int64_t>(b, PKV_PLAN_SLOT_MAPPING, PKV_DTYPE_I64);
    auto qptr = plan_array<int32_t>(b, PKV_PLAN_QUERY_INDPTR, PKV_DTYPE_I32);
    auto pptr = plan_array<int32_t>(b, PKV_PLAN_PAGE_INDPTR, PKV_DTYPE_I32);
    auto pidx = plan_array<int32_t>(b, PKV_PLAN_PAGE_INDICES, PKV_DTYPE_I32);
    auto last = plan_array<int32_t>(b, PKV_PLAN_LAST_PAGE_LEN, PKV_DTYPE_I32);
    auto ctx = plan_array<int32_t>(b, PKV_PLAN_CONTEXT_LENS, PKV_DTYPE_I32);
    CHECK(qptr.size() == idx.size() + 1 && pptr.size() == idx.size() + 1, "indptr sizes");
    size_t t = 0, pg = 0;
    const size_t stride = persistent ? size_t(pptr[1]) : 0;
    for (size_t i = 0; i < idx.size(); ++i) {
      const MSeq& s = seqs_[idx[i]];
      const uint64_t n = s.tokens.size(), np = (n + bs_ - 1) / bs_;
      CHECK(qptr[i] == int32_t(t) && pptr[i] == int32_t(pg), "indptr of seq %zu", i);
      for (uint64_t p = n - qc[i]; p < n; ++p, ++t)
        CHECK(t < slots.size() && slots[t] == int64_t(s.table[p / bs_]) * bs_ + int64_t(p % bs_),
              "slot of position %llu", (unsigned long long)p);
      CHECK(!persistent || np <= stride, "row %zu: %llu pages, stride %zu", i,
            (unsigned long long)np, stride);
      for (uint64_t j = 0; j < (persistent ? stride : np); ++j, ++pg)
        CHECK(pg < pidx.size() && pidx[pg] == (j < np ? s.table[j] : PKV_NULL_BLOCK), "page %llu",
              (unsigned long long)j);
      CHECK(ctx[i] == int32_t(n) && last[i] == int32_t(n - (np - 1) * bs_), "lens of seq %zu", i);
    }
    CHECK(slots.size() == t && pidx.size() == pg, "plan sizes");
    pkv_batch_info bi;
    pkv_batch_info_init(&bi);
    EXPECT_STATUS(pkv_batch_get_info(b, &bi), PKV_OK);
    CHECK(bi.num_seqs == idx.size() && bi.num_tokens == t && bi.num_pages == pg &&
              bi.block_size == bs_,
          "batch info");
    check_positions(b, idx, qc);
  }

  // Each query row's position and each sequence's last row, from the model.
  void check_positions(pkv_batch* b, const std::vector<size_t>& idx,
                       const std::vector<uint32_t>& qc) {
    pkv_tensor pt, lt;
    EXPECT_STATUS(pkv_batch_token_positions(b, &pt), PKV_OK);
    EXPECT_STATUS(pkv_batch_last_token_indices(b, &lt), PKV_OK);
    CHECK(pt.dtype == PKV_DTYPE_I64 && lt.dtype == PKV_DTYPE_I64 &&
              lt.shape[0] == int64_t(idx.size()),
          "positions tensors");
    const int64_t* pos = static_cast<const int64_t*>(pt.data);
    const int64_t* last = static_cast<const int64_t*>(lt.data);
    int64_t t = 0;
    for (size_t i = 0; i < idx.size(); ++i) {
      const uint64_t n = seqs_[idx[i]].tokens.size();
      for (uint64_t p = n - qc[i]; p < n; ++p, ++t)
        CHECK(t < pt.shape[0] && pos[t] == int64_t(p), "position of row %lld", (long long)t);
      CHECK(last[i] == t - 1, "last row of seq %zu", i);
    }
    CHECK(pt.shape[0] == t, "positions size");
  }

  size_t esize() const { return cfg_.dtype == PKV_DTYPE_F32 ? 4 : 2; }
  void put(std::vector<uint8_t>& buf, size_t i, float v) const {
    if (cfg_.dtype == PKV_DTYPE_F32) {
      std::memcpy(&buf[i * 4], &v, 4);
    } else {
      uint16_t h = cfg_.dtype == PKV_DTYPE_F16 ? f_to_f16(v) : f_to_bf16(v);
      std::memcpy(&buf[i * 2], &h, 2);
    }
  }
  float get(const std::vector<uint8_t>& buf, size_t i) const {
    if (cfg_.dtype == PKV_DTYPE_F32) {
      float v;
      std::memcpy(&v, &buf[i * 4], 4);
      return v;
    }
    uint16_t h;
    std::memcpy(&h, &buf[i * 2], 2);
    return cfg_.dtype == PKV_DTYPE_F16 ? f16_to_f(h) : bf16_to_f(h);
  }
  pkv_tensor rows(std::vector<uint8_t>& buf, int64_t n0, int64_t n1, int64_t pad) const {
    pkv_tensor t;
    std::memset(&t, 0, sizeof t);
    t.data = buf.data();
    t.dtype = cfg_.dtype;
    t.device_type = PKV_DEVICE_CPU;
    t.ndim = 3;
    t.shape[0] = n0;
    t.shape[1] = n1;
    t.shape[2] = cfg_.head_dim;
    if (pad) {  // padded rows: exercises explicit strides
      t.strides[2] = 1;
      t.strides[1] = cfg_.head_dim;
      t.strides[0] = n1 * cfg_.head_dim + pad;
    }
    return t;
  }

  struct Row {
    const MSeq* s;
    uint64_t pos;
  };
  std::vector<Row> rows_of(const std::vector<size_t>& idx, const std::vector<uint32_t>& qc) const {
    std::vector<Row> rowv;
    for (size_t i = 0; i < idx.size(); ++i) {
      const MSeq& s = seqs_[idx[i]];
      for (uint64_t p = s.tokens.size() - qc[i]; p < s.tokens.size(); ++p) rowv.push_back({&s, p});
    }
    return rowv;
  }

  // Writes the K/V of the plan's queries into layers [0, layers) through
  // the library (the last layer commits the step).
  void write_layers(pkv_batch* batch, const std::vector<size_t>& idx,
                    const std::vector<uint32_t>& qc, uint32_t layers) {
    const uint32_t D = cfg_.head_dim, Hk = cfg_.kv_heads;
    const int64_t pad = (in_.u8() & 8) ? 8 : 0;
    const std::vector<Row> rowv = rows_of(idx, qc);
    const int64_t T = int64_t(rowv.size());
    const size_t kv_row = size_t(Hk) * D + pad;
    std::vector<uint8_t> kb(T * kv_row * esize()), vb(kb.size());
    for (uint32_t layer = 0; layer < layers; ++layer) {
      for (int64_t r = 0; r < T; ++r) {
        const uint64_t fp = slot_fp(rowv[r].pos, rowv[r].s->tokens[rowv[r].pos], rowv[r].s->lora);
        for (uint32_t h = 0; h < Hk; ++h)
          for (uint32_t d = 0; d < D; ++d) {
            put(kb, r * kv_row + h * D + d, kv_value(fp, layer, 0, h, d));
            put(vb, r * kv_row + h * D + d, kv_value(fp, layer, 1, h, d));
          }
      }
      pkv_tensor kt = rows(kb, T, Hk, pad), vt = rows(vb, T, Hk, pad);
      EXPECT_STATUS(pkv_cache_write(batch, layer, &kt, &vt, nullptr), PKV_OK);
    }
  }

  void attend_and_check(pkv_batch* batch, const std::vector<size_t>& idx,
                        const std::vector<uint32_t>& qc, uint8_t mode) {
    const uint32_t D = cfg_.head_dim, Hk = cfg_.kv_heads, Hq = Hk * cfg_.group;
    const int64_t pad = (mode & 8) ? 8 : 0;
    const std::vector<Row> rowv = rows_of(idx, qc);
    const int64_t T = int64_t(rowv.size());
    const size_t q_row = size_t(Hq) * D + pad;
    // Attention on one layer, against a float64 reference.
    const uint32_t layer = in_.below(cfg_.layers);
    pkv_attention_params ap;
    pkv_attention_params_init(&ap);
    const uint8_t pm = in_.u8();
    if (pm & 1) ap.softmax_scale = 0.05f;
    if (pm & 2) ap.logit_softcap = 5.0f;
    if (cfg_.window)
      ap.sliding_window = 1 + (pm >> 2) % cfg_.window;
    else if (pm & 4)
      ap.sliding_window = 1 + (pm >> 3) % (3 * bs_);
    std::vector<uint8_t> qb(T * q_row * esize()), ob(qb.size());
    std::vector<float> lse(size_t(T) * Hq, NAN);
    const uint64_t qseed = mix(++step_no_);
    for (int64_t r = 0; r < T; ++r)
      for (uint32_t h = 0; h < Hq; ++h)
        for (uint32_t d = 0; d < D; ++d)
          put(qb, r * q_row + h * D + d, kv_value(qseed ^ uint64_t(r), 9, 2, h, d));
    pkv_tensor qt = rows(qb, T, Hq, pad), ot = rows(ob, T, Hq, pad), lt;
    const int64_t lshape[2] = {T, Hq};
    EXPECT_STATUS(pkv_tensor_init(lse.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 2, lshape, &lt),
                  PKV_OK);
    const bool want_lse = pm & 0x40;
    EXPECT_STATUS(pkv_attention_forward(batch, layer, &qt, &ot, want_lse ? &lt : nullptr,
                                        (pm & 0x80) && !cfg_.window ? nullptr : &ap, nullptr),
                  PKV_OK);
    if ((pm & 0x80) && !cfg_.window) pkv_attention_params_init(&ap);  // NULL = defaults

    const double scale = ap.softmax_scale != 0 ? ap.softmax_scale : 1.0 / std::sqrt(double(D));
    const double tol_abs = cfg_.dtype == PKV_DTYPE_F32   ? 2e-4
                           : cfg_.dtype == PKV_DTYPE_F16 ? 4e-3
                                                         : 3e-2;
    std::vector<double> logit;
    for (int64_t r = 0; r < T; ++r) {
      const MSeq& s = *rowv[r].s;
      const uint64_t p = rowv[r].pos;
      const uint64_t lo =
          ap.sliding_window && p + 1 > ap.sliding_window ? p + 1 - ap.sliding_window : 0;
      // The plan was accepted, so every key it reads holds what the harness
      // wrote: the model must vouch for all of them.
      for (uint64_t kp = std::max(lo, s.num_null() * bs_); kp <= p; ++kp)
        CHECK(readable(s, kp), "an accepted plan reads position %llu that nobody wrote",
              (unsigned long long)kp);
      for (uint32_t h = 0; h < Hq; ++h) {
        const uint32_t g = h / cfg_.group;
        logit.assign(p - lo + 1, 0);
        double mx = -INFINITY;
        for (uint64_t kp = lo; kp <= p; ++kp) {
          const uint64_t fp = slot_fp(kp, s.tokens[kp], s.lora);
          double dot = 0;
          for (uint32_t d = 0; d < D; ++d)
            dot += double(get(qb, r * q_row + h * D + d)) * kv_value(fp, layer, 0, g, d);
          double x = dot * scale;
          if (ap.logit_softcap > 0) x = ap.logit_softcap * std::tanh(x / ap.logit_softcap);
          logit[kp - lo] = x;
          mx = std::max(mx, x);
        }
        double sum = 0;
        for (double& x : logit) sum += (x = std::exp(x - mx));
        for (uint32_t d = 0; d < D; ++d) {
          double ref = 0;
          for (uint64_t kp = lo; kp <= p; ++kp)
            ref += logit[kp - lo] * kv_value(slot_fp(kp, s.tokens[kp], s.lora), layer, 1, g, d);
          ref /= sum;
          const double got = get(ob, r * q_row + h * D + d);
          CHECK(std::fabs(got - ref) <= tol_abs + 8e-3 * std::fabs(ref),
                "attention row %lld head %u dim %u: %g, reference %g (pos %llu, window %u)",
                (long long)r, h, d, got, ref, (unsigned long long)p, ap.sliding_window);
        }
        if (want_lse) {
          const double ref_lse = mx + std::log(sum);
          const double got = lse[size_t(r) * Hq + h];
          CHECK(std::fabs(got - ref_lse) <= 1e-3 + 1e-4 * std::fabs(ref_lse), "lse %g vs %g", got,
                ref_lse);
        }
      }
      ++g_counters.attention_checked;
    }
  }

  // A plan whose sequence changes afterwards must refuse to run.
  void op_stale_plan() {
    MSeq* s = pick();
    if (!s || s->tokens.empty()) return op_append();
    uint32_t q = 1;
    pkv_batch* b = nullptr;
    const uint64_t n = s->tokens.size();
    const uint64_t first_key = cfg_.window && n > cfg_.window ? n - cfg_.window : 0;
    const size_t si = size_t(s - seqs_.data());
    pkv_status want = first_key / bs_ < s->num_null() ? PKV_E_INVALID_ARGUMENT : PKV_OK;
    if (want == PKV_OK && !context_readable({si}, {q})) want = PKV_E_INVALID_STATE;
    EXPECT_STATUS(pkv_batch_prepare(pool_, &s->id, &q, 1, nullptr, &b), want);
    if (want != PKV_OK) return;
    const bool use_free = in_.u8() & 1;
    if (use_free) {
      EXPECT_STATUS(pkv_seq_free(pool_, s->id), PKV_OK);
      dead_.push_back(s->id);
      seqs_.erase(seqs_.begin() + si);
      s = nullptr;
    } else {
      // Truncating to the current length keeps every token (it drops only
      // lookahead blocks) but still counts as a change for the plan.
      const pkv_status tw = truncate_status(*s, s->tokens.size());
      EXPECT_STATUS(pkv_seq_truncate(pool_, s->id, s->tokens.size()), tw);
      if (tw != PKV_OK) {  // nothing changed: the plan is still fresh; it is dropped
        if (!cfg_.storage) mark_written(*s, n - 1);  // manager-only: counts (ABI 1)
        pkv_batch_destroy(b);
        return;
      }
      apply_truncate(*s, s->tokens.size());
    }
    std::vector<uint8_t> buf(64);
    pkv_tensor t;
    std::memset(&t, 0, sizeof t);
    t.data = buf.data();
    EXPECT_STATUS(pkv_cache_write(b, 0, &t, &t, nullptr), PKV_E_INVALID_STATE);
    pkv_batch_info bi;
    pkv_batch_info_init(&bi);
    EXPECT_STATUS(pkv_batch_get_info(b, &bi), PKV_OK);  // info stays readable
    // Manager-only pools count a plan destroyed without abort (ABI 1): the
    // truncate kept every token, so the step's one query counts; a freed
    // sequence's does not. Storage pools: nothing was written, nothing counts.
    if (s && !cfg_.storage) mark_written(*s, n - 1);
    pkv_batch_destroy(b);
  }

  void mark_written(MSeq& s, uint64_t pos) {
    fp_[s.table[pos / bs_] * bs_ + pos % bs_] = slot_fp(pos, s.tokens[pos], s.lora);
    s.committed = std::max(s.committed, pos + 1);
  }

  // ------------------------------------------------------------ invariants
  void check_all() {
    EXPECT_STATUS(pkv_pool_validate(pool_), PKV_OK);
    ++g_counters.validates;
    uint64_t tokens = 0;
    std::map<int32_t, uint64_t> full_key;  // block -> content key, for full blocks
    for (MSeq& s : seqs_) {
      pkv_seq_info info;
      pkv_seq_info_init(&info);
      EXPECT_STATUS(pkv_seq_get_info(pool_, s.id, &info), PKV_OK);
      CHECK(info.num_tokens == s.tokens.size() && info.num_blocks == s.table.size() &&
                info.num_slots == s.table.size() * bs_ && info.num_cached_tokens == s.num_cached &&
                info.lora_id == s.lora,
            "seq info: %llu tokens %llu blocks %llu cached; model %zu %zu %llu",
            (unsigned long long)info.num_tokens, (unsigned long long)info.num_blocks,
            (unsigned long long)info.num_cached_tokens, s.tokens.size(), s.table.size(),
            (unsigned long long)s.num_cached);
      if (g_trace) {
        trace("  %llx: %zu tokens, table", (unsigned long long)s.id, s.tokens.size());
        for (int32_t b : observed_table(s.id)) trace(" %d", b);
        trace("\n");
      }
      CHECK(observed_table(s.id) == s.table, "a block table changed behind the model's back");
      CHECK(info.num_computed_tokens == model_computed(s),
            "%llu tokens computed, but the harness wrote the first %llu",
            (unsigned long long)info.num_computed_tokens, (unsigned long long)model_computed(s));
      CHECK(s.table.size() * bs_ >= s.tokens.size(), "fewer slots than tokens");
      tokens += s.tokens.size();
      for (uint64_t j = 0; j < s.tokens.size() / bs_; ++j) {
        const int32_t b = s.table[j];
        if (b == PKV_NULL_BLOCK) continue;
        const uint64_t key = prefix_key(s.lora, s.salt, s.tokens.data(), (j + 1) * bs_);
        auto it = full_key.emplace(b, key).first;
        CHECK(it->second == key, "block %d is full in two sequences with different content", b);
        cdom_[b] = key_domain(s.lora, s.salt);
      }
    }
    for (auto& kv : full_key) ckey_[kv.first] = kv.second;
    pkv_pool_stats st;
    pkv_pool_stats_init(&st);
    EXPECT_STATUS(pkv_pool_get_stats(pool_, &st), PKV_OK);
    const uint64_t used = refs().size();
    CHECK(st.num_blocks == cfg_.num_blocks && st.block_size == bs_, "stats geometry");
    CHECK(st.kv_bytes_used + st.kv_bytes_wasted == st.num_used_blocks * st.kv_bytes_per_block &&
              st.kv_bytes_wasted <= st.kv_bytes_allocated,
          "stats: kv_bytes_used %llu + wasted %llu do not split %llu used blocks",
          (unsigned long long)st.kv_bytes_used, (unsigned long long)st.kv_bytes_wasted,
          (unsigned long long)st.num_used_blocks);
    CHECK(st.num_seqs == seqs_.size() && st.num_tokens == tokens, "stats: %llu seqs %llu tokens",
          (unsigned long long)st.num_seqs, (unsigned long long)st.num_tokens);
    CHECK(st.num_used_blocks == used && st.num_free_blocks == cfg_.num_blocks - 1 - used,
          "stats: %llu used %llu free, the model %llu used", (unsigned long long)st.num_used_blocks,
          (unsigned long long)st.num_free_blocks, (unsigned long long)used);
    CHECK(
        st.num_cached_blocks <= cfg_.num_blocks - 1 && (cfg_.caching || st.num_cached_blocks == 0),
        "stats: %llu cached", (unsigned long long)st.num_cached_blocks);
    CHECK(st.usage >= 0 && st.usage <= 1, "usage %g", st.usage);
    CHECK(st.prefix_query_tokens == query_tokens_ && st.prefix_hit_tokens == hit_tokens_,
          "prefix stats %llu/%llu, the model %llu/%llu", (unsigned long long)st.prefix_hit_tokens,
          (unsigned long long)st.prefix_query_tokens, (unsigned long long)hit_tokens_,
          (unsigned long long)query_tokens_);
    CHECK(st.num_cow_copies == cow_, "cow copies %llu, the model %llu",
          (unsigned long long)st.num_cow_copies, (unsigned long long)cow_);
    CHECK(st.num_partial_hits == partial_hits_ && st.partial_hit_tokens == partial_tokens_,
          "partial hits %llu (%llu tokens), the model %llu (%llu)",
          (unsigned long long)st.num_partial_hits, (unsigned long long)st.partial_hit_tokens,
          (unsigned long long)partial_hits_, (unsigned long long)partial_tokens_);
    // Every cached block has one priority; nothing is pinned without a budget.
    uint64_t counts[PKV_PRIORITY_MAX + 1], len = 0, sum = 0;
    EXPECT_STATUS(pkv_pool_get_priority_counts(pool_, counts, PKV_PRIORITY_MAX + 1, &len), PKV_OK);
    for (uint64_t c : counts) sum += c;
    CHECK(len == PKV_PRIORITY_MAX + 1 && sum == st.num_cached_blocks &&
              counts[PKV_PRIORITY_PINNED] == 0 && st.num_pinned_blocks == 0,
          "priority counts: %llu blocks over the levels, %llu cached, %llu pinned",
          (unsigned long long)sum, (unsigned long long)st.num_cached_blocks,
          (unsigned long long)counts[PKV_PRIORITY_PINNED]);
    CHECK(cfg_.reuse || counts[PKV_PRIORITY_DEFAULT] == sum, "a priority without retention");
  }

  Bytes& in_;
  Config cfg_;
  uint64_t bs_ = 1;
  pkv_pool* pool_ = nullptr;
  std::vector<MSeq> seqs_;
  std::vector<pkv_seq_id> dead_;
  std::vector<pkv_seq_id> running_;  // the last fused decode step's ids, in order
  uint64_t epoch_ = 0, query_tokens_ = 0, hit_tokens_ = 0, cow_ = 0, last_event_ = 0, step_no_ = 0;
  uint64_t partial_hits_ = 0, partial_tokens_ = 0, clock_ns_ = 0;
  std::vector<uint64_t> ckey_;  // per block: content key while it was last full
  std::vector<uint64_t> cdom_;  // per block: LoRA and salt of that content
  std::vector<uint64_t> fp_;    // per slot: fingerprint of the KV physically there
};

}  // namespace

void run_one(const uint8_t* data, size_t size) {
  ++g_counters.inputs;
  Bytes in(data, size);
  Harness h(in);
  h.run();
}

const Counters& counters() { return g_counters; }

}  // namespace pkv_fuzz
