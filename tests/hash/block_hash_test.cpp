#include "hash/block_hash.h"
#include <gtest/gtest.h>
TEST(Hash, Smoke) { EXPECT_EQ(pagedkv::hash_digest_size(pagedkv::HashAlgo::kXxh3_128), 16u); }
