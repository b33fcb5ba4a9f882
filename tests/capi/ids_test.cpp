// Sequence ids name their pool (DESIGN.md §9, "Ids"): two pools never hand
// out the same id while both live, and any id used on another pool is
// PKV_E_NOT_FOUND for every sequence call, changing nothing.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

pkv_pool* make_pool() {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 32;
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

TEST(Ids, AnIdOfAnotherPoolIsNotFoundThere) {
  pkv_pool* a = make_pool();
  pkv_pool* b = make_pool();
  pkv_seq_id ia = 0, ib = 0;
  ASSERT_EQ(pkv_seq_create(a, nullptr, &ia), PKV_OK);
  ASSERT_EQ(pkv_seq_create(b, nullptr, &ib), PKV_OK);
  EXPECT_NE(ia, ib);  // the first sequence of each pool: same slot, other tag
  const int32_t toks[6] = {1, 2, 3, 4, 5, 6};
  ASSERT_EQ(pkv_seq_append(b, ib, toks, 6, 0), PKV_OK);

  uint64_t n = 0;
  pkv_seq_id child = 0;
  int32_t table[4];
  pkv_seq_info info;
  pkv_seq_info_init(&info);
  EXPECT_EQ(pkv_seq_free(b, ia), PKV_E_NOT_FOUND);
  EXPECT_NE(std::string(pkv_last_error_message()).find("stale or unknown"), std::string::npos)
      << pkv_last_error_message();
  EXPECT_EQ(pkv_seq_append(b, ia, toks, 1, 0), PKV_E_NOT_FOUND);
  EXPECT_EQ(pkv_seq_truncate(b, ia, 0), PKV_E_NOT_FOUND);
  EXPECT_EQ(pkv_seq_fork(b, ia, &child), PKV_E_NOT_FOUND);
  EXPECT_EQ(pkv_seq_get_info(b, ia, &info), PKV_E_NOT_FOUND);
  EXPECT_EQ(pkv_seq_get_block_table(b, ia, table, 4, &n), PKV_E_NOT_FOUND);
  EXPECT_EQ(pkv_seq_blocks_needed(b, ia, 1, 0, &n), PKV_E_NOT_FOUND);
  const uint32_t q = 1;
  pkv_batch* batch = nullptr;
  EXPECT_EQ(pkv_batch_prepare(b, &ia, &q, 1, nullptr, &batch), PKV_E_NOT_FOUND);
  EXPECT_EQ(batch, nullptr);
  // The message says the id is not this pool's, in single calls and batches.
  const std::string other = "not an id of this pool";
  EXPECT_EQ(pkv_seq_append(b, ia, toks, 1, 0), PKV_E_NOT_FOUND);
  EXPECT_NE(std::string(pkv_last_error_message()).find(other), std::string::npos)
      << pkv_last_error_message();
  EXPECT_EQ(pkv_batch_prepare(b, &ia, &q, 1, nullptr, &batch), PKV_E_NOT_FOUND);
  EXPECT_NE(std::string(pkv_last_error_message()).find("seqs[0]: "), std::string::npos);
  EXPECT_NE(std::string(pkv_last_error_message()).find(other), std::string::npos)
      << pkv_last_error_message();
  pkv_seq_id both[2] = {ib, ia};
  EXPECT_EQ(pkv_seq_free_batch(b, both, 2), PKV_E_NOT_FOUND);
  EXPECT_NE(std::string(pkv_last_error_message()).find("seqs[1]: "), std::string::npos);
  EXPECT_NE(std::string(pkv_last_error_message()).find(other), std::string::npos)
      << pkv_last_error_message();
  // A freed id of the pool itself is stale, not another pool's.
  pkv_seq_id gone = 0;
  ASSERT_EQ(pkv_seq_create(b, nullptr, &gone), PKV_OK);
  ASSERT_EQ(pkv_seq_free(b, gone), PKV_OK);
  EXPECT_EQ(pkv_seq_free(b, gone), PKV_E_NOT_FOUND);
  EXPECT_NE(std::string(pkv_last_error_message()).find("stale or unknown"), std::string::npos);
  EXPECT_EQ(std::string(pkv_last_error_message()).find(other), std::string::npos)
      << pkv_last_error_message();

  // b's sequence is untouched; a's still works on a.
  ASSERT_EQ(pkv_seq_get_info(b, ib, &info), PKV_OK);
  EXPECT_EQ(info.num_tokens, 6u);
  EXPECT_EQ(pkv_seq_free(a, ia), PKV_OK);
  EXPECT_EQ(pkv_pool_validate(a), PKV_OK);
  EXPECT_EQ(pkv_pool_validate(b), PKV_OK);
  pkv_pool_destroy(a);
  pkv_pool_destroy(b);
}

TEST(Ids, LivePoolsNeverShareAnId) {
  std::vector<pkv_pool*> pools;
  std::set<pkv_seq_id> ids;
  for (int i = 0; i < 20; ++i) {
    pools.push_back(make_pool());
    for (int j = 0; j < 3; ++j) {
      pkv_seq_id id = 0;
      ASSERT_EQ(pkv_seq_create(pools.back(), nullptr, &id), PKV_OK);
      EXPECT_NE(id, PKV_SEQ_ID_INVALID);
      EXPECT_TRUE(ids.insert(id).second);
    }
  }
  for (pkv_pool* p : pools) pkv_pool_destroy(p);
}

}  // namespace
