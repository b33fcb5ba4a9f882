/* Memory per token and prefix hits of hybrid model configurations on a
 * multi-group pool (pagedkv/groups.h), printed as the Markdown table of the
 * README's "Hybrid models" section:
 *  - gpt-oss-20b (openai/gpt-oss-20b config.json): 24 layers alternating
 *    sliding window 128 / full attention, 8 KV heads x 64, bf16;
 *  - the same layers all full attention (what a single-group pool holds);
 *  - a DeepSeek-V3-like MLA stack: 61 layers, one 512 + 64 latent per token;
 *  - a Jamba-v0.1-like hybrid: 32 layers, 1 attention (8 KV heads x 128) :
 *    7 Mamba (d_inner 8192, d_state 16, d_conv 4; bf16 conv + SSM state =
 *    311296 bytes per layer). As in vLLM, layers are grouped 4 per group
 *    (1 attention group, 7 state groups) and the block size (80) makes an
 *    attention page at least a state slot, so the two alias one arena.
 * Prefill goes in block-aligned chunks of 2048 / bs * bs tokens (chunked
 * prefill; 2000 at bs 80); a state group keeps a snapshot where each chunk
 * starts, so the hit there is the last chunk start. With
 * PKV_GROUP_SNAPSHOT_EVERY_BLOCK on the state groups (the last Jamba rows),
 * each chunk runs as a committed step plan whose PKV_PLAN_SNAPSHOT_* arrays
 * name a slot per block boundary inside the chunk (the engine's chunked
 * scan writes the state there), so the hit is the last block boundary.
 * For each, one request of T prompt tokens is prefilled and decodes one
 * token; memory is the blocks it then holds times the pool's block bytes.
 * "vLLM" is what vLLM's hybrid allocator holds for the same request: full
 * groups cdiv(T + 1, bs) blocks, window groups the blocks of the last
 * W - 1 keys plus the new token (cdiv(W, bs) + 1 at most).
 * A second request sharing the prompt then shows the prefix hit: tokens
 * reused and the blocks each group attaches (window groups only the window).
 * Exits non-zero if the hybrid pool holds more than the all-full one. */
#include <stdio.h>
#include <stdlib.h>

#include "pagedkv/pagedkv.h"

