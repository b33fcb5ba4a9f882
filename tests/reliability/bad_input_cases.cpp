#include "bad_input_cases.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace pkv_rel {
namespace {

void must(pkv_status s, const char* what) {
  if (s != PKV_OK) {
    std::fprintf(stderr, "bad_input env: %s failed: %d %s\n", what, int(s),
                 pkv_last_error_message());
    std::abort();
  }
}

pkv_tensor dense(std::vector<float>& buf, int64_t n0, int64_t n1, int64_t n2) {
  buf.assign(size_t(n0 * n1 * n2), 0.f);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = float(int((i * 2654435761u) % 129) - 64) / 64.f;
  const int64_t shape[3] = {n0, n1, n2};
  pkv_tensor t;
  must(pkv_tensor_init(buf.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &t), "tensor_init");
  return t;
}

constexpr uint64_t k2_62 = uint64_t(1) << 62;
constexpr uint64_t k2_60 = uint64_t(1) << 60;

pkv_pool_options storage_opts() {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 16;
  o.num_blocks = 32;
  o.num_layers = 2;
  o.num_kv_heads = 2;
  o.head_dim = 64;
  o.dtype = PKV_DTYPE_F32;
  o.enable_events = 1;
  o.max_events = 4;
  o.num_threads = 1;
  return o;
}

pkv_status create_with(pkv_pool_options o, Env& e) {
  pkv_pool* p = nullptr;
  pkv_status s = pkv_pool_create(&o, &p);
  pkv_pool_destroy(p);  // in case it unexpectedly succeeded
  (void)e;
  return s;
}

// FP8 pools (per tensor: 2 layers -> 2 scales each).
pkv_pool_options fp8_opts() {
  pkv_pool_options o = storage_opts();
  o.dtype = PKV_DTYPE_FP8_E4M3;
  return o;
}

// Runs f on a fresh FP8 pool and checks that a failure left its scales as
// they were; returns f's status.
template <class F>
pkv_status with_fp8_pool(F f) {
  pkv_pool_options o = fp8_opts();
  const float k0[2] = {0.5f, 2.0f}, v0[2] = {4.0f, 0.25f};
  o.num_kv_scales = 2;
  o.k_scales = k0;
  o.v_scales = v0;
  pkv_pool* p = nullptr;
  must(pkv_pool_create(&o, &p), "fp8 pool_create");
  const pkv_status s = f(p);
  float k[2] = {0, 0}, v[2] = {0, 0};
  uint64_t n = 0;
  must(pkv_pool_get_kv_scales(p, k, v, 2, &n), "get_kv_scales");
  const bool same = n == 2 && k[0] == k0[0] && k[1] == k0[1] && v[0] == v0[0] && v[1] == v0[1];
  // Again, for the message (the check above cleared it): the same status.
  const pkv_status again = f(p);
  pkv_pool_destroy(p);
  if ((s != PKV_OK && !same) || again != s) return PKV_E_INTERNAL;
  return s;
}

// Each bad value in turn, in k_scales[1] (or v_scales[0]); all must fail alike.
pkv_status bad_create_scales(Env& e, bool in_v) {
  for (float bad : {0.0f, -1.0f, std::nanf(""), INFINITY}) {
    pkv_pool_options o = fp8_opts();
    float k[2] = {1, 1}, v[2] = {1, 1};
    (in_v ? v[0] : k[1]) = bad;
    o.num_kv_scales = 2;
    o.k_scales = k;
    o.v_scales = v;
    const pkv_status s = create_with(o, e);
    if (s != PKV_E_INVALID_ARGUMENT) return s;
  }
  return PKV_E_INVALID_ARGUMENT;
}

pkv_status bad_set_scales() {
  for (float bad : {0.0f, -1.0f, std::nanf(""), -INFINITY}) {
    const float k[2] = {1, 1}, v[2] = {1, bad};
    const pkv_status s =
        with_fp8_pool([&](pkv_pool* p) { return pkv_pool_set_kv_scales(p, k, v, 2); });
    if (s != PKV_E_INVALID_ARGUMENT) return s;
  }
  return PKV_E_INVALID_ARGUMENT;
}

pkv_status hash_with(pkv_hash_options o, const int32_t* tokens, uint64_t n, Env& e) {
  return pkv_hash_prefix(&o, tokens, n, e.hashes, 8, &e.u64);
}

pkv_hash_options hopts() {
  pkv_hash_options o;
  pkv_hash_options_init(&o);
  return o;
}

pkv_status seq_with(const pkv_seq_options& o, Env& e) {
  return pkv_seq_create(e.pool, &o, &e.id_out);
}

pkv_seq_options sopts() {
  pkv_seq_options o;
  pkv_seq_options_init(&o);
  return o;
}

pkv_status write_k(Env& e, pkv_tensor k) { return pkv_cache_write(e.batch, 0, &k, &e.vt, nullptr); }
pkv_status attend_q(Env& e, pkv_tensor q) {
  return pkv_attention_forward(e.batch, 0, &q, &e.ot, nullptr, nullptr, nullptr);
}
pkv_status attend_out(Env& e, pkv_tensor o) {
  return pkv_attention_forward(e.batch, 0, &e.qt, &o, nullptr, nullptr, nullptr);
}
pkv_status attend_lse(Env& e, pkv_tensor l) {
  return pkv_attention_forward(e.batch, 0, &e.qt, &e.ot, &l, nullptr, nullptr);
}
pkv_status attend_params(Env& e, pkv_attention_params p) {
  return pkv_attention_forward(e.batch, 0, &e.qt, &e.ot, nullptr, &p, nullptr);
}
// A descriptor of the pool's own layer-0 K storage shaped like t.
pkv_tensor in_kv_storage(Env& e, pkv_tensor t) {
  pkv_tensor kv;
  must(pkv_pool_kv_tensor(e.pool, 0, PKV_KV_KEY, &kv), "kv_tensor");
  t.data = kv.data;
  return t;
}
char* misaligned(std::vector<float>& buf) { return reinterpret_cast<char*>(buf.data()) + 2; }
pkv_attention_params aparams() {
  pkv_attention_params p;
  pkv_attention_params_init(&p);
  return p;
}

// Setups that make a plan stale or orphaned before the bad call.
void append_to_a(Env& e) { pkv_seq_append(e.pool, e.a, e.tokens, 1, 0); }
void free_b(Env& e) { pkv_seq_free(e.pool, e.b); }
void append_a(Env& e) { pkv_seq_append(e.pool, e.a, e.tokens + 40, 2, 0); }
void destroy_pool(Env& e) {
  pkv_pool_destroy(e.pool);
  e.pool = nullptr;
}
Case with_setup(Case c, void (*setup)(Env&)) {
  c.setup = setup;
  return c;
}

// A manager-only pool with retention priorities, and a sequence on it, for
// the cases that need one; set_retention(ranges) on it, then destroyed.
pkv_status on_retention_pool(const pkv_retention_range* r, uint64_t n, uint64_t max_pinned) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 16;
  o.enable_retention = 1;
  o.max_pinned_blocks = max_pinned;
  pkv_pool* p = nullptr;
  must(pkv_pool_create(&o, &p), "retention pool");
  pkv_seq_id s = 0;
  must(pkv_seq_create(p, nullptr, &s), "seq_create");
  const pkv_status st = pkv_seq_set_retention(p, s, r, n);
  pkv_pool_destroy(p);
  return st;
}
pkv_retention_range rrange(uint64_t begin, uint64_t end, uint32_t priority) {
  return pkv_retention_range{begin, end, priority, 0, 0};
}
pkv_status match_partial(Env& e, pkv_seq_id s, const int32_t* t, uint64_t n, pkv_prefix_match* m) {
  return pkv_seq_match_prefix_partial(e.pool, s, t, n, m);
}
pkv_tier_options tier_opts(uint64_t host_bytes) {
  pkv_tier_options o;
  pkv_tier_options_init(&o);
  o.host_bytes = host_bytes;
  return o;
}
pkv_tier_match tmatch() {
  pkv_tier_match m;
  pkv_tier_match_init(&m);
  return m;
}
pkv_tier_stats tstats() {
  pkv_tier_stats s;
  pkv_tier_stats_init(&s);
  return s;
}
pkv_prefix_match pmatch() {
  pkv_prefix_match m;
  pkv_prefix_match_init(&m);
  return m;
}

// Multi-group pools (pagedkv/groups.h): a full and a window-8 group on one
// budget of 16 blocks of 4; seq g holds 10 tokens, seq dead was freed. f
// runs on it; the pool must still validate afterwards.
pkv_kv_group_spec gspec(uint32_t kind) {
  pkv_kv_group_spec g;
  pkv_kv_group_spec_init(&g);
  g.kind = kind;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  if (kind == PKV_GROUP_SLIDING_WINDOW) g.sliding_window = 8;
  return g;
}
pkv_pool_options gbase() {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 16;
  return o;
}
pkv_status create_groups_with(pkv_pool_options o, pkv_kv_group_spec g1) {
  const pkv_kv_group_spec g[2] = {gspec(PKV_GROUP_FULL), g1};
  pkv_pool* p = nullptr;
  const pkv_status s = pkv_pool_create_groups(&o, g, 2, &p);
  pkv_pool_destroy(p);
  return s;
}
struct GroupsState {
  pkv_pool_stats stats;
  std::vector<int32_t> tables[2];
  bool operator==(const GroupsState& o) const {
    return std::memcmp(&stats, &o.stats, sizeof stats) == 0 && tables[0] == o.tables[0] &&
           tables[1] == o.tables[1];
  }
};
GroupsState groups_state(pkv_pool* p, pkv_seq_id s) {
  GroupsState st;
  pkv_pool_stats_init(&st.stats);
  must(pkv_pool_get_stats(p, &st.stats), "groups stats");
  for (uint32_t g = 0; g < 2; ++g) {
    st.tables[g].resize(16);
    uint64_t n = 0;
    must(pkv_seq_group_block_table(p, s, g, st.tables[g].data(), 16, &n), "groups table");
    st.tables[g].resize(n);
  }
  return st;
}
// Runs f twice on fresh copies of the pool: the first run checks that the
// pool validates and nothing observable changed, the second leaves its
// message as the last one for the case's needle check.
template <class P, class F>
pkv_status on_groups(Env& e, P&& prep, F&& f) {
  for (int pass = 0;; ++pass) {
    const pkv_kv_group_spec g[2] = {gspec(PKV_GROUP_FULL), gspec(PKV_GROUP_SLIDING_WINDOW)};
    pkv_pool_options o = gbase();
    pkv_pool* p = nullptr;
    must(pkv_pool_create_groups(&o, g, 2, &p), "pool_create_groups");
    pkv_seq_id s = 0, dead = 0;
    must(pkv_seq_create(p, nullptr, &s), "groups seq_create");
    must(pkv_seq_append(p, s, e.tokens, 10, 0), "groups append");
    must(pkv_seq_create(p, nullptr, &dead), "groups seq_create dead");
    must(pkv_seq_free(p, dead), "groups free dead");
    prep(p, s);
    const GroupsState before = groups_state(p, s);
    const pkv_status st = f(p, s, dead);
    if (pass == 1) {
      pkv_pool_destroy(p);
      return st;
    }
    const bool same = pkv_pool_validate(p) == PKV_OK && groups_state(p, s) == before;
    pkv_pool_destroy(p);
    if (!same) return PKV_E_INTERNAL;
  }
}
template <class F>
pkv_status on_groups(Env& e, F&& f) {
  return on_groups(
      e, [](pkv_pool*, pkv_seq_id) {}, f);
}
// A plan over the multi-group pool (one query of seq g) handed to f, then
// destroyed (committing one computed token: nothing observable) without a
// call that would replace f's message.
template <class F>
pkv_status on_group_plan(Env& e, F&& f) {
  pkv_batch* gb[2] = {};
  int k = 0;
  return on_groups(
      e,
      [&](pkv_pool* p, pkv_seq_id s) {
        const uint32_t q = 1;
        must(pkv_batch_prepare(p, &s, &q, 1, nullptr, &gb[k++]), "prepare");
      },
      [&](pkv_pool*, pkv_seq_id, pkv_seq_id) {
        const pkv_status st = f(gb[k - 1]);
        for (pkv_batch*& b : gb) pkv_batch_destroy(std::exchange(b, nullptr));
        return st;
      });
}

// A plan whose recurrent snapshot slots (PKV_GROUP_SNAPSHOT_EVERY_BLOCK)
// exceed the free blocks: 40 tokens take 10 pages and a state slot of 15
// blocks, 10 snapshots do not fit in the 4 left. Checks that the failed
// prepare changed nothing (else PKV_E_INTERNAL).
pkv_status snapshot_prepare_oob(Env& e) {
  pkv_kv_group_spec g[2] = {gspec(PKV_GROUP_FULL), gspec(PKV_GROUP_RECURRENT)};
  g[1].state_bytes = 16;
  g[1].flags = PKV_GROUP_SNAPSHOT_EVERY_BLOCK;
  std::vector<int32_t> toks(e.tokens, e.tokens + 20);
  toks.insert(toks.end(), e.tokens, e.tokens + 20);
  // Two passes as on_groups: the first checks, the second leaves the message.
  for (int pass = 0;; ++pass) {
    pkv_pool_options o = gbase();
    pkv_pool* p = nullptr;
    must(pkv_pool_create_groups(&o, g, 2, &p), "snapshot pool");
    pkv_seq_id s = 0;
    must(pkv_seq_create(p, nullptr, &s), "snapshot seq");
    must(pkv_seq_append(p, s, toks.data(), 40, 0), "snapshot append");
    const GroupsState before = groups_state(p, s);
    const uint32_t q = 40;
    pkv_batch* b = nullptr;
    const pkv_status st = pkv_batch_prepare(p, &s, &q, 1, nullptr, &b);
    if (pass == 1) {
      pkv_batch_destroy(b);
      pkv_pool_destroy(p);
      return st;
    }
    const bool same =
        b == nullptr && pkv_pool_validate(p) == PKV_OK && groups_state(p, s) == before;
    pkv_batch_destroy(b);
    pkv_pool_destroy(p);
    if (!same) return PKV_E_INTERNAL;
  }
}

// MLA pools (issue 19): 2 layers of rank 32 + rope 8, f32, a 3-token
// sequence planned. f gets the pool, the batch and valid tensors; a failure
// must leave the step uncommitted. Returns f's status.
struct MlaEnv {
  pkv_pool* pool = nullptr;
  pkv_batch* batch = nullptr;
  pkv_seq_id seq = 0;
  std::vector<float> c, pe, ql, qp, out;
  pkv_tensor ct{}, pt{}, qlt{}, qpt{}, ot{};
  pkv_attention_params params{};
};
pkv_pool_options mla_opts() {
  pkv_pool_options o = storage_opts();
  o.num_kv_heads = 0;
  o.head_dim = 0;
  o.kv_layout = PKV_KV_LAYOUT_MLA;
  o.kv_lora_rank = 32;
  o.qk_rope_head_dim = 8;
  return o;
}
pkv_tensor mla_dense(std::vector<float>& buf, std::initializer_list<int64_t> shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  buf.assign(n, 0.25f);
  pkv_tensor t;
  must(pkv_tensor_init(buf.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, int32_t(shape.size()),
                       shape.begin(), &t),
       "tensor_init");
  return t;
}
template <class F>
pkv_status with_mla(F f) {
  MlaEnv m;
  pkv_pool_options o = mla_opts();
  must(pkv_pool_create(&o, &m.pool), "mla pool_create");
  must(pkv_seq_create(m.pool, nullptr, &m.seq), "seq_create");
  const int32_t toks[3] = {1, 2, 3};
  must(pkv_seq_append(m.pool, m.seq, toks, 3, 0), "seq_append");
  const uint32_t q = 3;
  must(pkv_batch_prepare(m.pool, &m.seq, &q, 1, nullptr, &m.batch), "batch_prepare");
  m.ct = mla_dense(m.c, {3, 32});
  m.pt = mla_dense(m.pe, {3, 8});
  m.qlt = mla_dense(m.ql, {3, 4, 32});
  m.qpt = mla_dense(m.qp, {3, 4, 8});
  m.ot = mla_dense(m.out, {3, 4, 32});
  pkv_attention_params_init(&m.params);
  m.params.softmax_scale = 0.1f;
  // Layer 1 written: a failing write to layer 0 must not commit the step.
  must(pkv_mla_cache_write(m.batch, 1, &m.ct, &m.pt, nullptr), "mla_cache_write");
  const pkv_status s = f(m);
  pkv_seq_info si;
  pkv_seq_info_init(&si);
  must(pkv_seq_get_info(m.pool, m.seq, &si), "seq_get_info");
  // Again, for the message (the check above cleared it): the same status.
  const pkv_status again = f(m);
  pkv_batch_destroy(m.batch);
  pkv_pool_destroy(m.pool);
  if ((s != PKV_OK && si.num_computed_tokens != 0) || again != s) return PKV_E_INTERNAL;
  return s;
}

// A value check: PKV_OK when the documented result holds.
pkv_status holds(bool ok) { return ok ? PKV_OK : PKV_E_INTERNAL; }

#define S(fn, cls, what, want, needle, ...)                          \
  Case {                                                             \
    fn, cls, what, want, needle, nullptr, [](Env& e) -> pkv_status { \
      (void)e;                                                       \
      __VA_ARGS__                                                    \
    }                                                                \
  }
#define S2(fn, cls, what, want, alt, needle, ...) \
  Case {                                          \
    fn, cls, what, want, needle, nullptr,         \
        [](Env& e) -> pkv_status {                \
          (void)e;                                \
          __VA_ARGS__                             \
        },                                        \
        alt                                       \
  }
#define V(fn, cls, what, result, ...)                                  \
  Case {                                                               \
    fn, cls, what, PKV_OK, nullptr, result, [](Env& e) -> pkv_status { \
      (void)e;                                                         \
      __VA_ARGS__                                                      \
    }                                                                  \
  }

