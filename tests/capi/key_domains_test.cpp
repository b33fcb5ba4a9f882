// Cache salts, LoRA names and multimodal item hashes (issue 14 item 9): in
// vLLM's key encoding a salt and a LoRA name are both bare text extra keys,
// so an unsalted request whose adapter name equals a tenant's salt shares
// that tenant's first block (older vLLM encoded item hashes bare too; current
// vLLM makes them [hash, offset] pairs, which no salt equals). The default
// keeps vLLM's encoding; strict_key_domains separates every domain.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

pkv_pool* make_pool(uint32_t strict) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 16;
  o.num_blocks = 64;
  o.strict_key_domains = strict;
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

uint32_t strict_of(const pkv_pool* p) {
  pkv_pool_options got;
  pkv_pool_options_init(&got);
  EXPECT_EQ(pkv_pool_get_options(p, &got), PKV_OK);
  return got.strict_key_domains;
}

std::vector<int32_t> prompt() {
  std::vector<int32_t> t(33);
  for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t(1000 + 7 * i);
  return t;
}

// A sequence holding the prompt's 32 full-block tokens under these options.
pkv_seq_id holder(pkv_pool* p, const pkv_seq_options* so) {
  pkv_seq_id id = 0;
  EXPECT_EQ(pkv_seq_create(p, so, &id), PKV_OK);
  std::vector<int32_t> t = prompt();
  EXPECT_EQ(pkv_seq_append(p, id, t.data(), 32, 0), PKV_OK);
  // Its step ran: the blocks hold written K/V and can be hit.
  const uint32_t q = 32;
  pkv_batch* b = nullptr;
  EXPECT_EQ(pkv_batch_prepare(p, &id, &q, 1, nullptr, &b), PKV_OK);
  EXPECT_EQ(pkv_batch_commit(b), PKV_OK);
  pkv_batch_destroy(b);
  return id;
}

uint64_t hit(pkv_pool* p, const pkv_seq_options* so) {
  pkv_seq_id id = 0;
  EXPECT_EQ(pkv_seq_create(p, so, &id), PKV_OK);
  std::vector<int32_t> t = prompt();
  uint64_t cached = 0;
  EXPECT_EQ(pkv_seq_match_prefix(p, id, t.data(), t.size(), &cached), PKV_OK);
  EXPECT_EQ(pkv_seq_free(p, id), PKV_OK);
  return cached;
}

struct Requests {
  pkv_seq_options salted, aimed, other_salt, imaged;
  pkv_mm_item item{0, 4, "tenant-a-salt"};  // an item hash equal to the salt
  Requests() {
    for (pkv_seq_options* o : {&salted, &aimed, &other_salt, &imaged}) pkv_seq_options_init(o);
    salted.cache_salt = "tenant-a-salt";
    other_salt.cache_salt = "tenant-b-salt";
    aimed.mm_items = &item;  // unsalted
    aimed.num_mm_items = 1;
    imaged.mm_items = &item;
    imaged.num_mm_items = 1;
  }
};

TEST(KeyDomains, DefaultFollowsVllmWhereALoraNameCanEqualASalt) {
  pkv_pool* p = make_pool(0);
  Requests r;
  holder(p, &r.salted);
  EXPECT_EQ(hit(p, &r.salted), 32u);     // same tenant
  EXPECT_EQ(hit(p, &r.other_salt), 0u);  // another tenant
  EXPECT_EQ(hit(p, &r.aimed), 0u);       // an item key is a [hash, offset] pair
  pkv_seq_options named;
  pkv_seq_options_init(&named);
  named.lora_name = "tenant-a-salt";
  // vLLM's encoding: the name reads like the salt in the first block (it
  // keys every block, the salt only the first).
  EXPECT_EQ(hit(p, &named), 16u);
  pkv_pool_destroy(p);
}

TEST(KeyDomains, StrictModeKeepsSaltsAndItemHashesApart) {
  pkv_pool* p = make_pool(1);
  Requests r;
  pkv_seq_id tenant = holder(p, &r.salted);
  EXPECT_EQ(hit(p, &r.salted), 32u);
  EXPECT_EQ(hit(p, &r.other_salt), 0u);
  EXPECT_EQ(hit(p, &r.aimed), 0u);
  // Items still share with items, salts with salts.
  holder(p, &r.imaged);
  EXPECT_EQ(hit(p, &r.aimed), 32u);
  EXPECT_EQ(pkv_seq_free(p, tenant), PKV_OK);
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK);
  EXPECT_EQ(strict_of(p), 1u);
  pkv_pool_destroy(p);
}

TEST(KeyDomains, StrictModeIsOptInAndChecked) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  EXPECT_EQ(o.strict_key_domains, 0u);
  o.num_blocks = 8;
  o.strict_key_domains = 3;  // past PKV_KEY_DOMAINS_VLLM_TAGGED
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pkv_last_error_message()).find("opts->strict_key_domains"),
            std::string::npos);
  EXPECT_EQ(p, nullptr);
  // A caller built against the first release: the field is not read.
  o.struct_size = offsetof(pkv_pool_options, strict_key_domains);
  ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  EXPECT_EQ(strict_of(p), 0u);
  pkv_pool_destroy(p);
}

