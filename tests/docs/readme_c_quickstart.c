/* README.md's "Quick start (C)", compiled and run as written
 * (docs.readme_c_quickstart). extract_snippet.cmake copies the block out of
 * README.md at build time; this file adds only what a reader adds: a main,
 * the variables the block leaves to the engine (a 100-token prompt, one
 * sequence, bf16 k/v/q/out of the step's 101 tokens) and a check of every
 * status the block ignores. So a renamed function, a changed signature or a
 * call that fails on the documented path fails this test.
 *
 * The block is compiled with its own #includes only (the checks that print
 * are in readme_c_checks.c), so a block that uses what it does not include
 * fails to compile.
 *
 * The one liberty: the block names the scheduled sequences `seqs`, an array
 * the engine keeps; here that is the block's own `seq`. */
#include "readme_quickstart_includes.inc"

/* readme_c_checks.c */
pkv_status pkv_doc_check(pkv_status st, const char* call);
pkv_status doc_seq_free(pkv_pool* pool, pkv_seq_id seq, uint64_t n);
int doc_report(void);

#include "readme_quickstart_shims.inc"
#undef pkv_seq_free
#define pkv_seq_free(pool, seq) pkv_doc_check(doc_seq_free(pool, seq, n), "pkv_seq_free")

enum { PROMPT = 100, KV_HEADS = 8, Q_HEADS = 32, HEAD_DIM = 128, STEP = PROMPT + 1 };

int main(void) {
  int32_t prompt[PROMPT];
  for (int i = 0; i < PROMPT; ++i) prompt[i] = 1000 + i;
  uint64_t n = PROMPT, max_new_tokens = 64;
#define seqs (&seq)
  uint32_t num_seqs = 1;
  int32_t sampled_tokens[1] = {7};
  pkv_seq_id finished[1] = {0};
  uint32_t num_finished = 0;
  /* the admitted prompt plus the token appended by pkv_seq_append_batch */
  uint32_t query_counts[1] = {STEP};
  void* stream = NULL;
  static uint16_t kb[STEP * KV_HEADS * HEAD_DIM], vb[STEP * KV_HEADS * HEAD_DIM];
  static uint16_t qb[STEP * Q_HEADS * HEAD_DIM], ob[STEP * Q_HEADS * HEAD_DIM];
  for (unsigned i = 0; i < sizeof kb / sizeof kb[0]; ++i)
    kb[i] = vb[i] = (uint16_t)(0x3c00 + i % 64);
  for (unsigned i = 0; i < sizeof qb / sizeof qb[0]; ++i) qb[i] = (uint16_t)(0x3c00 + i % 32);
  int64_t kv_shape[3] = {STEP, KV_HEADS, HEAD_DIM}, q_shape[3] = {STEP, Q_HEADS, HEAD_DIM};
  pkv_tensor k, v, q, out;
  pkv_doc_check(pkv_tensor_init(kb, PKV_DTYPE_BF16, PKV_DEVICE_CPU, 0, 3, kv_shape, &k), "k");
  pkv_doc_check(pkv_tensor_init(vb, PKV_DTYPE_BF16, PKV_DEVICE_CPU, 0, 3, kv_shape, &v), "v");
  pkv_doc_check(pkv_tensor_init(qb, PKV_DTYPE_BF16, PKV_DEVICE_CPU, 0, 3, q_shape, &q), "q");
  pkv_doc_check(pkv_tensor_init(ob, PKV_DTYPE_BF16, PKV_DEVICE_CPU, 0, 3, q_shape, &out), "out");
  (void)finished;

  {
#include "readme_quickstart_body.inc"
  }

  return doc_report();
}
