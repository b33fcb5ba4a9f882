/* The C ABI from C99: ownership, NULL handling, bad and stale ids, status
 * codes and messages, versioned structs. Exits non-zero on the first
 * failed check, naming it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pagedkv/pagedkv.h"

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

#define CHECK_STATUS(call, want)                                                              \
  do {                                                                                        \
    pkv_status got_ = (call);                                                                 \
    if (got_ != (want)) {                                                                     \
      fprintf(stderr, "%s:%d: %s returned %d, expected %d (%s)\n", __FILE__, __LINE__, #call, \
              (int)got_, (int)(want), pkv_last_error_message());                              \
      ++failures;                                                                             \
    }                                                                                         \
  } while (0)

/* The last message mentions `needle`. */
#define CHECK_MESSAGE(needle)                                                     \
  do {                                                                            \
    if (!strstr(pkv_last_error_message(), (needle))) {                            \
      fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, \
              pkv_last_error_message(), (needle));                                \
      ++failures;                                                                 \
    }                                                                             \
  } while (0)

static pkv_pool* make_pool(uint64_t num_blocks) {
  pkv_pool_options o;
  pkv_pool* pool = NULL;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = num_blocks;
  o.enable_events = 1;
  CHECK_STATUS(pkv_pool_create(&o, &pool), PKV_OK);
  CHECK(pool != NULL);
  return pool;
}

static void test_versions_and_statuses(void) {
  int32_t code;
  char buf[8];
  CHECK(strcmp(pkv_version_string(), PKV_VERSION_STRING) == 0);
  CHECK(pkv_version_number() == PKV_VERSION_NUMBER);
  CHECK(pkv_abi_version() == PKV_ABI_VERSION);
  CHECK((pkv_features() & PKV_FEATURE_SHA256) != 0);
  CHECK((pkv_features() & PKV_FEATURE_XXHASH) != 0);
  CHECK(pkv_cuda_device_count() >= 0);
  for (code = PKV_E_INTERNAL; code <= PKV_OK; ++code) {
    const char* s = pkv_status_string(code);
    CHECK(s != NULL && s[0] != '\0');
  }
  CHECK(strstr(pkv_status_string(PKV_E_OUT_OF_BLOCKS), "PKV_E_OUT_OF_BLOCKS") != NULL);
  CHECK(pkv_status_string(12345) != NULL);
  CHECK(pkv_dtype_size(PKV_DTYPE_F32) == 4 && pkv_dtype_size(PKV_DTYPE_BF16) == 2);
  CHECK(pkv_dtype_size(PKV_DTYPE_I64) == 8 && pkv_dtype_size(99) == 0);
  CHECK(pkv_hash_size(PKV_HASH_SHA256_CBOR) == 32 && pkv_hash_size(PKV_HASH_XXH3_128) == 16);
  CHECK(pkv_hash_size(77) == 0);

  /* The message: set by a failure, cleared by a success, copied on demand. */
  CHECK_STATUS(pkv_pool_create(NULL, NULL), PKV_E_INVALID_ARGUMENT);
  CHECK(strlen(pkv_last_error_message()) > 0);
  CHECK_MESSAGE("pkv_pool_create");
  CHECK_MESSAGE("opts");
  CHECK(pkv_last_error_copy(buf, sizeof buf) == strlen(pkv_last_error_message()));
  CHECK(strlen(buf) == sizeof buf - 1);
  CHECK(strncmp(buf, pkv_last_error_message(), sizeof buf - 1) == 0);
  CHECK(pkv_last_error_copy(NULL, 0) == strlen(pkv_last_error_message()));
  {
    pkv_block_hash root;
    CHECK_STATUS(pkv_hash_root(PKV_HASH_SHA256_CBOR, "", &root), PKV_OK);
  }
  CHECK(pkv_last_error_message() != NULL && pkv_last_error_message()[0] == '\0');
}

