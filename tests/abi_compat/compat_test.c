/* An old ABI-1 user against the current library (docs/conventions.md, "Old headers").
 *
 * Compiled once per header set in tests/abi_compat/v<commit>/ (the public headers as they were at
 * that commit, extracted with git show) and linked against the current libpagedkv. It does what a
 * user of those headers does: init the options, create a pool, sequences, appends, prefix matches,
 * events, a step plan, cache writes and CPU attention, stats, frees, error messages. Results are
 * checked against what the user can observe (bytes read back, ids, statuses, counts); every output
 * struct carries a canary after its old size, and every input struct is followed by 0xFF bytes
 * that a read past the old size would take as a (refused or different) appended field.
 *
 * PKV_COMPAT_LEVEL says which calls the header set has: 1 first wave (4da0352), 2 second wave
 * (0dff910: commit/abort, num_computed_tokens), 3 c2a1c9f (partial prefix hits), 4 7869d05
 * (_init_sized, frozen _init sizes). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pagedkv/pagedkv.h"

#ifndef PKV_COMPAT_LEVEL
#error "PKV_COMPAT_LEVEL must be defined"
#endif

static int g_failures = 0;
static int g_known = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      g_failures++;                                                            \
    }                                                                          \
  } while (0)
#define CHECK_OK(expr)                                                              \
  do {                                                                              \
    pkv_status st_ = (expr);                                                        \
    if (st_ != PKV_OK) {                                                            \
      fprintf(stderr, "%s:%d: %s = %d (%s)\n", __FILE__, __LINE__, #expr, (int)st_, \
              pkv_last_error_message());                                            \
      g_failures++;                                                                 \
    }                                                                               \
  } while (0)

/* The current library's frozen sizes (capi/src/capi_util.h k*Frozen): what pkv_X_init writes,
 * forever. Headers older than 7869d05 have smaller structs, so their _init overruns them. */
#define FROZEN_pkv_pool_options 144u
#define FROZEN_pkv_seq_options 56u
#define FROZEN_pkv_seq_info 56u
#define FROZEN_pkv_pool_stats 168u
#define FROZEN_pkv_hash_options 72u
#define FROZEN_pkv_batch_info 40u
#define FROZEN_pkv_attention_params 16u
#define FROZEN_pkv_prefix_match 24u

#define CANARY 0xC3
#define POISON 0xFF
#define SLACK 256

/* Bytes written by init: run it over two patterns, a byte is written if it differs from either. */
static size_t written_extent(const unsigned char* a, const unsigned char* b, size_t n) {
  size_t i, e = 0;
  for (i = 0; i < n; i++)
    if (a[i] != 0xA5 || b[i] != 0x5A) e = i + 1;
  return e;
}

static void check_init_extent(const char* name, size_t extent, size_t old_size, size_t frozen) {
  if (extent <= old_size) return;
  if (PKV_COMPAT_LEVEL < 4 && extent == frozen) {
    /* docs/reliability.md, "Defects found": cannot be fixed inside ABI 1. */
    printf("KNOWN BREAK: %s writes %zu bytes into this header's %zu-byte struct\n", name, extent,
           old_size);
    g_known++;
    return;
  }
  fprintf(stderr, "%s wrote %zu bytes, struct is %zu (frozen %zu)\n", name, extent, old_size,
          frozen);
  g_failures++;
}

/* What the old user's pkv_X_init(&s) gave it with the library of its time: sizeof(T) bytes of
 * defaults, struct_size = sizeof(T). The current init runs into a larger buffer (it overruns a
 * pre-7869d05 struct by design, checked and reported above) and the first sizeof(T) bytes are
 * kept, followed by POISON bytes that a read past the old size would see. */
