// KV provenance model of the offload tiers: a randomized test through the
// public C API only, in the style of provenance_test.cpp (same identities,
// prompts and extra keys: provenance_model.h).
//
// Every K/V element the test writes encodes the sequence's extra keys, the
// tokens up to its position, the layer and K or V. The pools are small and
// so are their tiers (a host tier, a file tier, or both, each of 0-4
// blocks), so evictions push blocks to the host tier, demote them to the
// file tier and drop them from there all the time. After every operation
// the test reads the storage back and checks, from what a user observes:
//  - every token a sequence counts as computed sits in its slot with
//    exactly the K/V of that token prefix and those extra keys, in every
//    layer (device hits, tier hits once loaded, swap-ins, copies, forks);
//  - every prefix hit (device, host or file tokens of pkv_tier_match) covers
//    only tokens whose K/V the test wrote (a step it committed, or a
//    swap-in of bytes it swapped out) since the last reset of the prefix
//    cache; the device hits count as computed at once;
//  - the tiers' hit counts equal the sum of the matches' host and file
//    tokens, loads never exceed hits, the host tier (never corrupted) has
//    no checksum failure and the file tier at most one per corruption;
//  - accounting: used + free == usable blocks, used == the distinct blocks
//    the block tables name, pkv_pool_validate.
// Operations: tiered admission (pkv_seq_admit_tiered with and without the
// engine's hashes) and tiered matches (token path, precomputed hashes)
// followed by an append, hits that span device blocks and tier blocks,
// appends, steps (pkv_batch_prepare and pkv_batch_prepare_decode, written
// layer by layer with provenance-encoded K/V; a step refused because a
// tier load turned into a miss is rescheduled from num_computed_tokens),
// frees, forks (copy-on-write at the next step), truncation, block copies
// into blocks no sequence holds, swap-out of a running sequence (then
// freed: preemption) and its swap-in into the blocks of a re-admitted
// sequence (after its own prefix hits), corruption of the file tier's
// bytes (through the process's descriptor of the unlinked file: a load
// must turn it into a miss, never serve it), pkv_pool_flush_tiers,
// pkv_pool_reset_prefix_cache (also with loads pending) and, at the end of
// some seeds, pkv_pool_destroy with loads pending.
// Not covered: sliding windows, partial-block hits, retention, multi-group
// pools, CUDA pools (tests/gpu/tiers_cuda_test.cpp), transfers.
//
// The copy thread offloads asynchronously, so whether a match right after
// an eviction finds the block in a tier depends on timing; most matches
// come after pkv_pool_flush_tiers. PKV_PROVENANCE_TIERS_SYNC=1 flushes
// before every match (a failing seed then replays exactly);
// PKV_PROVENANCE_TIERS_NO_FLUSH=1 never does (matches race the copy thread).
// PKV_PROVENANCE_SEEDS=n runs seeds 1..n (default 100; 20 under sanitizers),
// PKV_PROVENANCE_SEED=s seed s alone, PKV_PROVENANCE_STEPS=k k operations a
// seed (default 1000); PKV_PROVENANCE_DUMP=1 prints what was covered.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../reliability/sanitizers.h"
#include "pagedkv/pagedkv.h"
#include "provenance_model.h"
#include "provenance_storage.h"

