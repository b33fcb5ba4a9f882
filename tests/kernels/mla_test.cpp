// MLA kernels (impl/cpu/mla.h) against a float64 reference written here:
// random latents and queries (never zeros), pages in a random permutation
// of the blocks, NaN in every slot no token owns, every output element and
// LSE checked, for each ISA, dtype, several block sizes and head counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/mla.h"
#include "cpu/thread_pool.h"
#include "test_util.h"

namespace pagedkv {
namespace {

using test::Buffer;

struct SeqSpec {
  int32_t len, nq;
};

struct Case {
  const char* name;
  int32_t block_size, heads, rank, rope;
  std::vector<SeqSpec> seqs;
};

double dtype_eps(DType t) {
  return t == DType::kF32 ? 0.0 : t == DType::kF16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}

std::vector<const cpu::MlaOps*> ops_under_test() {
  std::vector<const cpu::MlaOps*> out{&cpu::mla_ops_scalar()};
  if (cpu::cpu_isa_supported(CpuIsa::kAvx2)) out.push_back(cpu::mla_ops_avx2());
  if (cpu::cpu_isa_supported(CpuIsa::kAvx512)) out.push_back(cpu::mla_ops_avx512());
  return out;
}

// One randomly filled paged latent cache and plan for a case and dtype.
struct Fixture {
  Case c;
  DType dtype;
  int32_t D = 0, num_blocks = 0;
  int64_t num_tokens = 0;
  Buffer cache;
  std::vector<int64_t> slots;
  std::vector<int32_t> qptr, pptr, pages, last, ctx;
  // Exact values of every position's latent row, per sequence.
  std::vector<std::vector<double>> rows;
  // The query tokens' rows as write inputs (kv_c strided: rank + 5 apart).
  Buffer kv_c, k_pe, q_lat, q_pe;
  int64_t kv_c_stride = 0;
  std::vector<double> ql_exact, qp_exact;

  Fixture(const Case& cs, DType t, std::mt19937& rng) : c(cs), dtype(t) {
    D = c.rank + c.rope;
    int32_t total_pages = 0;
    for (const SeqSpec& s : c.seqs) total_pages += (s.len + c.block_size - 1) / c.block_size;
    num_blocks = total_pages + 3;  // spare blocks stay NaN
    const int64_t plane = int64_t(num_blocks) * c.block_size * D;
    cache = Buffer(size_t(plane) * dtype_size(t));
    test::fill_nan(cache.data(), t, plane);
    std::vector<int32_t> ids(size_t(num_blocks - 1));
    std::iota(ids.begin(), ids.end(), 1);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto value = [&] {
      float x = 0;
      while (std::fabs(x) < 1e-3f) x = u(rng);  // never zero
      return x;
    };
    qptr.push_back(0);
    pptr.push_back(0);
    for (const SeqSpec& s : c.seqs) num_tokens += s.nq;
    kv_c_stride = c.rank + 5;
    kv_c = Buffer(size_t(num_tokens * kv_c_stride) * dtype_size(t));
    test::fill_nan(kv_c.data(), t, num_tokens * kv_c_stride);
    k_pe = Buffer(size_t(std::max<int64_t>(1, num_tokens * c.rope)) * dtype_size(t));
    size_t next_id = 0;
    int64_t row = 0;
    for (const SeqSpec& s : c.seqs) {
      const int32_t np = (s.len + c.block_size - 1) / c.block_size;
      for (int32_t i = 0; i < np; ++i) pages.push_back(ids[next_id++]);
      std::vector<double> r(size_t(s.len) * D);
      for (int32_t p = 0; p < s.len; ++p) {
        const int32_t block = pages[size_t(pptr.back() + p / c.block_size)];
        const int64_t slot = int64_t(block) * c.block_size + p % c.block_size;
        const bool query = p >= s.len - s.nq;
        for (int32_t d = 0; d < D; ++d) {
          const float x = value();
          if (!query) {  // the cached prefix: already in the cache
            r[size_t(p) * D + d] = test::store(cache.data(), t, slot * D + d, x);
          } else if (d < c.rank) {
            r[size_t(p) * D + d] = test::store(kv_c.data(), t, row * kv_c_stride + d, x);
          } else {
            r[size_t(p) * D + d] = test::store(k_pe.data(), t, row * c.rope + d - c.rank, x);
          }
        }
        if (query) {
          slots.push_back(slot);
          ++row;
        }
      }
      rows.push_back(std::move(r));
      qptr.push_back(qptr.back() + s.nq);
      pptr.push_back(pptr.back() + np);
      last.push_back(s.len - (np - 1) * c.block_size);
      ctx.push_back(s.len);
    }
    const int64_t nql = num_tokens * c.heads * c.rank, nqp = num_tokens * c.heads * c.rope;
    q_lat = Buffer(size_t(nql) * dtype_size(t));
    q_pe = Buffer(size_t(std::max<int64_t>(1, nqp)) * dtype_size(t));
    ql_exact.resize(size_t(nql));
    qp_exact.resize(size_t(nqp));
    for (int64_t i = 0; i < nql; ++i)
      ql_exact[size_t(i)] = test::store(q_lat.data(), t, i, value());
    for (int64_t i = 0; i < nqp; ++i) qp_exact[size_t(i)] = test::store(q_pe.data(), t, i, value());
  }