#define OLD_INIT(T, fn, holder)                                                              \
  do {                                                                                       \
    static union {                                                                           \
      T s;                                                                                   \
      unsigned char b[sizeof(T) + SLACK];                                                    \
    } ua_, ub_;                                                                              \
    memset(&ua_, 0xA5, sizeof ua_);                                                          \
    memset(&ub_, 0x5A, sizeof ub_);                                                          \
    fn(&ua_.s);                                                                              \
    fn(&ub_.s);                                                                              \
    check_init_extent(#fn, written_extent(ua_.b, ub_.b, sizeof ua_), sizeof(T), FROZEN_##T); \
    memset(&(holder), POISON, sizeof(holder));                                               \
    memcpy(&(holder).s, &ua_.s, sizeof(T));                                                  \
    (holder).s.struct_size = (uint32_t)sizeof(T);                                            \
  } while (0)

/* An output struct of the old size followed by a canary. */
#define OUT_HOLDER(T)          \
  struct {                     \
    T s;                       \
    unsigned char tail[SLACK]; \
  }

static int tail_intact(const unsigned char* tail, unsigned char v) {
  int i;
  for (i = 0; i < SLACK; i++)
    if (tail[i] != v) return 0;
  return 1;
}

#define PREP_OUT(T, fn, holder)           \
  do {                                    \
    OLD_INIT(T, fn, holder);              \
    memset((holder).tail, CANARY, SLACK); \
  } while (0)

enum { BS = 16, LAYERS = 2, HEADS = 1, DIM = 64, NTOK = 40 };

static float kv_value(uint32_t layer, int which, int t, int d) {
  return (float)((layer * 7 + (unsigned)which * 3 + (unsigned)t * 5 + (unsigned)d) % 23) / 23.0f -
         0.4f;
}

static void check_versions(void) {
  pkv_status c;
  CHECK(pkv_abi_version() == PKV_ABI_VERSION);
  CHECK(PKV_ABI_VERSION == 1);
  CHECK(pkv_version_string() != NULL);
  CHECK(pkv_version_number() / 10000 == PKV_VERSION_MAJOR);
  for (c = PKV_E_INTERNAL; c <= PKV_OK; c++) {
    const char* s = pkv_status_string(c);
    CHECK(s != NULL && s[0] != '\0');
  }
  CHECK(strcmp(pkv_status_string(PKV_E_NOT_FOUND), pkv_status_string(PKV_E_OUT_OF_BLOCKS)) != 0);
  CHECK(pkv_hash_size(PKV_HASH_SHA256_CBOR) == 32);
  CHECK(pkv_dtype_size(PKV_DTYPE_F32) == 4 && pkv_dtype_size(PKV_DTYPE_BF16) == 2);
}

static pkv_pool* make_pool(uint32_t num_layers) {
  OUT_HOLDER(pkv_pool_options) o, got;
  pkv_pool* pool = NULL;
  OLD_INIT(pkv_pool_options, pkv_pool_options_init, o);
  /* the documented defaults of the fields this header has */
  CHECK(o.s.block_size == 16);
  CHECK(o.s.hash_algo == PKV_HASH_SHA256_CBOR);
  CHECK(o.s.enable_prefix_caching == 1);
  CHECK(o.s.max_events == 65536);
  CHECK(o.s.dtype == PKV_DTYPE_BF16);
  CHECK(o.s.device_type == PKV_DEVICE_CPU);
  CHECK(o.s.sliding_window == 0 && o.s.enable_events == 0 && o.s.num_layers == 0);
  o.s.block_size = BS;
  o.s.num_blocks = 64;
  o.s.enable_events = 1;
  o.s.num_layers = num_layers;
  o.s.num_kv_heads = HEADS;
  o.s.head_dim = DIM;
  o.s.dtype = PKV_DTYPE_F32;
  o.s.num_threads = 1;
  CHECK_OK(pkv_pool_create(&o.s, &pool));
  if (!pool) return NULL;
  CHECK(tail_intact(o.tail, POISON));

  PREP_OUT(pkv_pool_options, pkv_pool_options_init, got);
  CHECK_OK(pkv_pool_get_options(pool, &got.s));
  CHECK(got.s.struct_size == sizeof got.s);
  CHECK(tail_intact(got.tail, CANARY));
  CHECK(got.s.block_size == BS && got.s.num_blocks == 64 && got.s.num_layers == num_layers);
  CHECK(got.s.head_dim == DIM && got.s.dtype == PKV_DTYPE_F32 && got.s.enable_events == 1);
  CHECK(got.s.enable_prefix_caching == 1 && got.s.hash_algo == PKV_HASH_SHA256_CBOR);

  /* a struct_size below every released size is refused, with a message naming it */
  o.s.struct_size = 8;
  {
    pkv_pool* bad = NULL;
    char buf[256];
    CHECK(pkv_pool_create(&o.s, &bad) == PKV_E_INVALID_ARGUMENT);
    CHECK(bad == NULL);
    CHECK(strstr(pkv_last_error_message(), "struct_size") != NULL);
    CHECK(pkv_last_error_copy(buf, sizeof buf) > 0 && strstr(buf, "struct_size") != NULL);
  }
  return pool;
}

static pkv_seq_id make_seq(pkv_pool* pool) {
  OUT_HOLDER(pkv_seq_options) so;
  pkv_seq_id id = PKV_SEQ_ID_INVALID;
  OLD_INIT(pkv_seq_options, pkv_seq_options_init, so);
  CHECK(so.s.lora_id == 0 && so.s.cache_salt == NULL && so.s.num_mm_items == 0);
  CHECK_OK(pkv_seq_create(pool, &so.s, &id));
  CHECK(id != PKV_SEQ_ID_INVALID);
  return id;
}

static void get_info(pkv_pool* pool, pkv_seq_id id, pkv_seq_info* out) {
  OUT_HOLDER(pkv_seq_info) info;
  PREP_OUT(pkv_seq_info, pkv_seq_info_init, info);
  CHECK_OK(pkv_seq_get_info(pool, id, &info.s));
  CHECK(info.s.struct_size == sizeof info.s);
  CHECK(tail_intact(info.tail, CANARY));
  *out = info.s;
}

static void get_stats(pkv_pool* pool, pkv_pool_stats* out) {
  OUT_HOLDER(pkv_pool_stats) st;
  PREP_OUT(pkv_pool_stats, pkv_pool_stats_init, st);
  CHECK_OK(pkv_pool_get_stats(pool, &st.s));
  CHECK(st.s.struct_size == sizeof st.s);
  CHECK(tail_intact(st.tail, CANARY));
  *out = st.s;
}

static int64_t plan_i64(const pkv_tensor* t, int64_t i) {
  const char* base = (const char*)t->data + t->byte_offset;
  if (t->dtype == PKV_DTYPE_I64) return ((const int64_t*)(const void*)base)[i];
  return ((const int32_t*)(const void*)base)[i];
}

/* Element offset of [i0, i1, i2, i3] in a 4-d tensor (zero strides: dense row-major). */
static int64_t offset4(const pkv_tensor* t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  int64_t s[4];
  int k;
  if (t->strides[0] == 0 && t->strides[3] == 0) {
    s[3] = 1;
    for (k = 2; k >= 0; k--) s[k] = s[k + 1] * t->shape[k + 1];
  } else {
    for (k = 0; k < 4; k++) s[k] = t->strides[k];
  }
  return i0 * s[0] + i1 * s[1] + i2 * s[2] + i3 * s[3];
}

static void storage_flow(void) {
  pkv_pool* pool = make_pool(LAYERS);
  pkv_seq_id a, b;
  int32_t tokens[NTOK], table[8], table_b[8];
  pkv_block_hash hashes[8], ref[8];
  uint64_t n = 0, nb = 0, cached = 0;
  int t, d;
  uint32_t layer;
  pkv_seq_info info;
  pkv_pool_stats stats;
  pkv_batch* batch = NULL;
  static float k[NTOK * HEADS * DIM], v[NTOK * HEADS * DIM], q[NTOK * HEADS * DIM],
      out[NTOK * HEADS * DIM];
  int64_t shape[3] = {NTOK, HEADS, DIM};
  pkv_tensor kt, vt, qt, ot;

  if (!pool) return;
  for (t = 0; t < NTOK; t++) tokens[t] = 1000 + t;
  a = make_seq(pool);
  CHECK_OK(pkv_seq_append(pool, a, tokens, NTOK, 0));
  get_info(pool, a, &info);
  CHECK(info.num_tokens == NTOK && info.num_blocks == 3 && info.num_slots == 3 * BS);
  CHECK(info.num_cached_tokens == 0 && info.lora_id == 0);

  CHECK_OK(pkv_seq_get_block_table(pool, a, table, 8, &n));
  CHECK(n == 3);
  CHECK(table[0] != PKV_NULL_BLOCK && table[1] != table[0] && table[2] != table[1]);
  CHECK(pkv_seq_get_block_table(pool, a, table, 1, &n) == PKV_E_BUFFER_TOO_SMALL && n == 3);

  /* the step: plan, write every layer, attention */
  {
    const pkv_seq_id seqs[1] = {a};
    const uint32_t qc[1] = {NTOK};
    OUT_HOLDER(pkv_batch_info) bi;
    pkv_tensor sm;
    CHECK_OK(pkv_batch_prepare(pool, seqs, qc, 1, NULL, &batch));
    if (!batch) {
      pkv_pool_destroy(pool);
      return;
    }
    PREP_OUT(pkv_batch_info, pkv_batch_info_init, bi);
    CHECK_OK(pkv_batch_get_info(batch, &bi.s));
    CHECK(tail_intact(bi.tail, CANARY) && bi.s.struct_size == sizeof bi.s);
    CHECK(bi.s.num_seqs == 1 && bi.s.num_tokens == NTOK && bi.s.max_query == NTOK);
    CHECK(bi.s.block_size == BS && bi.s.num_pages == 3 && bi.s.max_context == NTOK);
    CHECK_OK(pkv_batch_plan_tensor(batch, PKV_PLAN_SLOT_MAPPING, &sm));
    CHECK(sm.dtype == PKV_DTYPE_I64 && sm.ndim == 1 && sm.shape[0] == NTOK);
    for (t = 0; t < NTOK; t++) CHECK(plan_i64(&sm, t) == (int64_t)table[t / BS] * BS + t % BS);
    CHECK_OK(pkv_batch_plan_tensor(batch, PKV_PLAN_CONTEXT_LENS, &sm));
    CHECK(plan_i64(&sm, 0) == NTOK);
  }
  CHECK_OK(pkv_tensor_init(k, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &kt));
  CHECK_OK(pkv_tensor_init(v, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &vt));
  CHECK_OK(pkv_tensor_init(q, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &qt));
  CHECK_OK(pkv_tensor_init(out, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &ot));
  for (layer = 0; layer < LAYERS; layer++) {
    OUT_HOLDER(pkv_attention_params) ap;
    pkv_tensor ks, vs;
    for (t = 0; t < NTOK; t++)
      for (d = 0; d < DIM; d++) {
        k[t * DIM + d] = kv_value(layer, 0, t, d);
        v[t * DIM + d] = kv_value(layer, 1, t, d);
        q[t * DIM + d] = kv_value(layer, 2, t, d);
      }
    CHECK_OK(pkv_cache_write(batch, layer, &kt, &vt, NULL));
    /* the bytes read back from the pool's storage */
    CHECK_OK(pkv_pool_kv_tensor(pool, layer, PKV_KV_KEY, &ks));
    CHECK_OK(pkv_pool_kv_tensor(pool, layer, PKV_KV_VALUE, &vs));
    CHECK(ks.ndim == 4 && ks.shape[1] == HEADS && ks.shape[2] == BS && ks.shape[3] == DIM);
    for (t = 0; t < NTOK; t++)
      for (d = 0; d < DIM; d++) {
        const float* kp = (const float*)((const char*)ks.data + ks.byte_offset);
        const float* vp = (const float*)((const char*)vs.data + vs.byte_offset);
        CHECK(kp[offset4(&ks, table[t / BS], 0, t % BS, d)] == k[t * DIM + d]);
        CHECK(vp[offset4(&vs, table[t / BS], 0, t % BS, d)] == v[t * DIM + d]);
      }
    OLD_INIT(pkv_attention_params, pkv_attention_params_init, ap);
    CHECK(ap.s.softmax_scale == 0.0f && ap.s.sliding_window == 0 && ap.s.logit_softcap == 0.0f);
    memset(out, 0, sizeof out);
    CHECK_OK(pkv_attention_forward(batch, layer, &qt, &ot, NULL, &ap.s, NULL));
    /* reference: causal softmax(q k^T / sqrt(d)) v for a few rows */
    for (t = 0; t < NTOK; t += 13) {
      double m = -1e30, den = 0, acc[DIM];
      int j;
      for (d = 0; d < DIM; d++) acc[d] = 0;
      for (j = 0; j <= t; j++) {
        double s = 0;
        for (d = 0; d < DIM; d++) s += (double)q[t * DIM + d] * k[j * DIM + d];
        s /= sqrt((double)DIM);
        if (s > m) m = s;
      }
      for (j = 0; j <= t; j++) {
        double s = 0, w;
        for (d = 0; d < DIM; d++) s += (double)q[t * DIM + d] * k[j * DIM + d];
        w = exp(s / sqrt((double)DIM) - m);
        den += w;
        for (d = 0; d < DIM; d++) acc[d] += w * v[j * DIM + d];
      }
      for (d = 0; d < DIM; d++) CHECK(fabs(acc[d] / den - out[t * DIM + d]) < 1e-4);
    }
  }
  pkv_batch_destroy(batch); /* every layer written: the step counts as computed */
#if PKV_COMPAT_LEVEL >= 2
  get_info(pool, a, &info);
  CHECK(info.num_computed_tokens == NTOK);
#endif

  /* the two full blocks are cached under the hashes a user computes with pkv_hash_prefix */
  CHECK_OK(pkv_seq_get_block_hashes(pool, a, hashes, 8, &nb));
  CHECK(nb == 2);
  {
    OUT_HOLDER(pkv_hash_options) ho;
    uint64_t nr = 0;
    OLD_INIT(pkv_hash_options, pkv_hash_options_init, ho);
    CHECK(ho.s.algo == PKV_HASH_SHA256_CBOR && ho.s.lora_id == 0 && ho.s.cache_salt == NULL);
    ho.s.block_size = BS;
    ho.s.seed = "";
    CHECK_OK(pkv_hash_prefix(&ho.s, tokens, NTOK, ref, 8, &nr));
    CHECK(nr == 2 && memcmp(ref, hashes, 2 * sizeof ref[0]) == 0);
    CHECK(tail_intact(ho.tail, POISON));
  }
  {
    pkv_event ev[8];
    uint64_t ne = 0;
    CHECK_OK(pkv_pool_drain_events(pool, ev, 8, &ne));
    CHECK(ne == 2);
    if (ne == 2) {
      CHECK(ev[0].type == PKV_EVENT_BLOCK_STORED && ev[1].type == PKV_EVENT_BLOCK_STORED);
      CHECK(ev[0].seq_no == 1 && ev[1].seq_no == 2);
      CHECK(ev[0].block_id == table[0] && ev[1].block_id == table[1]);
      CHECK(ev[0].num_tokens == BS && ev[0].has_parent == 0 && ev[1].has_parent == 1);
      CHECK(memcmp(&ev[0].block_hash, &hashes[0], sizeof hashes[0]) == 0);
      CHECK(memcmp(&ev[1].parent_hash, &hashes[0], sizeof hashes[0]) == 0);
    }
  }

  /* a second sequence with the same prompt: two full blocks from the prefix cache */
  b = make_seq(pool);
  CHECK_OK(pkv_seq_match_prefix(pool, b, tokens, NTOK, &cached));
  CHECK(cached == 2 * BS);
  CHECK_OK(pkv_seq_append(pool, b, tokens + cached, NTOK - cached, 0));
  CHECK_OK(pkv_seq_get_block_table(pool, b, table_b, 8, &n));
  CHECK(n == 3 && table_b[0] == table[0] && table_b[1] == table[1] && table_b[2] != table[2]);
  get_info(pool, b, &info);
  CHECK(info.num_tokens == NTOK && info.num_cached_tokens == 2 * BS);
#if PKV_COMPAT_LEVEL >= 3
  {
    pkv_seq_id c = make_seq(pool);
    OUT_HOLDER(pkv_prefix_match) pm;
    PREP_OUT(pkv_prefix_match, pkv_prefix_match_init, pm);
    CHECK_OK(pkv_seq_match_prefix_partial(pool, c, tokens, NTOK, &pm.s));
    CHECK(tail_intact(pm.tail, CANARY));
    /* partial reuse is off by default: full blocks only */
    CHECK(pm.s.num_cached == 2 * BS && pm.s.partial_tokens == 0);
    CHECK(pm.s.copy_src == PKV_NULL_BLOCK && pm.s.copy_dst == PKV_NULL_BLOCK);
    CHECK_OK(pkv_seq_free(pool, c));
  }
#endif
  get_stats(pool, &stats);
  CHECK(stats.block_size == BS && stats.num_blocks == 64 && stats.num_seqs == 2);
  CHECK(stats.num_tokens == 2 * NTOK && stats.num_cached_blocks == 2);
  CHECK(stats.prefix_hit_tokens >= 2 * BS && stats.num_events_dropped == 0);
  CHECK(stats.num_used_blocks == 4 && stats.kv_bytes_per_block == 2u * LAYERS * BS * DIM * 4u);

  CHECK_OK(pkv_seq_free(pool, a));
  CHECK_OK(pkv_seq_free(pool, b));
  CHECK(pkv_seq_free(pool, a) == PKV_E_NOT_FOUND);
  CHECK(pkv_last_error_message()[0] != '\0');
  CHECK(pkv_seq_get_info(pool, b, &info) == PKV_E_NOT_FOUND);
  CHECK_OK(pkv_pool_validate(pool));
  CHECK(pkv_last_error_message()[0] == '\0');
  get_stats(pool, &stats);
  CHECK(stats.num_seqs == 0 && stats.num_used_blocks == 0 && stats.num_cached_blocks == 2);
  CHECK_OK(pkv_pool_reset_prefix_cache(pool));
  get_stats(pool, &stats);
  CHECK(stats.num_cached_blocks == 0);
  pkv_pool_destroy(pool);
}

/* A manager-only pool (the engine writes K/V elsewhere): a plan destroyed without commit counts
 * as committed for ABI-1 callers, so the step's full blocks become prefix hits. */
static void manager_only_flow(void) {
  pkv_pool* pool = make_pool(0);
  pkv_seq_id a, b;
  int32_t tokens[2 * BS + 1];
  uint64_t cached = 0;
  pkv_batch* batch = NULL;
  int t;
  const uint32_t qc[1] = {2 * BS};
  if (!pool) return;
  for (t = 0; t < 2 * BS + 1; t++) tokens[t] = 7 + t;
  a = make_seq(pool);
  CHECK_OK(pkv_seq_append(pool, a, tokens, 2 * BS, 0));
  CHECK_OK(pkv_batch_prepare(pool, &a, qc, 1, NULL, &batch));
  pkv_batch_destroy(batch);
  b = make_seq(pool);
  /* a hit leaves at least one token to compute (as documented in ABI 1): one more token */
  CHECK_OK(pkv_seq_match_prefix(pool, b, tokens, 2 * BS + 1, &cached));
  CHECK(cached == 2 * BS);
  {
    uint64_t need = 0;
    CHECK_OK(pkv_seq_blocks_needed(pool, b, 1, 0, &need));
    CHECK(need == 1);
  }
  CHECK(pkv_seq_free(pool, 0) == PKV_E_NOT_FOUND);
  pkv_pool_destroy(pool);
}

#if PKV_COMPAT_LEVEL >= 4
/* The header that added _init_sized: _init writes exactly its struct, _init_sized(sizeof). */
static void init_sized_flow(void) {
  OUT_HOLDER(pkv_pool_options) o;
  memset(&o, CANARY, sizeof o);
  CHECK_OK(pkv_pool_options_init_sized(&o.s, sizeof o.s));
  CHECK(o.s.struct_size == sizeof o.s && tail_intact(o.tail, CANARY) && o.s.block_size == 16);
  memset(&o, CANARY, sizeof o);
  pkv_pool_options_init(&o.s);
  CHECK(o.s.struct_size == sizeof o.s && tail_intact(o.tail, CANARY));
}
#endif

int main(void) {
  check_versions();
  storage_flow();
  manager_only_flow();
#if PKV_COMPAT_LEVEL >= 4
  init_sized_flow();
#endif
  if (g_failures) {
    fprintf(stderr, "abi_compat level %d: %d check(s) failed\n", PKV_COMPAT_LEVEL, g_failures);
    return 1;
  }
  printf("abi_compat level %d: ok (%d known init overruns, docs/reliability.md)\n",
         PKV_COMPAT_LEVEL, g_known);
  return 0;
}