static void test_ownership(void) {
  pkv_pool* pool = make_pool(16);
  pkv_seq_id a, b;
  pkv_batch* batch = NULL;
  uint32_t six = 6;
  int32_t tokens[6] = {1, 2, 3, 4, 5, 6};
  pkv_pool_destroy(NULL); /* no-ops */
  pkv_batch_destroy(NULL);
  CHECK_STATUS(pkv_seq_create(pool, NULL, &a), PKV_OK);
  CHECK(a != PKV_SEQ_ID_INVALID);
  CHECK_STATUS(pkv_seq_append(pool, a, tokens, 6, 0), PKV_OK);
  CHECK_STATUS(pkv_batch_commit(NULL), PKV_E_INVALID_ARGUMENT);
  CHECK_STATUS(pkv_batch_abort(NULL), PKV_E_INVALID_ARGUMENT);
  CHECK_STATUS(pkv_batch_prepare(pool, &a, &six, 1, NULL, &batch), PKV_OK);
  /* The plan outlives the pool and then fails cleanly. */
  CHECK_STATUS(pkv_seq_create(pool, NULL, &b), PKV_OK);
  pkv_pool_destroy(pool);
  {
    pkv_batch_info info;
    pkv_batch_info_init(&info);
    CHECK_STATUS(pkv_batch_get_info(batch, &info), PKV_OK);
    CHECK(info.num_tokens == 6 && info.num_seqs == 1 && info.block_size == 4);
  }
  CHECK_STATUS(pkv_batch_commit(batch), PKV_E_INVALID_STATE);
  CHECK_MESSAGE("destroyed");
  CHECK_STATUS(pkv_cache_write(batch, 0, NULL, NULL, NULL), PKV_E_INVALID_ARGUMENT);
  {
    float data[16];
    int64_t shape[3] = {1, 1, 16};
    pkv_tensor t;
    CHECK_STATUS(pkv_tensor_init(data, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &t), PKV_OK);
    CHECK_STATUS(pkv_cache_write(batch, 0, &t, &t, NULL), PKV_E_INVALID_STATE);
    CHECK_MESSAGE("destroyed");
  }
  CHECK_STATUS(pkv_batch_abort(batch), PKV_OK); /* nothing was counted */
  pkv_batch_destroy(batch);
}