const pkv_status kInv = PKV_E_INVALID_ARGUMENT, kNf = PKV_E_NOT_FOUND, kState = PKV_E_INVALID_STATE,
                 kSmall = PKV_E_BUFFER_TOO_SMALL, kOob = PKV_E_OUT_OF_BLOCKS;

// pkv_X_init_sized: s = NULL; a size below every struct's first released
// size (4: struct_size alone) or above 2^16. A failed call writes no byte of
// the caller's buffer (else PKV_E_INTERNAL).
template <class T, pkv_status (*F)(T*, size_t)>
pkv_status sized_null(Env&) {
  return F(nullptr, sizeof(T));
}

template <class T, pkv_status (*F)(T*, size_t)>
pkv_status sized_range(Env&) {
  const size_t too_big = (size_t(1) << 16) + 1;
  std::vector<unsigned char> buf(too_big + 64, 0xAB);
  T* s = reinterpret_cast<T*>(buf.data());
  pkv_status st = F(s, 4);
  if (st == kInv) st = F(s, too_big);
  for (unsigned char b : buf)
    if (b != 0xAB) return PKV_E_INTERNAL;
  return st;
}

template <class T, pkv_status (*F)(T*, size_t)>
Case sized_null_case(const char* fn, const char* what, const char* param) {
  return Case{fn, PKV_CLASS_NULL, what, kInv, param, nullptr, sized_null<T, F>};
}

template <class T, pkv_status (*F)(T*, size_t)>
Case sized_range_case(const char* fn) {
  return Case{fn,     PKV_CLASS_STRUCT, "size = 4 or 2^16 + 1", kInv,
              "size", nullptr,          sized_range<T, F>};
}

// The two cases of pkv_<T>_init_sized(pkv_<T>* param, size_t size).
#define SIZED_INIT_CASES(T, param)                                                          \
  sized_null_case<pkv_##T, pkv_##T##_init_sized>("pkv_" #T "_init_sized", #param " = NULL", \
                                                 #param),                                   \
      sized_range_case<pkv_##T, pkv_##T##_init_sized>("pkv_" #T "_init_sized")

