// FP8 KV pools end to end through libpagedkv.so: the same steps (prefill,
// then chunked prefill and decode over the cached context) on a bf16, an
// E4M3 and an E5M2 pool, with random K/V (never zero) at several
// magnitudes, some saturating. Checked per element: the stored codes are
// the encoding of x / scale (read back through pkv_pool_kv_tensor), the
// outputs match a float64 reference over those codes tightly, and the
// error against the float64 reference over the original values stays
// within pinned bounds (printed next to the bf16 pool's). Also: scales set
// at creation and updated (also while attention runs on another thread),
// block copies, swaps and prefix-cache hits on FP8 pools.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../kernels/fp8_ref.h"
#include "pagedkv/pagedkv.h"

namespace {

constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 64, kBs = 16, kGroup = 2;
constexpr uint32_t kQHeads = kHeads * kGroup;

int fmt_of(uint32_t dtype) { return dtype == PKV_DTYPE_FP8_E4M3 ? fp8_ref::kE4m3 : fp8_ref::kE5m2; }
double fmax_of(uint32_t dtype) { return dtype == PKV_DTYPE_FP8_E4M3 ? 448.0 : 57344.0; }

pkv_pool* make_pool(uint32_t dtype, uint32_t granularity, const std::vector<float>& ks,
                    const std::vector<float>& vs) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBs;
  o.num_blocks = 64;
  o.num_layers = kLayers;
  o.num_kv_heads = kHeads;
  o.head_dim = kDim;
  o.dtype = dtype;
  o.num_threads = 2;
  o.kv_scale_granularity = granularity;
  o.num_kv_scales = uint32_t(ks.size());
  o.k_scales = ks.empty() ? nullptr : ks.data();
  o.v_scales = vs.empty() ? nullptr : vs.data();
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

pkv_tensor f32_tensor(std::vector<float>& buf, int64_t n0, int64_t n1, int64_t n2) {
  const int64_t shape[3] = {n0, n1, n2};
  pkv_tensor t;
  EXPECT_EQ(pkv_tensor_init(buf.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &t), PKV_OK);
  return t;
}

// The model's activations: for every (sequence, position) K/V rows and
// every (sequence, position) query rows, the same for every pool.
struct Data {
  double mag;
  std::vector<std::vector<float>> k[kLayers], v[kLayers], q[kLayers];  // [seq][pos*H*D]
};

uint16_t to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t x = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// A tensor of the pool's activation dtype (bf16 for the bf16 pool, f32
// for FP8 pools) holding buf's values; converted back by read_back.
struct Act {
  std::vector<float>* f;
  std::vector<uint16_t> h;
  pkv_tensor t;
  Act(std::vector<float>& buf, bool bf16, int64_t n0, int64_t n1, int64_t n2) : f(&buf) {
    const int64_t shape[3] = {n0, n1, n2};
    if (bf16) {
      for (float x : buf) h.push_back(to_bf16(x));
      EXPECT_EQ(pkv_tensor_init(h.data(), PKV_DTYPE_BF16, PKV_DEVICE_CPU, 0, 3, shape, &t), PKV_OK);
    } else {
      EXPECT_EQ(pkv_tensor_init(buf.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &t),
                PKV_OK);
    }
  }
  void read_back() {
    for (size_t i = 0; i < h.size(); ++i) (*f)[i] = from_bf16(h[i]);
  }
};

// Values are bf16-representable, so the bf16 pool's inputs are exact and
// every pool sees the same numbers.
Data make_data(double mag, uint32_t seed, const std::vector<int>& lens) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  auto nz = [&](double m) { return from_bf16(to_bf16(float((rng() & 1 ? -m : m) * u(rng)))); };
  Data d;
  d.mag = mag;
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int len : lens) {
      std::vector<float> k(size_t(len) * kHeads * kDim), v(k.size()),
          q(size_t(len) * kQHeads * kDim);
      for (float& x : k) x = nz(mag);
      for (float& x : v) x = nz(mag);
      for (float& x : q) x = nz(2.0 / mag);  // logits O(1)
      d.k[l].push_back(k);
      d.v[l].push_back(v);
      d.q[l].push_back(q);
    }
  }
  return d;
}

// Runs the steps on pool and returns the outputs of every query of the
// second step: [layer][seq][query*QH*D].
struct Steps {
  std::vector<int> first_q = {40, 23};  // step 1: prefill
  std::vector<int> second_q = {9, 1};   // step 2: chunked prefill of A, decode of B
};

