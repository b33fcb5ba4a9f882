// Step plans: slot mapping and CSR page table for mixed batches, query-count
// checks, staleness, and copy-on-write copies executed by prepare.
#include <gtest/gtest.h>

#include <random>

#include "step_plan.h"
#include "test_util.h"

namespace pagedkv {
namespace {

using test::append;
using test::code_of;
using test::iota_tokens;
using test::table;
using V = std::vector<int32_t>;

template <class T>
std::vector<T> arr(const T* p, size_t n) {
  return std::vector<T>(p, p + n);
}

TEST(Plan, MixedDecodeAndPrefillBatch) {
  auto pool = Pool::create(test::manager_options(4, 20));
  SeqId a = pool->seq_create({}), b = pool->seq_create({});
  append(*pool, a, iota_tokens(10));     // 1 2 3
  test::step(pool, a);                   // a's context below is written
  append(*pool, b, iota_tokens(5, 50));  // 4 5
  SeqId c = pool->fork(a);
  append(*pool, c, {99});  // copy-on-write of 3 into 6
  ASSERT_EQ(table(*pool, c), (V{1, 2, 6}));
  ASSERT_EQ(pool->pending_copies().size(), 1u);

  SeqId ids[3] = {a, b, c};
  uint32_t q[3] = {1, 5, 1};
  auto batch = Batch::prepare(pool, ids, q, 3, nullptr);
  EXPECT_TRUE(pool->pending_copies().empty());  // executed (nothing to move here)
  const PlanView& v = batch->host_view();
  const BatchInfo& info = batch->info();
  EXPECT_EQ(info.num_seqs, 3u);
  EXPECT_EQ(info.num_tokens, 7u);
  EXPECT_EQ(info.num_pages, 8u);
  EXPECT_EQ(info.max_context, 11u);
  EXPECT_EQ(info.max_query, 5u);
  EXPECT_EQ(arr(v.slot_mapping, 7), (std::vector<int64_t>{13, 16, 17, 18, 19, 20, 26}));
  EXPECT_EQ(arr(v.query_indptr, 4), (V{0, 1, 6, 7}));
  EXPECT_EQ(arr(v.page_indptr, 4), (V{0, 3, 5, 8}));
  EXPECT_EQ(arr(v.page_indices, 8), (V{1, 2, 3, 4, 5, 1, 2, 6}));
  EXPECT_EQ(arr(v.last_page_len, 3), (V{2, 1, 3}));
  EXPECT_EQ(arr(v.context_lens, 3), (V{10, 5, 11}));
  // On the CPU the device view is the host view.
  EXPECT_EQ(batch->view().slot_mapping, v.slot_mapping);
  // Callers get their own copy of the arrays, never the one the kernels read.
  TensorArg t = batch->plan_tensor(uint32_t(PlanArray::kSlotMapping));
  EXPECT_EQ(t.dtype, uint32_t(DType::kI64));
  EXPECT_EQ(t.ndim, 1);
  EXPECT_EQ(t.shape[0], 7);
  EXPECT_NE(t.data, static_cast<const void*>(v.slot_mapping));
  EXPECT_EQ(arr(static_cast<const int64_t*>(t.data), 7), arr(v.slot_mapping, 7));
  t = batch->plan_tensor(uint32_t(PlanArray::kPageIndices));
  EXPECT_EQ(t.dtype, uint32_t(DType::kI32));
  EXPECT_EQ(t.shape[0], 8);
  EXPECT_NE(t.data, static_cast<const void*>(v.page_indices));
  EXPECT_EQ(arr(static_cast<const int32_t*>(t.data), 8), arr(v.page_indices, 8));
  EXPECT_EQ(code_of([&] { batch->plan_tensor(6); }), Errc::kInvalidArgument);
}

TEST(Plan, RandomBatchesMatchTheBlockTables) {
  std::mt19937 rng(5);
  auto pool = Pool::create(test::manager_options(16, 4000));
  std::vector<SeqId> ids;
  std::vector<uint32_t> q;
  for (int i = 0; i < 40; ++i) {
    SeqId s = pool->seq_create({});
    const uint32_t n = 1 + rng() % 300, qi = 1 + rng() % n;
    if (n > qi) {  // the context was computed by an earlier step
      append(*pool, s, iota_tokens(n - qi, i * 1000));
      test::step(pool, s);
    }
    append(*pool, s, iota_tokens(qi, i * 1000 + int32_t(n - qi)));
    ids.push_back(s);
    q.push_back(qi);
  }
  auto batch = Batch::prepare(pool, ids.data(), q.data(), uint32_t(ids.size()), nullptr);
  const PlanView& v = batch->host_view();
  int64_t row = 0;
  int32_t page = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto t = table(*pool, ids[i]);
    const int64_t n = int64_t(pool->seq_info(ids[i]).num_tokens);
    ASSERT_EQ(v.query_indptr[i], row);
    ASSERT_EQ(v.page_indptr[i], page);
    ASSERT_EQ(v.context_lens[i], n);
    const int64_t pages = (n + 15) / 16;
    ASSERT_EQ(v.last_page_len[i], n - (pages - 1) * 16);
    for (int64_t j = 0; j < pages; ++j) ASSERT_EQ(v.page_indices[page++], t[j]);
    for (int64_t pos = n - q[i]; pos < n; ++pos)
      ASSERT_EQ(v.slot_mapping[row++], int64_t(t[pos / 16]) * 16 + pos % 16);
  }
  EXPECT_EQ(v.query_indptr[ids.size()], row);
  EXPECT_EQ(v.page_indptr[ids.size()], page);
}

TEST(Plan, RejectsBadQueryCountsDuplicatesAndStaleIds) {
  auto pool = Pool::create(test::manager_options(4, 20));
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(6));
  SeqId gone = pool->seq_create({});
  pool->free(gone);
  auto prep = [&](std::vector<SeqId> ids, std::vector<uint32_t> q) {
    return code_of(
        [&] { Batch::prepare(pool, ids.data(), q.data(), uint32_t(ids.size()), nullptr); });
  };
  EXPECT_EQ(prep({a}, {0}), Errc::kInvalidArgument);
  EXPECT_EQ(prep({a}, {7}), Errc::kInvalidArgument);
  EXPECT_EQ(prep({a, a}, {1, 1}), Errc::kInvalidArgument);
  EXPECT_EQ(prep({gone}, {1}), Errc::kNotFound);
  EXPECT_EQ(prep({}, {}), Errc::kInvalidArgument);
  EXPECT_EQ(prep({a}, {6}), Errc(0));
  EXPECT_VALID(*pool);
}