std::vector<Case> make_cases() {
  return {
    // ------------------------------------------------------------ common.h
    V("pkv_status_string", PKV_CLASS_RANGE, "status = 12345", "static \"unknown pkv_status\"",
      return holds(pkv_status_string(12345) != nullptr &&
                   std::strcmp(pkv_status_string(12345), "unknown pkv_status") == 0);),
        V("pkv_last_error_copy", PKV_CLASS_NULL, "buf = NULL", "writes nothing, returns the length",
          pkv_status_string(0);
          return holds(pkv_last_error_copy(nullptr, 100) ==
                       std::strlen(pkv_last_error_message()));),
        V("pkv_last_error_copy", PKV_CLASS_CAPACITY, "capacity = 1",
          "writes \"\" (truncated), returns the length", pkv_pool_validate(nullptr);
          const uint64_t n = pkv_last_error_copy(e.msg, 1);
          return holds(e.msg[0] == '\0' && n == std::strlen(pkv_last_error_message()) && n > 0);),
        S("pkv_tensor_init", PKV_CLASS_NULL, "out = NULL", kInv, "out", const int64_t sh[1] = {4};
          return pkv_tensor_init(e.k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 1, sh, nullptr);),
        S("pkv_tensor_init", PKV_CLASS_NULL, "shape = NULL", kInv, "shape", pkv_tensor t;
          return pkv_tensor_init(e.k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 1, nullptr, &t);),
        S("pkv_tensor_init", PKV_CLASS_RANGE, "ndim = 0 or 7", kInv, "ndim", pkv_tensor t;
          const int64_t sh[7] = {1, 1, 1, 1, 1, 1, 1};
          pkv_status s = pkv_tensor_init(e.k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 0, sh, &t);
          return s != kInv
                     ? s
                     : pkv_tensor_init(e.k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 7, sh, &t);),
        S("pkv_tensor_init", PKV_CLASS_SHAPE, "shape[1] = -1", kInv, "shape[1]", pkv_tensor t;
          const int64_t sh[2] = {2, -1};
          return pkv_tensor_init(e.k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 2, sh, &t);),
        S("pkv_tensor_init", PKV_CLASS_DTYPE, "dtype = 99", kInv, "dtype", pkv_tensor t;
          const int64_t sh[1] = {4};
          return pkv_tensor_init(e.k.data(), 99, PKV_DEVICE_CPU, 0, 1, sh, &t);),
        S("pkv_tensor_init", PKV_CLASS_DEVICE, "device_type = 5", kInv, "device_type", pkv_tensor t;
          const int64_t sh[1] = {4};
          return pkv_tensor_init(e.k.data(), PKV_DTYPE_F32, 5, 0, 1, sh, &t);),
        S("pkv_tensor_init", PKV_CLASS_DEVICE, "device_id = -1", kInv, "device_id", pkv_tensor t;
          const int64_t sh[1] = {4};
          return pkv_tensor_init(e.k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, -1, 1, sh, &t);),
        V("pkv_dtype_size", PKV_CLASS_DTYPE, "dtype = 0 or 99", "returns 0",
          return holds(pkv_dtype_size(0) == 0 && pkv_dtype_size(99) == 0);),

        // ------------------------------------------------------------ hash.h
        V("pkv_hash_size", PKV_CLASS_RANGE, "algo = 0 or 99", "returns 0",
          return holds(pkv_hash_size(0) == 0 && pkv_hash_size(99) == 0);),
        V("pkv_hash_options_init", PKV_CLASS_NULL, "opts = NULL", "no-op",
          pkv_hash_options_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(hash_options, opts),
        S("pkv_hash_prefix", PKV_CLASS_RANGE, "strict_key_domains = 3", kInv, "strict_key_domains",
          pkv_hash_options o = hopts();
          o.strict_key_domains = 3; return hash_with(o, e.tokens, 16, e);),
        S("pkv_hash_prefix", PKV_CLASS_NULL, "opts = NULL", kInv, "opts",
          return pkv_hash_prefix(nullptr, e.tokens, 16, e.hashes, 8, &e.u64);),
        S("pkv_hash_prefix", PKV_CLASS_NULL, "out_num_blocks = NULL", kInv, "out_num_blocks",
          pkv_hash_options o = hopts();
          return pkv_hash_prefix(&o, e.tokens, 16, e.hashes, 8, nullptr);),
        S("pkv_hash_prefix", PKV_CLASS_NULL, "tokens = NULL, num_tokens = 16", kInv, "tokens",
          return hash_with(hopts(), nullptr, 16, e);),
        S("pkv_hash_prefix", PKV_CLASS_NULL, "out_hashes = NULL, capacity = 8", kInv, "out_hashes",
          pkv_hash_options o = hopts();
          return pkv_hash_prefix(&o, e.tokens, 32, nullptr, 8, &e.u64);),
        S("pkv_hash_prefix", PKV_CLASS_NULL, "mm_items = NULL, num_mm_items = 1", kInv, "mm_items",
          pkv_hash_options o = hopts();
          o.num_mm_items = 1; return hash_with(o, e.tokens, 16, e);),
        S("pkv_hash_prefix", PKV_CLASS_NULL, "mm_items[0].hash = NULL", kInv, "mm_items[0]",
          pkv_hash_options o = hopts();
          pkv_mm_item m{0, 4, nullptr}; o.mm_items = &m; o.num_mm_items = 1;
          return hash_with(o, e.tokens, 16, e);),
        S("pkv_hash_prefix", PKV_CLASS_STRUCT, "opts->struct_size = 0", kInv, "struct_size",
          pkv_hash_options o = hopts();
          o.struct_size = 0; return hash_with(o, e.tokens, 16, e);),
        S("pkv_hash_prefix", PKV_CLASS_RANGE, "opts->algo = 99", kInv, "algo",
          pkv_hash_options o = hopts();
          o.algo = 99; return hash_with(o, e.tokens, 16, e);),
        S("pkv_hash_prefix", PKV_CLASS_RANGE, "opts->block_size = 0", kInv, "block_size",
          pkv_hash_options o = hopts();
          o.block_size = 0; return hash_with(o, e.tokens, 16, e);),
        S("pkv_hash_prefix", PKV_CLASS_RANGE, "mm item of length 0", kInv, "length",
          pkv_hash_options o = hopts();
          pkv_mm_item m{0, 0, "img"}; o.mm_items = &m; o.num_mm_items = 1;
          return hash_with(o, e.tokens, 16, e);),
        S("pkv_hash_prefix", PKV_CLASS_RANGE, "overlapping mm items", kInv, "mm_items[1]",
          pkv_hash_options o = hopts();
          pkv_mm_item m[2] = {{0, 8, "x"}, {4, 8, "y"}}; o.mm_items = m; o.num_mm_items = 2;
          return hash_with(o, e.tokens, 16, e);),
        S("pkv_hash_prefix", PKV_CLASS_ABSURD, "mm item offset + length overflows", kInv,
          "overflows", pkv_hash_options o = hopts();
          pkv_mm_item m{~uint64_t(0) - 2, 8, "x"}; o.mm_items = &m; o.num_mm_items = 1;
          return hash_with(o, e.tokens, 16, e);),
        S("pkv_hash_prefix", PKV_CLASS_CAPACITY, "capacity = 1 for 2 blocks", kSmall, "out_hashes",
          pkv_hash_options o = hopts();
          return pkv_hash_prefix(&o, e.tokens, 32, e.hashes, 1, &e.u64);),
        S("pkv_hash_prefix", PKV_CLASS_ABSURD, "num_tokens = 2^62 (capacity 8)", kSmall,
          "out_hashes", pkv_hash_options o = hopts();
          pkv_status s = pkv_hash_prefix(&o, e.tokens, k2_62, e.hashes, 8, &e.u64);
          return s == kSmall && e.u64 != k2_62 / 16 ? PKV_E_INTERNAL : s;),
        S("pkv_hash_root", PKV_CLASS_RANGE, "algo = 0", kInv, "algo",
          return pkv_hash_root(0, "", e.hashes);),
        S("pkv_hash_root", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_hash_root(PKV_HASH_SHA256_CBOR, "", nullptr);),

        // ------------------------------------------------------------ pool.h: pools
        V("pkv_pool_options_init", PKV_CLASS_NULL, "opts = NULL", "no-op",
          pkv_pool_options_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(pool_options, opts),
        S("pkv_pool_create", PKV_CLASS_NULL, "opts = NULL", kInv, "opts", pkv_pool* p = nullptr;
          return pkv_pool_create(nullptr, &p);),
        S("pkv_pool_create", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          pkv_pool_options o = storage_opts();
          return pkv_pool_create(&o, nullptr);),
        S("pkv_pool_create", PKV_CLASS_STRUCT, "opts->struct_size = 8 or 2^20", kInv, "struct_size",
          pkv_pool_options o = storage_opts();
          o.struct_size = 8; pkv_status s = create_with(o, e); o.struct_size = 1u << 20;
          return s != kInv ? s : create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "block_size = 0 or 1025", kInv, "block_size",
          pkv_pool_options o = storage_opts();
          o.block_size = 0; pkv_status s = create_with(o, e); o.block_size = 1025;
          return s != kInv ? s : create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "num_blocks = 1", kInv, "num_blocks",
          pkv_pool_options o = storage_opts();
          o.num_blocks = 1; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_ABSURD, "num_blocks = 2^60", kInv, "num_blocks",
          pkv_pool_options o = storage_opts();
          o.num_blocks = k2_60; pkv_status s = create_with(o, e); o.num_layers = 0;
          return s != kInv ? s : create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_ABSURD, "memory_budget_bytes = 2^62 (num_blocks 0)", kInv,
          "num_blocks", pkv_pool_options o = storage_opts();
          o.num_blocks = 0; o.memory_budget_bytes = k2_62; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "memory_budget_bytes below 2 blocks", kInv,
          "memory_budget_bytes", pkv_pool_options o = storage_opts();
          o.num_blocks = 0; o.memory_budget_bytes = 100; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_STATE, "num_blocks = 0 without storage", kInv, "num_blocks",
          pkv_pool_options o = storage_opts();
          o.num_blocks = 0; o.num_layers = 0; o.memory_budget_bytes = 1 << 20;
          return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_ABSURD, "bytes per block overflow 64 bits", kInv,
          "overflows", pkv_pool_options o = storage_opts();
          o.num_layers = 65536; o.num_kv_heads = 4096; o.head_dim = 4096; o.block_size = 1024;
          o.num_blocks = 1u << 30; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "hash_algo = 0", kInv, "hash_algo",
          pkv_pool_options o = storage_opts();
          o.hash_algo = 0; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "enable_prefix_caching = 2", kInv,
          "enable_prefix_caching", pkv_pool_options o = storage_opts();
          o.enable_prefix_caching = 2; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "strict_key_domains = 3", kInv, "strict_key_domains",
          pkv_pool_options o = storage_opts();
          o.strict_key_domains = 3; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "enable_events = 7", kInv, "enable_events",
          pkv_pool_options o = storage_opts();
          o.enable_events = 7; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "max_events = 0 with events", kInv, "max_events",
          pkv_pool_options o = storage_opts();
          o.max_events = 0; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "num_kv_heads = 0 with layers", kInv, "num_kv_heads",
          pkv_pool_options o = storage_opts();
          o.num_kv_heads = 0; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "head_dim = 0 with layers", kInv, "head_dim",
          pkv_pool_options o = storage_opts();
          o.head_dim = 0; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "head_dim = 48 on a CUDA pool", kInv,
          "64, 80, 96, 128, 256", pkv_pool_options o = storage_opts();
          o.device_type = PKV_DEVICE_CUDA; o.head_dim = 48; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_ABSURD, "num_layers = 2^32 - 1", kInv, "num_layers",
          pkv_pool_options o = storage_opts();
          o.num_layers = ~0u; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_DTYPE, "dtype = PKV_DTYPE_I32 or 99", kInv, "dtype",
          pkv_pool_options o = storage_opts();
          o.dtype = PKV_DTYPE_I32; pkv_status s = create_with(o, e); o.dtype = 99;
          return s != kInv ? s : create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_DEVICE, "device_type = 3", kInv, "device_type",
          pkv_pool_options o = storage_opts();
          o.device_type = 3; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_DEVICE, "device_id = 1 on CPU, -1 on CUDA", kInv,
          "device_id", pkv_pool_options o = storage_opts();
          o.device_id = 1; pkv_status s = create_with(o, e); o.device_type = PKV_DEVICE_CUDA;
          o.device_id = -1; return s != kInv ? s : create_with(o, e);),
        S2("pkv_pool_create", PKV_CLASS_DEVICE, "device_type = CUDA, device_id = 4096",
           PKV_E_UNSUPPORTED, PKV_E_CUDA, "CUDA", pkv_pool_options o = storage_opts();
           o.device_type = PKV_DEVICE_CUDA; o.device_id = 4096; return create_with(o, e);),
        V("pkv_pool_destroy", PKV_CLASS_NULL, "pool = NULL", "no-op", pkv_pool_destroy(nullptr);
          return PKV_OK;),
        S("pkv_pool_get_options", PKV_CLASS_NULL, "pool = NULL", kInv, "pool", pkv_pool_options o;
          pkv_pool_options_init(&o); return pkv_pool_get_options(nullptr, &o);),
        S("pkv_pool_get_options", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_pool_get_options(e.pool, nullptr);),
        S("pkv_pool_get_options", PKV_CLASS_STRUCT, "out->struct_size = 4", kInv, "struct_size",
          pkv_pool_options o;
          pkv_pool_options_init(&o); o.struct_size = 4; return pkv_pool_get_options(e.pool, &o);),
        S("pkv_pool_bytes_per_block", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_pool_bytes_per_block(nullptr, &e.u64);),
        S("pkv_pool_bytes_per_block", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_pool_bytes_per_block(e.pool, nullptr);),
        V("pkv_pool_stats_init", PKV_CLASS_NULL, "stats = NULL", "no-op",
          pkv_pool_stats_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(pool_stats, stats),
        S("pkv_pool_get_stats", PKV_CLASS_NULL, "pool = NULL", kInv, "pool", pkv_pool_stats s;
          pkv_pool_stats_init(&s); return pkv_pool_get_stats(nullptr, &s);),
        S("pkv_pool_get_stats", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_pool_get_stats(e.pool, nullptr);),
        S("pkv_pool_get_stats", PKV_CLASS_STRUCT, "out->struct_size = 0", kInv, "struct_size",
          pkv_pool_stats s;
          pkv_pool_stats_init(&s); s.struct_size = 0; return pkv_pool_get_stats(e.pool, &s);),
        S("pkv_pool_drain_events", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_pool_drain_events(nullptr, e.events, 8, &e.u64);),
        S("pkv_pool_drain_events", PKV_CLASS_NULL, "out = NULL, capacity = 8", kInv, "out",
          return pkv_pool_drain_events(e.pool, nullptr, 8, &e.u64);),
        S("pkv_pool_drain_events", PKV_CLASS_NULL, "out_count = NULL", kInv, "out_count",
          return pkv_pool_drain_events(e.pool, e.events, 8, nullptr);),
        S("pkv_pool_drain_events_v2", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          pkv_event_v2 ev[2] = {};
          ev[0].struct_size = sizeof ev[0];
          return pkv_pool_drain_events_v2(nullptr, ev, 2, e.tokens, 64, &e.u64);),
        S("pkv_pool_drain_events_v2", PKV_CLASS_NULL, "out = NULL, capacity = 2", kInv, "out",
          return pkv_pool_drain_events_v2(e.pool, nullptr, 2, e.tokens, 64, &e.u64);),
        S("pkv_pool_drain_events_v2", PKV_CLASS_NULL, "token_buf = NULL, token_capacity = 64", kInv,
          "token_buf", pkv_event_v2 ev[2] = {};
          ev[0].struct_size = sizeof ev[0];
          return pkv_pool_drain_events_v2(e.pool, ev, 2, nullptr, 64, &e.u64);),
        S("pkv_pool_drain_events_v2", PKV_CLASS_NULL, "out_count = NULL", kInv, "out_count",
          pkv_event_v2 ev[2] = {};
          ev[0].struct_size = sizeof ev[0];
          return pkv_pool_drain_events_v2(e.pool, ev, 2, e.tokens, 64, nullptr);),
        S("pkv_pool_drain_events_v2", PKV_CLASS_STRUCT, "out[0].struct_size = 0", kInv,
          "struct_size", pkv_event_v2 ev[2] = {};
          return pkv_pool_drain_events_v2(e.pool, ev, 2, e.tokens, 64, &e.u64);),
        S("pkv_pool_drain_events_v2", PKV_CLASS_CAPACITY,
          "token_capacity = 15 (a stored block of 16 pending)", PKV_E_BUFFER_TOO_SMALL,
          "token_capacity", pkv_event_v2 ev[2] = {};
          ev[0].struct_size = sizeof ev[0];
          return pkv_pool_drain_events_v2(e.pool, ev, 2, e.tokens, 15, &e.u64);),
        S("pkv_event_publisher_create", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          pkv_event_publisher* p = nullptr;
          return pkv_event_publisher_create(nullptr, "inproc://x", nullptr, nullptr, &p);),
        S("pkv_event_publisher_create", PKV_CLASS_NULL, "endpoint = NULL", kInv, "endpoint",
          pkv_event_publisher* p = nullptr;
          return pkv_event_publisher_create(e.pool, nullptr, nullptr, nullptr, &p);),
        S("pkv_event_publisher_create", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_event_publisher_create(e.pool, "inproc://x", nullptr, nullptr, nullptr);),
        S("pkv_event_publisher_create", PKV_CLASS_STRUCT, "opts->struct_size = 0", kInv,
          "struct_size", pkv_event_publisher_options o;
          pkv_event_publisher_options_init(&o); o.struct_size = 0; pkv_event_publisher* p = nullptr;
          return pkv_event_publisher_create(e.pool, "inproc://x", nullptr, &o, &p);),
        S("pkv_event_publisher_create", PKV_CLASS_RANGE, "opts->event_encoding = 9", kInv,
          "event_encoding", pkv_event_publisher_options o;
          pkv_event_publisher_options_init(&o); o.event_encoding = 9;
          pkv_event_publisher* p = nullptr;
          return pkv_event_publisher_create(e.pool, "inproc://x", nullptr, &o, &p);),
        S("pkv_event_publisher_create", PKV_CLASS_RANGE, "opts->hash_encoding = 9", kInv,
          "hash_encoding", pkv_event_publisher_options o;
          pkv_event_publisher_options_init(&o); o.hash_encoding = 9;
          pkv_event_publisher* p = nullptr;
          return pkv_event_publisher_create(e.pool, "inproc://x", nullptr, &o, &p);),
        S("pkv_event_publisher_create", PKV_CLASS_RANGE, "opts->replay_with_topic = 2", kInv,
          "replay_with_topic", pkv_event_publisher_options o;
          pkv_event_publisher_options_init_sized(&o, sizeof o); o.replay_with_topic = 2;
          pkv_event_publisher* p = nullptr;
          return pkv_event_publisher_create(e.pool, "inproc://x", nullptr, &o, &p);),
        S("pkv_event_publisher_create", PKV_CLASS_RANGE, "endpoint = \"\"", kInv, "endpoint",
          pkv_event_publisher* p = nullptr;
          return pkv_event_publisher_create(e.pool, "", nullptr, nullptr, &p);),
        S("pkv_event_publisher_create", PKV_CLASS_RANGE,
          "data_parallel_rank = 1, endpoint without a numeric port", kInv, "port",
          pkv_event_publisher_options o;
          pkv_event_publisher_options_init(&o); o.data_parallel_rank = 1;
          pkv_event_publisher* p = nullptr;
          return pkv_event_publisher_create(e.pool, "tcp://127.0.0.1:*", nullptr, &o, &p);),
        S("pkv_event_publisher_create", PKV_CLASS_STATE, "pool without enable_events", kInv,
          "enable_events", pkv_event_publisher* p = nullptr;
          return pkv_event_publisher_create(e.mgr, "inproc://x", nullptr, nullptr, &p);),
        V("pkv_event_publisher_options_init", PKV_CLASS_NULL, "opts = NULL", "no-op",
          pkv_event_publisher_options_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(event_publisher_options, opts),
        V("pkv_event_publisher_stats_init", PKV_CLASS_NULL, "stats = NULL", "no-op",
          pkv_event_publisher_stats_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(event_publisher_stats, stats),
        V("pkv_event_publisher_destroy", PKV_CLASS_NULL, "pub = NULL", "no-op",
          pkv_event_publisher_destroy(nullptr);
          return PKV_OK;),
        S("pkv_event_publisher_publish", PKV_CLASS_NULL, "pub = NULL", kInv, "pub",
          return pkv_event_publisher_publish(nullptr, &e.u64);),
        S("pkv_event_publisher_get_stats", PKV_CLASS_NULL, "pub = NULL", kInv, "pub",
          pkv_event_publisher_stats st;
          pkv_event_publisher_stats_init(&st); return pkv_event_publisher_get_stats(nullptr, &st);),
        S("pkv_event_publisher_endpoint", PKV_CLASS_NULL, "pub = NULL", kInv, "pub",
          return pkv_event_publisher_endpoint(nullptr, 0, e.msg, sizeof e.msg, &e.u64);),
        S("pkv_pool_reset_prefix_cache", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_pool_reset_prefix_cache(nullptr);),
        S("pkv_pool_validate", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_pool_validate(nullptr);),
        S("pkv_pool_kv_tensor", PKV_CLASS_NULL, "pool = NULL", kInv, "pool", pkv_tensor t;
          return pkv_pool_kv_tensor(nullptr, 0, 0, &t);),
        S("pkv_pool_kv_tensor", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_pool_kv_tensor(e.pool, 0, 0, nullptr);),
        S("pkv_pool_kv_tensor", PKV_CLASS_RANGE, "layer = num_layers", kInv, "layer", pkv_tensor t;
          return pkv_pool_kv_tensor(e.pool, 2, 0, &t);),
        S("pkv_pool_kv_tensor", PKV_CLASS_RANGE, "which = 2", kInv, "which", pkv_tensor t;
          return pkv_pool_kv_tensor(e.pool, 0, 2, &t);),
        S("pkv_pool_kv_tensor", PKV_CLASS_STATE, "pool without storage", kState, "storage",
          pkv_tensor t;
          return pkv_pool_kv_tensor(e.mgr, 0, 0, &t);),
        S("pkv_pool_copy_blocks", PKV_CLASS_NULL, "pool = NULL", kInv, "pool", int32_t s = 1, d = 2;
          return pkv_pool_copy_blocks(nullptr, &s, &d, 1, nullptr);),
        S("pkv_pool_copy_blocks", PKV_CLASS_NULL, "src = NULL, num_pairs = 1", kInv, "src",
          int32_t d = 2;
          return pkv_pool_copy_blocks(e.pool, nullptr, &d, 1, nullptr);),
        S("pkv_pool_copy_blocks", PKV_CLASS_NULL, "dst = NULL, num_pairs = 1", kInv, "dst",
          int32_t s = 1;
          return pkv_pool_copy_blocks(e.pool, &s, nullptr, 1, nullptr);),
        S("pkv_pool_copy_blocks", PKV_CLASS_RANGE, "src[1] = 0 (the null block)", kInv, "src[1]",
          int32_t s[2] = {1, 0}, d[2] = {2, 3};
          return pkv_pool_copy_blocks(e.pool, s, d, 2, nullptr);),
        S("pkv_pool_copy_blocks", PKV_CLASS_RANGE, "dst[0] = num_blocks or -5", kInv, "dst[0]",
          int32_t s[1] = {1}, d[1] = {32};
          pkv_status st = pkv_pool_copy_blocks(e.pool, s, d, 1, nullptr); d[0] = -5;
          return st != kInv ? st : pkv_pool_copy_blocks(e.pool, s, d, 1, nullptr);),
        S("pkv_pool_copy_blocks", PKV_CLASS_ALIAS, "src[1] = dst[0] (a chain)", kInv, "chain",
          int32_t s[2] = {1, 2}, d[2] = {2, 3};
          return pkv_pool_copy_blocks(e.pool, s, d, 2, nullptr);),
        S("pkv_pool_copy_blocks", PKV_CLASS_ALIAS, "dst[0] = dst[1]", kInv, "both block",
          int32_t s[2] = {1, 2}, d[2] = {3, 3};
          return pkv_pool_copy_blocks(e.pool, s, d, 2, nullptr);),
        S("pkv_pool_copy_blocks", PKV_CLASS_STATE, "pool without storage", kState, "storage",
          int32_t s = 1, d = 2;
          return pkv_pool_copy_blocks(e.mgr, &s, &d, 1, nullptr);),
        S("pkv_pool_swap_blocks", PKV_CLASS_NULL, "pool = NULL", kInv, "pool", int32_t b = 1;
          return pkv_pool_swap_blocks(nullptr, &b, 1, e.k.data(), 4, PKV_SWAP_OUT, nullptr);),
        S("pkv_pool_swap_blocks", PKV_CLASS_NULL, "blocks = NULL, num_blocks = 1", kInv, "blocks",
          return pkv_pool_swap_blocks(e.pool, nullptr, 1, e.k.data(), 1 << 20, PKV_SWAP_OUT,
                                      nullptr);),
        S("pkv_pool_swap_blocks", PKV_CLASS_NULL, "host_buffer = NULL", kInv, "host_buffer",
          int32_t b = 1;
          return pkv_pool_swap_blocks(e.pool, &b, 1, nullptr, 1 << 20, PKV_SWAP_OUT, nullptr);),
        S("pkv_pool_swap_blocks", PKV_CLASS_RANGE, "direction = 2", kInv, "direction",
          int32_t b = 1;
          return pkv_pool_swap_blocks(e.pool, &b, 1, e.k.data(), 1 << 20, 2, nullptr);),
        S("pkv_pool_swap_blocks", PKV_CLASS_RANGE, "blocks[0] = 0 (the null block)", kInv,
          "blocks[0]", int32_t b = 0;
          return pkv_pool_swap_blocks(e.pool, &b, 1, e.k.data(), 1 << 20, PKV_SWAP_OUT, nullptr);),
        S("pkv_pool_swap_blocks", PKV_CLASS_CAPACITY,
          "host_bytes below num_blocks * bytes per block", kInv, "host_bytes", int32_t b = 1;
          return pkv_pool_swap_blocks(e.pool, &b, 1, e.k.data(), 64, PKV_SWAP_IN, nullptr);),
        S("pkv_pool_swap_blocks", PKV_CLASS_ALIAS, "host_buffer inside the pool's KV storage", kInv,
          "host_buffer overlaps", int32_t b = 1;
          void* h = in_kv_storage(e, e.kt).data;
          return pkv_pool_swap_blocks(e.pool, &b, 1, h, 1 << 20, PKV_SWAP_IN, nullptr);),
        S("pkv_pool_swap_blocks", PKV_CLASS_ALIAS, "swap-in blocks[0] = blocks[1]", kInv,
          "both block", int32_t b[2] = {3, 3};
          uint64_t bpb = 0; pkv_pool_bytes_per_block(e.pool, &bpb);
          std::vector<uint8_t> h(2 * bpb, 1);
          return pkv_pool_swap_blocks(e.pool, b, 2, h.data(), h.size(), PKV_SWAP_IN, nullptr);),
        S("pkv_pool_swap_blocks", PKV_CLASS_OVERFLOW, "host_buffer + host_bytes wraps", kInv,
          "wraps", int32_t b = 1;
          void* h = reinterpret_cast<void*>(~uintptr_t(0) - 4095);
          return pkv_pool_swap_blocks(e.pool, &b, 1, h, 1 << 20, PKV_SWAP_OUT, nullptr);),
        S("pkv_pool_swap_blocks", PKV_CLASS_STATE, "pool without storage", kState, "storage",
          int32_t b = 1;
          return pkv_pool_swap_blocks(e.mgr, &b, 1, e.k.data(), 1 << 20, PKV_SWAP_OUT, nullptr);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "kv_scale_granularity = 2", kInv,
          "kv_scale_granularity", pkv_pool_options o = fp8_opts();
          o.kv_scale_granularity = 2; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_SHAPE, "num_kv_scales = 3 (per tensor: num_layers 2)", kInv,
          "num_kv_scales", pkv_pool_options o = fp8_opts();
          const float k[3] = {1, 1, 1}; o.num_kv_scales = 3; o.k_scales = k; o.v_scales = k;
          return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_SHAPE, "num_kv_scales = 2, per head (needs 4)", kInv,
          "num_kv_scales", pkv_pool_options o = fp8_opts();
          const float k[2] = {1, 1}; o.kv_scale_granularity = PKV_KV_SCALE_PER_HEAD;
          o.num_kv_scales = 2; o.k_scales = k; o.v_scales = k; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "k_scales[1] = 0, -1, NaN or inf", kInv,
          "k_scales[1]", return bad_create_scales(e, false);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "v_scales[0] = 0, -1, NaN or inf", kInv,
          "v_scales[0]", return bad_create_scales(e, true);),
        S("pkv_pool_create", PKV_CLASS_NULL, "k_scales = NULL, num_kv_scales = 2", kInv, "k_scales",
          pkv_pool_options o = fp8_opts();
          const float v[2] = {1, 1}; o.num_kv_scales = 2; o.v_scales = v;
          return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_STATE, "k_scales set, num_kv_scales = 0", kInv,
          "num_kv_scales", pkv_pool_options o = fp8_opts();
          const float k[2] = {1, 1}; o.k_scales = k; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_DTYPE, "num_kv_scales = 2 on a bf16 pool", kInv,
          "fp8 pools only", pkv_pool_options o = fp8_opts();
          const float k[2] = {1, 1}; o.dtype = PKV_DTYPE_BF16; o.num_kv_scales = 2; o.k_scales = k;
          o.v_scales = k; return create_with(o, e);),
        S("pkv_pool_set_kv_scales", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          const float k[2] = {1, 1};
          return pkv_pool_set_kv_scales(nullptr, k, k, 2);),
        S("pkv_pool_set_kv_scales", PKV_CLASS_NULL, "k_scales = NULL, num_scales = 2", kInv,
          "k_scales", const float v[2] = {1, 1};
          return with_fp8_pool(
              [&](pkv_pool* p) { return pkv_pool_set_kv_scales(p, nullptr, v, 2); });),
        S("pkv_pool_set_kv_scales", PKV_CLASS_SHAPE, "num_scales = 3 (pool has 2)", kInv,
          "num_scales", const float k[3] = {1, 1, 1};
          return with_fp8_pool([&](pkv_pool* p) { return pkv_pool_set_kv_scales(p, k, k, 3); });),
        S("pkv_pool_set_kv_scales", PKV_CLASS_RANGE, "v_scales[1] = 0, -1, NaN or inf", kInv,
          "v_scales[1]", return bad_set_scales();),
        S("pkv_pool_set_kv_scales", PKV_CLASS_STATE, "an f32 pool", kState, "not fp8",
          const float k[2] = {1, 1};
          return pkv_pool_set_kv_scales(e.pool, k, k, 2);),
        S("pkv_pool_get_kv_scales", PKV_CLASS_NULL, "pool = NULL", kInv, "pool", float k[2], v[2];
          return pkv_pool_get_kv_scales(nullptr, k, v, 2, &e.u64);),
        S("pkv_pool_get_kv_scales", PKV_CLASS_NULL, "out_len = NULL", kInv, "out_len", float k[2],
          v[2];
          return with_fp8_pool(
              [&](pkv_pool* p) { return pkv_pool_get_kv_scales(p, k, v, 2, nullptr); });),
        S("pkv_pool_get_kv_scales", PKV_CLASS_NULL, "k_out = NULL, capacity = 2", kInv, "k_out",
          float v[2];
          return with_fp8_pool(
              [&](pkv_pool* p) { return pkv_pool_get_kv_scales(p, nullptr, v, 2, &e.u64); });),
        S("pkv_pool_get_kv_scales", PKV_CLASS_CAPACITY, "capacity = 1 (pool has 2)", kSmall,
          "capacity", float k[2], v[2];
          return with_fp8_pool(
              [&](pkv_pool* p) { return pkv_pool_get_kv_scales(p, k, v, 1, &e.u64); });),
        S("pkv_pool_get_kv_scales", PKV_CLASS_STATE, "an f32 pool", kState, "not fp8", float k[2],
          v[2];
          return pkv_pool_get_kv_scales(e.pool, k, v, 2, &e.u64);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "enable_partial_reuse = 2", kInv,
          "enable_partial_reuse", pkv_pool_options o = storage_opts();
          o.enable_partial_reuse = 2; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "enable_retention = 2", kInv, "enable_retention",
          pkv_pool_options o = storage_opts();
          o.enable_retention = 2; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE,
          "max_pinned_blocks = 4 without enable_retention, or = num_blocks - 1", kInv,
          "max_pinned_blocks", pkv_pool_options o = storage_opts();
          o.max_pinned_blocks = 4; pkv_status s = create_with(o, e); o.enable_retention = 1;
          o.max_pinned_blocks = o.num_blocks - 1; return s != kInv ? s : create_with(o, e);),

        // ------------------------------------------------------------ pool.h: sequences
        V("pkv_seq_options_init", PKV_CLASS_NULL, "opts = NULL", "no-op",
          pkv_seq_options_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(seq_options, opts),
        S("pkv_seq_create", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_seq_create(nullptr, nullptr, &e.id_out);),
        S("pkv_seq_create", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_seq_create(e.pool, nullptr, nullptr);),
        S("pkv_seq_create", PKV_CLASS_NULL, "opts->mm_items = NULL, num_mm_items = 2", kInv,
          "mm_items", pkv_seq_options o = sopts();
          o.num_mm_items = 2; return seq_with(o, e);),
        S("pkv_seq_create", PKV_CLASS_NULL, "opts->mm_items[0].hash = NULL or \"\"", kInv,
          "mm_items[0]", pkv_seq_options o = sopts();
          pkv_mm_item m{0, 4, nullptr}; o.mm_items = &m; o.num_mm_items = 1;
          pkv_status s = seq_with(o, e); m.hash = ""; return s != kInv ? s : seq_with(o, e);),
        S("pkv_seq_create", PKV_CLASS_STRUCT, "opts->struct_size = 2", kInv, "struct_size",
          pkv_seq_options o = sopts();
          o.struct_size = 2; return seq_with(o, e);),
        S("pkv_seq_create", PKV_CLASS_RANGE, "overlapping or unsorted mm items", kInv,
          "mm_items[1]", pkv_seq_options o = sopts();
          pkv_mm_item m[2] = {{10, 8, "x"}, {2, 4, "y"}}; o.mm_items = m; o.num_mm_items = 2;
          return seq_with(o, e);),
        S("pkv_seq_create", PKV_CLASS_ABSURD, "mm item offset + length overflows", kInv,
          "overflows", pkv_seq_options o = sopts();
          pkv_mm_item m{~uint64_t(0), 2, "x"}; o.mm_items = &m; o.num_mm_items = 1;
          return seq_with(o, e);),
        S("pkv_seq_match_prefix", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_seq_match_prefix(nullptr, e.empty, e.tokens, 20, &e.u64);),
        S("pkv_seq_match_prefix", PKV_CLASS_NULL, "tokens = NULL, num_tokens = 20", kInv, "tokens",
          return pkv_seq_match_prefix(e.pool, e.empty, nullptr, 20, &e.u64);),
        S("pkv_seq_match_prefix", PKV_CLASS_NULL, "out_num_cached = NULL", kInv, "out_num_cached",
          return pkv_seq_match_prefix(e.pool, e.empty, e.tokens, 20, nullptr);),
        S("pkv_seq_match_prefix", PKV_CLASS_STALE, "seq freed", kNf, "stale",
          return pkv_seq_match_prefix(e.pool, e.dead, e.tokens, 20, &e.u64);),
        S("pkv_seq_match_prefix", PKV_CLASS_UNKNOWN, "seq never issued, or 0", kNf,
          "stale or unknown",
          pkv_status s = pkv_seq_match_prefix(e.pool, e.unknown, e.tokens, 20, &e.u64);
          return s != kNf
                     ? s
                     : pkv_seq_match_prefix(e.pool, PKV_SEQ_ID_INVALID, e.tokens, 20, &e.u64);),
        S("pkv_seq_match_prefix", PKV_CLASS_ABSURD, "num_tokens = 2^62", kInv, "num_tokens",
          return pkv_seq_match_prefix(e.pool, e.empty, e.tokens, k2_62, &e.u64);),
        S("pkv_seq_match_prefix", PKV_CLASS_STATE, "seq already holds tokens", kState, "empty",
          return pkv_seq_match_prefix(e.pool, e.a, e.tokens, 20, &e.u64);),
        S("pkv_seq_append", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_seq_append(nullptr, e.a, e.tokens, 1, 0);),
        S("pkv_seq_append", PKV_CLASS_NULL, "tokens = NULL, num_tokens = 4", kInv, "tokens",
          return pkv_seq_append(e.pool, e.a, nullptr, 4, 0);),
        S("pkv_seq_append", PKV_CLASS_STALE, "seq freed", kNf, "stale",
          return pkv_seq_append(e.pool, e.dead, e.tokens, 1, 0);),
        S("pkv_seq_append", PKV_CLASS_UNKNOWN, "seq never issued", kNf, "stale or unknown",
          return pkv_seq_append(e.pool, e.unknown, e.tokens, 1, 0);),
        S("pkv_seq_append", PKV_CLASS_ABSURD, "num_tokens = 2^62", kInv, "2^31",
          return pkv_seq_append(e.pool, e.a, e.tokens, k2_62, 0);),
        S("pkv_seq_append", PKV_CLASS_ABSURD, "num_lookahead = 2^32 - 1", kInv, "2^31",
          return pkv_seq_append(e.pool, e.a, e.tokens, 1, ~0u);),
        S("pkv_seq_append", PKV_CLASS_EXHAUSTED, "more tokens than free slots (64 + 512 lookahead)",
          kOob, "free", return pkv_seq_append(e.pool, e.a, e.tokens, 64, 512);),
        S("pkv_seq_blocks_needed", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_seq_blocks_needed(nullptr, e.a, 1, 0, &e.u64);),
        S("pkv_seq_blocks_needed", PKV_CLASS_NULL, "out_blocks = NULL", kInv, "out_blocks",
          return pkv_seq_blocks_needed(e.pool, e.a, 1, 0, nullptr);),
        S("pkv_seq_blocks_needed", PKV_CLASS_STALE, "seq freed", kNf, "stale",
          return pkv_seq_blocks_needed(e.pool, e.dead, 1, 0, &e.u64);),
        S("pkv_seq_blocks_needed", PKV_CLASS_UNKNOWN, "seq never issued", kNf, "stale or unknown",
          return pkv_seq_blocks_needed(e.pool, e.unknown, 1, 0, &e.u64);),
        S("pkv_seq_blocks_needed", PKV_CLASS_ABSURD, "num_tokens = 2^62", kInv, "2^31",
          return pkv_seq_blocks_needed(e.pool, e.a, k2_62, 0, &e.u64);),
        S("pkv_seq_fork", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_seq_fork(nullptr, e.a, &e.id_out);),
        S("pkv_seq_fork", PKV_CLASS_NULL, "out_child = NULL", kInv, "out_child",
          return pkv_seq_fork(e.pool, e.a, nullptr);),
        S("pkv_seq_fork", PKV_CLASS_STALE, "parent freed", kNf, "stale",
          return pkv_seq_fork(e.pool, e.dead, &e.id_out);),
        S("pkv_seq_fork", PKV_CLASS_UNKNOWN, "parent never issued", kNf, "stale or unknown",
          return pkv_seq_fork(e.pool, e.unknown, &e.id_out);),
        S("pkv_seq_truncate", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_seq_truncate(nullptr, e.a, 1);),
        S("pkv_seq_truncate", PKV_CLASS_STALE, "seq freed", kNf, "stale",
          return pkv_seq_truncate(e.pool, e.dead, 0);),
        S("pkv_seq_truncate", PKV_CLASS_UNKNOWN, "seq never issued", kNf, "stale or unknown",
          return pkv_seq_truncate(e.pool, e.unknown, 0);),
        S("pkv_seq_truncate", PKV_CLASS_RANGE, "num_tokens above the sequence's (41, or 2^62)",
          kInv, "num_tokens", pkv_status s = pkv_seq_truncate(e.pool, e.a, 41);
          return s != kInv ? s : pkv_seq_truncate(e.pool, e.a, k2_62);),
        S("pkv_seq_reserve", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_seq_reserve(nullptr, e.a, 64);),
        S("pkv_seq_reserve", PKV_CLASS_STALE, "seq freed", kNf, "stale",
          return pkv_seq_reserve(e.pool, e.dead, 64);),
        S("pkv_seq_reserve", PKV_CLASS_UNKNOWN, "seq never issued", kNf, "stale or unknown",
          return pkv_seq_reserve(e.pool, e.unknown, 64);),
        S("pkv_seq_reserve", PKV_CLASS_RANGE, "num_tokens above 2^31 - 1 (2^31, or 2^62)", kInv,
          "num_tokens", pkv_status s = pkv_seq_reserve(e.pool, e.a, uint64_t(1) << 31);
          return s != kInv ? s : pkv_seq_reserve(e.pool, e.a, k2_62);),
        S("pkv_seq_reserve", PKV_CLASS_RANGE, "multi-group pool: num_tokens 2^31", kInv,
          "num_tokens",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id s, pkv_seq_id) {
                             return pkv_seq_reserve(p, s, uint64_t(1) << 31);
                           });),
        S("pkv_seq_free", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_seq_free(nullptr, e.a);),
        S("pkv_seq_free", PKV_CLASS_STALE, "seq freed (double free)", kNf, "stale",
          return pkv_seq_free(e.pool, e.dead);),
        S("pkv_seq_free", PKV_CLASS_UNKNOWN, "seq never issued, or of another pool", kNf,
          "stale or unknown", pkv_status s = pkv_seq_free(e.pool, e.unknown);
          if (s == kNf) s = pkv_seq_free(e.mgr, e.b);
          // m is the first sequence of mgr, a of pool: same slot and
          // generation, told apart by the pool tag in the id.
          return s != kNf ? s : pkv_seq_free(e.pool, e.m);),
        V("pkv_seq_info_init", PKV_CLASS_NULL, "info = NULL", "no-op", pkv_seq_info_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(seq_info, info),
        S("pkv_seq_get_info", PKV_CLASS_NULL, "pool = NULL", kInv, "pool", pkv_seq_info i;
          pkv_seq_info_init(&i); return pkv_seq_get_info(nullptr, e.a, &i);),
        S("pkv_seq_get_info", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_seq_get_info(e.pool, e.a, nullptr);),
        S("pkv_seq_get_info", PKV_CLASS_STRUCT, "out->struct_size = 1", kInv, "struct_size",
          pkv_seq_info i;
          pkv_seq_info_init(&i); i.struct_size = 1; return pkv_seq_get_info(e.pool, e.a, &i);),
        S("pkv_seq_get_info", PKV_CLASS_STALE, "seq freed", kNf, "stale", pkv_seq_info i;
          pkv_seq_info_init(&i); return pkv_seq_get_info(e.pool, e.dead, &i);),
        S("pkv_seq_get_block_table", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_seq_get_block_table(nullptr, e.a, e.table, 64, &e.u64);),
        S("pkv_seq_get_block_table", PKV_CLASS_NULL, "out_blocks = NULL, capacity = 64", kInv,
          "out_blocks", return pkv_seq_get_block_table(e.pool, e.a, nullptr, 64, &e.u64);),
        S("pkv_seq_get_block_table", PKV_CLASS_NULL, "out_len = NULL", kInv, "out_len",
          return pkv_seq_get_block_table(e.pool, e.a, e.table, 64, nullptr);),
        S("pkv_seq_get_block_table", PKV_CLASS_STALE, "seq freed", kNf, "stale",
          return pkv_seq_get_block_table(e.pool, e.dead, e.table, 64, &e.u64);),
        S("pkv_seq_get_block_table", PKV_CLASS_CAPACITY, "capacity = 1 for 3 blocks", kSmall,
          "out_blocks", pkv_status s = pkv_seq_get_block_table(e.pool, e.a, e.table, 1, &e.u64);
          return s == kSmall && e.u64 != 3 ? PKV_E_INTERNAL : s;),
        S("pkv_seq_get_block_hashes", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_seq_get_block_hashes(nullptr, e.a, e.hashes, 8, &e.u64);),
        S("pkv_seq_get_block_hashes", PKV_CLASS_NULL, "out_hashes = NULL, capacity = 8", kInv,
          "out_hashes", return pkv_seq_get_block_hashes(e.pool, e.a, nullptr, 8, &e.u64);),
        S("pkv_seq_get_block_hashes", PKV_CLASS_NULL, "out_len = NULL", kInv, "out_len",
          return pkv_seq_get_block_hashes(e.pool, e.a, e.hashes, 8, nullptr);),
        S("pkv_seq_get_block_hashes", PKV_CLASS_STALE, "seq freed", kNf, "stale",
          return pkv_seq_get_block_hashes(e.pool, e.dead, e.hashes, 8, &e.u64);),
        S("pkv_seq_get_block_hashes", PKV_CLASS_CAPACITY, "capacity = 1 for 2 hashes", kSmall,
          "out_hashes", pkv_status s = pkv_seq_get_block_hashes(e.pool, e.a, e.hashes, 1, &e.u64);
          return s == kSmall && e.u64 != 2 ? PKV_E_INTERNAL : s;),
        V("pkv_prefix_match_init", PKV_CLASS_NULL, "out = NULL", "no-op",
          pkv_prefix_match_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(prefix_match, out),
        S("pkv_seq_match_prefix_partial", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          pkv_prefix_match m = pmatch();
          return pkv_seq_match_prefix_partial(nullptr, e.empty, e.tokens, 20, &m);),
        S("pkv_seq_match_prefix_partial", PKV_CLASS_NULL, "tokens = NULL, num_tokens = 20", kInv,
          "tokens", pkv_prefix_match m = pmatch();
          return match_partial(e, e.empty, nullptr, 20, &m);),
        S("pkv_seq_match_prefix_partial", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return match_partial(e, e.empty, e.tokens, 20, nullptr);),
        S("pkv_seq_match_prefix_partial", PKV_CLASS_STRUCT, "out->struct_size = 0", kInv,
          "struct_size", pkv_prefix_match m = pmatch();
          m.struct_size = 0; return match_partial(e, e.empty, e.tokens, 20, &m);),
        S("pkv_seq_match_prefix_partial", PKV_CLASS_STALE, "seq freed", kNf, "stale",
          pkv_prefix_match m = pmatch();
          return match_partial(e, e.dead, e.tokens, 20, &m);),
        S("pkv_seq_match_prefix_partial", PKV_CLASS_ABSURD, "num_tokens = 2^62", kInv, "num_tokens",
          pkv_prefix_match m = pmatch();
          return match_partial(e, e.empty, e.tokens, k2_62, &m);),
        S("pkv_seq_match_prefix_partial", PKV_CLASS_STATE, "seq already holds tokens", kState,
          "empty", pkv_prefix_match m = pmatch();
          return match_partial(e, e.a, e.tokens, 20, &m);),
        S("pkv_seq_set_retention", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          pkv_retention_range r = rrange(0, 4, 50);
          return pkv_seq_set_retention(nullptr, e.a, &r, 1);),
        S("pkv_seq_set_retention", PKV_CLASS_NULL, "ranges = NULL, num_ranges = 1", kInv, "ranges",
          return pkv_seq_set_retention(e.pool, e.a, nullptr, 1);),
        S("pkv_seq_set_retention", PKV_CLASS_STALE, "seq freed", kNf, "stale",
          pkv_retention_range r = rrange(0, 4, 50);
          return pkv_seq_set_retention(e.pool, e.dead, &r, 1);),
        S("pkv_seq_set_retention", PKV_CLASS_STATE, "pool without enable_retention", kState,
          "enable_retention", pkv_retention_range r = rrange(0, 4, 50);
          return pkv_seq_set_retention(e.pool, e.a, &r, 1);),
        S("pkv_seq_set_retention", PKV_CLASS_RANGE, "ranges[0].token_begin = token_end", kInv,
          "ranges[0].token_begin", pkv_retention_range r = rrange(4, 4, 50);
          return on_retention_pool(&r, 1, 0);),
        S("pkv_seq_set_retention", PKV_CLASS_RANGE, "ranges[0].priority = 101", kInv,
          "ranges[0].priority", pkv_retention_range r = rrange(0, 4, 101);
          return on_retention_pool(&r, 1, 0);),
        S("pkv_seq_set_retention", PKV_CLASS_RANGE, "ranges[0].reserved = 1", kInv,
          "ranges[0].reserved", pkv_retention_range r = rrange(0, 4, 50);
          r.reserved = 1; return on_retention_pool(&r, 1, 0);),
        S("pkv_seq_set_retention", PKV_CLASS_ABSURD, "num_ranges = 65", kInv, "num_ranges",
          std::vector<pkv_retention_range> r(65, rrange(0, 4, 50));
          return on_retention_pool(r.data(), r.size(), 0);),
        S("pkv_seq_set_retention", PKV_CLASS_RANGE, "a pin with max_pinned_blocks = 0", kOob,
          "max_pinned_blocks", pkv_retention_range r = rrange(0, 4, PKV_PRIORITY_PINNED);
          return on_retention_pool(&r, 1, 0);),
        S("pkv_pool_set_clock", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_pool_set_clock(nullptr, 5);),
        S("pkv_pool_get_priority_counts", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          uint64_t c[101];
          return pkv_pool_get_priority_counts(nullptr, c, 101, &e.u64);),
        S("pkv_pool_get_priority_counts", PKV_CLASS_NULL, "out_counts = NULL, capacity = 101", kInv,
          "out_counts", return pkv_pool_get_priority_counts(e.pool, nullptr, 101, &e.u64);),
        S("pkv_pool_get_priority_counts", PKV_CLASS_NULL, "out_len = NULL", kInv, "out_len",
          uint64_t c[101];
          return pkv_pool_get_priority_counts(e.pool, c, 101, nullptr);),
        S("pkv_pool_get_priority_counts", PKV_CLASS_CAPACITY, "capacity = 100", kSmall,
          "out_counts", uint64_t c[101];
          pkv_status s = pkv_pool_get_priority_counts(e.pool, c, 100, &e.u64);
          return s == kSmall && e.u64 != 101 ? PKV_E_INTERNAL : s;),

        // ------------------------------------------------------------ tiers.h
        V("pkv_tier_options_init", PKV_CLASS_NULL, "opts = NULL", "no-op",
          pkv_tier_options_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(tier_options, opts),
        V("pkv_tier_match_init", PKV_CLASS_NULL, "out = NULL", "no-op",
          pkv_tier_match_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(tier_match, out),
        V("pkv_tier_stats_init", PKV_CLASS_NULL, "stats = NULL", "no-op",
          pkv_tier_stats_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(tier_stats, stats),
        S("pkv_pool_attach_tiers", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          pkv_tier_options o = tier_opts(1 << 20);
          return pkv_pool_attach_tiers(nullptr, &o);),
        S("pkv_pool_attach_tiers", PKV_CLASS_NULL, "opts = NULL", kInv, "opts",
          return pkv_pool_attach_tiers(e.pool, nullptr);),
        S("pkv_pool_attach_tiers", PKV_CLASS_STRUCT, "opts->struct_size = 3", kInv, "struct_size",
          pkv_tier_options o = tier_opts(1 << 20);
          o.struct_size = 3; return pkv_pool_attach_tiers(e.pool, &o);),
        S("pkv_pool_attach_tiers", PKV_CLASS_RANGE, "host_bytes below one block", kInv,
          "opts->host_bytes", pkv_tier_options o = tier_opts(1);
          return pkv_pool_attach_tiers(e.pool, &o);),
        S("pkv_pool_attach_tiers", PKV_CLASS_RANGE, "file_bytes without file_dir", kInv,
          "opts->file_bytes", pkv_tier_options o = tier_opts(1 << 20);
          o.file_bytes = 1 << 20; return pkv_pool_attach_tiers(e.pool, &o);),
        S("pkv_pool_attach_tiers", PKV_CLASS_RANGE, "file_dir does not exist", kInv,
          "opts->file_dir", pkv_tier_options o = tier_opts(1 << 20);
          o.file_dir = "/nonexistent-pagedkv-dir"; o.file_bytes = 1 << 20;
          return pkv_pool_attach_tiers(e.pool, &o);),
        S("pkv_pool_attach_tiers", PKV_CLASS_RANGE, "flags = 1", kInv, "opts->flags",
          pkv_tier_options o = tier_opts(1 << 20);
          o.flags = 1; return pkv_pool_attach_tiers(e.pool, &o);),
        S("pkv_pool_attach_tiers", PKV_CLASS_STATE, "manager-only pool", kState, "manager-only",
          pkv_tier_options o = tier_opts(1 << 20);
          return pkv_pool_attach_tiers(e.mgr, &o);),
        S("pkv_pool_attach_tiers", PKV_CLASS_STATE, "tiers attached twice", kState, "already",
          pkv_tier_options o = tier_opts(1 << 20);
          pkv_status s = pkv_pool_attach_tiers(e.pool, &o);
          return s != PKV_OK ? PKV_E_INTERNAL : pkv_pool_attach_tiers(e.pool, &o);),
        S("pkv_seq_match_prefix_tiered", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          pkv_tier_match m = tmatch();
          return pkv_seq_match_prefix_tiered(nullptr, e.empty, e.tokens, 20, &m);),
        S("pkv_seq_match_prefix_tiered", PKV_CLASS_NULL, "tokens = NULL, num_tokens = 20", kInv,
          "tokens", pkv_tier_match m = tmatch();
          return pkv_seq_match_prefix_tiered(e.pool, e.empty, nullptr, 20, &m);),
        S("pkv_seq_match_prefix_tiered", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_seq_match_prefix_tiered(e.pool, e.empty, e.tokens, 20, nullptr);),
        S("pkv_seq_match_prefix_tiered", PKV_CLASS_STRUCT, "out->struct_size = 3", kInv,
          "struct_size", pkv_tier_match m = tmatch();
          m.struct_size = 3;
          return pkv_seq_match_prefix_tiered(e.pool, e.empty, e.tokens, 20, &m);),
        S("pkv_seq_match_prefix_tiered", PKV_CLASS_STALE, "seq freed", kNf, "stale",
          pkv_tier_match m = tmatch();
          return pkv_seq_match_prefix_tiered(e.pool, e.dead, e.tokens, 20, &m);),
        S("pkv_seq_match_prefix_tiered", PKV_CLASS_STATE, "seq already holds tokens", kState,
          "empty", pkv_tier_match m = tmatch();
          return pkv_seq_match_prefix_tiered(e.pool, e.a, e.tokens, 20, &m);),
        S("pkv_seq_match_prefix_hashes_tiered", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          pkv_tier_match m = tmatch();
          return pkv_seq_match_prefix_hashes_tiered(nullptr, e.empty, e.tokens, 20, e.hashes, 1,
                                                    &m);),
        S("pkv_seq_match_prefix_hashes_tiered", PKV_CLASS_NULL, "tokens = NULL, num_tokens = 20",
          kInv, "tokens", pkv_tier_match m = tmatch();
          return pkv_seq_match_prefix_hashes_tiered(e.pool, e.empty, nullptr, 20, e.hashes, 1,
                                                    &m);),
        S("pkv_seq_match_prefix_hashes_tiered", PKV_CLASS_NULL, "hashes = NULL, num_hashes = 1",
          kInv, "hashes is NULL", pkv_tier_match m = tmatch();
          return pkv_seq_match_prefix_hashes_tiered(e.pool, e.empty, e.tokens, 20, nullptr, 1,
                                                    &m);),
        S("pkv_seq_match_prefix_hashes_tiered", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_seq_match_prefix_hashes_tiered(e.pool, e.empty, e.tokens, 20, e.hashes, 1,
                                                    nullptr);),
        S("pkv_seq_match_prefix_hashes_tiered", PKV_CLASS_STRUCT, "out->struct_size = 3", kInv,
          "struct_size", pkv_tier_match m = tmatch();
          m.struct_size = 3; return pkv_seq_match_prefix_hashes_tiered(e.pool, e.empty, e.tokens,
                                                                       20, e.hashes, 1, &m);),
        S("pkv_seq_match_prefix_hashes_tiered", PKV_CLASS_RANGE, "num_hashes above the full blocks",
          kInv, "num_hashes", pkv_tier_match m = tmatch();
          return pkv_seq_match_prefix_hashes_tiered(e.pool, e.empty, e.tokens, 20, e.hashes, 2,
                                                    &m);),
        S("pkv_seq_match_prefix_hashes_tiered", PKV_CLASS_RANGE,
          "hashes[0] not this pool's hash of the first block (another salt, seed, algorithm)", kInv,
          "hashes[0]", pkv_tier_match m = tmatch();
          return pkv_seq_match_prefix_hashes_tiered(e.pool, e.empty, e.tokens, 40, e.hashes, 2,
                                                    &m);),
        S("pkv_seq_match_prefix_hashes_tiered", PKV_CLASS_STALE, "seq freed", kNf, "stale",
          pkv_tier_match m = tmatch();
          return pkv_seq_match_prefix_hashes_tiered(e.pool, e.dead, e.tokens, 20, e.hashes, 1,
                                                    &m);),
        S("pkv_seq_match_prefix_hashes_tiered", PKV_CLASS_STATE, "seq already holds tokens", kState,
          "empty", pkv_tier_match m = tmatch();
          return pkv_seq_match_prefix_hashes_tiered(e.pool, e.a, e.tokens, 20, e.hashes, 1, &m);),
        S("pkv_seq_admit_tiered", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          pkv_tier_match m = tmatch();
          return pkv_seq_admit_tiered(nullptr, nullptr, e.tokens, 20, nullptr, 0, 0, &e.id_out,
                                      &m);),
        S("pkv_seq_admit_tiered", PKV_CLASS_NULL, "tokens = NULL, num_tokens = 20", kInv, "tokens",
          pkv_tier_match m = tmatch();
          return pkv_seq_admit_tiered(e.pool, nullptr, nullptr, 20, nullptr, 0, 0, &e.id_out, &m);),
        S("pkv_seq_admit_tiered", PKV_CLASS_NULL, "out_seq = NULL", kInv, "out_seq",
          pkv_tier_match m = tmatch();
          return pkv_seq_admit_tiered(e.pool, nullptr, e.tokens, 20, nullptr, 0, 0, nullptr, &m);),
        S("pkv_seq_admit_tiered", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_seq_admit_tiered(e.pool, nullptr, e.tokens, 20, nullptr, 0, 0, &e.id_out,
                                      nullptr);),
        S("pkv_seq_admit_tiered", PKV_CLASS_STRUCT, "out->struct_size = 3", kInv, "struct_size",
          pkv_tier_match m = tmatch();
          m.struct_size = 3; return pkv_seq_admit_tiered(e.pool, nullptr, e.tokens, 20, nullptr, 0,
                                                         0, &e.id_out, &m);),
        S("pkv_seq_admit_tiered", PKV_CLASS_NULL, "hashes = NULL, num_hashes = 1", kInv,
          "hashes is NULL", pkv_tier_match m = tmatch();
          return pkv_seq_admit_tiered(e.pool, nullptr, e.tokens, 20, nullptr, 1, 0, &e.id_out,
                                      &m);),
        S("pkv_seq_admit_tiered", PKV_CLASS_ABSURD, "num_tokens = 2^62", kInv, "2^31",
          pkv_tier_match m = tmatch();
          return pkv_seq_admit_tiered(e.pool, nullptr, e.tokens, k2_62, nullptr, 0, 0, &e.id_out,
                                      &m);),
        S("pkv_seq_admit_tiered", PKV_CLASS_RANGE, "hashes[0] not this pool's hash", kInv,
          "hashes[0]", pkv_tier_match m = tmatch();
          return pkv_seq_admit_tiered(e.pool, nullptr, e.tokens, 40, e.hashes, 2, 0, &e.id_out,
                                      &m);),
        S("pkv_seq_admit_tiered", PKV_CLASS_EXHAUSTED,
          "prompt larger than the free blocks (64 + 512)", kOob, "free",
          pkv_tier_match m = tmatch();
          return pkv_seq_admit_tiered(e.pool, nullptr, e.tokens, 64, nullptr, 0, 512, &e.id_out,
                                      &m);),
        S("pkv_pool_get_tier_stats", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          pkv_tier_stats st = tstats();
          return pkv_pool_get_tier_stats(nullptr, 1, &st);),
        S("pkv_pool_get_tier_stats", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_pool_get_tier_stats(e.pool, 1, nullptr);),
        S("pkv_pool_get_tier_stats", PKV_CLASS_STRUCT, "out->struct_size = 3", kInv, "struct_size",
          pkv_tier_stats st = tstats();
          st.struct_size = 3; return pkv_pool_get_tier_stats(e.pool, 1, &st);),
        S("pkv_pool_get_tier_stats", PKV_CLASS_RANGE, "medium = 0 (device)", kInv, "medium",
          pkv_tier_stats st = tstats();
          return pkv_pool_get_tier_stats(e.pool, 0, &st);),
        S("pkv_pool_get_tier_stats", PKV_CLASS_STATE, "pool without tiers", kState, "no host tier",
          pkv_tier_stats st = tstats();
          return pkv_pool_get_tier_stats(e.pool, 1, &st);),
        S("pkv_pool_flush_tiers", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_pool_flush_tiers(nullptr);),

        // ------------------------------------------------------------ batch.h
        S("pkv_batch_prepare", PKV_CLASS_NULL, "pool = NULL", kInv, "pool", uint32_t q = 1;
          pkv_batch* b = nullptr; return pkv_batch_prepare(nullptr, &e.a, &q, 1, nullptr, &b);),
        S("pkv_batch_prepare", PKV_CLASS_NULL, "seqs = NULL, num_seqs = 1", kInv, "seqs",
          uint32_t q = 1;
          pkv_batch* b = nullptr; return pkv_batch_prepare(e.pool, nullptr, &q, 1, nullptr, &b);),
        S("pkv_batch_prepare", PKV_CLASS_NULL, "query_counts = NULL", kInv, "query_counts",
          pkv_batch* b = nullptr;
          return pkv_batch_prepare(e.pool, &e.a, nullptr, 1, nullptr, &b);),
        S("pkv_batch_prepare", PKV_CLASS_NULL, "out = NULL", kInv, "out", uint32_t q = 1;
          return pkv_batch_prepare(e.pool, &e.a, &q, 1, nullptr, nullptr);),
        S("pkv_batch_prepare", PKV_CLASS_RANGE, "num_seqs = 0", kInv, "num_seqs",
          pkv_batch* b = nullptr;
          return pkv_batch_prepare(e.pool, &e.a, nullptr, 0, nullptr, &b);),
        S("pkv_batch_prepare", PKV_CLASS_STALE, "seqs[1] freed", kNf, "seqs[1]",
          pkv_seq_id s[2] = {e.a, e.dead};
          uint32_t q[2] = {1, 1}; pkv_batch* b = nullptr;
          return pkv_batch_prepare(e.pool, s, q, 2, nullptr, &b);),
        S("pkv_batch_prepare", PKV_CLASS_UNKNOWN, "seqs[0] never issued", kNf, "seqs[0]",
          uint32_t q = 1;
          pkv_batch* b = nullptr;
          return pkv_batch_prepare(e.pool, &e.unknown, &q, 1, nullptr, &b);),
        S("pkv_batch_prepare", PKV_CLASS_RANGE, "seqs[1] repeats seqs[0]", kInv, "seqs[1]",
          pkv_seq_id s[2] = {e.a, e.a};
          uint32_t q[2] = {1, 1}; pkv_batch* b = nullptr;
          return pkv_batch_prepare(e.pool, s, q, 2, nullptr, &b);),
        S("pkv_batch_prepare", PKV_CLASS_RANGE, "query_counts[0] = 0 or above the tokens", kInv,
          "query_counts[0]", uint32_t q = 0;
          pkv_batch* b = nullptr;
          pkv_status s = pkv_batch_prepare(e.pool, &e.a, &q, 1, nullptr, &b); q = 41;
          return s != kInv ? s : pkv_batch_prepare(e.pool, &e.a, &q, 1, nullptr, &b);),
        S("pkv_batch_prepare", PKV_CLASS_RANGE, "an empty sequence (query count 1)", kInv,
          "query_counts[0]", uint32_t q = 1;
          pkv_batch* b = nullptr; return pkv_batch_prepare(e.pool, &e.empty, &q, 1, nullptr, &b);),
        S("pkv_batch_prepare_ex", PKV_CLASS_NULL, "pool = NULL", kInv, "pool", uint32_t q = 1;
          pkv_batch* b = nullptr; return pkv_batch_prepare_ex(
              nullptr, &e.a, &q, 1, PKV_PREPARE_PERSISTENT_TABLE, nullptr, &b);),
        S("pkv_batch_prepare_ex", PKV_CLASS_NULL, "out = NULL", kInv, "out", uint32_t q = 1;
          return pkv_batch_prepare_ex(e.pool, &e.a, &q, 1, PKV_PREPARE_PERSISTENT_TABLE, nullptr,
                                      nullptr);),
        S("pkv_batch_prepare_ex", PKV_CLASS_RANGE, "flags = 2 (unknown bit)", kInv, "flags",
          uint32_t q = 1;
          pkv_batch* b = nullptr;
          return pkv_batch_prepare_ex(e.pool, &e.a, &q, 1, 2, nullptr, &b);),
        S("pkv_batch_prepare_ex", PKV_CLASS_STALE, "seqs[1] freed (persistent table)", kNf,
          "seqs[1]", pkv_seq_id s[2] = {e.a, e.dead};
          uint32_t q[2] = {1, 1}; pkv_batch* b = nullptr;
          return pkv_batch_prepare_ex(e.pool, s, q, 2, PKV_PREPARE_PERSISTENT_TABLE, nullptr, &b);),
        S("pkv_batch_prepare_ex", PKV_CLASS_RANGE, "query_counts[0] = 0 (persistent table)", kInv,
          "query_counts[0]", uint32_t q = 0;
          pkv_batch* b = nullptr; return pkv_batch_prepare_ex(
              e.pool, &e.a, &q, 1, PKV_PREPARE_PERSISTENT_TABLE, nullptr, &b);),
        with_setup(S("pkv_batch_prepare", PKV_CLASS_STATE,
                     "context not computed (query_counts[0] = 1 after appending 2)", kState,
                     "would attend over tokens [40, 41)", pkv_batch* b = nullptr;
                     uint32_t q = 1; return pkv_batch_prepare(e.pool, &e.a, &q, 1, nullptr, &b);),
                   append_a),
        S("pkv_batch_prepare_decode", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          pkv_batch* b = nullptr;
          return pkv_batch_prepare_decode(nullptr, &e.a, e.tokens, 1, 0, nullptr, &b);),
        S("pkv_batch_prepare_decode", PKV_CLASS_NULL, "seqs = NULL or tokens = NULL, num_seqs = 1",
          kInv, "is NULL", pkv_batch* b = nullptr;
          pkv_status s = pkv_batch_prepare_decode(e.pool, nullptr, e.tokens, 1, 0, nullptr, &b);
          return s != kInv ? s
                           : pkv_batch_prepare_decode(e.pool, &e.a, nullptr, 1, 0, nullptr, &b);),
        S("pkv_batch_prepare_decode", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_batch_prepare_decode(e.pool, &e.a, e.tokens, 1, 0, nullptr, nullptr);),
        S("pkv_batch_prepare_decode", PKV_CLASS_RANGE, "num_seqs = 0", kInv, "num_seqs",
          pkv_batch* b = nullptr;
          return pkv_batch_prepare_decode(e.pool, &e.a, e.tokens, 0, 0, nullptr, &b);),
        S("pkv_batch_prepare_decode", PKV_CLASS_RANGE, "flags = 2 (unknown bit)", kInv, "flags",
          pkv_batch* b = nullptr;
          return pkv_batch_prepare_decode(e.pool, &e.a, e.tokens, 1, 2, nullptr, &b);),
        S("pkv_batch_prepare_decode", PKV_CLASS_STALE, "seqs[1] freed", kNf, "seqs[1]",
          pkv_seq_id s[2] = {e.a, e.dead};
          pkv_batch* b = nullptr;
          return pkv_batch_prepare_decode(e.pool, s, e.tokens, 2, 0, nullptr, &b);),
        S("pkv_batch_prepare_decode", PKV_CLASS_UNKNOWN, "seqs[0] never issued", kNf, "seqs[0]",
          pkv_batch* b = nullptr;
          return pkv_batch_prepare_decode(e.pool, &e.unknown, e.tokens, 1, 0, nullptr, &b);),
        S("pkv_batch_prepare_decode", PKV_CLASS_RANGE, "seqs[2] repeats seqs[0]", kInv, "seqs[2]",
          pkv_seq_id s[3] = {e.a, e.b, e.a};
          pkv_batch* b = nullptr; return pkv_batch_prepare_decode(
              e.pool, s, e.tokens, 3, PKV_PREPARE_PERSISTENT_TABLE, nullptr, &b);),
        with_setup(S("pkv_batch_prepare_decode", PKV_CLASS_STATE,
                     "context not computed (2 tokens appended since the last step)", kState,
                     "nothing was appended", pkv_batch* b = nullptr;
                     return pkv_batch_prepare_decode(e.pool, &e.a, e.tokens, 1, 0, nullptr, &b);),
                   append_a),
        S("pkv_batch_commit", PKV_CLASS_NULL, "batch = NULL", kInv, "batch",
          return pkv_batch_commit(nullptr);),
        S("pkv_batch_commit", PKV_CLASS_STATE, "after pkv_batch_abort", kState, "aborted",
          pkv_batch* b = nullptr;
          uint32_t q = 1; pkv_status s = pkv_batch_prepare(e.pool, &e.a, &q, 1, nullptr, &b);
          if (s == PKV_OK) s = pkv_batch_abort(b); if (s == PKV_OK) s = pkv_batch_commit(b);
          pkv_batch_destroy(b); return s;),
        S("pkv_batch_abort", PKV_CLASS_NULL, "batch = NULL", kInv, "batch",
          return pkv_batch_abort(nullptr);),
        S("pkv_batch_abort", PKV_CLASS_STATE, "after every layer was written (committed)", kState,
          "committed", return pkv_batch_abort(e.batch);),
        V("pkv_batch_destroy", PKV_CLASS_NULL, "batch = NULL", "no-op", pkv_batch_destroy(nullptr);
          return PKV_OK;),
        V("pkv_batch_info_init", PKV_CLASS_NULL, "info = NULL", "no-op",
          pkv_batch_info_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(batch_info, info),
        S("pkv_batch_get_info", PKV_CLASS_NULL, "batch = NULL", kInv, "batch", pkv_batch_info i;
          pkv_batch_info_init(&i); return pkv_batch_get_info(nullptr, &i);),
        S("pkv_batch_get_info", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_batch_get_info(e.batch, nullptr);),
        S("pkv_batch_get_info", PKV_CLASS_STRUCT, "out->struct_size = 0", kInv, "struct_size",
          pkv_batch_info i;
          pkv_batch_info_init(&i); i.struct_size = 0; return pkv_batch_get_info(e.batch, &i);),
        S("pkv_batch_plan_tensor", PKV_CLASS_NULL, "batch = NULL", kInv, "batch", pkv_tensor t;
          return pkv_batch_plan_tensor(nullptr, 0, &t);),
        S("pkv_batch_plan_tensor", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_batch_plan_tensor(e.batch, 0, nullptr);),
        S("pkv_batch_plan_tensor", PKV_CLASS_RANGE, "which = 6", kInv, "which", pkv_tensor t;
          return pkv_batch_plan_tensor(e.batch, 6, &t);),
        S("pkv_cache_write", PKV_CLASS_NULL, "batch = NULL", kInv, "batch",
          return pkv_cache_write(nullptr, 0, &e.kt, &e.vt, nullptr);),
        S("pkv_cache_write", PKV_CLASS_NULL, "k = NULL", kInv, "k",
          return pkv_cache_write(e.batch, 0, nullptr, &e.vt, nullptr);),
        S("pkv_cache_write", PKV_CLASS_NULL, "v = NULL", kInv, "v",
          return pkv_cache_write(e.batch, 0, &e.kt, nullptr, nullptr);),
        S("pkv_cache_write", PKV_CLASS_NULL, "k->data = NULL", kInv, "k->data", pkv_tensor k = e.kt;
          k.data = nullptr; return write_k(e, k);),
        S("pkv_cache_write", PKV_CLASS_RANGE, "layer = num_layers", kInv, "layer",
          return pkv_cache_write(e.batch, 2, &e.kt, &e.vt, nullptr);),
        S("pkv_cache_write", PKV_CLASS_SHAPE, "k rows != plan tokens", kInv, "k has shape",
          pkv_tensor k = e.kt;
          k.shape[0] = 10; return write_k(e, k);),
        S("pkv_cache_write", PKV_CLASS_SHAPE, "v heads != num_kv_heads", kInv, "v has shape",
          pkv_tensor v = e.vt;
          v.shape[1] = 1; return pkv_cache_write(e.batch, 0, &e.kt, &v, nullptr);),
        S("pkv_cache_write", PKV_CLASS_SHAPE, "k head_dim != pool's", kInv, "k has shape",
          pkv_tensor k = e.kt;
          k.shape[2] = 32; return write_k(e, k);),
        S("pkv_cache_write", PKV_CLASS_SHAPE, "k ndim = 2", kInv, "ndim", pkv_tensor k = e.kt;
          k.ndim = 2; return write_k(e, k);),
        S("pkv_cache_write", PKV_CLASS_DTYPE, "k dtype f16 on an f32 pool", kInv, "dtype",
          pkv_tensor k = e.kt;
          k.dtype = PKV_DTYPE_F16; return write_k(e, k);),
        S("pkv_cache_write", PKV_CLASS_DEVICE, "k on CUDA for a CPU pool", kInv, "device",
          pkv_tensor k = e.kt;
          k.device_type = PKV_DEVICE_CUDA; return write_k(e, k);),
        S("pkv_cache_write", PKV_CLASS_STRIDE, "k innermost stride 2", kInv, "stride",
          pkv_tensor k = e.kt;
          k.strides[2] = 2; return write_k(e, k);),
        S("pkv_cache_write", PKV_CLASS_STRIDE, "k negative row stride", kInv, "stride",
          pkv_tensor k = e.kt;
          k.strides[0] = -128; return write_k(e, k);),
        S("pkv_cache_write", PKV_CLASS_OVERFLOW, "k strides {2^62, 64, 1}: extent overflows int64",
          kInv, "k's extent", pkv_tensor k = e.kt;
          k.strides[0] = int64_t(k2_62); k.strides[1] = 64; k.strides[2] = 1;
          return write_k(e, k);),
        S("pkv_cache_write", PKV_CLASS_OVERFLOW, "k byte_offset 2^64 - 64: address wraps", kInv,
          "k->byte_offset", pkv_tensor k = e.kt;
          k.byte_offset = ~uint64_t(0) - 63; return write_k(e, k);),
        S("pkv_cache_write", PKV_CLASS_ALIGN, "v data at an f32 buffer + 2 bytes", kInv,
          "v->data + byte_offset is not aligned", pkv_tensor v = e.vt;
          v.data = misaligned(e.v); return pkv_cache_write(e.batch, 0, &e.kt, &v, nullptr);),
        S("pkv_cache_write", PKV_CLASS_ALIAS, "k inside the storage of the layer it writes", kInv,
          "k overlaps the pool's KV storage", return write_k(e, in_kv_storage(e, e.kt));),
        with_setup(S("pkv_cache_write", PKV_CLASS_STATE, "plan stale (a sequence appended since)",
                     kState, "stale", return pkv_cache_write(e.batch, 0, &e.kt, &e.vt, nullptr);),
                   append_to_a),
        S("pkv_cache_write", PKV_CLASS_STATE, "plan of a pool without storage", kState, "storage",
          return pkv_cache_write(e.mgr_batch, 0, &e.kt, &e.vt, nullptr);),
        with_setup(S("pkv_cache_write", PKV_CLASS_STATE, "pool destroyed before the plan", kState,
                     "destroyed", return pkv_cache_write(e.batch, 0, &e.kt, &e.vt, nullptr);),
                   destroy_pool),
        V("pkv_attention_params_init", PKV_CLASS_NULL, "params = NULL", "no-op",
          pkv_attention_params_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(attention_params, params),
        S("pkv_attention_forward", PKV_CLASS_NULL, "batch = NULL", kInv, "batch",
          return pkv_attention_forward(nullptr, 0, &e.qt, &e.ot, nullptr, nullptr, nullptr);),
        S("pkv_attention_forward", PKV_CLASS_NULL, "q = NULL", kInv, "q",
          return pkv_attention_forward(e.batch, 0, nullptr, &e.ot, nullptr, nullptr, nullptr);),
        S("pkv_attention_forward", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_attention_forward(e.batch, 0, &e.qt, nullptr, nullptr, nullptr, nullptr);),
        S("pkv_attention_forward", PKV_CLASS_NULL, "out->data = NULL", kInv, "out->data",
          pkv_tensor o = e.ot;
          o.data = nullptr; return attend_out(e, o);),
        S("pkv_attention_forward", PKV_CLASS_RANGE, "layer = 2^32 - 1", kInv, "layer",
          return pkv_attention_forward(e.batch, ~0u, &e.qt, &e.ot, nullptr, nullptr, nullptr);),
        S("pkv_attention_forward", PKV_CLASS_SHAPE, "q heads not a multiple of num_kv_heads", kInv,
          "q has shape", pkv_tensor q = e.qt;
          q.shape[1] = 3; return attend_q(e, q);),
        S("pkv_attention_forward", PKV_CLASS_SHAPE, "q rows != plan tokens", kInv, "q has shape",
          pkv_tensor q = e.qt;
          q.shape[0] = 12; return attend_q(e, q);),
        S("pkv_attention_forward", PKV_CLASS_SHAPE, "out shape != q shape", kInv, "out has shape",
          pkv_tensor o = e.ot;
          o.shape[1] = 2; return attend_out(e, o);),
        S("pkv_attention_forward", PKV_CLASS_SHAPE, "lse shape != [rows, q heads]", kInv,
          "lse has shape", pkv_tensor l = e.lt;
          l.shape[1] = 2; return attend_lse(e, l);),
        S("pkv_attention_forward", PKV_CLASS_DTYPE, "q dtype bf16 on an f32 pool", kInv, "dtype",
          pkv_tensor q = e.qt;
          q.dtype = PKV_DTYPE_BF16; return attend_q(e, q);),
        S("pkv_attention_forward", PKV_CLASS_DTYPE, "lse dtype f16", kInv, "lse has dtype",
          pkv_tensor l = e.lt;
          l.dtype = PKV_DTYPE_F16; return attend_lse(e, l);),
        S("pkv_attention_forward", PKV_CLASS_DEVICE, "out on device id 3", kInv, "device",
          pkv_tensor o = e.ot;
          o.device_id = 3; return attend_out(e, o);),
        S("pkv_attention_forward", PKV_CLASS_STRIDE, "q innermost stride 0 with other strides set",
          kInv, "stride", pkv_tensor q = e.qt;
          q.strides[2] = 0; return attend_q(e, q);),
        S("pkv_attention_forward", PKV_CLASS_STRIDE, "lse head stride 4", kInv,
          "lse has head stride", pkv_tensor l = e.lt;
          l.strides[1] = 4; return attend_lse(e, l);),
        S("pkv_attention_forward", PKV_CLASS_OVERFLOW, "q strides {2^62, 64, 1}: extent overflows",
          kInv, "q's extent", pkv_tensor q = e.qt;
          q.strides[0] = int64_t(k2_62); q.strides[1] = 64; q.strides[2] = 1;
          return attend_q(e, q);),
        S("pkv_attention_forward", PKV_CLASS_OVERFLOW, "out byte_offset 2^64 - 64: address wraps",
          kInv, "out->byte_offset", pkv_tensor o = e.ot;
          o.byte_offset = ~uint64_t(0) - 63; return attend_out(e, o);),
        S("pkv_attention_forward", PKV_CLASS_OVERFLOW,
          "q byte_offset 2^63: data + byte_offset past int64", kInv, "q's extent",
          pkv_tensor q = e.qt;
          q.byte_offset = uint64_t(1) << 63; return attend_q(e, q);),
        S("pkv_attention_forward", PKV_CLASS_ALIGN, "lse (f32) data at buffer + 2 bytes", kInv,
          "lse->data + byte_offset is not aligned", pkv_tensor l = e.lt;
          l.data = misaligned(e.lse); return attend_lse(e, l);),
        S("pkv_attention_forward", PKV_CLASS_ABSURD, "q, out with 2^32 heads per KV head", kInv,
          "heads, more than 2^31 - 1", pkv_tensor q = e.qt;
          pkv_tensor o = e.ot; q.shape[1] = o.shape[1] = int64_t(1) << 33;
          q.strides[0] = o.strides[0] = 256; q.strides[1] = o.strides[1] = 0;
          q.strides[2] = o.strides[2] = 1;
          return pkv_attention_forward(e.batch, 0, &q, &o, nullptr, nullptr, nullptr);),
        S("pkv_attention_forward", PKV_CLASS_ABSURD,
          "q, out with 2^28 heads per KV head: 8 queries x 2^28 rows overflow int32", kInv,
          "query rows", pkv_tensor q = e.qt;
          pkv_tensor o = e.ot; q.shape[1] = o.shape[1] = int64_t(1) << 29;
          q.strides[0] = o.strides[0] = 256; q.strides[1] = o.strides[1] = 0;
          q.strides[2] = o.strides[2] = 1;
          return pkv_attention_forward(e.batch, 0, &q, &o, nullptr, nullptr, nullptr);),
        S("pkv_attention_forward", PKV_CLASS_ALIAS, "out row stride 0: all rows alias", kInv,
          "out is an output whose elements overlap", pkv_tensor o = e.ot;
          o.strides[0] = 0; o.strides[1] = 64; o.strides[2] = 1; return attend_out(e, o);),
        S("pkv_attention_forward", PKV_CLASS_ALIAS, "lse row stride 0: all rows alias", kInv,
          "lse is an output whose elements overlap", pkv_tensor l = e.lt;
          l.strides[0] = 0; l.strides[1] = 1; return attend_lse(e, l);),
        S("pkv_attention_forward", PKV_CLASS_ALIAS, "out = q (in place)", kInv, "out overlaps q",
          return attend_out(e, e.qt);),
        S("pkv_attention_forward", PKV_CLASS_ALIAS, "lse inside out", kInv, "lse overlaps out",
          pkv_tensor l = e.lt;
          l.data = e.out.data(); return attend_lse(e, l);),
        S("pkv_attention_forward", PKV_CLASS_ALIAS, "out inside the pool's KV storage", kInv,
          "out overlaps the pool's KV storage", return attend_out(e, in_kv_storage(e, e.ot));),
        S("pkv_attention_forward", PKV_CLASS_STRUCT, "params->struct_size = 0", kInv, "struct_size",
          pkv_attention_params p = aparams();
          p.struct_size = 0; return attend_params(e, p);),
        S("pkv_attention_forward", PKV_CLASS_RANGE, "params->softmax_scale = NaN or -1", kInv,
          "softmax_scale", pkv_attention_params p = aparams();
          p.softmax_scale = std::nanf(""); pkv_status s = attend_params(e, p); p.softmax_scale = -1;
          return s != kInv ? s : attend_params(e, p);),
        S("pkv_attention_forward", PKV_CLASS_RANGE, "params->logit_softcap = +inf", kInv,
          "logit_softcap", pkv_attention_params p = aparams();
          p.logit_softcap = HUGE_VALF; return attend_params(e, p);),
        S("pkv_attention_forward", PKV_CLASS_ABSURD, "params->sliding_window = 2^32 - 1", kInv,
          "sliding_window", pkv_attention_params p = aparams();
          p.sliding_window = ~0u; return attend_params(e, p);),
        with_setup(
            S("pkv_attention_forward", PKV_CLASS_STATE, "plan stale (a sequence freed since)",
              kState, "stale",
              return pkv_attention_forward(e.batch, 0, &e.qt, &e.ot, nullptr, nullptr, nullptr);),
            free_b),
        // Batched and fused sequence calls (all or nothing).
        S("pkv_seq_append_batch", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          const pkv_seq_id ids[1] = {e.a};
          return pkv_seq_append_batch(nullptr, ids, e.tokens, 1);),
        S("pkv_seq_append_batch", PKV_CLASS_NULL, "seqs = NULL or tokens = NULL, num_seqs = 1",
          kInv, "is NULL", const pkv_seq_id ids[1] = {e.a};
          pkv_status s = pkv_seq_append_batch(e.pool, nullptr, e.tokens, 1);
          return s != kInv ? s : pkv_seq_append_batch(e.pool, ids, nullptr, 1);),
        S("pkv_seq_append_batch", PKV_CLASS_STALE, "seqs[1] freed", kNf, "seqs[1]",
          const pkv_seq_id ids[2] = {e.a, e.dead};
          return pkv_seq_append_batch(e.pool, ids, e.tokens, 2);),
        S("pkv_seq_append_batch", PKV_CLASS_RANGE, "seqs[2] repeats seqs[0]", kInv, "seqs[2]",
          const pkv_seq_id ids[3] = {e.a, e.b, e.a};
          return pkv_seq_append_batch(e.pool, ids, e.tokens, 3);),
        S("pkv_seq_free_batch", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          const pkv_seq_id ids[1] = {e.a};
          return pkv_seq_free_batch(nullptr, ids, 1);),
        S("pkv_seq_free_batch", PKV_CLASS_NULL, "seqs = NULL, num_seqs = 1", kInv, "seqs",
          return pkv_seq_free_batch(e.pool, nullptr, 1);),
        S("pkv_seq_free_batch", PKV_CLASS_STALE, "seqs[1] freed", kNf, "seqs[1]",
          const pkv_seq_id ids[2] = {e.a, e.dead};
          return pkv_seq_free_batch(e.pool, ids, 2);),
        S("pkv_seq_free_batch", PKV_CLASS_RANGE, "seqs[1] repeats seqs[0]", kInv, "seqs[1]",
          const pkv_seq_id ids[2] = {e.b, e.b};
          return pkv_seq_free_batch(e.pool, ids, 2);),
        S("pkv_seq_admit", PKV_CLASS_NULL, "pool = NULL", kInv, "pool",
          return pkv_seq_admit(nullptr, nullptr, e.tokens, 20, 0, &e.id_out, &e.u64);),
        S("pkv_seq_admit", PKV_CLASS_NULL, "tokens = NULL, num_tokens = 20", kInv, "tokens",
          return pkv_seq_admit(e.pool, nullptr, nullptr, 20, 0, &e.id_out, &e.u64);),
        S("pkv_seq_admit", PKV_CLASS_NULL, "out_seq = NULL", kInv, "out_seq",
          return pkv_seq_admit(e.pool, nullptr, e.tokens, 20, 0, nullptr, &e.u64);),
        S("pkv_seq_admit", PKV_CLASS_ABSURD, "num_tokens = 2^62", kInv, "2^31",
          return pkv_seq_admit(e.pool, nullptr, e.tokens, k2_62, 0, &e.id_out, &e.u64);),
        S("pkv_seq_admit", PKV_CLASS_EXHAUSTED, "prompt larger than the free blocks (64 + 512)",
          kOob, "free",
          return pkv_seq_admit(e.pool, nullptr, e.tokens, 64, 512, &e.id_out, &e.u64);),
        S("pkv_seq_match_prefix_hashes", PKV_CLASS_NULL, "hashes = NULL, num_hashes = 1", kInv,
          "hashes is NULL",
          return pkv_seq_match_prefix_hashes(e.pool, e.empty, e.tokens, 20, nullptr, 1, &e.u64);),
        S("pkv_seq_match_prefix_hashes", PKV_CLASS_RANGE, "num_hashes above the full blocks", kInv,
          "num_hashes",
          return pkv_seq_match_prefix_hashes(e.pool, e.empty, e.tokens, 20, e.hashes, 2, &e.u64);),
        S("pkv_seq_match_prefix_hashes", PKV_CLASS_RANGE,
          "hashes[0] not this pool's hash of the first block (another salt, seed, algorithm)", kInv,
          "hashes[0]",
          return pkv_seq_match_prefix_hashes(e.pool, e.empty, e.tokens, 40, e.hashes, 2, &e.u64);),
        S("pkv_seq_match_prefix_hashes", PKV_CLASS_STALE, "seq freed", kNf, "stale",
          return pkv_seq_match_prefix_hashes(e.pool, e.dead, e.tokens, 20, e.hashes, 1, &e.u64);),
        S("pkv_seq_admit_hashes", PKV_CLASS_NULL, "out_num_cached = NULL", kInv, "out_num_cached",
          return pkv_seq_admit_hashes(e.pool, nullptr, e.tokens, 20, e.hashes, 1, 0, &e.id_out,
                                      nullptr);),
        S("pkv_seq_admit_hashes", PKV_CLASS_RANGE, "hashes[0] not this pool's hash", kInv,
          "hashes[0]",
          return pkv_seq_admit_hashes(e.pool, nullptr, e.tokens, 40, e.hashes, 2, 0, &e.id_out,
                                      &e.u64);),
        S("pkv_batch_token_positions", PKV_CLASS_NULL, "batch = NULL", kInv, "batch", pkv_tensor t;
          return pkv_batch_token_positions(nullptr, &t);),
        S("pkv_batch_token_positions", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_batch_token_positions(e.batch, nullptr);),
        S("pkv_batch_last_token_indices", PKV_CLASS_NULL, "batch = NULL", kInv, "batch",
          pkv_tensor t;
          return pkv_batch_last_token_indices(nullptr, &t);),
        S("pkv_batch_last_token_indices", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_batch_last_token_indices(e.batch, nullptr);),
        // ------------------------------------------------------------ groups.h
        V("pkv_kv_group_spec_init", PKV_CLASS_NULL, "spec = NULL", "no-op",
          pkv_kv_group_spec_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(kv_group_spec, spec),
        V("pkv_group_stats_init", PKV_CLASS_NULL, "stats = NULL", "no-op",
          pkv_group_stats_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(group_stats, stats),
        S("pkv_pool_create_groups", PKV_CLASS_NULL, "base = NULL", kInv, "base",
          pkv_kv_group_spec g = gspec(PKV_GROUP_FULL);
          pkv_pool* p = nullptr; return pkv_pool_create_groups(nullptr, &g, 1, &p);),
        S("pkv_pool_create_groups", PKV_CLASS_NULL, "groups = NULL, num_groups = 2", kInv, "groups",
          pkv_pool_options o = gbase();
          pkv_pool* p = nullptr; return pkv_pool_create_groups(&o, nullptr, 2, &p);),
        S("pkv_pool_create_groups", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          pkv_pool_options o = gbase();
          pkv_kv_group_spec g = gspec(PKV_GROUP_FULL);
          return pkv_pool_create_groups(&o, &g, 1, nullptr);),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "num_groups = 0", kInv, "num_groups",
          pkv_pool_options o = gbase();
          pkv_kv_group_spec g = gspec(PKV_GROUP_FULL); pkv_pool* p = nullptr;
          return pkv_pool_create_groups(&o, &g, 0, &p);),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "base->enable_events = 2", kInv,
          "base->enable_events", pkv_pool_options o = gbase();
          o.enable_events = 2; return create_groups_with(o, gspec(PKV_GROUP_FULL));),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "base->enable_retention = 2", kInv,
          "base->enable_retention", pkv_pool_options o = gbase();
          o.enable_retention = 2; return create_groups_with(o, gspec(PKV_GROUP_FULL));),
        S("pkv_pool_create_groups", PKV_CLASS_STRUCT, "groups[1].struct_size = 4", kInv,
          "groups[1]", pkv_kv_group_spec g = gspec(PKV_GROUP_FULL);
          g.struct_size = 4; return create_groups_with(gbase(), g);),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "groups[1].kind = 9", kInv, "groups[1].kind",
          pkv_kv_group_spec g = gspec(PKV_GROUP_FULL);
          g.kind = 9; return create_groups_with(gbase(), g);),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE,
          "groups[1].flags = PKV_GROUP_SNAPSHOT_EVERY_BLOCK on a full-attention group", kInv,
          "groups[1].flags", pkv_kv_group_spec g = gspec(PKV_GROUP_FULL);
          g.flags = PKV_GROUP_SNAPSHOT_EVERY_BLOCK; return create_groups_with(gbase(), g);),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "groups[1].flags = 0x2 (not a flag)", kInv,
          "groups[1].flags", pkv_kv_group_spec g = gspec(PKV_GROUP_RECURRENT);
          g.state_bytes = 16; g.flags = 0x2u; return create_groups_with(gbase(), g);),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "groups[1].reserved1 = 1", kInv,
          "groups[1].reserved1", pkv_kv_group_spec g = gspec(PKV_GROUP_FULL);
          g.reserved1 = 1; return create_groups_with(gbase(), g);),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "recurrent group with state_bytes = 0", kInv,
          "groups[1].state_bytes", pkv_kv_group_spec g = gspec(PKV_GROUP_RECURRENT);
          return create_groups_with(gbase(), g);),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "window group with sliding_window = 0", kInv,
          "groups[1].sliding_window", pkv_kv_group_spec g = gspec(PKV_GROUP_SLIDING_WINDOW);
          g.sliding_window = 0; return create_groups_with(gbase(), g);),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "groups[1].num_layers = 0", kInv,
          "groups[1].num_layers", pkv_kv_group_spec g = gspec(PKV_GROUP_FULL);
          g.num_layers = 0; return create_groups_with(gbase(), g);),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "groups[1].head_dim = 0", kInv,
          "groups[1].head_dim", pkv_kv_group_spec g = gspec(PKV_GROUP_FULL);
          g.head_dim = 0; return create_groups_with(gbase(), g);),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "MLA group with kv_lora_rank = 0", kInv,
          "groups[1].kv_lora_rank", pkv_kv_group_spec g = gspec(PKV_GROUP_MLA);
          return create_groups_with(gbase(), g);),
        S("pkv_pool_create_groups", PKV_CLASS_DTYPE, "groups[1].dtype = PKV_DTYPE_I32", kInv,
          "groups[1].dtype", pkv_kv_group_spec g = gspec(PKV_GROUP_FULL);
          g.dtype = PKV_DTYPE_I32; return create_groups_with(gbase(), g);),
        S("pkv_pool_create_groups", PKV_CLASS_STATE, "base->num_layers = 2 (storage)",
          PKV_E_UNSUPPORTED, "base->num_layers", pkv_pool_options o = gbase();
          o.num_layers = 2; return create_groups_with(o, gspec(PKV_GROUP_FULL));),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "base->block_size = 0", kInv,
          "base->block_size", pkv_pool_options o = gbase();
          o.block_size = 0; return create_groups_with(o, gspec(PKV_GROUP_FULL));),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "base->sliding_window = 8", kInv,
          "base->sliding_window", pkv_pool_options o = gbase();
          o.sliding_window = 8; return create_groups_with(o, gspec(PKV_GROUP_FULL));),
        S("pkv_pool_num_groups", PKV_CLASS_NULL, "pool = NULL", kInv, "pool", uint32_t n;
          return pkv_pool_num_groups(nullptr, &n);),
        S("pkv_pool_num_groups", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_pool_num_groups(e.pool, nullptr);),
        S("pkv_pool_group_of_layer", PKV_CLASS_NULL, "pool = NULL", kInv, "pool", uint32_t g, k;
          return pkv_pool_group_of_layer(nullptr, 0, &g, &k);),
        S("pkv_pool_group_of_layer", PKV_CLASS_NULL, "out_index = NULL", kInv, "out_index",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id, pkv_seq_id) {
                             uint32_t g;
                             return pkv_pool_group_of_layer(p, 0, &g, nullptr);
                           });),
        S("pkv_pool_group_of_layer", PKV_CLASS_RANGE, "layer 2 of 2", kNf, "layer 2",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id, pkv_seq_id) {
                             uint32_t g = 7, k = 7;
                             const pkv_status st = pkv_pool_group_of_layer(p, 2, &g, &k);
                             return g == 7 && k == 7 ? st : PKV_E_INTERNAL;
                           });),
        S("pkv_pool_group_of_layer", PKV_CLASS_RANGE, "layer = num_layers, one group", kNf,
          "layer 2", uint32_t g, k;
          return pkv_pool_group_of_layer(e.pool, 2, &g, &k);),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "layer_ids in one group only", kInv,
          "groups[1].layer_ids", pkv_pool_options o = gbase();
          const uint32_t ids[1] = {3};
          pkv_kv_group_spec g[2] = {gspec(PKV_GROUP_FULL), gspec(PKV_GROUP_FULL)};
          g[0].layer_ids = ids; pkv_pool* p = nullptr;
          const pkv_status st = pkv_pool_create_groups(&o, g, 2, &p); pkv_pool_destroy(p);
          return st;),
        S("pkv_pool_create_groups", PKV_CLASS_RANGE, "layer id in two groups", kInv,
          "groups[1].layer_ids[0] = 3 is also groups[0].layer_ids[0]", pkv_pool_options o = gbase();
          const uint32_t ids[1] = {3};
          pkv_kv_group_spec g[2] = {gspec(PKV_GROUP_FULL), gspec(PKV_GROUP_FULL)};
          g[0].layer_ids = ids; g[1].layer_ids = ids; pkv_pool* p = nullptr;
          const pkv_status st = pkv_pool_create_groups(&o, g, 2, &p); pkv_pool_destroy(p);
          return st;),
        S("pkv_seq_group_block_table", PKV_CLASS_NULL, "out_len = NULL", kInv, "out_len",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id s, pkv_seq_id) {
                             return pkv_seq_group_block_table(p, s, 0, e.table, 64, nullptr);
                           });),
        S("pkv_seq_group_block_table", PKV_CLASS_RANGE, "group = 2 of 2", kInv, "group 2",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id s, pkv_seq_id) {
                             return pkv_seq_group_block_table(p, s, 2, e.table, 64, &e.u64);
                           });),
        S("pkv_seq_group_block_table", PKV_CLASS_RANGE, "group = 1 on a single-group pool", kInv,
          "group 1", return pkv_seq_group_block_table(e.pool, e.a, 1, e.table, 64, &e.u64);),
        S("pkv_seq_group_block_table", PKV_CLASS_STALE, "seq freed", kNf, "stale",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id, pkv_seq_id dead) {
                             return pkv_seq_group_block_table(p, dead, 0, e.table, 64, &e.u64);
                           });),
        S("pkv_seq_group_block_table", PKV_CLASS_CAPACITY, "capacity = 1 for 3 blocks", kSmall,
          "out_blocks",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id s, pkv_seq_id) {
                             return pkv_seq_group_block_table(p, s, 1, e.table, 1, &e.u64);
                           });),
        S("pkv_pool_group_stats", PKV_CLASS_STATE, "single-group pool", PKV_E_UNSUPPORTED,
          "single-group", pkv_group_stats g;
          pkv_group_stats_init(&g); return pkv_pool_group_stats(e.pool, 0, &g);),
        S("pkv_pool_group_stats", PKV_CLASS_RANGE, "group = 2 of 2", kInv, "group 2",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id, pkv_seq_id) {
                             pkv_group_stats g;
                             pkv_group_stats_init(&g);
                             return pkv_pool_group_stats(p, 2, &g);
                           });),
        S("pkv_pool_group_stats", PKV_CLASS_STRUCT, "out->struct_size = 0", kInv, "struct_size",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id, pkv_seq_id) {
                             pkv_group_stats g;
                             pkv_group_stats_init(&g);
                             g.struct_size = 0;
                             return pkv_pool_group_stats(p, 0, &g);
                           });),
        S("pkv_pool_group_take_copies", PKV_CLASS_NULL, "src = NULL, capacity = 4", kInv, "src",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id, pkv_seq_id) {
                             int32_t d[4];
                             return pkv_pool_group_take_copies(p, 0, nullptr, d, 4, &e.u64);
                           });),
        S("pkv_pool_group_take_copies", PKV_CLASS_STATE, "single-group pool", PKV_E_UNSUPPORTED,
          "single-group", int32_t a[4], b[4];
          return pkv_pool_group_take_copies(e.pool, 0, a, b, 4, &e.u64);),
        S("pkv_pool_group_take_copies", PKV_CLASS_CAPACITY, "capacity = 0 with a copy pending",
          kSmall, "pending",
          return on_groups(
              e,
              [&](pkv_pool* p, pkv_seq_id s) {
                pkv_seq_id c = 0;
                must(pkv_seq_fork(p, s, &c), "fork");
                must(pkv_seq_append(p, c, e.tokens, 1, 0), "append child");
              },
              [&](pkv_pool* p, pkv_seq_id, pkv_seq_id) {
                return pkv_pool_group_take_copies(p, 0, nullptr, nullptr, 0, &e.u64);
              });),
        S("pkv_seq_append", PKV_CLASS_EXHAUSTED, "multi-group pool: more blocks than free", kOob,
          "free",
          return on_groups(e, [&](pkv_pool* p, pkv_seq_id s,
                                  pkv_seq_id) { return pkv_seq_append(p, s, e.tokens, 64, 0); });),
        S("pkv_seq_append", PKV_CLASS_UNKNOWN, "multi-group pool: seq of another multi-group pool",
          kNf, "stale or unknown",
          // Before the ids carried the pool tag, the other pool's first id
          // named this pool's first sequence (s) and the append landed there.
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id, pkv_seq_id) {
                             const pkv_kv_group_spec g[2] = {gspec(PKV_GROUP_FULL),
                                                             gspec(PKV_GROUP_FULL)};
                             pkv_pool_options o = gbase();
                             pkv_pool* other = nullptr;
                             must(pkv_pool_create_groups(&o, g, 2, &other),
                                  "pool_create_groups other");
                             pkv_seq_id theirs = 0;
                             must(pkv_seq_create(other, nullptr, &theirs), "other seq_create");
                             const pkv_status st = pkv_seq_append(p, theirs, e.tokens, 1, 0);
                             pkv_pool_destroy(other);
                             return st;
                           });),
        S("pkv_seq_truncate", PKV_CLASS_RANGE, "multi-group pool: into released window blocks",
          kInv, "released",
          return on_groups(
              e,
              [&](pkv_pool* p, pkv_seq_id s) {
                must(pkv_seq_append(p, s, e.tokens, 10, 0), "append 10");
                must(pkv_seq_append(p, s, e.tokens, 1, 0), "append 1");
              },
              [&](pkv_pool* p, pkv_seq_id s, pkv_seq_id) { return pkv_seq_truncate(p, s, 4); });),
        S("pkv_batch_prepare", PKV_CLASS_RANGE, "multi-group pool: query_counts[0] = 11 of 10",
          kInv, "query_counts[0]",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id s, pkv_seq_id) {
                             pkv_batch* b = nullptr;
                             const uint32_t q = 11;
                             return pkv_batch_prepare(p, &s, &q, 1, nullptr, &b);
                           });),
        S("pkv_batch_prepare", PKV_CLASS_STALE, "multi-group pool: seq freed", kNf, "stale",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id, pkv_seq_id dead) {
                             pkv_batch* b = nullptr;
                             const uint32_t q = 1;
                             return pkv_batch_prepare(p, &dead, &q, 1, nullptr, &b);
                           });),
        S("pkv_batch_prepare", PKV_CLASS_STATE,
          "multi-group pool: context never computed (planned pool)", PKV_E_INVALID_STATE,
          "no committed step",
          return on_groups(
              e,
              [&](pkv_pool* p, pkv_seq_id s) {
                // The pool plans from now on: an aborted step leaves 10 uncomputed.
                pkv_batch* b = nullptr;
                const uint32_t q = 10;
                must(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b), "prepare");
                must(pkv_batch_abort(b), "abort");
                pkv_batch_destroy(b);
              },
              [&](pkv_pool* p, pkv_seq_id s, pkv_seq_id) {
                pkv_batch* b = nullptr;
                const uint32_t q = 1;
                return pkv_batch_prepare(p, &s, &q, 1, nullptr, &b);
              });),
        S("pkv_batch_prepare_decode", PKV_CLASS_STATE, "multi-group pool", PKV_E_UNSUPPORTED,
          "multi-group",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id s, pkv_seq_id) {
                             pkv_batch* b = nullptr;
                             return pkv_batch_prepare_decode(p, &s, e.tokens, 1, 0, nullptr, &b);
                           });),
        S("pkv_batch_prepare_ex", PKV_CLASS_RANGE, "multi-group pool: flags with an unknown bit",
          kInv, "flags",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id s, pkv_seq_id) {
                             pkv_batch* b = nullptr;
                             const uint32_t q = 1;
                             return pkv_batch_prepare_ex(
                                 p, &s, &q, 1, PKV_PREPARE_PERSISTENT_TABLE | 0x8u, nullptr, &b);
                           });),
        S("pkv_batch_plan_tensor_group", PKV_CLASS_NULL, "batch = NULL", kInv, "batch",
          pkv_tensor t;
          return pkv_batch_plan_tensor_group(nullptr, 0, 0, &t);),
        S("pkv_batch_plan_tensor_group", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_batch_plan_tensor_group(e.batch, 0, 0, nullptr);),
        S("pkv_batch_plan_tensor_group", PKV_CLASS_RANGE, "group = 1 on a single-group plan", kInv,
          "group 1", pkv_tensor t;
          return pkv_batch_plan_tensor_group(e.batch, 1, 0, &t);),
        S("pkv_batch_plan_tensor_group", PKV_CLASS_RANGE, "multi-group plan: group = 2 of 2", kInv,
          "group 2",
          return on_group_plan(e,
                               [&](pkv_batch* b) {
                                 pkv_tensor t;
                                 (void)t;
                                 return pkv_batch_plan_tensor_group(b, 2, 0, &t);
                               });),
        S("pkv_batch_plan_tensor_group", PKV_CLASS_RANGE, "multi-group plan: which = 6", kInv,
          "which",
          return on_group_plan(e,
                               [&](pkv_batch* b) {
                                 pkv_tensor t;
                                 (void)t;
                                 return pkv_batch_plan_tensor_group(b, 1, 6, &t);
                               });),
        S("pkv_batch_plan_tensor_group", PKV_CLASS_RANGE,
          "multi-group plan: which = PKV_PLAN_SNAPSHOT_INDPTR of a window group", kInv,
          "not PKV_GROUP_RECURRENT",
          return on_group_plan(e,
                               [&](pkv_batch* b) {
                                 pkv_tensor t;
                                 (void)t;
                                 return pkv_batch_plan_tensor_group(b, 1, PKV_PLAN_SNAPSHOT_INDPTR,
                                                                    &t);
                               });),
        S("pkv_batch_prepare", PKV_CLASS_EXHAUSTED,
          "recurrent snapshot slots (PKV_GROUP_SNAPSHOT_EVERY_BLOCK) exceed the free blocks", kOob,
          "snapshot slots", return snapshot_prepare_oob(e);),
        S("pkv_cache_write", PKV_CLASS_STATE, "plan over a multi-group pool", PKV_E_UNSUPPORTED,
          "manager only",
          return on_group_plan(e,
                               [&](pkv_batch* b) {
                                 pkv_tensor t;
                                 (void)t;
                                 return pkv_cache_write(b, 0, &e.kt, &e.vt, nullptr);
                               });),
        S("pkv_pool_drain_events_v2", PKV_CLASS_STATE, "multi-group pool", PKV_E_UNSUPPORTED,
          "multi-group",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id, pkv_seq_id) {
                             pkv_event_v2 ev[2] = {};
                             ev[0].struct_size = sizeof ev[0];
                             return pkv_pool_drain_events_v2(p, ev, 2, e.tokens, 64, &e.u64);
                           });),
        S("pkv_event_publisher_create", PKV_CLASS_STATE, "multi-group pool", PKV_E_UNSUPPORTED,
          "multi-group",
          return on_groups(e,
                           [&](pkv_pool* p, pkv_seq_id, pkv_seq_id) {
                             pkv_event_publisher* pub = nullptr;
                             return pkv_event_publisher_create(p, "inproc://groups", nullptr,
                                                               nullptr, &pub);
                           });),
        // ---------------------------------------------------------- transfer.h
        V("pkv_transfer_options_init", PKV_CLASS_NULL, "opts = NULL", "no-op",
          pkv_transfer_options_init(nullptr);
          return PKV_OK;),
        SIZED_INIT_CASES(transfer_options, opts),
        V("pkv_transfer_engine_destroy", PKV_CLASS_NULL, "engine = NULL", "no-op",
          pkv_transfer_engine_destroy(nullptr);
          return PKV_OK;),
        V("pkv_transfer_destroy", PKV_CLASS_NULL, "transfer = NULL", "no-op",
          pkv_transfer_destroy(nullptr);
          return PKV_OK;),
        S("pkv_transfer_engine_create", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return pkv_transfer_engine_create(nullptr, nullptr);),
        S("pkv_transfer_engine_create", PKV_CLASS_STRUCT, "opts->struct_size = 3", kInv,
          "struct_size", pkv_transfer_options o;
          pkv_transfer_options_init(&o); o.struct_size = 3; pkv_transfer_engine* t = nullptr;
          return pkv_transfer_engine_create(&o, &t);),
        S("pkv_transfer_engine_progress", PKV_CLASS_NULL, "engine = NULL", kInv, "engine",
          return pkv_transfer_engine_progress(nullptr);),
        S("pkv_transfer_export", PKV_CLASS_NULL, "engine = NULL", kInv, "engine",
          return pkv_transfer_export(nullptr, e.pool, e.a, &e.u64);),
        S("pkv_transfer_export_descriptor", PKV_CLASS_NULL, "engine = NULL", kInv, "engine",
          return pkv_transfer_export_descriptor(nullptr, 1, nullptr, 0, &e.u64);),
        S("pkv_transfer_export_release", PKV_CLASS_NULL, "engine = NULL", kInv, "engine",
          return pkv_transfer_export_release(nullptr, 1);),
        S("pkv_transfer_engine_num_exports", PKV_CLASS_NULL, "engine = NULL", kInv, "engine",
          return pkv_transfer_engine_num_exports(nullptr, &e.u64);),
        S("pkv_transfer_import", PKV_CLASS_NULL, "engine = NULL", kInv, "engine",
          const uint8_t d[4] = {};
          pkv_transfer* t = nullptr;
          return pkv_transfer_import(nullptr, e.pool, nullptr, d, 4, &t);),
        S("pkv_transfer_poll", PKV_CLASS_NULL, "transfer = NULL", kInv, "transfer", uint32_t st;
          return pkv_transfer_poll(nullptr, &st, nullptr);),
        S("pkv_transfer_cancel", PKV_CLASS_NULL, "transfer = NULL", kInv, "transfer",
          return pkv_transfer_cancel(nullptr);),
        S("pkv_transfer_bytes", PKV_CLASS_NULL, "transfer = NULL", kInv, "transfer",
          return pkv_transfer_bytes(nullptr, &e.u64);),

        // ------------------------------------------------------------ MLA (issue 19)
        S("pkv_pool_create", PKV_CLASS_RANGE, "kv_layout = 2", kInv, "kv_layout",
          pkv_pool_options o = mla_opts();
          o.kv_layout = 2; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "kv_lora_rank = 0 (or > 4096) on an MLA pool", kInv,
          "kv_lora_rank", pkv_pool_options o = mla_opts();
          o.kv_lora_rank = 0; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "kv_lora_rank set on an MHA pool", kInv,
          "kv_lora_rank", pkv_pool_options o = storage_opts();
          o.kv_lora_rank = 512; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_RANGE, "num_kv_heads = 2 on an MLA pool", kInv,
          "num_kv_heads", pkv_pool_options o = mla_opts();
          o.num_kv_heads = 2; return create_with(o, e);),
        S("pkv_pool_create", PKV_CLASS_DTYPE, "dtype fp8 on an MLA pool", kInv, "MLA storage type",
          pkv_pool_options o = mla_opts();
          o.dtype = PKV_DTYPE_FP8_E4M3; return create_with(o, e);),
        S("pkv_pool_kv_tensor", PKV_CLASS_RANGE, "which = PKV_KV_VALUE on an MLA pool", kInv,
          "no V", return with_mla([&](MlaEnv& m) {
            pkv_tensor t;
            return pkv_pool_kv_tensor(m.pool, 0, PKV_KV_VALUE, &t);
          });),
        S("pkv_mla_cache_write", PKV_CLASS_NULL, "batch = NULL", kInv, "batch",
          return with_mla(
              [](MlaEnv& m) { return pkv_mla_cache_write(nullptr, 0, &m.ct, &m.pt, nullptr); });),
        S("pkv_mla_cache_write", PKV_CLASS_NULL, "kv_c = NULL", kInv, "kv_c",
          return with_mla(
              [](MlaEnv& m) { return pkv_mla_cache_write(m.batch, 0, nullptr, &m.pt, nullptr); });),
        S("pkv_mla_cache_write", PKV_CLASS_NULL, "k_pe = NULL (pool has a rope part)", kInv, "k_pe",
          return with_mla(
              [](MlaEnv& m) { return pkv_mla_cache_write(m.batch, 0, &m.ct, nullptr, nullptr); });),
        S("pkv_mla_cache_write", PKV_CLASS_RANGE, "layer = num_layers", kInv, "layer",
          return with_mla(
              [](MlaEnv& m) { return pkv_mla_cache_write(m.batch, 2, &m.ct, &m.pt, nullptr); });),
        S("pkv_mla_cache_write", PKV_CLASS_SHAPE, "kv_c width != kv_lora_rank", kInv,
          "kv_c has shape", return with_mla([](MlaEnv& m) {
            pkv_tensor c = m.ct;
            c.shape[1] = 16;
            return pkv_mla_cache_write(m.batch, 0, &c, &m.pt, nullptr);
          });),
        S("pkv_mla_cache_write", PKV_CLASS_DTYPE, "kv_c f16 on an f32 pool", kInv, "dtype",
          return with_mla([](MlaEnv& m) {
            pkv_tensor c = m.ct;
            c.dtype = PKV_DTYPE_F16;
            return pkv_mla_cache_write(m.batch, 0, &c, &m.pt, nullptr);
          });),
        S("pkv_mla_cache_write", PKV_CLASS_STATE, "a pool that is not MLA", kState,
          "needs an MLA pool", return pkv_mla_cache_write(e.batch, 0, &e.kt, &e.kt, nullptr);),
        S("pkv_mla_attention", PKV_CLASS_NULL, "batch = NULL", kInv, "batch",
          return with_mla([](MlaEnv& m) {
            return pkv_mla_attention(nullptr, 0, &m.qlt, &m.qpt, &m.ot, nullptr, &m.params,
                                     nullptr);
          });),
        S("pkv_mla_attention", PKV_CLASS_NULL, "q_latent = NULL", kInv, "q_latent",
          return with_mla([](MlaEnv& m) {
            return pkv_mla_attention(m.batch, 0, nullptr, &m.qpt, &m.ot, nullptr, &m.params,
                                     nullptr);
          });),
        S("pkv_mla_attention", PKV_CLASS_NULL, "out = NULL", kInv, "out",
          return with_mla([](MlaEnv& m) {
            return pkv_mla_attention(m.batch, 0, &m.qlt, &m.qpt, nullptr, nullptr, &m.params,
                                     nullptr);
          });),
        S("pkv_mla_attention", PKV_CLASS_NULL, "params = NULL (no default scale)", kInv, "params",
          return with_mla([](MlaEnv& m) {
            return pkv_mla_attention(m.batch, 0, &m.qlt, &m.qpt, &m.ot, nullptr, nullptr, nullptr);
          });),
        S("pkv_mla_attention", PKV_CLASS_RANGE, "params->softmax_scale = 0", kInv, "softmax_scale",
          return with_mla([](MlaEnv& m) {
            pkv_attention_params p = m.params;
            p.softmax_scale = 0;
            return pkv_mla_attention(m.batch, 0, &m.qlt, &m.qpt, &m.ot, nullptr, &p, nullptr);
          });),
        S("pkv_mla_attention", PKV_CLASS_RANGE, "params->logit_softcap or sliding_window set",
          PKV_E_UNSUPPORTED, "logit_softcap", return with_mla([](MlaEnv& m) {
            pkv_attention_params p = m.params;
            p.logit_softcap = 30;
            return pkv_mla_attention(m.batch, 0, &m.qlt, &m.qpt, &m.ot, nullptr, &p, nullptr);
          });),
        S("pkv_mla_attention", PKV_CLASS_SHAPE, "q_pe heads != q_latent heads", kInv,
          "q_pe has shape", return with_mla([](MlaEnv& m) {
            pkv_tensor p = m.qpt;
            p.shape[1] = 2;
            p.shape[2] = 16;
            return pkv_mla_attention(m.batch, 0, &m.qlt, &p, &m.ot, nullptr, &m.params, nullptr);
          });),
        S("pkv_mla_attention", PKV_CLASS_ALIAS, "out = q_latent", kInv, "overlaps",
          return with_mla([](MlaEnv& m) {
            return pkv_mla_attention(m.batch, 0, &m.qlt, &m.qpt, &m.qlt, nullptr, &m.params,
                                     nullptr);
          });),
        S("pkv_mla_attention", PKV_CLASS_STATE, "a pool that is not MLA", kState,
          "needs an MLA pool", pkv_attention_params p;
          pkv_attention_params_init(&p); p.softmax_scale = 0.1f;
          return pkv_mla_attention(e.batch, 0, &e.qt, &e.qt, &e.ot, nullptr, &p, nullptr);),
  };
}

}  // namespace