namespace {

// Coverage over all seeds, printed with PKV_PROVENANCE_DUMP=1.
uint64_t g_host_hits, g_file_hits, g_spanning, g_loaded, g_failed_loads, g_swap_ins, g_refused,
    g_pending_at_end;

using provenance::Key;
using provenance::mix;

using provenance::elem;
using provenance::ident;
using provenance::kHeadDim;
using provenance::kLayers;

struct Seq {
  pkv_seq_id id = 0;
  Key key;
  std::vector<int32_t> tokens;
  // Where the engine's next step starts: the match's cached tokens (tier
  // hits included: the step's prepare loads them) or what its last step
  // computed; after a refused step, num_computed_tokens.
  uint64_t done = 0;
};

// A preempted sequence: its blocks' bytes in host memory.
struct Swapped {
  Key key;
  std::vector<int32_t> tokens;
  uint64_t computed = 0;
  std::vector<char> bytes;  // [blocks][bytes_per_block]
};

// Per process: the tier files of every pool go into one fresh directory.
const std::string& tier_dir() {
  static const std::string dir = [] {
    char buf[] = "/tmp/pkv-prov-tiers-XXXXXX";
    const char* d = mkdtemp(buf);
    return std::string(d ? d : "/tmp");
  }();
  return dir;
}

struct Harness : provenance::Storage {
  std::mt19937_64 rng;
  pkv_pool* pool = nullptr;
  uint32_t bs = 4;
  uint64_t nblocks = 0, bpb = 0, host_slots = 0, file_slots = 0;
  std::vector<Seq> seqs;
  std::vector<Swapped> swapped;
  std::set<uint64_t> written;  // identities the test wrote since the last reset
  uint64_t host_hits = 0, file_hits = 0, corruptions = 0;
  std::set<int32_t> pending_dst;
  std::map<pkv_seq_id, std::vector<int32_t>> last_table;
  std::vector<std::vector<int32_t>> bases;
  std::string trace;
  bool sync = std::getenv("PKV_PROVENANCE_TIERS_SYNC") != nullptr;
  bool no_flush = std::getenv("PKV_PROVENANCE_TIERS_NO_FLUSH") != nullptr;

  explicit Harness(uint64_t seed) : rng(seed) {}
  ~Harness() { pkv_pool_destroy(pool); }
  uint64_t r(uint64_t n) { return n ? rng() % n : 0; }