std::vector<std::vector<float>> run_steps(pkv_pool* p, const Data& d, const Steps& st,
                                          std::vector<pkv_seq_id>* ids_out = nullptr) {
  const int ns = 2;
  std::vector<pkv_seq_id> ids(ns);
  std::vector<int> pos(ns, 0);
  std::vector<std::vector<float>> outs(kLayers);
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  EXPECT_EQ(pkv_pool_get_options(p, &o), PKV_OK);
  const bool bf16 = o.dtype == PKV_DTYPE_BF16;
  for (int s = 0; s < ns; ++s) EXPECT_EQ(pkv_seq_create(p, nullptr, &ids[s]), PKV_OK);
  for (int step = 0; step < 2; ++step) {
    const std::vector<int>& nq = step == 0 ? st.first_q : st.second_q;
    std::vector<uint32_t> qc(ns);
    int64_t T = 0;
    for (int s = 0; s < ns; ++s) {
      std::vector<int32_t> toks(static_cast<size_t>(nq[s]));
      for (int i = 0; i < nq[s]; ++i) toks[size_t(i)] = 1000 * s + pos[s] + i;
      EXPECT_EQ(pkv_seq_append(p, ids[s], toks.data(), toks.size(), 0), PKV_OK);
      qc[s] = uint32_t(nq[s]);
      T += nq[s];
    }
    pkv_batch* b = nullptr;
    EXPECT_EQ(pkv_batch_prepare(p, ids.data(), qc.data(), ns, nullptr, &b), PKV_OK)
        << pkv_last_error_message();
    for (uint32_t l = 0; l < kLayers; ++l) {
      std::vector<float> k(size_t(T) * kHeads * kDim), v(k.size()), q(size_t(T) * kQHeads * kDim),
          out(q.size(), std::nanf(""));
      int64_t row = 0;
      for (int s = 0; s < ns; ++s) {
        for (int i = 0; i < nq[s]; ++i, ++row) {
          const size_t at = size_t(pos[s] + i);
          std::memcpy(&k[size_t(row) * kHeads * kDim], &d.k[l][s][at * kHeads * kDim],
                      sizeof(float) * kHeads * kDim);
          std::memcpy(&v[size_t(row) * kHeads * kDim], &d.v[l][s][at * kHeads * kDim],
                      sizeof(float) * kHeads * kDim);
          std::memcpy(&q[size_t(row) * kQHeads * kDim], &d.q[l][s][at * kQHeads * kDim],
                      sizeof(float) * kQHeads * kDim);
        }
      }
      Act kt(k, bf16, T, kHeads, kDim), vt(v, bf16, T, kHeads, kDim);
      Act qt(q, bf16, T, kQHeads, kDim), ot(out, bf16, T, kQHeads, kDim);
      EXPECT_EQ(pkv_cache_write(b, l, &kt.t, &vt.t, nullptr), PKV_OK) << pkv_last_error_message();
      EXPECT_EQ(pkv_attention_forward(b, l, &qt.t, &ot.t, nullptr, nullptr, nullptr), PKV_OK)
          << pkv_last_error_message();
      ot.read_back();
      if (step == 1) outs[l] = out;
    }
    pkv_batch_destroy(b);
    for (int s = 0; s < ns; ++s) pos[s] += nq[s];
  }
  if (ids_out) *ids_out = ids;
  return outs;
}

// float64 attention of the second step's queries over the K/V `kv(l, s,
// pos, h, d)` returns.
template <class KV>
std::vector<std::vector<double>> reference(const Data& d, const Steps& st, KV kv_k, KV kv_v) {
  std::vector<std::vector<double>> outs(kLayers);
  const double scale = 1.0 / std::sqrt(double(kDim));
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int s = 0; s < 2; ++s) {
      for (int i = 0; i < st.second_q[size_t(s)]; ++i) {
        const int p = st.first_q[size_t(s)] + i;
        for (uint32_t h = 0; h < kQHeads; ++h) {
          const uint32_t kh = h / kGroup;
          std::vector<double> w(size_t(p + 1));
          double mx = -INFINITY;
          for (int k = 0; k <= p; ++k) {
            double x = 0;
            for (uint32_t e = 0; e < kDim; ++e)
              x += double(d.q[l][size_t(s)][(size_t(p) * kQHeads + h) * kDim + e]) *
                   kv_k(l, s, k, kh, e);
            w[size_t(k)] = x * scale;
            mx = std::max(mx, w[size_t(k)]);
          }
          double sum = 0;
          for (double& x : w) sum += (x = std::exp(x - mx));
          for (uint32_t e = 0; e < kDim; ++e) {
            double o = 0;
            for (int k = 0; k <= p; ++k) o += w[size_t(k)] / sum * kv_v(l, s, k, kh, e);
            outs[l].push_back(o);
          }
        }
      }
    }
  }
  return outs;
}