Env::Env() {
  pkv_pool_options o = storage_opts();
  must(pkv_pool_create(&o, &pool), "pool_create");
  for (int i = 0; i < 64; ++i) tokens[i] = 1000 + i * 7;
  must(pkv_seq_create(pool, nullptr, &a), "seq_create a");
  must(pkv_seq_append(pool, a, tokens, 40, 0), "append a");
  {  // one step computes a's 40 tokens (writing every layer commits it)
    pkv_batch* first = nullptr;
    const uint32_t all = 40;
    must(pkv_batch_prepare(pool, &a, &all, 1, nullptr, &first), "prepare a");
    std::vector<float> kb, vb;
    pkv_tensor k40 = dense(kb, 40, 2, 64), v40 = dense(vb, 40, 2, 64);
    for (uint32_t layer = 0; layer < 2; ++layer)
      must(pkv_cache_write(first, layer, &k40, &v40, nullptr), "cache_write a");
    pkv_batch_destroy(first);
  }
  must(pkv_seq_fork(pool, a, &b), "fork");
  must(pkv_seq_append(pool, b, tokens + 40, 3, 0), "append b");
  must(pkv_seq_create(pool, nullptr, &empty), "seq_create empty");
  must(pkv_seq_create(pool, nullptr, &dead), "seq_create dead");
  must(pkv_seq_free(pool, dead), "free dead");
  unknown = (uint64_t(0x7777) << 32) | 999;
  const pkv_seq_id ids[2] = {a, b};
  const uint32_t qc[2] = {8, 3};
  must(pkv_batch_prepare(pool, ids, qc, 2, nullptr, &batch), "prepare");
  kt = dense(k, rows, 2, 64);
  vt = dense(v, rows, 2, 64);
  qt = dense(q, rows, 4, 64);
  ot = dense(out, rows, 4, 64);
  lse.assign(size_t(rows) * 4, 0.f);
  const int64_t lshape[2] = {rows, 4};
  must(pkv_tensor_init(lse.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 2, lshape, &lt), "lse");
  for (uint32_t layer = 0; layer < 2; ++layer)
    must(pkv_cache_write(batch, layer, &kt, &vt, nullptr), "cache_write");

  pkv_pool_options mo;
  pkv_pool_options_init(&mo);
  mo.block_size = 4;
  mo.num_blocks = 16;
  mo.num_threads = 1;
  must(pkv_pool_create(&mo, &mgr), "pool_create mgr");
  must(pkv_seq_create(mgr, nullptr, &m), "seq_create m");
  must(pkv_seq_append(mgr, m, tokens, 8, 0), "append m");
  {  // an earlier step computed the first 8 (manager-only: committed explicitly)
    pkv_batch* first = nullptr;
    const uint32_t q8 = 8;
    must(pkv_batch_prepare(mgr, &m, &q8, 1, nullptr, &first), "prepare mgr first");
    must(pkv_batch_commit(first), "commit mgr first");
    pkv_batch_destroy(first);
  }
  must(pkv_seq_append(mgr, m, tokens + 8, 2, 0), "append m 2");
  const uint32_t q2 = 2;
  must(pkv_batch_prepare(mgr, &m, &q2, 1, nullptr, &mgr_batch), "prepare mgr");
}