TEST(Plan, QueriesInsideTheReleasedWindowAreRejected) {
  PoolOptions o = test::manager_options(4, 20);
  o.sliding_window = 4;
  auto pool = Pool::create(o);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(8));
  test::step(pool, a);    // 0..7 computed
  append(*pool, a, {8});  // query at 8 sees 5..8: block 0 released
  ASSERT_EQ(table(*pool, a)[0], 0);
  // 2 queries: the first (7) reads keys 4..7, all in block 1. 3 queries: the
  // first (6) would read key 3 of the released block 0.
  uint32_t ok = 2, bad = 3;
  EXPECT_EQ(code_of([&] { Batch::prepare(pool, &a, &ok, 1, nullptr); }), Errc(0));
  EXPECT_EQ(code_of([&] { Batch::prepare(pool, &a, &bad, 1, nullptr); }), Errc::kInvalidArgument);
}

// A small pool with f32 storage, one layer.
std::shared_ptr<Pool> storage_pool(uint32_t heads = 2, uint32_t dim = 8) {
  PoolOptions o = test::manager_options(4, 16);
  o.num_layers = 1;
  o.num_kv_heads = heads;
  o.head_dim = dim;
  o.dtype = DType::kF32;
  o.num_threads = 1;
  return Pool::create(o);
}

using test::random_floats;
using test::rows;