double max_err(const std::vector<std::vector<float>>& got,
               const std::vector<std::vector<double>>& want) {
  double m = 0;
  for (uint32_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(got[l].size(), want[l].size());
    for (size_t i = 0; i < want[l].size(); ++i) {
      const double e = std::fabs(double(got[l][i]) - want[l][i]);
      m = std::isnan(e) ? INFINITY : std::max(m, e);
    }
  }
  return m;
}

// The code stored for (layer, which, seq, pos, head, dim), via the pool's
// block table and kv_tensor view.
uint8_t stored(pkv_pool* p, pkv_seq_id id, uint32_t l, uint32_t which, int pos, uint32_t h,
               uint32_t e) {
  int32_t table[16];
  uint64_t n = 0;
  EXPECT_EQ(pkv_seq_get_block_table(p, id, table, 16, &n), PKV_OK);
  pkv_tensor t;
  EXPECT_EQ(pkv_pool_kv_tensor(p, l, which, &t), PKV_OK);
  EXPECT_EQ(t.strides[3], 1);
  const int64_t at = int64_t(table[pos / int(kBs)]) * t.strides[0] + int64_t(h) * t.strides[1] +
                     int64_t(pos % int(kBs)) * t.strides[2] + e;
  return static_cast<const uint8_t*>(t.data)[at];
}