#define CHECK(call)                                                                            \
  do {                                                                                         \
    pkv_status s_ = (call);                                                                    \
    if (s_ != PKV_OK) {                                                                        \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, pkv_last_error_message()); \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

static pkv_kv_group_spec attn(uint32_t kind, uint32_t layers, uint32_t window) {
  pkv_kv_group_spec g;
  pkv_kv_group_spec_init(&g);
  g.kind = kind;
  g.num_layers = layers;
  g.num_kv_heads = 8;
  g.head_dim = 64;
  g.sliding_window = window;
  return g;
}

static uint64_t cdiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

struct result {
  double bytes_per_token, vllm_bytes_per_token;
  uint64_t hit_tokens, hit_blocks[8];
};

/* The engine runs each step's copies (state snapshots, copy-on-write) in every
 * group before the step; until then both blocks of a copy stay held. */
static void run_copies(pkv_pool* pool, uint32_t n) {
  int32_t src[64], dst[64];
  uint64_t len = 0;
  for (uint32_t g = 0; g < n; ++g) CHECK(pkv_pool_group_take_copies(pool, g, src, dst, 64, &len));
}

/* One committed step computing the last q tokens of seq (an engine would
 * run its kernels, and write the snapshots the plan names, before commit). */
static void step(pkv_pool* pool, pkv_seq_id seq, uint32_t q, uint32_t n) {
  pkv_batch* plan = NULL;
  CHECK(pkv_batch_prepare(pool, &seq, &q, 1, NULL, &plan));
  run_copies(pool, n);
  CHECK(pkv_batch_commit(plan));
  pkv_batch_destroy(plan);
}

/* planned: every chunk and the decode step run as committed step plans. */
static struct result run(const pkv_kv_group_spec* groups, uint32_t n, uint32_t bs, uint64_t T,
                         int planned) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = bs;
  o.num_blocks = 4 * n * (cdiv(T + 1, bs) + 2) + 2;
  pkv_pool* pool = NULL;
  CHECK(pkv_pool_create_groups(&o, groups, n, &pool));
  int32_t* tokens = malloc(sizeof(int32_t) * (T + 2));
  for (uint64_t i = 0; i < T + 2; ++i) tokens[i] = (int32_t)((i * 7919u) % 50000u);
  pkv_seq_id a = 0, b = 0;
  CHECK(pkv_seq_create(pool, NULL, &a));
  const uint64_t chunk = 2048 / bs * bs;
  for (uint64_t done = 0; done < T; done += chunk) { /* chunked prefill */
    const uint64_t q = T - done < chunk ? T - done : chunk;
    CHECK(pkv_seq_append(pool, a, tokens + done, q, 0));
    run_copies(pool, n);
    if (planned) step(pool, a, (uint32_t)q, n);
  }
  CHECK(pkv_seq_append(pool, a, tokens + T, 1, 0)); /* one decode step */
  run_copies(pool, n);
  if (planned) step(pool, a, 1, n);
  pkv_pool_stats st;
  pkv_pool_stats_init(&st);
  CHECK(pkv_pool_get_stats(pool, &st));
  struct result r = {0};
  r.bytes_per_token = (double)st.kv_bytes_used / (double)(T + 1);
  uint64_t vllm_blocks = 0;
  for (uint32_t g = 0; g < n; ++g) {
    uint64_t full = cdiv(T + 1, bs);
    if (groups[g].kind == PKV_GROUP_RECURRENT) {
      vllm_blocks += 1; /* one state slot */
    } else if (groups[g].kind == PKV_GROUP_SLIDING_WINDOW) {
      /* keys T + 1 - W .. T: the blocks holding them */
      uint64_t first =
          T + 1 > groups[g].sliding_window ? (T + 1 - groups[g].sliding_window) / bs : 0;
      vllm_blocks += full - first;
    } else {
      vllm_blocks += full;
    }
  }
  r.vllm_bytes_per_token = (double)(vllm_blocks * st.kv_bytes_per_block) / (double)(T + 1);
  /* A second request with the same prompt and another last token. */
  tokens[T] = 99999;
  CHECK(pkv_seq_create(pool, NULL, &b));
  CHECK(pkv_seq_match_prefix(pool, b, tokens, T + 1, &r.hit_tokens));
  for (uint32_t g = 0; g < n && g < 8; ++g) {
    int32_t* t = malloc(sizeof(int32_t) * (cdiv(T, bs) + 1));
    uint64_t len = 0;
    CHECK(pkv_seq_group_block_table(pool, b, g, t, cdiv(T, bs) + 1, &len));
    for (uint64_t j = 0; j < len; ++j) r.hit_blocks[g] += t[j] != PKV_NULL_BLOCK;
    free(t);
  }
  CHECK(pkv_pool_validate(pool));
  free(tokens);
  pkv_pool_destroy(pool);
  return r;
}