static void test_ids_and_errors(void) {
  pkv_pool* pool = make_pool(6); /* 5 usable blocks of 4 tokens */
  pkv_seq_id a, stale, child;
  int32_t tokens[32];
  int32_t table[8];
  uint64_t n = 0, len = 0;
  pkv_pool_stats before, after;
  int i;
  for (i = 0; i < 32; ++i) tokens[i] = 100 + i;

  CHECK_STATUS(pkv_seq_create(pool, NULL, &stale), PKV_OK);
  CHECK_STATUS(pkv_seq_free(pool, stale), PKV_OK);
  CHECK_STATUS(pkv_seq_free(pool, stale), PKV_E_NOT_FOUND);
  CHECK_MESSAGE("stale or unknown");
  CHECK_STATUS(pkv_seq_append(pool, stale, tokens, 1, 0), PKV_E_NOT_FOUND);
  CHECK_MESSAGE("pkv_seq_append");
  CHECK_STATUS(pkv_seq_append(pool, PKV_SEQ_ID_INVALID, tokens, 1, 0), PKV_E_NOT_FOUND);
  CHECK_STATUS(pkv_seq_fork(pool, stale, &child), PKV_E_NOT_FOUND);

  CHECK_STATUS(pkv_seq_create(pool, NULL, &a), PKV_OK);
  CHECK(a != stale);
  CHECK_STATUS(pkv_seq_append(pool, a, NULL, 3, 0), PKV_E_INVALID_ARGUMENT);
  CHECK_MESSAGE("tokens is NULL but num_tokens is 3");
  CHECK_STATUS(pkv_seq_append(pool, a, NULL, 0, 0), PKV_OK);    /* nothing to do */
  CHECK_STATUS(pkv_seq_append(pool, a, tokens, 16, 0), PKV_OK); /* 4 blocks */

  pkv_pool_stats_init(&before);
  CHECK_STATUS(pkv_pool_get_stats(pool, &before), PKV_OK);
  CHECK_STATUS(pkv_seq_append(pool, a, tokens, 5, 0), PKV_E_OUT_OF_BLOCKS);
  CHECK_MESSAGE("needs 2 blocks");
  pkv_pool_stats_init(&after);
  CHECK_STATUS(pkv_pool_get_stats(pool, &after), PKV_OK);
  CHECK(after.num_free_blocks == before.num_free_blocks && after.num_tokens == 16);
  CHECK_STATUS(pkv_seq_blocks_needed(pool, a, 5, 0, &n), PKV_OK);
  CHECK(n == 2);

  CHECK_STATUS(pkv_seq_get_block_table(pool, a, table, 2, &len), PKV_E_BUFFER_TOO_SMALL);
  CHECK(len == 4);
  CHECK_STATUS(pkv_seq_get_block_table(pool, a, NULL, 0, &len), PKV_E_BUFFER_TOO_SMALL);
  CHECK(len == 4);
  CHECK_STATUS(pkv_seq_get_block_table(pool, a, table, 8, &len), PKV_OK);
  CHECK(len == 4 && table[0] == 1 && table[3] == 4);
  CHECK_STATUS(pkv_seq_truncate(pool, a, 17), PKV_E_INVALID_ARGUMENT);
  CHECK_MESSAGE("num_tokens 17");

  /* Versioned structs: too small or garbage sizes are refused. */
  {
    pkv_seq_info info;
    pkv_seq_info_init(&info);
    info.struct_size = 4;
    CHECK_STATUS(pkv_seq_get_info(pool, a, &info), PKV_E_INVALID_ARGUMENT);
    CHECK_MESSAGE("struct_size");
    pkv_seq_info_init(&info);
    CHECK_STATUS(pkv_seq_get_info(pool, a, &info), PKV_OK);
    CHECK(info.num_tokens == 16 && info.num_blocks == 4 && info.num_slots == 16);
  }
  {
    pkv_pool_options o;
    pkv_pool* p2 = NULL;
    pkv_pool_options_init(&o);
    o.num_blocks = 8;
    o.struct_size = 0xdeadbeefu;
    CHECK_STATUS(pkv_pool_create(&o, &p2), PKV_E_INVALID_ARGUMENT);
    CHECK(p2 == NULL);
    pkv_pool_options_init(&o);
    o.num_blocks = 8;
    o.block_size = 0;
    CHECK_STATUS(pkv_pool_create(&o, &p2), PKV_E_INVALID_ARGUMENT);
    CHECK_MESSAGE("opts->block_size");
    CHECK(p2 == NULL);
  }
  /* A stats struct from an "older header" gets only its own bytes. */
  {
    pkv_pool_stats s;
    memset(&s, 0xab, sizeof s);
    s.struct_size = (uint32_t)offsetof(pkv_pool_stats, kv_bytes_wasted);
    CHECK_STATUS(pkv_pool_get_stats(pool, &s), PKV_E_INVALID_ARGUMENT); /* below v1 */
  }
  CHECK_STATUS(pkv_pool_validate(pool), PKV_OK);
  CHECK_STATUS(pkv_pool_validate(NULL), PKV_E_INVALID_ARGUMENT);
  pkv_pool_destroy(pool);
}