  void create() {
    const uint32_t sizes[] = {1, 2, 3, 4};
    bs = sizes[r(4)];
    nblocks = 6 + r(14);
    pkv_pool_options o = provenance::storage_options(bs, nblocks);
    o.hash_algo = r(2) ? PKV_HASH_XXH3_128 : PKV_HASH_SHA256_CBOR;
    ASSERT_EQ(pkv_pool_create(&o, &pool), PKV_OK) << pkv_last_error_message();
    ASSERT_EQ(pkv_pool_bytes_per_block(pool, &bpb), PKV_OK);
    host_slots = r(5);
    file_slots = host_slots == 0 ? 1 + r(4) : r(5);
    pkv_tier_options t;
    pkv_tier_options_init(&t);
    t.host_bytes = host_slots * bpb;
    if (file_slots) {
      t.file_dir = tier_dir().c_str();
      t.file_bytes = file_slots * bpb;
    }
    ASSERT_EQ(pkv_pool_attach_tiers(pool, &t), PKV_OK) << pkv_last_error_message();
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t w = 0; w < 2; ++w) ASSERT_EQ(pkv_pool_kv_tensor(pool, l, w, &kv[l][w]), PKV_OK);
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> b(bs * (1 + r(4)) + r(bs));
      for (auto& tk : b) tk = int32_t(r(3));
      bases.push_back(b);
    }
    trace = "bs=" + std::to_string(bs) + " blocks=" + std::to_string(nblocks) +
            " host=" + std::to_string(host_slots) + " file=" + std::to_string(file_slots) + "\n";
  }

  std::vector<int32_t> table(pkv_seq_id id) {
    std::vector<int32_t> t(4096);
    uint64_t n = 0;
    EXPECT_EQ(pkv_seq_get_block_table(pool, id, t.data(), t.size(), &n), PKV_OK);
    t.resize(n);
    return t;
  }
  pkv_seq_info info(pkv_seq_id id) {
    pkv_seq_info i;
    pkv_seq_info_init(&i);
    EXPECT_EQ(pkv_seq_get_info(pool, id, &i), PKV_OK) << pkv_last_error_message();
    return i;
  }
  pkv_tier_stats tstats(uint32_t medium) {
    pkv_tier_stats s;
    pkv_tier_stats_init(&s);
    const bool has = medium == PKV_MEDIUM_HOST ? host_slots > 0 : file_slots > 0;
    if (has) {
      EXPECT_EQ(pkv_pool_get_tier_stats(pool, medium, &s), PKV_OK);
    }
    return s;
  }

  void check() {
    ASSERT_EQ(pkv_pool_validate(pool), PKV_OK) << trace << pkv_last_error_message();
    pkv_pool_stats st;
    pkv_pool_stats_init(&st);
    ASSERT_EQ(pkv_pool_get_stats(pool, &st), PKV_OK);
    std::set<int32_t> used;
    for (Seq& s : seqs) {
      const pkv_seq_info in = info(s.id);
      ASSERT_EQ(in.num_tokens, s.tokens.size()) << trace;
      ASSERT_LE(in.num_computed_tokens, in.num_tokens) << trace;
      const auto t = table(s.id);
      {
        auto& old = last_table[s.id];
        for (size_t j = 0; j < old.size() && j < t.size(); ++j)
          if (old[j] != t[j]) pending_dst.insert(t[j]);
        old = t;
      }
      for (int32_t b : t) used.insert(b);
      for (uint64_t pos = 0; pos < in.num_computed_tokens; ++pos) {
        const int32_t b = t[pos / bs];
        if (pending_dst.count(b)) continue;
        const std::string bad = slot_holds(b, pos % bs, ident(s.key, s.tokens, pos));
        ASSERT_EQ(bad, "") << trace << "seq " << s.id << " counts token " << pos << " computed (of "
                           << in.num_computed_tokens << "), but its " << bad;
      }
    }
    ASSERT_EQ(st.num_used_blocks, used.size()) << trace;
    ASSERT_EQ(st.num_used_blocks + st.num_free_blocks, nblocks - 1) << trace;
    const pkv_tier_stats h = tstats(PKV_MEDIUM_HOST), f = tstats(PKV_MEDIUM_FILE);
    ASSERT_EQ(h.num_hits, host_hits) << trace << "host tier hits vs the matches' host tokens";
    ASSERT_EQ(f.num_hits, file_hits) << trace << "file tier hits vs the matches' file tokens";
    ASSERT_LE(h.num_loaded + h.num_checksum_failures, h.num_hits) << trace;
    ASSERT_LE(f.num_loaded + f.num_checksum_failures + f.num_io_errors,
              f.num_hits + f.num_io_errors)
        << trace;
    ASSERT_EQ(h.num_checksum_failures, 0u) << trace << "nobody corrupted the host tier";
    ASSERT_LE(f.num_checksum_failures, corruptions) << trace;
    ASSERT_LE(h.num_blocks, host_slots) << trace;
    ASSERT_LE(f.num_blocks, file_slots) << trace;
  }

  std::vector<int32_t> prompt() {
    return provenance::random_prompt([this](uint64_t n) { return r(n); }, bases, bs);
  }
  Key key() {
    return provenance::random_key([this](uint64_t n) { return r(n); });
  }

  void maybe_flush() {
    if ((r(4) || sync) && !no_flush) {
      trace += "flush\n";
      ASSERT_EQ(pkv_pool_flush_tiers(pool), PKV_OK) << pkv_last_error_message();
    }
  }

  // A match's claims: its parts add up, whole blocks, and every token it
  // counts cached was written by the test (device hits also computed).
  void check_match(const Seq& s, const pkv_tier_match& m) {
    ASSERT_EQ(m.num_cached, m.device_tokens + m.host_tokens + m.file_tokens) << trace;
    ASSERT_EQ(m.num_cached % bs, 0u) << trace;
    ASSERT_LT(m.num_cached, std::max<uint64_t>(s.tokens.size(), 1)) << trace;
    for (uint64_t pos = 0; pos < m.num_cached; ++pos)
      ASSERT_TRUE(written.count(ident(s.key, s.tokens, pos)))
          << trace << "a hit of " << m.num_cached << " tokens (device " << m.device_tokens
          << ", host " << m.host_tokens << ", file " << m.file_tokens << ") covers token " << pos
          << ", whose K/V the test never wrote";
    g_spanning += m.device_tokens > 0 && m.host_tokens + m.file_tokens > 0;
    host_hits += m.host_tokens / bs;
    file_hits += m.file_tokens / bs;
    ASSERT_GE(info(s.id).num_computed_tokens, m.device_tokens) << trace;
  }

  void seq_opts(const Key& k, pkv_seq_options* so, std::string* salt) {
    pkv_seq_options_init(so);
    so->lora_id = k.lora;
    *salt = "s" + std::to_string(k.salt);
    so->cache_salt = k.salt ? salt->c_str() : nullptr;
  }

  std::vector<pkv_block_hash> hash_prompt(const Seq& s, const pkv_seq_options& so) {
    pkv_pool_options po;
    pkv_pool_options_init(&po);
    EXPECT_EQ(pkv_pool_get_options(pool, &po), PKV_OK);
    pkv_hash_options ho;
    pkv_hash_options_init(&ho);
    ho.algo = po.hash_algo;
    ho.block_size = bs;
    ho.lora_id = s.key.lora;
    ho.cache_salt = so.cache_salt;
    std::vector<pkv_block_hash> hs(s.tokens.size() / bs + 1);
    uint64_t nh = 0;
    EXPECT_EQ(pkv_hash_prefix(&ho, s.tokens.data(), s.tokens.size(), hs.data(), hs.size(), &nh),
              PKV_OK);
    hs.resize(nh);
    return hs;
  }

  // Admits s (tokens and key set): a tiered admission or a tiered match
  // and an append. false: it did not fit (nothing is left of it).
  bool admit_seq(Seq& s, pkv_tier_match* m) {
    pkv_seq_options so;
    std::string salt;
    seq_opts(s.key, &so, &salt);
    const std::vector<pkv_block_hash> hs = hash_prompt(s, so);
    const int how = int(r(4));
    maybe_flush();
    pkv_tier_match_init(m);
    trace += "admit how=" + std::to_string(how) + " n=" + std::to_string(s.tokens.size());
    pkv_status st;
    if (how < 2) {
      st = pkv_seq_admit_tiered(pool, &so, s.tokens.data(), s.tokens.size(),
                                how ? hs.data() : nullptr, how ? hs.size() : 0, 0, &s.id, m);
      trace += " -> " + std::to_string(st) + " seq " + std::to_string(s.id) + " cached " +
               std::to_string(m->device_tokens) + "/" + std::to_string(m->host_tokens) + "/" +
               std::to_string(m->file_tokens) + "\n";
      if (st == PKV_E_OUT_OF_BLOCKS) return false;
      EXPECT_EQ(st, PKV_OK) << pkv_last_error_message();
      if (st != PKV_OK) return false;
      s.done = m->num_cached;
      seqs.push_back(s);
      check_match(s, *m);
      return true;
    }
    EXPECT_EQ(pkv_seq_create(pool, &so, &s.id), PKV_OK);
    if (how == 2)
      st = pkv_seq_match_prefix_tiered(pool, s.id, s.tokens.data(), s.tokens.size(), m);
    else
      st = pkv_seq_match_prefix_hashes_tiered(pool, s.id, s.tokens.data(), s.tokens.size(),
                                              hs.data(), hs.size(), m);
    EXPECT_EQ(st, PKV_OK) << pkv_last_error_message();
    trace += " seq " + std::to_string(s.id) + " cached " + std::to_string(m->device_tokens) + "/" +
             std::to_string(m->host_tokens) + "/" + std::to_string(m->file_tokens);
    check_match(s, *m);
    const std::vector<int32_t> all = s.tokens;
    s.tokens.assign(all.begin(), all.begin() + long(m->num_cached));
    seqs.push_back(s);
    if (::testing::Test::HasFailure()) return false;
    st = pkv_seq_append(pool, s.id, all.data() + m->num_cached, all.size() - m->num_cached, 0);
    trace += " append -> " + std::to_string(st) + "\n";
    if (st != PKV_OK) {
      EXPECT_EQ(st, PKV_E_OUT_OF_BLOCKS) << pkv_last_error_message();
      free_at(seqs.size() - 1);
      return false;
    }
    seqs.back().tokens = all;
    seqs.back().done = m->num_cached;
    s.tokens = all;
    return true;
  }

  void admit() {
    Seq s;
    s.key = key();
    s.tokens = prompt();
    pkv_tier_match m;
    admit_seq(s, &m);
  }

  void append() {
    if (seqs.empty()) return;
    Seq& s = seqs[r(seqs.size())];
    std::vector<int32_t> t(1 + r(2 * bs));
    for (auto& x : t) x = int32_t(r(3));
    const pkv_status st = pkv_seq_append(pool, s.id, t.data(), t.size(), 0);
    trace += "append seq " + std::to_string(s.id) + " +" + std::to_string(t.size()) + " -> " +
             std::to_string(st) + "\n";
    if (st == PKV_OK)
      s.tokens.insert(s.tokens.end(), t.begin(), t.end());
    else
      ASSERT_EQ(st, PKV_E_OUT_OF_BLOCKS) << pkv_last_error_message();
  }

  void truncate() {
    if (seqs.empty()) return;
    Seq& s = seqs[r(seqs.size())];
    const uint64_t n = r(s.tokens.size() + 1);
    trace += "truncate seq " + std::to_string(s.id) + " to " + std::to_string(n) + "\n";
    ASSERT_EQ(pkv_seq_truncate(pool, s.id, n), PKV_OK) << pkv_last_error_message();
    s.tokens.resize(n);
    s.done = std::min(s.done, n);
  }

  void fork() {
    if (seqs.empty()) return;
    Seq c = seqs[r(seqs.size())];
    const pkv_seq_id parent = c.id;
    const pkv_status st = pkv_seq_fork(pool, parent, &c.id);
    trace += "fork seq " + std::to_string(parent) + " -> " + std::to_string(c.id) + "\n";
    ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
    seqs.push_back(c);
  }

  void free_at(size_t i) {
    trace += "free seq " + std::to_string(seqs[i].id) + "\n";
    last_table.erase(seqs[i].id);
    ASSERT_EQ(pkv_seq_free(pool, seqs[i].id), PKV_OK) << pkv_last_error_message();
    seqs.erase(seqs.begin() + long(i));
  }
  void free_one() {
    if (!seqs.empty()) free_at(r(seqs.size()));
  }

  // Writes every layer of a prepared plan: rows[i] is the identity of row i.
  bool write_plan(pkv_batch* b, const std::vector<uint64_t>& rows) {
    const int64_t n = int64_t(rows.size());
    for (uint32_t l = 0; l < kLayers; ++l) {
      std::vector<float> k(size_t(n) * kHeadDim), v(size_t(n) * kHeadDim);
      for (int64_t row = 0; row < n; ++row)
        for (uint32_t d = 0; d < kHeadDim; ++d) {
          k[size_t(row) * kHeadDim + d] = elem(rows[size_t(row)], l, 0, d);
          v[size_t(row) * kHeadDim + d] = elem(rows[size_t(row)], l, 1, d);
        }
      const int64_t shape[3] = {n, 1, kHeadDim};
      pkv_tensor kt, vt;
      EXPECT_EQ(pkv_tensor_init(k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &kt), PKV_OK);
      EXPECT_EQ(pkv_tensor_init(v.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &vt), PKV_OK);
      const pkv_status st = pkv_cache_write(b, l, &kt, &vt, nullptr);
      EXPECT_EQ(st, PKV_OK) << trace << pkv_last_error_message();
      if (st != PKV_OK) return false;
    }
    for (uint64_t id : rows) written.insert(id);
    return true;
  }

  // One step over a random pick of sequences, every token not yet computed
  // as a query (and sometimes a few more). A refusal (a tier load turned
  // into a miss, or a fork relative's unwritten blocks) is rescheduled once.
  void step() {
    std::vector<size_t> pick;
    for (size_t i = 0; i < seqs.size(); ++i)
      if (r(3) && !seqs[i].tokens.empty()) pick.push_back(i);
    if (pick.empty()) return;
    const uint64_t extra = r(4) == 0 ? r(3) : 0;
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::vector<pkv_seq_id> ids;
      std::vector<uint32_t> q;
      std::vector<uint64_t> rows;
      for (size_t i : pick) {
        const Seq& s = seqs[i];
        const pkv_seq_info in = info(s.id);
        const uint64_t from =
            attempt ? in.num_computed_tokens : std::max<uint64_t>(in.num_computed_tokens, s.done);
        const uint64_t c = std::min<uint64_t>(
            in.num_tokens,
            std::max<uint64_t>(in.num_tokens - std::min(from, in.num_tokens), 1) + extra);
        ids.push_back(s.id);
        q.push_back(uint32_t(c));
        for (size_t pos = s.tokens.size() - c; pos < s.tokens.size(); ++pos)
          rows.push_back(ident(s.key, s.tokens, pos));
      }
      pkv_batch* b = nullptr;
      const pkv_status st =
          pkv_batch_prepare(pool, ids.data(), q.data(), uint32_t(ids.size()), nullptr, &b);
      trace += "prepare " + std::to_string(ids.size()) + " seqs -> " + std::to_string(st) + "\n";
      if (st == PKV_E_INVALID_STATE) {
        ++g_refused;
        continue;  // pending copies may not have run
      }
      ASSERT_EQ(st, PKV_OK) << trace << pkv_last_error_message();
      pending_dst.clear();
      const bool ok = write_plan(b, rows);
      pkv_batch_destroy(b);
      if (!ok) return;
      for (size_t i : pick) {
        const pkv_seq_info in = info(seqs[i].id);
        ASSERT_EQ(in.num_computed_tokens, in.num_tokens)
            << trace << "seq " << seqs[i].id << " after its committed step";
        seqs[i].done = in.num_tokens;
      }
      return;
    }
  }

  void decode() {
    std::vector<pkv_seq_id> ids;
    std::vector<size_t> idx;
    for (size_t i = 0; i < seqs.size(); ++i)
      if (r(2)) ids.push_back(seqs[i].id), idx.push_back(i);
    if (ids.empty()) return;
    std::vector<int32_t> tok(ids.size());
    for (auto& t : tok) t = int32_t(r(3));
    pkv_batch* b = nullptr;
    const pkv_status st = pkv_batch_prepare_decode(pool, ids.data(), tok.data(),
                                                   uint32_t(ids.size()), 0, nullptr, &b);
    trace += "prepare_decode " + std::to_string(ids.size()) + " -> " + std::to_string(st) + "\n";
    if (st != PKV_OK) {
      // Refused before its appends: a context token not computed (the
      // engine prefills those first), or no room.
      ASSERT_TRUE(st == PKV_E_INVALID_STATE || st == PKV_E_OUT_OF_BLOCKS)
          << trace << pkv_last_error_message();
      return;
    }
    pending_dst.clear();
    std::vector<uint64_t> rows;
    for (size_t k = 0; k < idx.size(); ++k) {
      Seq& s = seqs[idx[k]];
      s.tokens.push_back(tok[k]);
      s.done = s.tokens.size();
      rows.push_back(ident(s.key, s.tokens, s.tokens.size() - 1));
    }
    write_plan(b, rows);
    pkv_batch_destroy(b);
  }

  std::set<int32_t> held() {
    std::set<int32_t> h;
    for (Seq& q : seqs)
      for (int32_t b : table(q.id)) h.insert(b);
    return h;
  }

  void copy_into_free() {
    const std::set<int32_t> h = held();
    const int32_t dst = int32_t(1 + r(nblocks - 1)), src = int32_t(1 + r(nblocks - 1));
    if (h.count(dst) || pending_dst.count(src) || dst == src) return;
    trace += "copy block " + std::to_string(src) + " -> " + std::to_string(dst) + "\n";
    ASSERT_EQ(pkv_pool_copy_blocks(pool, &src, &dst, 1, nullptr), PKV_OK)
        << pkv_last_error_message();
    pending_dst.clear();
  }

  // Preemption by swapping: the sequence's blocks go to host memory and
  // the sequence is freed.
  void swap_out() {
    if (seqs.empty() || swapped.size() >= 3) return;
    const size_t i = r(seqs.size());
    const auto t = table(seqs[i].id);
    Swapped w;
    w.key = seqs[i].key;
    w.tokens = seqs[i].tokens;
    w.computed = info(seqs[i].id).num_computed_tokens;
    w.bytes.resize(std::max<size_t>(t.size(), 1) * bpb);
    trace += "swap out seq " + std::to_string(seqs[i].id) + "\n";
    ASSERT_EQ(pkv_pool_swap_blocks(pool, t.data(), t.size(), w.bytes.data(), w.bytes.size(),
                                   PKV_SWAP_OUT, nullptr),
              PKV_OK)
        << pkv_last_error_message();
    pending_dst.clear();
    free_at(i);
    swapped.push_back(std::move(w));
  }

  // Resumes a swapped-out sequence: admitted again (prefix hits first),
  // then the blocks it had computed that no hit covers are swapped in.
  void swap_in() {
    if (swapped.empty()) return;
    const size_t k = r(swapped.size());
    Swapped w = swapped[k];
    swapped.erase(swapped.begin() + long(k));
    Seq s;
    s.key = w.key;
    s.tokens = w.tokens;
    if (s.tokens.empty()) return;
    pkv_tier_match m;
    if (!admit_seq(s, &m)) return;
    const auto t = table(s.id);
    // Blocks whose every filled slot the swap-out saw written.
    const uint64_t n = s.tokens.size();
    const uint64_t last = w.computed == n ? (n + bs - 1) / bs : w.computed / bs;
    std::vector<int32_t> blocks;
    std::vector<char> buf;
    for (uint64_t j = m.num_cached / bs; j < last; ++j) {
      blocks.push_back(t[j]);
      buf.insert(buf.end(), w.bytes.begin() + long(j * bpb), w.bytes.begin() + long((j + 1) * bpb));
    }
    if (blocks.empty()) return;
    trace += "swap in " + std::to_string(blocks.size()) + " blocks of seq " + std::to_string(s.id) +
             "\n";
    ASSERT_EQ(pkv_pool_swap_blocks(pool, blocks.data(), blocks.size(), buf.data(), buf.size(),
                                   PKV_SWAP_IN, nullptr),
              PKV_OK)
        << pkv_last_error_message();
    pending_dst.clear();
    ++g_swap_ins;
    for (uint64_t pos = m.num_cached; pos < std::min(n, last * bs); ++pos)
      written.insert(ident(s.key, s.tokens, pos));
  }

  // Flips bytes of the file tier through this process's descriptor of the
  // unlinked file (the only one in tier_dir()).
  void corrupt_file() {
    if (!file_slots) return;
    DIR* d = opendir("/proc/self/fd");
    ASSERT_NE(d, nullptr);
    int fd = -1;
    while (dirent* e = readdir(d)) {
      char link[512];
      const std::string p = std::string("/proc/self/fd/") + e->d_name;
      const ssize_t len = readlink(p.c_str(), link, sizeof link - 1);
      if (len <= 0) continue;
      link[len] = 0;
      if (std::strncmp(link, tier_dir().c_str(), tier_dir().size()) == 0) fd = std::atoi(e->d_name);
    }
    closedir(d);
    ASSERT_GE(fd, 0) << "no descriptor of the file tier in " << tier_dir();
    const uint64_t slot = r(file_slots);
    const off_t at = off_t(slot * bpb + r(bpb));
    char c = 0;
    ASSERT_EQ(pread(fd, &c, 1, at), 1);
    c = char(c ^ (1 + r(255)));
    ASSERT_EQ(pwrite(fd, &c, 1, at), 1);
    ++corruptions;
    trace += "corrupt file slot " + std::to_string(slot) + "\n";
  }

  void reset() {
    trace += "reset prefix cache\n";
    ASSERT_EQ(pkv_pool_reset_prefix_cache(pool), PKV_OK);
    // Cached from now on: what live sequences computed (a partial block
    // filled later is cached with what it holds) and later writes.
    written.clear();
    for (Seq& s : seqs) {
      const uint64_t c = info(s.id).num_computed_tokens;
      for (uint64_t pos = 0; pos < c; ++pos) written.insert(ident(s.key, s.tokens, pos));
    }
  }

  void op() {
    const int o = int(r(30));
    if (o < 6)
      admit();
    else if (o < 8)
      append();
    else if (o < 9)
      truncate();
    else if (o < 11)
      fork();
    else if (o < 14)
      free_one();
    else if (o < 19)
      step();
    else if (o < 21)
      decode();
    else if (o < 22)
      copy_into_free();
    else if (o < 24)
      swap_out();
    else if (o < 26)
      swap_in();
    else if (o < 27)
      corrupt_file();
    else if (o < 28 && r(3) == 0)
      reset();
    else if (o < 29) {
      trace += "flush\n";
      ASSERT_EQ(pkv_pool_flush_tiers(pool), PKV_OK);
    }
  }
};

