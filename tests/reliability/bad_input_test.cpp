// Runs every case of the bad-input matrix (bad_input_cases.cpp) on a fresh
// environment: the documented status, a message naming the argument, and the
// pools exactly as they were (validate clean, stats, infos, block tables and
// hashes equal). Also proves the matrix covers every function the public
// headers declare.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "bad_input_cases.h"

namespace pkv_rel {
namespace {

struct SeqSnap {
  pkv_status info_status = 0;
  pkv_seq_info info{};
  std::vector<int32_t> table;
  std::vector<std::string> hashes;
  bool operator==(const SeqSnap& o) const {
    return info_status == o.info_status && std::memcmp(&info, &o.info, sizeof info) == 0 &&
           table == o.table && hashes == o.hashes;
  }
};

struct PoolSnap {
  pkv_status validate = 0;
  pkv_pool_stats stats{};
  std::vector<SeqSnap> seqs;
  bool operator==(const PoolSnap& o) const {
    return validate == o.validate && std::memcmp(&stats, &o.stats, sizeof stats) == 0 &&
           seqs == o.seqs;
  }
};

SeqSnap snap_seq(const pkv_pool* p, pkv_seq_id id) {
  SeqSnap s;
  pkv_seq_info_init(&s.info);
  s.info_status = pkv_seq_get_info(p, id, &s.info);
  if (s.info_status != PKV_OK) return s;
  uint64_t n = 0;
  pkv_seq_get_block_table(p, id, nullptr, 0, &n);
  s.table.resize(n);
  if (n) EXPECT_EQ(pkv_seq_get_block_table(p, id, s.table.data(), n, &n), PKV_OK);
  pkv_seq_get_block_hashes(p, id, nullptr, 0, &n);
  std::vector<pkv_block_hash> h(n);
  if (n) EXPECT_EQ(pkv_seq_get_block_hashes(p, id, h.data(), n, &n), PKV_OK);
  for (const pkv_block_hash& x : h)
    s.hashes.emplace_back(reinterpret_cast<const char*>(x.bytes), PKV_HASH_MAX_BYTES);
  return s;
}

PoolSnap snap_pool(const pkv_pool* p, std::initializer_list<pkv_seq_id> ids) {
  PoolSnap s;
  if (!p) return s;
  s.validate = pkv_pool_validate(p);
  pkv_pool_stats_init(&s.stats);
  EXPECT_EQ(pkv_pool_get_stats(p, &s.stats), PKV_OK);
  for (pkv_seq_id id : ids) s.seqs.push_back(snap_seq(p, id));
  return s;
}

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  const Case& c = bad_input_cases()[info.param];
  std::string n = std::string(c.fn + 4) + "_" + std::to_string(info.param);
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

class BadInput : public ::testing::TestWithParam<size_t> {};

TEST_P(BadInput, DocumentedStatusMessageAndNothingChanged) {
  const Case& c = bad_input_cases()[GetParam()];
  SCOPED_TRACE(std::string(c.fn) + " / " + c.cls + " / " + c.what);
  Env e;
  if (c.setup) c.setup(e);
  const PoolSnap before = snap_pool(e.pool, {e.a, e.b, e.empty, e.dead});
  const PoolSnap before_mgr = snap_pool(e.mgr, {e.m});
  const pkv_status got = c.call(e);
  const std::string msg = pkv_last_error_message();  // before anything else runs
  if (c.want_alt != 1 && got == c.want_alt) {
    SUCCEED();
  } else {
    EXPECT_EQ(got, c.want) << status_name(got) << " instead of " << status_name(c.want)
                           << "; message: " << msg;
  }
  if (c.needle) {
    EXPECT_FALSE(msg.empty()) << "a failed call left no message";
    EXPECT_NE(msg.find(c.needle), std::string::npos)
        << "message \"" << msg << "\" does not name \"" << c.needle << "\"";
  }
  const PoolSnap after = snap_pool(e.pool, {e.a, e.b, e.empty, e.dead});
  const PoolSnap after_mgr = snap_pool(e.mgr, {e.m});
  EXPECT_TRUE(before == after) << "the storage pool changed";
  EXPECT_TRUE(before_mgr == after_mgr) << "the manager pool changed";
  if (e.pool) EXPECT_EQ(after.validate, PKV_OK);
  EXPECT_EQ(after_mgr.validate, PKV_OK);
}

INSTANTIATE_TEST_SUITE_P(Matrix, BadInput, ::testing::Range<size_t>(0, bad_input_cases().size()),
                         case_name);

// The valid calls the cases start from succeed, so every failure above is
// caused by the one bad argument.
TEST(BadInputControl, ValidCallsSucceed) {
  Env e;
  EXPECT_EQ(pkv_cache_write(e.batch, 1, &e.kt, &e.vt, nullptr), PKV_OK);
  EXPECT_EQ(pkv_attention_forward(e.batch, 1, &e.qt, &e.ot, &e.lt, nullptr, nullptr), PKV_OK);
  pkv_attention_params p;
  pkv_attention_params_init(&p);
  EXPECT_EQ(pkv_attention_forward(e.batch, 0, &e.qt, &e.ot, nullptr, &p, nullptr), PKV_OK);
  EXPECT_EQ(pkv_seq_match_prefix(e.pool, e.empty, e.tokens, 20, &e.u64), PKV_OK);
  EXPECT_EQ(e.u64, 16u);
  EXPECT_EQ(pkv_seq_get_block_table(e.pool, e.a, e.table, 3, &e.u64), PKV_OK);
  EXPECT_EQ(pkv_seq_get_block_hashes(e.pool, e.a, e.hashes, 2, &e.u64), PKV_OK);
  pkv_hash_options ho;
  pkv_hash_options_init(&ho);
  EXPECT_EQ(pkv_hash_prefix(&ho, e.tokens, 32, e.hashes, 2, &e.u64), PKV_OK);
  int32_t b = 5;
  std::vector<char> host(1 << 20);
  EXPECT_EQ(pkv_pool_swap_blocks(e.pool, &b, 1, host.data(), host.size(), PKV_SWAP_OUT, nullptr),
            PKV_OK);
  int32_t s = 5, d = 6;
  EXPECT_EQ(pkv_pool_copy_blocks(e.pool, &s, &d, 1, nullptr), PKV_OK);
  EXPECT_EQ(pkv_seq_append(e.pool, e.a, e.tokens, 64, 0), PKV_OK);  // fits; the OOB case does not
  EXPECT_EQ(pkv_pool_validate(e.pool), PKV_OK);
}

// Every PKV_API function of the public headers has at least one case, or is
// listed here as having no argument that can be wrong.
TEST(BadInputCoverage, EveryFunctionOfTheHeaders) {
  const std::set<std::string> no_bad_input = {"pkv_version_string",     "pkv_version_number",
                                              "pkv_abi_version",        "pkv_features",
                                              "pkv_last_error_message", "pkv_cuda_device_count"};
  std::set<std::string> covered;
  for (const Case& c : bad_input_cases()) covered.insert(c.fn);
  std::set<std::string> declared;
  const std::regex decl(R"(PKV_API[^;(]*?\b(pkv_\w+)\s*\()");
  for (const char* h : {"common.h", "hash.h", "pool.h", "batch.h", "tiers.h"}) {
    std::ifstream in(std::string(PKV_HEADER_DIR) + "/" + h);
    ASSERT_TRUE(in) << h;
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    for (std::sregex_iterator it(text.begin(), text.end(), decl), end; it != end; ++it)
      declared.insert((*it)[1]);
  }
  EXPECT_GE(declared.size(), 45u);  // the regex still finds them all
  for (const std::string& f : declared)
    EXPECT_TRUE(covered.count(f) || no_bad_input.count(f))
        << f << " has no bad-input case in tests/reliability/bad_input_cases.cpp";
  for (const std::string& f : covered) EXPECT_TRUE(declared.count(f)) << f << " is not declared";
}

}  // namespace
}  // namespace pkv_rel