TEST(Plan, CacheWriteLandsInThePlannedSlots) {
  auto pool = storage_pool();
  SeqId a = pool->seq_create({}), b = pool->seq_create({});
  append(*pool, b, iota_tokens(3));  // b takes block 1 first: a's blocks are not 1..n
  append(*pool, a, iota_tokens(7));
  SeqId ids[2] = {a, b};
  uint32_t q[2] = {7, 3};
  auto batch = Batch::prepare(pool, ids, q, 2, nullptr);
  auto k = random_floats(10 * 2 * 8, 1), v = random_floats(10 * 2 * 8, 2);
  TensorArg kt = rows(k, 10, 2, 8), vt = rows(v, 10, 2, 8);
  batch->write(0, &kt, &vt, nullptr);
  const float* kp = static_cast<const float*>(pool->kv_tensor(0, 0).data);
  const float* vp = static_cast<const float*>(pool->kv_tensor(0, 1).data);
  const PlanView& pv = batch->host_view();
  for (int64_t i = 0; i < 10; ++i) {
    const int64_t slot = pv.slot_mapping[i], blk = slot / 4, off = slot % 4;
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 8; ++d) {
        const int64_t at = ((blk * 2 + h) * 4 + off) * 8 + d;
        ASSERT_EQ(kp[at], k[(i * 2 + h) * 8 + d]);
        ASSERT_EQ(vp[at], v[(i * 2 + h) * 8 + d]);
      }
  }
}

TEST(Plan, PrepareExecutesCopyOnWriteCopiesBeforeAnyWrite) {
  auto pool = storage_pool();
  SeqId p = pool->seq_create({});
  append(*pool, p, iota_tokens(6));  // blocks 1 2
  {
    uint32_t q = 6;
    auto batch = Batch::prepare(pool, &p, &q, 1, nullptr);
    auto k = random_floats(6 * 16, 3), v = random_floats(6 * 16, 4);
    TensorArg kt = rows(k, 6, 2, 8), vt = rows(v, 6, 2, 8);
    batch->write(0, &kt, &vt, nullptr);
  }
  SeqId c = pool->fork(p);
  append(*pool, c, {6});  // copy 2 -> 3 pending
  ASSERT_EQ(table(*pool, c), (V{1, 3}));
  uint32_t q = 1;
  auto batch = Batch::prepare(pool, &c, &q, 1, nullptr);
  EXPECT_TRUE(pool->pending_copies().empty());
  const float* kp = static_cast<const float*>(pool->kv_tensor(0, 0).data);
  const float* vp = static_cast<const float*>(pool->kv_tensor(0, 1).data);
  const int64_t block_elems = 2 * 4 * 8;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t off = 0; off < 2; ++off)  // the two tokens block 2 held
      for (int64_t d = 0; d < 8; ++d) {
        const int64_t in_block = (h * 4 + off) * 8 + d;
        EXPECT_EQ(kp[3 * block_elems + in_block], kp[2 * block_elems + in_block]);
        EXPECT_EQ(vp[3 * block_elems + in_block], vp[2 * block_elems + in_block]);
      }
}