void run(uint64_t seed, int steps) {
  Harness h(seed);
  h.create();
  if (::testing::Test::HasFatalFailure()) return;
  for (int i = 0; i < steps; ++i) {
    h.op();
    if (!::testing::Test::HasFailure()) h.check();
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "seed " << seed << " step " << i;
      return;
    }
  }
  const pkv_tier_stats hs = h.tstats(PKV_MEDIUM_HOST), fs = h.tstats(PKV_MEDIUM_FILE);
  g_host_hits += h.host_hits;
  g_file_hits += h.file_hits;
  g_loaded += hs.num_loaded + fs.num_loaded;
  g_failed_loads += hs.num_checksum_failures + fs.num_checksum_failures + fs.num_io_errors;
  // Leave loads pending at destruction now and then.
  if (h.r(2)) {
    const uint64_t before = h.host_hits + h.file_hits;
    for (int i = 0; i < 8 && h.host_hits + h.file_hits == before; ++i) {
      if (!h.seqs.empty()) h.free_one();
      h.admit();
    }
    g_pending_at_end += h.host_hits + h.file_hits > before;
  }
}

TEST(ProvenanceTiers, OffloadLoadSwapForkCorruptionNeverServeKvNobodyWroteForThoseTokens) {
  const char* env = std::getenv("PKV_PROVENANCE_SEEDS");
#if defined(PKV_SANITIZED)
  constexpr int kSeeds = 20;
#else
  constexpr int kSeeds = 100;
#endif
  const int seeds = env ? std::atoi(env) : kSeeds;
  const char* one = std::getenv("PKV_PROVENANCE_SEED");
  const char* steps_env = std::getenv("PKV_PROVENANCE_STEPS");
  const int steps = steps_env ? std::atoi(steps_env) : 1000;
  if (one) {
    run(std::strtoull(one, nullptr, 10), steps);
  } else {
    for (int s = 1; s <= seeds && !HasFailure(); ++s) run(uint64_t(s), steps);
  }
  rmdir(tier_dir().c_str());
  if (std::getenv("PKV_PROVENANCE_DUMP"))
    std::printf(
        "tier hits host %lu file %lu, spanning device+tier %lu, loaded %lu, failed %lu, "
        "refused plans %lu, swap-ins %lu, destroys with hits pending %lu\n",
        (unsigned long)g_host_hits, (unsigned long)g_file_hits, (unsigned long)g_spanning,
        (unsigned long)g_loaded, (unsigned long)g_failed_loads, (unsigned long)g_refused,
        (unsigned long)g_swap_ins, (unsigned long)g_pending_at_end);
}

}  // namespace
