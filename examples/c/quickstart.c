/* pagedkv quickstart: a pool with KV storage, two requests sharing a prompt
 * prefix, engine steps (plan, cache write, attention) on random data: the
 * second request, admitted after the first one's step, hits the prefix
 * cache. Stats, cleanup.
 *
 * Build: cc -std=c99 quickstart.c $(pkg-config --cflags --libs pagedkv) -lm
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pagedkv/pagedkv.h"

/* Every pagedkv call returns a status; print the message and bail out. */
#define CHECK(call)                                                           \
  do {                                                                        \
    pkv_status st_ = (call);                                                  \
    if (st_ != PKV_OK) {                                                      \
      fprintf(stderr, "%s failed: %s\n  %s\n", #call, pkv_status_string(st_), \
              pkv_last_error_message());                                      \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

enum { BLOCK = 16, LAYERS = 2, KV_HEADS = 2, Q_HEADS = 4, HEAD_DIM = 64, PROMPT = 100 };

static float frand(void) { return (float)rand() / (float)RAND_MAX * 2.0f - 1.0f; }

static void fill_random(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = frand();
}

static pkv_tensor rows(float* data, int64_t n0, int64_t n1) {
  int64_t shape[3] = {n0, n1, HEAD_DIM};
  pkv_tensor t;
  CHECK(pkv_tensor_init(data, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &t));
  return t;
}

/* One engine step: the plan, then per layer the step's K/V written into the
 * cache and attention over it. Writing every layer commits the step: only
 * then do its tokens count as computed (and become prefix-cache hits). If
 * the model failed half-way, destroying the plan would count nothing. */
static void run_step(pkv_pool* pool, pkv_seq_id* seqs, uint32_t* queries, uint32_t n) {
  pkv_batch* batch = NULL;
  CHECK(pkv_batch_prepare(pool, seqs, queries, n, NULL, &batch));
  pkv_batch_info info;
  pkv_batch_info_init(&info);
  CHECK(pkv_batch_get_info(batch, &info));
  int64_t T = (int64_t)info.num_tokens;
  printf("step plan: %llu query tokens, %llu pages\n", (unsigned long long)info.num_tokens,
         (unsigned long long)info.num_pages);

  float* k = malloc(sizeof(float) * T * KV_HEADS * HEAD_DIM);
  float* v = malloc(sizeof(float) * T * KV_HEADS * HEAD_DIM);
  float* q = malloc(sizeof(float) * T * Q_HEADS * HEAD_DIM);
  float* out = malloc(sizeof(float) * T * Q_HEADS * HEAD_DIM);
  for (uint32_t layer = 0; layer < LAYERS; ++layer) {
    fill_random(k, (size_t)T * KV_HEADS * HEAD_DIM);
    fill_random(v, (size_t)T * KV_HEADS * HEAD_DIM);
    fill_random(q, (size_t)T * Q_HEADS * HEAD_DIM);
    pkv_tensor kt = rows(k, T, KV_HEADS), vt = rows(v, T, KV_HEADS);
    pkv_tensor qt = rows(q, T, Q_HEADS), ot = rows(out, T, Q_HEADS);
    CHECK(pkv_cache_write(batch, layer, &kt, &vt, NULL));
    CHECK(pkv_attention_forward(batch, layer, &qt, &ot, NULL, NULL, NULL));
    printf("layer %u: out[0][0][0..3] = %.4f %.4f %.4f %.4f\n", layer, out[0], out[1], out[2],
           out[3]);
  }
  pkv_batch_destroy(batch);
  free(k);
  free(v);
  free(q);
  free(out);
}

int main(void) {
  printf("pagedkv %s (features 0x%x)\n", pkv_version_string(), pkv_features());

  /* 1. A pool: 64 blocks of 16 tokens, f32 K/V for 2 layers on the CPU. */
  pkv_pool_options opts;
  pkv_pool_options_init(&opts);
  opts.block_size = BLOCK;
  opts.num_blocks = 64;
  opts.num_layers = LAYERS;
  opts.num_kv_heads = KV_HEADS;
  opts.head_dim = HEAD_DIM;
  opts.dtype = PKV_DTYPE_F32;
  opts.num_threads = 2;
  pkv_pool* pool = NULL;
  CHECK(pkv_pool_create(&opts, &pool));

  /* 2. Two requests whose prompts share their first 80 tokens. */
  int32_t prompt_a[PROMPT], prompt_b[PROMPT];
  for (int i = 0; i < PROMPT; ++i) prompt_a[i] = prompt_b[i] = 1000 + i;
  for (int i = 80; i < PROMPT; ++i) prompt_b[i] = 5000 + i;

  pkv_seq_id a, b;
  uint64_t cached = 0;
  CHECK(pkv_seq_create(pool, NULL, &a));
  CHECK(pkv_seq_match_prefix(pool, a, prompt_a, PROMPT, &cached));
  printf("request A: %llu of %d prompt tokens cached\n", (unsigned long long)cached, PROMPT);
  CHECK(pkv_seq_append(pool, a, prompt_a + cached, PROMPT - cached, 0));

  /* 3. Step 1: A prefills its prompt. */
  srand(42);
  uint32_t q_a = PROMPT;
  run_step(pool, &a, &q_a, 1);

  /* 4. B arrives: its first 80 tokens are A's computed prefix (whole blocks). */
  CHECK(pkv_seq_create(pool, NULL, &b));
  CHECK(pkv_seq_match_prefix(pool, b, prompt_b, PROMPT, &cached));
  printf("request B: %llu of %d prompt tokens cached (shared with A)\n", (unsigned long long)cached,
         PROMPT);
  uint64_t b_new = PROMPT - cached;
  CHECK(pkv_seq_append(pool, b, prompt_b + cached, b_new, 0));

  int32_t table[16];
  uint64_t len = 0;
  CHECK(pkv_seq_get_block_table(pool, b, table, 16, &len));
  printf("B's block table:");
  for (uint64_t i = 0; i < len; ++i) printf(" %d", table[i]);
  printf("\n");

  /* 5. Step 2: B prefills only its uncached tail; A decodes a token. */
  int32_t next = 7;
  CHECK(pkv_seq_append(pool, a, &next, 1, 0));
  pkv_seq_id seqs[2] = {a, b};
  uint32_t queries[2] = {1, (uint32_t)b_new};
  run_step(pool, seqs, queries, 2);

  /* 6. Stats, then cleanup. */
  pkv_pool_stats stats;
  pkv_pool_stats_init(&stats);
  CHECK(pkv_pool_get_stats(pool, &stats));
  printf("blocks used %llu / %llu, usage %.3f, prefix hit %llu of %llu tokens\n",
         (unsigned long long)stats.num_used_blocks, (unsigned long long)(stats.num_blocks - 1),
         stats.usage, (unsigned long long)stats.prefix_hit_tokens,
         (unsigned long long)stats.prefix_query_tokens);
  printf("KV bytes: %llu allocated, %llu used by tokens, %llu wasted in partial blocks\n",
         (unsigned long long)stats.kv_bytes_allocated, (unsigned long long)stats.kv_bytes_used,
         (unsigned long long)stats.kv_bytes_wasted);
  CHECK(pkv_pool_validate(pool));
  CHECK(pkv_seq_free(pool, a));
  CHECK(pkv_seq_free(pool, b));
  pkv_pool_destroy(pool);
  printf("done\n");
  return 0;
}