  PlanView plan() const {
    PlanView v{};
    v.num_seqs = int32_t(c.seqs.size());
    v.num_tokens = num_tokens;
    v.max_query = 0;
    v.max_context = 0;
    for (const SeqSpec& s : c.seqs) {
      v.max_query = std::max(v.max_query, s.nq);
      v.max_context = std::max(v.max_context, s.len);
    }
    v.slot_mapping = slots.data();
    v.query_indptr = qptr.data();
    v.page_indptr = pptr.data();
    v.page_indices = pages.data();
    v.last_page_len = last.data();
    v.context_lens = ctx.data();
    return v;
  }
  cpu::MlaCache mla_cache() {
    return cpu::MlaCache{cache.data(), num_blocks, c.block_size, c.rank, c.rope, dtype};
  }
  Tensor3 t3(Buffer& b, int64_t n1, int64_t n2, int64_t s0) {
    return Tensor3{b.data(), dtype, num_tokens, n1, n2, s0, n2};
  }
};

// The float64 reference: out [N, H, R] and lse [N, H].
void reference(const Fixture& f, double scale, std::vector<double>* out, std::vector<double>* lse) {
  const Case& c = f.c;
  out->assign(size_t(f.num_tokens * c.heads * c.rank), 0.0);
  lse->assign(size_t(f.num_tokens * c.heads), 0.0);
  int64_t t = 0;
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    const SeqSpec& sp = c.seqs[s];
    const std::vector<double>& rows = f.rows[s];
    for (int32_t i = 0; i < sp.nq; ++i, ++t) {
      const int32_t p = sp.len - sp.nq + i;
      for (int32_t h = 0; h < c.heads; ++h) {
        const double* ql = f.ql_exact.data() + (t * c.heads + h) * c.rank;
        const double* qp = f.qp_exact.data() + (t * c.heads + h) * c.rope;
        std::vector<double> x(size_t(p) + 1);
        double mx = -INFINITY;
        for (int32_t k = 0; k <= p; ++k) {
          const double* r = rows.data() + size_t(k) * f.D;
          double dot = 0;
          for (int32_t d = 0; d < c.rank; ++d) dot += ql[d] * r[d];
          for (int32_t d = 0; d < c.rope; ++d) dot += qp[d] * r[c.rank + d];
          x[size_t(k)] = scale * dot;
          mx = std::max(mx, x[size_t(k)]);
        }
        double sum = 0;
        for (double& v : x) sum += (v = std::exp(v - mx));
        double* o = out->data() + (t * c.heads + h) * c.rank;
        for (int32_t k = 0; k <= p; ++k)
          for (int32_t d = 0; d < c.rank; ++d)
            o[d] += x[size_t(k)] / sum * rows[size_t(k) * f.D + d];
        (*lse)[size_t(t * c.heads + h)] = mx + std::log(sum);
      }
    }
  }
}

const std::vector<Case>& cases() {
  static const std::vector<Case> cs = {
      {"decode_h16", 16, 16, 512, 64, {{1, 1}, {17, 1}, {40, 1}, {64, 1}, {130, 1}}},
      {"prefill_h16_bs8", 8, 16, 512, 64, {{37, 37}, {20, 20}}},
      {"mixed_h128_bs32", 32, 128, 512, 64, {{50, 1}, {45, 13}, {9, 9}}},
      {"long_decode_bs64", 64, 16, 512, 64, {{300, 1}, {129, 2}}},
      {"odd_dims_bs1", 1, 3, 37, 3, {{11, 4}, {5, 1}, {3, 3}}},
      {"no_rope_bs5", 5, 5, 24, 0, {{12, 7}, {6, 1}}},
  };
  return cs;
}

class MlaKernel : public ::testing::TestWithParam<std::tuple<size_t, DType>> {};

TEST_P(MlaKernel, MatchesFloat64Reference) {
  const Case& c = cases()[std::get<0>(GetParam())];
  const DType dtype = std::get<1>(GetParam());
  std::mt19937 rng(1234u + uint32_t(std::get<0>(GetParam())) * 7u + uint32_t(dtype));
  Fixture f(c, dtype, rng);
  const double scale = 1.0 / std::sqrt(192.0) * 1.3;
  std::vector<double> ref, ref_lse;
  reference(f, double(float(scale)), &ref, &ref_lse);
  const double eps = dtype_eps(dtype);

  // The write: query tokens' latents land in their slots, nothing else moves.
  const PlanView plan = f.plan();
  {
    ThreadPool pool(2);
    const int64_t plane = int64_t(f.num_blocks) * c.block_size * f.D;
    std::vector<uint8_t> before(
        static_cast<const uint8_t*>(f.cache.data()),
        static_cast<const uint8_t*>(f.cache.data()) + plane * int64_t(dtype_size(dtype)));
    cpu::mla_write(pool, f.mla_cache(), plan, f.t3(f.kv_c, 1, c.rank, f.kv_c_stride),
                   f.t3(f.k_pe, 1, c.rope, c.rope));
    std::vector<bool> owned(size_t(plane), false);
    for (int64_t t = 0; t < f.num_tokens; ++t)
      for (int32_t d = 0; d < f.D; ++d) owned[size_t(f.slots[size_t(t)] * f.D + d)] = true;
    const size_t es = dtype_size(dtype);
    for (int64_t i = 0; i < plane; ++i) {
      if (owned[size_t(i)]) continue;
      ASSERT_EQ(0, std::memcmp(before.data() + i * int64_t(es),
                               static_cast<const uint8_t*>(f.cache.data()) + i * int64_t(es), es))
          << "element " << i << " changed but no token owns it";
    }
  }
  // The written rows now hold the exact inputs (checked by the attention
  // below too, but here element by element).
  {
    int64_t t = 0;
    for (size_t s = 0; s < c.seqs.size(); ++s)
      for (int32_t i = 0; i < c.seqs[s].nq; ++i, ++t) {
        const int32_t p = c.seqs[s].len - c.seqs[s].nq + i;
        for (int32_t d = 0; d < f.D; ++d)
          ASSERT_EQ(f.rows[s][size_t(p) * f.D + d],
                    test::load(f.cache.data(), dtype, f.slots[size_t(t)] * f.D + d))
              << "token " << t << " dim " << d;
      }
  }

  for (const cpu::MlaOps* ops : ops_under_test()) {
    for (int32_t threads : {1, 3}) {
      ThreadPool pool(threads);
      const int64_t n_out = f.num_tokens * c.heads * c.rank;
      Buffer out(size_t(n_out) * dtype_size(dtype));
      test::fill_nan(out.data(), dtype, n_out);
      std::vector<float> lse(size_t(f.num_tokens * c.heads), NAN);
      AttentionArgs args{};
      args.softmax_scale = float(scale);
      args.lse = lse.data();
      args.lse_stride0 = c.heads;
      cpu::mla_attend(pool, *ops, f.mla_cache(), plan,
                      f.t3(f.q_lat, c.heads, c.rank, c.heads * c.rank),
                      f.t3(f.q_pe, c.heads, c.rope, c.heads * c.rope),
                      f.t3(out, c.heads, c.rank, c.heads * c.rank), args);
      int bad = 0;
      for (int64_t i = 0; i < n_out && bad < 5; ++i) {
        const double got = test::load(out.data(), dtype, i), want = ref[size_t(i)];
        const double tol = 2e-5 + 1e-4 * std::fabs(want) + eps * std::fabs(want);
        if (!(std::fabs(got - want) <= tol)) {
          ADD_FAILURE() << c.name << " " << test::dtype_name(dtype) << " threads " << threads
                        << ": out[" << i << "] = " << got << ", reference " << want;
          ++bad;
        }
      }
      for (size_t i = 0; i < lse.size() && bad < 5; ++i) {
        if (!(std::fabs(lse[i] - ref_lse[i]) <= 1e-4 + 1e-5 * std::fabs(ref_lse[i]))) {
          ADD_FAILURE() << c.name << " lse[" << i << "] = " << lse[i] << ", reference "
                        << ref_lse[i];
          ++bad;
        }
      }
      ASSERT_EQ(bad, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaKernel,
                         ::testing::Combine(::testing::Range<size_t>(0, 6),
                                            ::testing::Values(DType::kF32, DType::kF16,
                                                              DType::kBF16)),
                         [](const ::testing::TestParamInfo<std::tuple<size_t, DType>>& i) {
                           return std::string(cases()[std::get<0>(i.param)].name) + "_" +
                                  test::dtype_name(std::get<1>(i.param));
                         });

// A page id outside the cache is refused before anything is read or written.
TEST(MlaKernelArgs, BadPageIdFailsCleanly) {
  std::mt19937 rng(7);
  Fixture f(cases()[4], DType::kF32, rng);
  f.pages[0] = f.num_blocks;  // one past the end
  ThreadPool pool(1);
  const int64_t n_out = f.num_tokens * f.c.heads * f.c.rank;
  Buffer out(size_t(n_out) * 4);
  test::fill_nan(out.data(), DType::kF32, n_out);
  AttentionArgs args{};
  args.softmax_scale = 0.1f;
  try {
    cpu::mla_attend(pool, cpu::mla_ops_scalar(), f.mla_cache(), f.plan(),
                    f.t3(f.q_lat, f.c.heads, f.c.rank, f.c.heads * f.c.rank),
                    f.t3(f.q_pe, f.c.heads, f.c.rope, f.c.heads * f.c.rope),
                    f.t3(out, f.c.heads, f.c.rank, f.c.heads * f.c.rank), args);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("page_indices[0]"), std::string::npos) << e.what();
  }
  for (int64_t i = 0; i < n_out; ++i) ASSERT_TRUE(std::isnan(static_cast<float*>(out.data())[i]));
}

}  // namespace
}  // namespace pagedkv