static void test_prefix_cache_and_events(void) {
  pkv_pool* pool = make_pool(16);
  pkv_seq_id a, b;
  int32_t tokens[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  uint64_t cached = 99, count = 0;
  pkv_event ev[8];
  pkv_block_hash hashes[4];
  pkv_hash_options ho;
  pkv_block_hash want[4];
  CHECK_STATUS(pkv_seq_create(pool, NULL, &a), PKV_OK);
  CHECK_STATUS(pkv_seq_match_prefix(pool, a, tokens, 10, &cached), PKV_OK);
  CHECK(cached == 0);
  CHECK_STATUS(pkv_seq_append(pool, a, tokens, 10, 0), PKV_OK);
  CHECK_STATUS(pkv_seq_create(pool, NULL, &b), PKV_OK);
  /* a's blocks are registered but not computed: no hit yet. */
  CHECK_STATUS(pkv_seq_match_prefix(pool, b, tokens, 10, &cached), PKV_OK);
  CHECK(cached == 0);
  {
    pkv_batch* step = NULL;
    uint32_t ten = 10;
    CHECK_STATUS(pkv_batch_prepare(pool, &a, &ten, 1, NULL, &step), PKV_OK);
    CHECK_STATUS(pkv_batch_commit(step), PKV_OK);
    pkv_batch_destroy(step);
  }
  CHECK_STATUS(pkv_seq_free(pool, b), PKV_OK);
  CHECK_STATUS(pkv_seq_create(pool, NULL, &b), PKV_OK);
  CHECK_STATUS(pkv_seq_match_prefix(pool, b, tokens, 10, &cached), PKV_OK);
  CHECK(cached == 8);

  CHECK_STATUS(pkv_pool_drain_events(pool, ev, 8, &count), PKV_OK);
  CHECK(count == 2);
  CHECK(ev[0].seq_no == 1 && ev[0].type == PKV_EVENT_BLOCK_STORED && ev[0].has_parent == 0);
  CHECK(ev[1].seq_no == 2 && ev[1].has_parent == 1 && ev[1].num_tokens == 4);
  CHECK(memcmp(ev[1].parent_hash.bytes, ev[0].block_hash.bytes, PKV_HASH_MAX_BYTES) == 0);

  /* The pool's hashes equal pkv_hash_prefix over the same tokens. */
  CHECK_STATUS(pkv_seq_get_block_hashes(pool, a, hashes, 4, &count), PKV_OK);
  CHECK(count == 2);
  pkv_hash_options_init(&ho);
  ho.block_size = 4;
  CHECK_STATUS(pkv_hash_prefix(&ho, tokens, 10, want, 1, &count), PKV_E_BUFFER_TOO_SMALL);
  CHECK(count == 2);
  CHECK_STATUS(pkv_hash_prefix(&ho, tokens, 10, want, 4, &count), PKV_OK);
  CHECK(count == 2);
  CHECK(memcmp(want, hashes, 2 * sizeof(pkv_block_hash)) == 0);
  CHECK(memcmp(want[1].bytes, ev[1].block_hash.bytes, PKV_HASH_MAX_BYTES) == 0);

  CHECK_STATUS(pkv_pool_reset_prefix_cache(pool), PKV_OK);
  CHECK_STATUS(pkv_pool_drain_events(pool, ev, 8, &count), PKV_OK);
  CHECK(count == 1 && ev[0].type == PKV_EVENT_ALL_CLEARED && ev[0].seq_no == 3);
  CHECK_STATUS(pkv_pool_validate(pool), PKV_OK);
  pkv_pool_destroy(pool);
}

/* The sized initialisers, from C: sizeof the caller's struct, as new code
 * calls them. */
static void test_init_sized(void) {
  pkv_pool_options o;
  pkv_pool_stats st;
  pkv_pool* pool = NULL;
  memset(&o, 0xAB, sizeof o);
  CHECK_STATUS(pkv_pool_options_init_sized(&o, sizeof o), PKV_OK);
  CHECK(o.struct_size == sizeof o);
  CHECK(o.block_size == 16 && o.enable_prefix_caching == 1 && o.hash_seed != NULL);
  CHECK(o.qk_rope_head_dim == 0); /* the last field: written too */
  o.block_size = 4;
  o.num_blocks = 8;
  CHECK_STATUS(pkv_pool_create(&o, &pool), PKV_OK);
  CHECK_STATUS(pkv_pool_stats_init_sized(&st, sizeof st), PKV_OK);
  CHECK(st.struct_size == sizeof st);
  CHECK_STATUS(pkv_pool_get_stats(pool, &st), PKV_OK);
  CHECK(st.num_blocks == 8 && st.block_size == 4);
  pkv_pool_destroy(pool);
  CHECK_STATUS(pkv_pool_options_init_sized(&o, 4), PKV_E_INVALID_ARGUMENT);
  CHECK_MESSAGE("size");
  CHECK_STATUS(pkv_seq_options_init_sized(NULL, sizeof(pkv_seq_options)), PKV_E_INVALID_ARGUMENT);
  CHECK_MESSAGE("opts");
}

int main(void) {
  test_versions_and_statuses();
  test_init_sized();
  test_ownership();
  test_ids_and_errors();
  test_prefix_cache_and_events();
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("abi_test: all checks passed\n");
  return 0;
}