TEST(Fp8Pool, OptionsScalesAndBytes) {
  const std::vector<float> ks = {0.5f, 0.25f}, vs = {2.0f, 4.0f};
  pkv_pool* p = make_pool(PKV_DTYPE_FP8_E4M3, PKV_KV_SCALE_PER_TENSOR, ks, vs);
  pkv_pool* b = make_pool(PKV_DTYPE_BF16, 0, {}, {});
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  EXPECT_EQ(o.kv_scale_granularity, uint32_t(PKV_KV_SCALE_PER_TENSOR));
  EXPECT_EQ(o.num_kv_scales, 0u);
  ASSERT_EQ(pkv_pool_get_options(p, &o), PKV_OK);
  EXPECT_EQ(o.dtype, uint32_t(PKV_DTYPE_FP8_E4M3));
  EXPECT_EQ(o.num_kv_scales, 2u);
  EXPECT_EQ(o.k_scales, nullptr);
  uint64_t fp8_bytes = 0, bf16_bytes = 0;
  ASSERT_EQ(pkv_pool_bytes_per_block(p, &fp8_bytes), PKV_OK);
  ASSERT_EQ(pkv_pool_bytes_per_block(b, &bf16_bytes), PKV_OK);
  EXPECT_EQ(fp8_bytes * 2, bf16_bytes);
  EXPECT_EQ(fp8_bytes, uint64_t(2) * kLayers * kHeads * kBs * kDim);
  EXPECT_EQ(pkv_dtype_size(PKV_DTYPE_FP8_E4M3), 1u);
  EXPECT_EQ(pkv_dtype_size(PKV_DTYPE_FP8_E5M2), 1u);
  EXPECT_NE(pkv_features() & PKV_FEATURE_FP8, 0u);
  pkv_tensor t;
  ASSERT_EQ(pkv_pool_kv_tensor(p, 1, PKV_KV_VALUE, &t), PKV_OK);
  EXPECT_EQ(t.dtype, uint32_t(PKV_DTYPE_FP8_E4M3));
  float k[2], v[2];
  uint64_t n = 0;
  ASSERT_EQ(pkv_pool_get_kv_scales(p, k, v, 2, &n), PKV_OK);
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(k[0], 0.5f);
  EXPECT_EQ(k[1], 0.25f);
  EXPECT_EQ(v[0], 2.0f);
  EXPECT_EQ(v[1], 4.0f);
  const float k2[2] = {3.0f, 5.0f}, v2[2] = {7.0f, 9.0f};
  ASSERT_EQ(pkv_pool_set_kv_scales(p, k2, v2, 2), PKV_OK);
  ASSERT_EQ(pkv_pool_get_kv_scales(p, k, v, 2, &n), PKV_OK);
  EXPECT_EQ(k[1], 5.0f);
  EXPECT_EQ(v[0], 7.0f);
  // Default scales: all 1.0; per head: num_layers * num_kv_heads.
  pkv_pool* d = make_pool(PKV_DTYPE_FP8_E5M2, PKV_KV_SCALE_PER_HEAD, {}, {});
  float k4[4], v4[4];
  ASSERT_EQ(pkv_pool_get_kv_scales(d, k4, v4, 4, &n), PKV_OK);
  EXPECT_EQ(n, 4u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(k4[i] == 1.0f && v4[i] == 1.0f);
  EXPECT_EQ(pkv_pool_get_kv_scales(d, k4, v4, 3, &n), PKV_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, 4u);
  // NULL outputs with room enough: refused, *out_len left alone.
  n = 77;
  EXPECT_EQ(pkv_pool_get_kv_scales(d, nullptr, v4, 4, &n), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(pkv_pool_get_kv_scales(d, k4, nullptr, 4, &n), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(n, 77u);
  pkv_pool_destroy(d);
  pkv_pool_destroy(b);
  pkv_pool_destroy(p);
}

// The accuracy table: same data through bf16, E4M3 and E5M2 pools (per
// tensor and per head), at several magnitudes; scales as vLLM derives them
// (amax / format max, here with 25% headroom) and a saturating case
// (scale 8x too small: most values clamp to the format's maximum).
TEST(Fp8Pool, AccuracyAgainstFloat64AndBf16) {
  const Steps st;
  std::printf("%-9s %-8s %-10s %12s %12s %12s %12s\n", "dtype", "scales", "magnitude",
              "err/mag ref", "err/mag bf16", "bf16 err/mag", "err codes");
  for (double mag : {1e-2, 1.0, 1e2}) {
    const Data d = make_data(mag, 7 + uint32_t(std::log10(mag) + 3), {49, 24});
    auto orig = [&](const std::vector<std::vector<float>>* src) {
      return [src](uint32_t l, int s, int pos, uint32_t h, uint32_t e) {
        return double(src[l][size_t(s)][(size_t(pos) * kHeads + h) * kDim + e]);
      };
    };
    const auto ref = reference(d, st, orig(d.k), orig(d.v));
    pkv_pool* bp = make_pool(PKV_DTYPE_BF16, 0, {}, {});
    const auto bout = run_steps(bp, d, st);
    pkv_pool_destroy(bp);
    const double bf16_err = max_err(bout, ref) / mag;
    // bf16 pool: exact inputs, so only f32 arithmetic and the bf16 output's
    // rounding (2^-9 relative); pinned with headroom.
    EXPECT_LT(bf16_err, 4e-3);
    for (uint32_t dtype : {PKV_DTYPE_FP8_E4M3, PKV_DTYPE_FP8_E5M2}) {
      for (int mode = 0; mode < 3; ++mode) {  // per tensor, per head, saturating
        const int fmt = fmt_of(dtype);
        const uint32_t gran = mode == 1 ? PKV_KV_SCALE_PER_HEAD : PKV_KV_SCALE_PER_TENSOR;
        const size_t n = gran == PKV_KV_SCALE_PER_HEAD ? kLayers * kHeads : kLayers;
        std::vector<float> ks(n), vs(n);
        for (size_t i = 0; i < n; ++i) {
          ks[i] = float(mag * 1.25 / fmax_of(dtype) * (1.0 + 0.1 * double(i)));
          vs[i] = float(mag * 1.25 / fmax_of(dtype) * (1.0 + 0.07 * double(i)));
          if (mode == 2) ks[i] /= 8, vs[i] /= 8;
        }
        pkv_pool* p = make_pool(dtype, gran, ks, vs);
        std::vector<pkv_seq_id> ids;
        const auto out = run_steps(p, d, st, &ids);
        auto scale_of = [&](uint32_t l, uint32_t w, uint32_t h) {
          const size_t i = gran == PKV_KV_SCALE_PER_HEAD ? l * kHeads + h : l;
          return w == 0 ? ks[i] : vs[i];
        };
        // Every stored code is the encoding of x / scale.
        int bad = 0;
        for (uint32_t l = 0; l < kLayers; ++l)
          for (int s = 0; s < 2; ++s)
            for (int pos = 0; pos < 49 - 25 * s; ++pos)
              for (uint32_t h = 0; h < kHeads; ++h)
                for (uint32_t e = 0; e < kDim; ++e)
                  for (uint32_t w = 0; w < 2; ++w) {
                    const float x =
                        (w == 0 ? d.k : d.v)[l][size_t(s)][(size_t(pos) * kHeads + h) * kDim + e];
                    const uint8_t want = fp8_ref::ref_encode(fmt, double(x / scale_of(l, w, h)));
                    if (stored(p, ids[size_t(s)], l, w, pos, h, e) != want && ++bad <= 3)
                      ADD_FAILURE() << "code of layer " << l << " seq " << s << " pos " << pos;
                  }
        EXPECT_EQ(bad, 0);
        auto deq = [&](uint32_t w) {
          return [&, w](uint32_t l, int s, int pos, uint32_t h, uint32_t e) {
            return fp8_ref::ref_decode(fmt, stored(p, ids[size_t(s)], l, w, pos, h, e)) *
                   double(scale_of(l, w, h));
          };
        };
        const auto ref_codes = reference(d, st, deq(0), deq(1));
        const double err_codes = max_err(out, ref_codes) / mag;
        const double err_ref = max_err(out, ref) / mag;
        const double err_bf16 = max_err(out,
                                        [&] {
                                          std::vector<std::vector<double>> b(kLayers);
                                          for (uint32_t l = 0; l < kLayers; ++l)
                                            b[l].assign(bout[l].begin(), bout[l].end());
                                          return b;
                                        }()) /
                                mag;
        std::printf("%-9s %-8s %-10g %12.3e %12.3e %12.3e %12.3e\n",
                    dtype == PKV_DTYPE_FP8_E4M3 ? "e4m3" : "e5m2",
                    mode == 0   ? "tensor"
                    : mode == 1 ? "head"
                                : "sat/8",
                    mag, err_ref, err_bf16, bf16_err, err_codes);
        // Against the codes it read: f32 arithmetic only.
        EXPECT_LT(err_codes, 2e-5);
        // Against the original values: the format's rounding (E4M3: 3
        // mantissa bits, E5M2: 2); measured maxima 1.9e-2 and 4.1e-2 of the
        // magnitude (the table this test prints), pinned with ~1.5x
        // headroom. Saturation is not bounded: it only must match its
        // codes (above).
        if (mode != 2) EXPECT_LT(err_ref, dtype == PKV_DTYPE_FP8_E4M3 ? 3e-2 : 6e-2);
        pkv_pool_destroy(p);
      }
    }
  }
}

// Scales updated after the writes apply to the codes already stored: a V
// scale times 2 doubles every output exactly; a K scale change moves them.
TEST(Fp8Pool, SetScalesRescalesStoredCodes) {
  const Steps st;
  const Data d = make_data(1.0, 3, {49, 24});
  const std::vector<float> ks = {1.0f / 256, 1.0f / 256}, vs = {1.0f / 128, 1.0f / 128};
  pkv_pool* p = make_pool(PKV_DTYPE_FP8_E4M3, 0, ks, vs);
  std::vector<pkv_seq_id> ids;
  run_steps(p, d, st, &ids);
  // Attention again over what is stored: one decode query per sequence,
  // whose K is 0.5 and V is vval (codes in range, exact).
  auto attend = [&](float vval) {
    std::vector<uint32_t> qc = {1, 1};
    std::vector<int32_t> tok = {77};
    for (pkv_seq_id id : ids) EXPECT_EQ(pkv_seq_append(p, id, tok.data(), 1, 0), PKV_OK);
    pkv_batch* b = nullptr;
    EXPECT_EQ(pkv_batch_prepare(p, ids.data(), qc.data(), 2, nullptr, &b), PKV_OK);
    std::vector<float> kv(size_t(2) * kHeads * kDim, 0.5f), vv(kv.size(), vval);
    std::vector<float> q(size_t(2) * kQHeads * kDim);
    for (size_t i = 0; i < q.size(); ++i) q[i] = float(std::sin(double(i)));
    std::vector<float> out(q.size());
    pkv_tensor kt = f32_tensor(kv, 2, kHeads, kDim), vt = f32_tensor(vv, 2, kHeads, kDim),
               qt = f32_tensor(q, 2, kQHeads, kDim), ot = f32_tensor(out, 2, kQHeads, kDim);
    EXPECT_EQ(pkv_cache_write(b, 0, &kt, &vt, nullptr), PKV_OK);
    EXPECT_EQ(pkv_attention_forward(b, 0, &qt, &ot, nullptr, nullptr, nullptr), PKV_OK);
    pkv_batch_abort(b);
    pkv_batch_destroy(b);
    for (pkv_seq_id id : ids) {
      pkv_seq_info info;
      pkv_seq_info_init(&info);
      EXPECT_EQ(pkv_seq_get_info(p, id, &info), PKV_OK);
      EXPECT_EQ(pkv_seq_truncate(p, id, info.num_tokens - 1), PKV_OK);
    }
    return out;
  };
  const std::vector<float> a = attend(0.5f);
  // Twice the V scale: the stored codes mean twice the values; the new
  // token's V (written with the new scale) is given twice the value too.
  const std::vector<float> vs2 = {1.0f / 64, 1.0f / 64};
  ASSERT_EQ(pkv_pool_set_kv_scales(p, ks.data(), vs2.data(), 2), PKV_OK);
  const std::vector<float> b = attend(1.0f);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(b[i], 2 * a[i]) << i;
  const std::vector<float> ks3 = {1.0f / 128, 1.0f / 128};
  ASSERT_EQ(pkv_pool_set_kv_scales(p, ks3.data(), vs2.data(), 2), PKV_OK);
  const std::vector<float> c = attend(1.0f);
  size_t moved = 0;
  for (size_t i = 0; i < b.size(); ++i) moved += c[i] != b[i];
  EXPECT_GT(moved, b.size() / 2);
  pkv_pool_destroy(p);
}

// Scale updates racing attention on another thread: every attention result
// is one of the two exact results (old or new scales), never a mix.
TEST(Fp8Pool, SetScalesWhileAttentionRuns) {
  const Steps st;
  const Data d = make_data(1.0, 5, {49, 24});
  const std::vector<float> ks = {1.0f / 256, 1.0f / 256}, v1 = {1.0f / 128, 1.0f / 128},
                           v2 = {1.0f / 32, 1.0f / 32};
  pkv_pool* p = make_pool(PKV_DTYPE_FP8_E5M2, 0, ks, v1);
  std::vector<pkv_seq_id> ids;
  run_steps(p, d, st, &ids);
  std::vector<uint32_t> qc = {1, 1};
  // A plan whose queries are the last tokens (already written): attention
  // only, repeated.
  pkv_batch* b = nullptr;
  ASSERT_EQ(pkv_batch_prepare(p, ids.data(), qc.data(), 2, nullptr, &b), PKV_OK)
      << pkv_last_error_message();
  std::vector<float> q(size_t(2) * kQHeads * kDim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = float(std::cos(double(i)));
  auto attend = [&](std::vector<float>& out) {
    pkv_tensor qt = f32_tensor(q, 2, kQHeads, kDim), ot = f32_tensor(out, 2, kQHeads, kDim);
    return pkv_attention_forward(b, 1, &qt, &ot, nullptr, nullptr, nullptr);
  };
  std::vector<float> o1(q.size()), o2(q.size());
  ASSERT_EQ(attend(o1), PKV_OK);
  ASSERT_EQ(pkv_pool_set_kv_scales(p, ks.data(), v2.data(), 2), PKV_OK);
  ASSERT_EQ(attend(o2), PKV_OK);
  for (size_t i = 0; i < o1.size(); ++i) ASSERT_EQ(o2[i], 4 * o1[i]);
  std::atomic<bool> stop{false};
  std::thread setter([&] {
    for (int i = 0; !stop; ++i) {
      const std::vector<float>& v = i % 2 ? v1 : v2;
      EXPECT_EQ(pkv_pool_set_kv_scales(p, ks.data(), v.data(), 2), PKV_OK);
    }
  });
  int mixed = 0;
  for (int it = 0; it < 300; ++it) {
    std::vector<float> o(q.size());
    ASSERT_EQ(attend(o), PKV_OK);
    const bool is1 = std::equal(o.begin(), o.end(), o1.begin());
    const bool is2 = std::equal(o.begin(), o.end(), o2.begin());
    mixed += !(is1 || is2);
  }
  stop = true;
  setter.join();
  EXPECT_EQ(mixed, 0);
  pkv_batch_destroy(b);
  pkv_pool_destroy(p);
}

// Block copies, swaps and prefix hits move FP8 blocks as bytes: a swap out
// and back in, a copy, and a request hitting the cached prefix all read the
// same codes; the hit request's attention matches the writer's.
TEST(Fp8Pool, CopySwapAndPrefixCacheOnFp8Blocks) {
  const Steps st;
  const Data d = make_data(1.0, 9, {49, 24});
  const std::vector<float> ks = {0.004f, 0.003f}, vs = {0.005f, 0.002f};
  pkv_pool* p = make_pool(PKV_DTYPE_FP8_E4M3, 0, ks, vs);
  std::vector<pkv_seq_id> ids;
  run_steps(p, d, st, &ids);
  int32_t table[16];
  uint64_t n = 0;
  ASSERT_EQ(pkv_seq_get_block_table(p, ids[0], table, 16, &n), PKV_OK);
  uint64_t bpb = 0;
  ASSERT_EQ(pkv_pool_bytes_per_block(p, &bpb), PKV_OK);
  std::vector<uint8_t> host(bpb * 2), host2(bpb * 2);
  ASSERT_EQ(pkv_pool_swap_blocks(p, table, 2, host.data(), host.size(), PKV_SWAP_OUT, nullptr),
            PKV_OK);
  // The swapped-out bytes are the codes of the kv_tensor view.
  EXPECT_EQ(host[0], stored(p, ids[0], 0, 0, 0, 0, 0));
  EXPECT_EQ(host[bpb / 2 / kLayers], stored(p, ids[0], 0, 1, 0, 0, 0));
  // A free block receives a copy of block table[0]; swap both out again.
  const int32_t spare = 60;
  ASSERT_EQ(pkv_pool_copy_blocks(p, table, &spare, 1, nullptr), PKV_OK);
  const int32_t pair[2] = {spare, table[1]};
  ASSERT_EQ(pkv_pool_swap_blocks(p, pair, 2, host2.data(), host2.size(), PKV_SWAP_OUT, nullptr),
            PKV_OK);
  EXPECT_EQ(host, host2);
  // Swap in over the originals: unchanged bytes.
  ASSERT_EQ(pkv_pool_swap_blocks(p, table, 2, host2.data(), host2.size(), PKV_SWAP_IN, nullptr),
            PKV_OK);
  // Prefix hit: a new sequence with A's first 32 tokens attaches its two
  // cached blocks and computes token 32 with A's K/V and q for it.
  pkv_seq_id c = 0;
  ASSERT_EQ(pkv_seq_create(p, nullptr, &c), PKV_OK);
  std::vector<int32_t> toks(33);
  for (int i = 0; i < 33; ++i) toks[size_t(i)] = i;  // A's tokens are 0..48
  uint64_t cached = 0;
  ASSERT_EQ(pkv_seq_match_prefix(p, c, toks.data(), 33, &cached), PKV_OK);
  ASSERT_EQ(cached, 32u);
  ASSERT_EQ(pkv_seq_append(p, c, toks.data() + 32, 1, 0), PKV_OK);
  const uint32_t one = 1;
  pkv_batch* b = nullptr;
  ASSERT_EQ(pkv_batch_prepare(p, &c, &one, 1, nullptr, &b), PKV_OK);
  std::vector<float> k(d.k[0][0].begin() + 32 * kHeads * kDim,
                       d.k[0][0].begin() + 33 * kHeads * kDim);
  std::vector<float> v(d.v[0][0].begin() + 32 * kHeads * kDim,
                       d.v[0][0].begin() + 33 * kHeads * kDim);
  std::vector<float> q(d.q[0][0].begin() + 32 * kQHeads * kDim,
                       d.q[0][0].begin() + 33 * kQHeads * kDim);
  std::vector<float> out(q.size());
  pkv_tensor kt = f32_tensor(k, 1, kHeads, kDim), vt = f32_tensor(v, 1, kHeads, kDim),
             qt = f32_tensor(q, 1, kQHeads, kDim), ot = f32_tensor(out, 1, kQHeads, kDim);
  ASSERT_EQ(pkv_cache_write(b, 0, &kt, &vt, nullptr), PKV_OK);
  ASSERT_EQ(pkv_attention_forward(b, 0, &qt, &ot, nullptr, nullptr, nullptr), PKV_OK);
  pkv_batch_destroy(b);
  // The reference over A's stored codes at positions 0..32.
  const double scale = 1.0 / std::sqrt(double(kDim));
  for (uint32_t h = 0; h < kQHeads; ++h) {
    const uint32_t kh = h / kGroup;
    std::vector<double> w(33);
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j <= 32; ++j) {
      double x = 0;
      for (uint32_t e = 0; e < kDim; ++e)
        x += double(q[h * kDim + e]) *
             fp8_ref::ref_decode(fp8_ref::kE4m3, stored(p, ids[0], 0, 0, j, kh, e)) * ks[0];
      w[size_t(j)] = x * scale;
      mx = std::max(mx, w[size_t(j)]);
    }
    for (double& x : w) sum += (x = std::exp(x - mx));
    for (uint32_t e = 0; e < kDim; ++e) {
      double o = 0;
      for (int j = 0; j <= 32; ++j)
        o += w[size_t(j)] / sum *
             fp8_ref::ref_decode(fp8_ref::kE4m3, stored(p, ids[0], 0, 1, j, kh, e)) * vs[0];
      ASSERT_NEAR(out[h * kDim + e], o, 2e-5) << "head " << h << " dim " << e;
    }
  }
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK);
  pkv_pool_destroy(p);
}

TEST(Fp8Pool, WriteAndAttentionTakeAnyFloatInputNotOthers) {
  pkv_pool* p = make_pool(PKV_DTYPE_FP8_E5M2, 0, {}, {});
  pkv_seq_id id = 0;
  ASSERT_EQ(pkv_seq_create(p, nullptr, &id), PKV_OK);
  const int32_t tok[2] = {1, 2};
  ASSERT_EQ(pkv_seq_append(p, id, tok, 2, 0), PKV_OK);
  const uint32_t qc = 2;
  pkv_batch* b = nullptr;
  ASSERT_EQ(pkv_batch_prepare(p, &id, &qc, 1, nullptr, &b), PKV_OK);
  std::vector<uint16_t> kb(size_t(2) * kHeads * kDim, 0x3f80);  // bf16 1.0
  std::vector<int32_t> ki(kb.size(), 1);
  const int64_t shape[3] = {2, kHeads, kDim};
  pkv_tensor kt, it;
  ASSERT_EQ(pkv_tensor_init(kb.data(), PKV_DTYPE_BF16, PKV_DEVICE_CPU, 0, 3, shape, &kt), PKV_OK);
  ASSERT_EQ(pkv_tensor_init(ki.data(), PKV_DTYPE_I32, PKV_DEVICE_CPU, 0, 3, shape, &it), PKV_OK);
  pkv_tensor ft = kt;
  ft.dtype = PKV_DTYPE_FP8_E5M2;
  EXPECT_EQ(pkv_cache_write(b, 0, &it, &kt, nullptr), PKV_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pkv_last_error_message()).find("expected f32, f16 or bf16"),
            std::string::npos)
      << pkv_last_error_message();
  EXPECT_EQ(pkv_cache_write(b, 0, &kt, &ft, nullptr), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(pkv_cache_write(b, 0, &kt, &kt, nullptr), PKV_OK) << pkv_last_error_message();
  // q bf16 -> out must be bf16 too.
  std::vector<uint16_t> q(size_t(2) * kQHeads * kDim, 0x3f80), out(q.size());
  std::vector<float> outf(q.size());
  const int64_t qshape[3] = {2, kQHeads, kDim};
  pkv_tensor qt, ot, oft;
  ASSERT_EQ(pkv_tensor_init(q.data(), PKV_DTYPE_BF16, PKV_DEVICE_CPU, 0, 3, qshape, &qt), PKV_OK);
  ASSERT_EQ(pkv_tensor_init(out.data(), PKV_DTYPE_BF16, PKV_DEVICE_CPU, 0, 3, qshape, &ot), PKV_OK);
  ASSERT_EQ(pkv_tensor_init(outf.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, qshape, &oft),
            PKV_OK);
  EXPECT_EQ(pkv_attention_forward(b, 0, &qt, &oft, nullptr, nullptr, nullptr),
            PKV_E_INVALID_ARGUMENT);
  // An output over the scales (stored after the last plane) is refused
  // like one over the planes: nothing is written.
  pkv_tensor last;
  ASSERT_EQ(pkv_pool_kv_tensor(p, kLayers - 1, PKV_KV_VALUE, &last), PKV_OK);
  const uintptr_t plane_end =
      reinterpret_cast<uintptr_t>(last.data) + uint64_t(last.shape[0]) * last.strides[0];
  pkv_tensor over = ot;
  over.data = reinterpret_cast<void*>((plane_end + 63) / 64 * 64);
  // Nothing is written: the check precedes the kernel.
  EXPECT_EQ(pkv_attention_forward(b, 0, &qt, &over, nullptr, nullptr, nullptr),
            PKV_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pkv_last_error_message()).find("overlaps the pool's KV storage"),
            std::string::npos)
      << pkv_last_error_message();
  float k1[2], v1[2];
  uint64_t n = 0;
  ASSERT_EQ(pkv_pool_get_kv_scales(p, k1, v1, 2, &n), PKV_OK);
  EXPECT_TRUE(k1[0] == 1.0f && k1[1] == 1.0f && v1[0] == 1.0f && v1[1] == 1.0f);
  ASSERT_EQ(pkv_attention_forward(b, 0, &qt, &ot, nullptr, nullptr, nullptr), PKV_OK);
  for (uint16_t x : out) ASSERT_EQ(x, 0x3f80);  // every key and value is 1.0
  pkv_batch_destroy(b);
  pkv_pool_destroy(p);
}

}  // namespace
