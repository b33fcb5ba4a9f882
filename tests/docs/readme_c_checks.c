/* The checks around README.md's C quick start (readme_c_quickstart.c),
 * apart from it so that the block compiles with its own #includes alone. */
#include <pagedkv/pagedkv.h>
#include <stdio.h>

static int failures;

pkv_status pkv_doc_check(pkv_status st, const char* call);
pkv_status doc_seq_free(pkv_pool* pool, pkv_seq_id seq, uint64_t n);
int doc_report(void);

pkv_status pkv_doc_check(pkv_status st, const char* call) {
  if (st != PKV_OK) {
    fprintf(stderr, "%s: %s: %s\n", call, pkv_status_string(st), pkv_last_error_message());
    ++failures;
  }
  return st;
}

/* What the block says about its end state, checked as it frees the
 * sequence: the first step (every layer written) committed the prompt and
 * the appended token; the decode step's plan, destroyed unwritten, counted
 * nothing. And the pool's invariants before it goes. */
pkv_status doc_seq_free(pkv_pool* pool, pkv_seq_id seq, uint64_t n) {
  pkv_seq_info info;
  pkv_seq_info_init(&info);
  if (pkv_doc_check(pkv_seq_get_info(pool, seq, &info), "pkv_seq_get_info") == PKV_OK &&
      (info.num_tokens != n + 2 || info.num_computed_tokens != n + 1)) {
    fprintf(stderr, "seq: %llu tokens, %llu computed; expected %llu, %llu\n",
            (unsigned long long)info.num_tokens, (unsigned long long)info.num_computed_tokens,
            (unsigned long long)(n + 2), (unsigned long long)(n + 1));
    ++failures;
  }
  pkv_doc_check(pkv_pool_validate(pool), "pkv_pool_validate");
  return pkv_seq_free(pool, seq);
}

int doc_report(void) {
  if (failures) {
    fprintf(stderr, "README.md's C quick start: %d failed call(s)\n", failures);
    return 1;
  }
  printf("README.md's C quick start ran: every call returned PKV_OK\n");
  return 0;
}