TEST(Plan, StalePlansAndDestroyedPoolsFailCleanly) {
  auto pool = storage_pool();
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(5));
  uint32_t q = 5;
  auto batch = Batch::prepare(pool, &a, &q, 1, nullptr);
  auto k = random_floats(5 * 16, 5), v = random_floats(5 * 16, 6);
  TensorArg kt = rows(k, 5, 2, 8), vt = rows(v, 5, 2, 8);
  EXPECT_EQ(code_of([&] { batch->write(0, &kt, &vt, nullptr); }), Errc(0));
  EXPECT_EQ(code_of([&] { batch->write(1, &kt, &vt, nullptr); }), Errc::kInvalidArgument);
  SeqId other = pool->seq_create({});
  append(*pool, other, {1});       // other sequences do not matter
  pool->append(a, nullptr, 0, 0);  // nor an append that changes nothing
  EXPECT_EQ(code_of([&] { batch->write(0, &kt, &vt, nullptr); }), Errc(0));
  pool->append(a, nullptr, 0, 3);  // nor a reservation the table already covers
  EXPECT_EQ(code_of([&] { batch->write(0, &kt, &vt, nullptr); }), Errc(0));
  append(*pool, a, {5});
  EXPECT_EQ(code_of([&] { batch->write(0, &kt, &vt, nullptr); }), Errc::kInvalidState);
  auto q3 = random_floats(5 * 16, 7), o3 = q3;
  TensorArg qt = rows(q3, 5, 2, 8), ot = rows(o3, 5, 2, 8);
  EXPECT_EQ(code_of([&] { batch->attend(0, &qt, &ot, nullptr, {}, nullptr); }),
            Errc::kInvalidState);
  auto fresh = Batch::prepare(pool, &a, &q, 1, nullptr);
  EXPECT_EQ(code_of([&] { fresh->write(0, &kt, &vt, nullptr); }), Errc(0));
  pool->truncate(a, 5);
  EXPECT_EQ(code_of([&] { fresh->write(0, &kt, &vt, nullptr); }), Errc::kInvalidState);
  auto again = Batch::prepare(pool, &a, &q, 1, nullptr);
  pool->free(a);
  EXPECT_EQ(code_of([&] { again->write(0, &kt, &vt, nullptr); }), Errc::kInvalidState);

  SeqId b = pool->seq_create({});
  append(*pool, b, iota_tokens(5));
  auto last = Batch::prepare(pool, &b, &q, 1, nullptr);
  pool->close();  // pkv_pool_destroy
  pool.reset();
  EXPECT_EQ(code_of([&] { last->write(0, &kt, &vt, nullptr); }), Errc::kInvalidState);
  EXPECT_EQ(last->info().num_tokens, 5u);
  last.reset();  // frees what is left of the pool
}

TEST(Plan, TensorChecksNameTheArgument) {
  auto pool = storage_pool(2, 8);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(3));
  uint32_t q = 3;
  auto batch = Batch::prepare(pool, &a, &q, 1, nullptr);
  auto buf = random_floats(3 * 4 * 8, 8), out = buf;
  auto message = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  TensorArg good = rows(buf, 3, 2, 8);
  TensorArg bad = good;
  bad.dtype = uint32_t(DType::kBF16);
  EXPECT_NE(message([&] { batch->write(0, &good, &bad, nullptr); }).find("v has dtype"),
            std::string::npos);
  bad = good;
  bad.shape[0] = 4;
  EXPECT_NE(message([&] { batch->write(0, &bad, &good, nullptr); }).find("k has shape"),
            std::string::npos);
  bad = good;
  bad.device_type = kDeviceCuda;
  EXPECT_NE(message([&] { batch->write(0, &bad, &good, nullptr); }).find("k is on device"),
            std::string::npos);
  bad = good;
  bad.strides[0] = 16;
  bad.strides[1] = 8;
  bad.strides[2] = 2;
  EXPECT_NE(message([&] { batch->write(0, &bad, &good, nullptr); }).find("innermost stride"),
            std::string::npos);
  bad = good;
  bad.data = nullptr;
  EXPECT_NE(message([&] { batch->write(0, &bad, &good, nullptr); }).find("k->data is NULL"),
            std::string::npos);
  TensorArg q3 = rows(buf, 3, 3, 8), o3 = rows(out, 3, 3, 8);  // 3 q heads over 2 kv heads
  EXPECT_NE(message([&] { batch->attend(0, &q3, &o3, nullptr, {}, nullptr); }).find("q has shape"),
            std::string::npos);
  TensorArg q4 = rows(buf, 3, 4, 8), o4 = rows(out, 3, 4, 8);
  std::vector<float> lse_buf(3 * 4);
  TensorArg lse;
  lse.data = lse_buf.data();
  lse.dtype = uint32_t(DType::kF32);
  lse.device_type = kDeviceCpu;
  lse.ndim = 2;
  lse.shape[0] = 3;
  lse.shape[1] = 2;  // wrong: 4 q heads
  EXPECT_NE(message([&] { batch->attend(0, &q4, &o4, &lse, {}, nullptr); }).find("lse has shape"),
            std::string::npos);
  AttentionParams p;
  p.softmax_scale = -1;
  EXPECT_NE(message([&] { batch->attend(0, &q4, &o4, nullptr, p, nullptr); }).find("softmax_scale"),
            std::string::npos);
}

}  // namespace
}  // namespace pagedkv