// pkv_hash_prefix with strict_key_domains gives the hashes a strict pool
// gives its blocks (and without it, the vLLM ones of a default pool).
TEST(KeyDomains, HashPrefixFollowsTheMode) {
  for (uint32_t strict : {0u, 1u, 2u}) {
    pkv_pool* p = make_pool(strict);
    Requests r;
    pkv_seq_options lora;
    pkv_seq_options_init(&lora);
    lora.lora_name = "sql";
    lora.lora_path = "/adapters/sql-v2";
    lora.cache_salt = "s";
    for (const pkv_seq_options* so : {&r.salted, &r.imaged, &lora}) {
      pkv_seq_id id = holder(p, so);
      pkv_block_hash pool_h[2], lib_h[2];
      uint64_t n = 0;
      ASSERT_EQ(pkv_seq_get_block_hashes(p, id, pool_h, 2, &n), PKV_OK);
      ASSERT_EQ(n, 2u);
      pkv_hash_options ho;
      pkv_hash_options_init(&ho);
      ho.cache_salt = so->cache_salt;
      ho.mm_items = so->mm_items;
      ho.num_mm_items = so->num_mm_items;
      ho.strict_key_domains = strict;
      ho.lora_name = so->lora_name;
      ho.lora_path = so->lora_path;
      std::vector<int32_t> t = prompt();
      ASSERT_EQ(pkv_hash_prefix(&ho, t.data(), 32, lib_h, 2, &n), PKV_OK);
      ASSERT_EQ(n, 2u);
      EXPECT_EQ(std::memcmp(pool_h, lib_h, sizeof pool_h), 0) << "strict " << strict;
      ASSERT_EQ(pkv_seq_free(p, id), PKV_OK);
    }
    pkv_pool_destroy(p);
  }
  pkv_hash_options ho;
  pkv_hash_options_init(&ho);
  ho.strict_key_domains = 3;
  uint64_t n = 0;
  EXPECT_EQ(pkv_hash_prefix(&ho, nullptr, 0, nullptr, 0, &n), PKV_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pkv_last_error_message()).find("opts->strict_key_domains"),
            std::string::npos);
}

// PKV_KEY_DOMAINS_VLLM_TAGGED (vLLM 0.33's tagged keys): salts, names and
// items apart as in strict mode; the adapter's path is part of its key
// there only; requests without extra keys hash as in every mode.
TEST(KeyDomains, TaggedKeysSeparateDomainsAndKeyTheLoraPath) {
  pkv_pool* p = make_pool(PKV_KEY_DOMAINS_VLLM_TAGGED);
  EXPECT_EQ(strict_of(p), uint32_t(PKV_KEY_DOMAINS_VLLM_TAGGED));
  Requests r;
  holder(p, &r.salted);
  EXPECT_EQ(hit(p, &r.salted), 32u);
  EXPECT_EQ(hit(p, &r.other_salt), 0u);
  EXPECT_EQ(hit(p, &r.aimed), 0u);
  pkv_seq_options named;
  pkv_seq_options_init(&named);
  named.lora_name = "tenant-a-salt";
  EXPECT_EQ(hit(p, &named), 0u);  // ("lora", name, path) never equals ("cache_salt", salt)
  named.lora_name = "sql";
  named.lora_path = "/adapters/sql-v1";
  pkv_seq_id own = holder(p, &named);
  EXPECT_EQ(hit(p, &named), 32u);
  pkv_seq_options moved = named;
  moved.lora_path = "/adapters/sql-v2";  // the name pointed at another adapter
  EXPECT_EQ(hit(p, &moved), 0u);
  EXPECT_EQ(pkv_seq_free(p, own), PKV_OK);
  // No extra keys: the same hashes as an untagged pool's.
  pkv_pool* plain = make_pool(PKV_KEY_DOMAINS_VLLM);
  pkv_seq_id a = holder(p, nullptr), b = holder(plain, nullptr);
  pkv_block_hash ha[2], hb[2];
  uint64_t n = 0;
  ASSERT_EQ(pkv_seq_get_block_hashes(p, a, ha, 2, &n), PKV_OK);
  ASSERT_EQ(pkv_seq_get_block_hashes(plain, b, hb, 2, &n), PKV_OK);
  EXPECT_EQ(std::memcmp(ha, hb, sizeof ha), 0);
  // An untagged pool ignores the path.
  pkv_seq_options path_only = named;
  pkv_seq_id c = holder(plain, &named);
  path_only.lora_path = "/elsewhere";
  EXPECT_EQ(hit(plain, &path_only), 32u);
  EXPECT_EQ(pkv_seq_free(plain, c), PKV_OK);
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK);
  pkv_pool_destroy(plain);
  pkv_pool_destroy(p);
}

TEST(KeyDomains, StrictModeSeparatesLoraNamesFromSalts) {
  pkv_pool* p = make_pool(1);
  Requests r;
  holder(p, &r.salted);
  pkv_seq_options named;
  pkv_seq_options_init(&named);
  named.lora_name = "tenant-a-salt";
  EXPECT_EQ(hit(p, &named), 0u);
  pkv_seq_id own = holder(p, &named);  // names still share with names
  EXPECT_EQ(hit(p, &named), 32u);
  EXPECT_EQ(pkv_seq_free(p, own), PKV_OK);
  pkv_pool_destroy(p);
}

}  // namespace