Env::~Env() {
  pkv_batch_destroy(batch);
  pkv_batch_destroy(mgr_batch);
  pkv_pool_destroy(pool);
  pkv_pool_destroy(mgr);
}

const std::vector<Case>& bad_input_cases() {
  static const std::vector<Case> cases = make_cases();
  return cases;
}

const char* status_name(pkv_status s) {
  switch (s) {
    case PKV_OK:
      return "PKV_OK";
    case PKV_E_INVALID_ARGUMENT:
      return "PKV_E_INVALID_ARGUMENT";
    case PKV_E_NOT_FOUND:
      return "PKV_E_NOT_FOUND";
    case PKV_E_OUT_OF_BLOCKS:
      return "PKV_E_OUT_OF_BLOCKS";
    case PKV_E_OUT_OF_MEMORY:
      return "PKV_E_OUT_OF_MEMORY";
    case PKV_E_UNSUPPORTED:
      return "PKV_E_UNSUPPORTED";
    case PKV_E_CUDA:
      return "PKV_E_CUDA";
    case PKV_E_BUFFER_TOO_SMALL:
      return "PKV_E_BUFFER_TOO_SMALL";
    case PKV_E_INVALID_STATE:
      return "PKV_E_INVALID_STATE";
    case PKV_E_INVARIANT:
      return "PKV_E_INVARIANT";
    case PKV_E_INTERNAL:
      return "PKV_E_INTERNAL";
    default:
      return "?";
  }
}

}  // namespace pkv_rel