int main(void) {
  const uint64_t lengths[3] = {1024, 8192, 32768};
  pkv_kv_group_spec gpt_oss[2] = {attn(PKV_GROUP_SLIDING_WINDOW, 12, 128),
                                  attn(PKV_GROUP_FULL, 12, 0)};
  pkv_kv_group_spec all_full[1] = {attn(PKV_GROUP_FULL, 24, 0)};
  pkv_kv_group_spec mla;
  pkv_kv_group_spec_init(&mla);
  mla.kind = PKV_GROUP_MLA;
  mla.num_layers = 61;
  mla.kv_lora_rank = 512;
  mla.rope_dim = 64;
  int bad = 0;
  printf(
      "| model | T | KiB/token (pagedkv) | KiB/token (vLLM hybrid) | KiB/token (all full) |"
      " prefix hit of T+1 | blocks attached per group |\n");
  printf("|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < 3; ++i) {
    const uint64_t T = lengths[i];
    struct result h = run(gpt_oss, 2, 16, T, 0), f = run(all_full, 1, 16, T, 0);
    printf(
        "| gpt-oss-20b (12 x window 128 + 12 x full), bs 16 | %llu | %.2f | %.2f | %.2f | %llu |"
        " window %llu, full %llu |\n",
        (unsigned long long)T, h.bytes_per_token / 1024, h.vllm_bytes_per_token / 1024,
        f.bytes_per_token / 1024, (unsigned long long)h.hit_tokens,
        (unsigned long long)h.hit_blocks[0], (unsigned long long)h.hit_blocks[1]);
    if (h.bytes_per_token > f.bytes_per_token || h.hit_tokens != T) bad = 1;
  }
  for (int i = 0; i < 3; ++i) {
    const uint64_t T = lengths[i];
    struct result m = run(&mla, 1, 64, T, 0);
    printf(
        "| DeepSeek-V3-like (61 x MLA 512 + 64), bs 64 | %llu | %.2f | %.2f | - | %llu |"
        " mla %llu |\n",
        (unsigned long long)T, m.bytes_per_token / 1024, m.vllm_bytes_per_token / 1024,
        (unsigned long long)m.hit_tokens, (unsigned long long)m.hit_blocks[0]);
    if (m.hit_tokens != T) bad = 1;
  }
  pkv_kv_group_spec jamba[8], jamba_full[1];
  jamba[0] = attn(PKV_GROUP_FULL, 4, 0);
  jamba[0].head_dim = 128;
  for (int g = 1; g < 8; ++g) {
    pkv_kv_group_spec_init(&jamba[g]);
    jamba[g].kind = PKV_GROUP_RECURRENT;
    jamba[g].num_layers = 4;
    jamba[g].state_bytes = (8192u * 16u + 8192u * 3u) * 2u;
  }
  jamba_full[0] = attn(PKV_GROUP_FULL, 32, 0);
  jamba_full[0].head_dim = 128;
  for (int i = 0; i < 3; ++i) {
    const uint64_t T = lengths[i];
    struct result j = run(jamba, 8, 80, T, 0), f = run(jamba_full, 1, 80, T, 0);
    printf(
        "| Jamba-v0.1-like (4 x attention + 28 x Mamba in 7 state groups), bs 80 | %llu | %.2f |"
        " %.2f | %.2f | %llu | attention %llu; each state group copies its snapshot |\n",
        (unsigned long long)T, j.bytes_per_token / 1024, j.vllm_bytes_per_token / 1024,
        f.bytes_per_token / 1024, (unsigned long long)j.hit_tokens,
        (unsigned long long)j.hit_blocks[0]);
    /* The state has snapshots where prefill chunks (2000 tokens) start. */
    if (j.bytes_per_token > f.bytes_per_token || j.hit_tokens != T / 2000 * 2000) bad = 1;
  }
  for (int g = 1; g < 8; ++g) jamba[g].flags = PKV_GROUP_SNAPSHOT_EVERY_BLOCK;
  for (int i = 0; i < 3; ++i) {
    const uint64_t T = lengths[i];
    struct result j = run(jamba, 8, 80, T, 1), f = run(jamba_full, 1, 80, T, 1);
    printf(
        "| Jamba-v0.1-like, PKV_GROUP_SNAPSHOT_EVERY_BLOCK, bs 80 | %llu | %.2f | %.2f | %.2f |"
        " %llu | attention %llu; each state group copies its snapshot |\n",
        (unsigned long long)T, j.bytes_per_token / 1024, j.vllm_bytes_per_token / 1024,
        f.bytes_per_token / 1024, (unsigned long long)j.hit_tokens,
        (unsigned long long)j.hit_blocks[0]);
    /* A snapshot at every block boundary: the hit is the last one <= T. */
    if (j.bytes_per_token > f.bytes_per_token || j.hit_tokens != T / 80 * 80) bad = 1;
  }
  return bad;
}
