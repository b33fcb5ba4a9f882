// The attention driver: cuts the step into (sequence, KV head or up to 8
// of them, row tile [, page range]) items, runs each with the per-ISA leaf
// kernels, and merges split items. Semantics: attention.h.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cpu/attention.h"
#include "cpu/fp8.h"
#include "cpu/overflow.h"
#include "error.h"

namespace pagedkv {
namespace cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Tile {
  int32_t seq, head, row0, rows;
  int32_t page_begin, page_end;  // pages of the sequence this item covers
  int32_t part;                  // -1: writes out directly; else its partial state
  int32_t heads = 1;             // KV heads head .. head + heads - 1 (> 1: never split)
};

struct MergeGroup {
  int32_t seq, head, row0, rows;
  int32_t part_begin, num_parts;
};

// One worker's buffers. q, acc, m, l and alpha hold one block per KV head
// of a tile (kMaxTileRows rows each); a view of one head offsets them.
struct Scratch {
  float* q;              // [heads][kMaxTileRows][D], scaled
  float* acc;            // [heads][kMaxTileRows][D]
  float* logits;         // [kMaxTileRows][ldl]
  float* row;            // [D]
  float *m, *l, *alpha;  // [heads][kMaxTileRows]
  int32_t lo[kMaxTileRows], hi[kMaxTileRows];

  Scratch head(int32_t hh, int32_t d) const {
    Scratch h = *this;
    const size_t rows = size_t(hh) * kMaxTileRows;
    h.q += rows * size_t(d);
    h.acc += rows * size_t(d);
    h.m += rows;
    h.l += rows;
    h.alpha += rows;
    return h;
  }
};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

int32_t pow2_at_least(int32_t n) {
  int32_t r = 1;
  while (r < n) r *= 2;
  return r;
}
// Pages per online-softmax step: enough keys that the per-row rescale and
// the max/sum reductions are spread over many keys, few enough that the
// step's K and V stay in L1.
constexpr int32_t kMaxStepPages = 8;
constexpr int32_t kStepKeys = 64;
// The L1 prefetches (Prefetcher) run one phase ahead, too close to cover
// DRAM latency when the memory system is busy (both cores reading, or
// neighbours on a shared host); a second stream brings the pages this many
// keys ahead into L2 (bench_cpu_attention under load: decode 0.43 -> 0.58 of
// the read bandwidth; 128 or 384 keys ahead did no better). It costs ~7 %
// when K/V are already in cache (AVX2, 1 thread).
constexpr int32_t kL2AheadKeys = 256;
// KV heads per decode tile. A block keeps its heads' K slices side by side
// (and its V slices): a tile that walks a step's pages head after head reads
// each block's K and V as runs of up to 8 slices (32 KiB at head dim 128,
// block 16, bf16) instead of one 4 KiB slice per block, and random 4 KiB
// slices stream at a fraction of the read bandwidth of longer runs
// (bench/README.md, "Heads together").
constexpr int32_t kMaxTileHeads = 8;
// Such a tile's steps are shorter (32 keys): with the L2 stream left out
// (the runs already stream), 2-page steps did best against 1 and 4 under
// load (bench/README.md, "Heads together").
constexpr int32_t kHeadStepKeys = 32;

// prefetcht1: into L2 (and not L1, where the step's K and V live).
void fetch_l2(const char* p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) {
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetcht1 %0" : : "m"(p[o]));
#else
    __builtin_prefetch(p + o, 0, 2);
#endif
  }
}

int row_index(int32_t r) { return r == 1 ? 0 : r == 2 ? 1 : r == 4 ? 2 : r == 8 ? 3 : 4; }

class Attention {
 public:
  Attention(const AttentionConfig& config, const KvArena& arena, int32_t layer,
            const PlanView& plan, const Tensor3& q, const Tensor3& out, const AttentionArgs& args)
      : arena_(arena), plan_(plan), q_(q), out_(out), args_(args) {
    const KvLayout& lay = arena.layout;
    d_ = lay.head_dim;
    bs_ = lay.block_size;
    hkv_ = lay.num_kv_heads;
    group_ = int32_t(q.n1 / hkv_);
    kt_ = config.table;
    if (d_ % kt_->width != 0) kt_ = &scalar_table();
    kv_dt_ = lay.dtype == DType::kFp8E4m3   ? kFp8E4m3Kind
             : lay.dtype == DType::kFp8E5m2 ? kFp8E5m2Kind
                                            : dtype_index(lay.dtype);
    if (is_fp8(lay.dtype)) {
      // Dequantisation: the K scale goes into q's scaling, the V scale into
      // the output's normalisation (with the loads' fp8_load_factor).
      const float f = 1.0f / (lay.dtype == DType::kFp8E4m3 ? fp8_load_factor<kFp8E4m3>()
                                                           : fp8_load_factor<kFp8E5m2>());
      k_scales_ = arena.plane_scales(layer, 0);
      v_scales_ = arena.plane_scales(layer, 1);
      load_factor_ = f;
    }
    // bf16 q against bf16 or FP8 pages: q . k with the ISA's bf16 dot
    // product (FP8 widens to bf16 exactly, so the accuracy is the same).
    const int fp8_fmt = lay.dtype == DType::kFp8E4m3 ? kFp8E4m3 : kFp8E5m2;
    const QkBf16Fn* dot = lay.dtype == DType::kBF16 ? kt_->qk_bf16 : nullptr;
    if (is_fp8(lay.dtype) && kt_->qk_bf16_fp8[0][fp8_fmt] != nullptr) {
      for (int ri = 0; ri < kNumRowSizes; ++ri) qk_fp8_dot_[ri] = kt_->qk_bf16_fp8[ri][fp8_fmt];
      dot = qk_fp8_dot_;
    }
    dot_bf16_ = q.dtype == DType::kBF16 && dot != nullptr && dot[0] != nullptr && d_ % 32 == 0;
    qk_dot_ = dot_bf16_ ? dot : nullptr;
    // bf16 and (where the ISA has the kind) FP8 pages are read in pairs:
    // two f32 vectors from one load, the even and the odd elements, with no
    // shuffle. AVX-512 pairs E4M3 through the bf16 table; its E5M2 widens to
    // f32 more cheaply through f16 (one shift) than through the table
    // (bench_cpu_fp8_decode), so only its bf16 dot product uses the table.
    // AVX2 pairs both formats through f16 (fp8_ops_avx2.inc).
    const int paired = kv_dt_ == 2              ? kBf16Paired
                       : kv_dt_ == kFp8E4m3Kind ? kFp8E4m3Paired
                       : kv_dt_ == kFp8E5m2Kind ? kFp8E5m2Paired
                                                : -1;
    pair_ = paired >= 0 && kt_->pair_width > 0 && kt_->pv[0][paired] != nullptr &&
                    d_ % (2 * kt_->pair_width) == 0
                ? kt_->pair_width
                : 0;
    if (pair_ > 0) kv_dt_ = paired;
    esize_ = dtype_size(lay.dtype);
    kplane_ = static_cast<const char*>(arena.plane(layer, 0));
    vplane_ = static_cast<const char*>(arena.plane(layer, 1));
    ldpg_ = (bs_ + 15) / 16 * 16;
    step_pages_ = std::max(1, std::min(kMaxStepPages, kStepKeys / bs_));
    head_step_pages_ = std::max(1, std::min(step_pages_, kHeadStepKeys / bs_));
    l2_ahead_steps_ = std::max(2, kL2AheadKeys / (step_pages_ * bs_));
    ldl_ = step_pages_ * ldpg_;
    max_rows_ = std::min(kt_->max_rows, kMaxTileRows);
    min_split_keys_ = std::max(1, config.min_split_keys);
  }

  void run(ThreadPool& pool) {
    build_tiles(pool.size());
    if (tiles_.empty()) return;
    const size_t floats =
        size_t(heads_per_tile_) * kMaxTileRows * (2 * d_ + 3) + size_t(kMaxTileRows) * ldl_ + d_;
    per_worker_ = (floats + 15) / 16 * 16;
    const size_t bytes = size_t(pool.size()) * per_worker_ * sizeof(float);
    scratch_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    if (!scratch_) fail(Errc::kOutOfMemory, "attention scratch");
    std::memset(scratch_.get(), 0, bytes);
    if (!groups_.empty()) {
      part_acc_.assign(size_t(num_parts_) * kMaxTileRows * d_, 0.0f);
      part_ml_.assign(size_t(num_parts_) * kMaxTileRows * 2, 0.0f);
    }
    pool.parallel_for(int64_t(tiles_.size()), [this](int64_t i, int32_t w) {
      run_tile(tiles_[size_t(i)], worker_scratch(w));
    });
    if (!groups_.empty()) {
      pool.parallel_for(int64_t(groups_.size()), [this](int64_t i, int32_t w) {
        merge(groups_[size_t(i)], worker_scratch(w));
      });
    }
  }

 private:
  Scratch worker_scratch(int32_t w) {
    Scratch s;
    float* base = scratch_.get() + size_t(w) * per_worker_;
    const size_t rows = size_t(heads_per_tile_) * kMaxTileRows;
    s.q = base;
    s.acc = s.q + rows * d_;
    s.logits = s.acc + rows * d_;
    s.row = s.logits + size_t(kMaxTileRows) * ldl_;
    s.m = s.row + d_;
    s.l = s.m + rows;
    s.alpha = s.l + rows;
    return s;
  }

  int32_t position(int32_t seq, int32_t i) const {
    const int32_t nq = plan_.query_indptr[seq + 1] - plan_.query_indptr[seq];
    return plan_.context_lens[seq] - nq + i;
  }
  int32_t window_lo(int32_t pos) const {
    return args_.sliding_window > 0 ? std::max(0, pos - args_.sliding_window + 1) : 0;
  }

  void build_tiles(int32_t threads) {
    // Sequences whose rows fit one tile per head (decode, short chunks) take
    // their heads in groups of heads_per_tile_, if that leaves enough items
    // for the threads. A group is one item that no thread shares and that is
    // never split, so a sequence is grouped only while its share of the
    // step's keys x heads stays within 1 / (2 x threads): one long context
    // among short ones keeps per-head tiles, which the split below can cut.
    const int64_t target = 4 * int64_t(threads);
    const int32_t hpt = std::min(hkv_, kMaxTileHeads);
    auto keys = [&](int32_t s, int32_t nq) -> int64_t {
      const int64_t ctx = plan_.context_lens[s];
      return args_.sliding_window > 0
                 ? std::min<int64_t>(ctx, int64_t(args_.sliding_window) + nq - 1)
                 : ctx;
    };
    int64_t work = 0, most_keys = 0;
    for (int32_t s = 0; s < plan_.num_seqs; ++s) {
      const int32_t nq = plan_.query_indptr[s + 1] - plan_.query_indptr[s];
      if (nq > 0) work += keys(s, nq) * hkv_;
      if (nq > 0) most_keys = std::max(most_keys, keys(s, nq));
    }
    // f32 and bf16 values reach FLT_MAX: the unnormalised sum of P V over n
    // keys (weights up to 1 each) can then overflow although the output (a
    // convex combination) is finite. Weights times 2^-c with 2^c >= 2n keep
    // it below max|v|; the power of two is exact (short of underflow), and
    // finish_row multiplies 2^c back. f16 and FP8 values stay far below.
    const DType kv = arena_.layout.dtype;
    if ((kv == DType::kF32 || kv == DType::kBF16) && most_keys > 1) {
      const int c = overflow_exponent(most_keys);
      p_scale_ = std::ldexp(1.0f, -c);
      p_unscale_ = std::ldexp(1.0f, c);
    }
    auto grouped_seq = [&](int32_t s, int32_t nq) {
      return hpt > 1 && nq * group_ <= max_rows_ &&
             (threads <= 1 || keys(s, nq) * hpt * 2 * threads <= work);
    };
    int64_t grouped = 0;
    for (int32_t s = 0; s < plan_.num_seqs; ++s) {
      const int32_t nq = plan_.query_indptr[s + 1] - plan_.query_indptr[s];
      if (nq <= 0) continue;
      grouped += grouped_seq(s, nq) ? (hkv_ + hpt - 1) / hpt
                                    : int64_t(hkv_) * ((nq * group_ + max_rows_ - 1) / max_rows_);
    }
    heads_per_tile_ = hpt > 1 && (threads <= 1 || grouped >= target) ? hpt : 1;
    for (int32_t s = 0; s < plan_.num_seqs; ++s) {
      const int32_t nq = plan_.query_indptr[s + 1] - plan_.query_indptr[s];
      if (nq <= 0) continue;
      const int32_t rows_total = nq * group_;
      const int32_t hstep = heads_per_tile_ > 1 && grouped_seq(s, nq) ? heads_per_tile_ : 1;
      for (int32_t h = 0; h < hkv_; h += hstep) {
        for (int32_t row0 = 0; row0 < rows_total; row0 += max_rows_) {
          const int32_t rows = std::min(max_rows_, rows_total - row0);
          const int32_t klo = window_lo(position(s, row0 / group_));
          const int32_t khi = position(s, (row0 + rows - 1) / group_) + 1;
          if (khi <= klo) continue;  // no visible key (n_q > L): rejected upstream
          tiles_.push_back(
              {s, h, row0, rows, klo / bs_, (khi - 1) / bs_ + 1, -1, std::min(hstep, hkv_ - h)});
        }
      }
    }
    const int64_t n = int64_t(tiles_.size());
    if (threads <= 1 || n == 0 || n >= target) return;
    // Too few items for the threads: split long ones along the context.
    const int64_t factor = (target + n - 1) / n;
    std::vector<Tile> split;
    split.reserve(size_t(target) * 2);
    for (const Tile& t : tiles_) {
      const int64_t pages = t.page_end - t.page_begin;
      const int64_t by_len = pages * bs_ / min_split_keys_;
      const int32_t parts = int32_t(std::max<int64_t>(1, std::min({factor, by_len, pages})));
      if (parts == 1 || t.heads > 1) {  // a tile of several heads stays whole
        split.push_back(t);
        continue;
      }
      groups_.push_back({t.seq, t.head, t.row0, t.rows, num_parts_, parts});
      for (int32_t p = 0; p < parts; ++p) {
        Tile c = t;
        c.page_begin = t.page_begin + int32_t(pages * p / parts);
        c.page_end = t.page_begin + int32_t(pages * (p + 1) / parts);
        c.part = num_parts_++;
        split.push_back(c);
      }
    }
    tiles_.swap(split);
  }

  const char* q_row(int32_t token, int32_t head) const {
    return static_cast<const char*>(q_.data) +
           (int64_t(token) * q_.s0 + int64_t(head) * q_.s1) * int64_t(dtype_size(q_.dtype));
  }
  char* out_row(int32_t token, int32_t head) const {
    return static_cast<char*>(out_.data) +
           (int64_t(token) * out_.s0 + int64_t(head) * out_.s1) * int64_t(dtype_size(out_.dtype));
  }

  void run_tile(const Tile& t, Scratch s) {
    const int32_t R = pow2_at_least(t.rows);
    const int32_t H = t.heads;
    const int32_t sp = H > 1 ? head_step_pages_ : step_pages_;  // pages per step
    const float scale = args_.softmax_scale;
    float qscale[kMaxTileHeads];
    for (int32_t hh = 0; hh < H; ++hh) {
      const Scratch hs = s.head(hh, d_);
      qscale[hh] = k_scales_ ? scale * (k_scales_[t.head + hh] * load_factor_) : scale;
      load_q(t, t.head + hh, R, qscale[hh], hs.q, s.row);
    }
    for (int32_t r = 0; r < R; ++r) {
      // Padding rows repeat the last real one; their results are dropped.
      const int32_t pos = position(t.seq, (t.row0 + std::min(r, t.rows - 1)) / group_);
      s.lo[r] = window_lo(pos);
      s.hi[r] = pos + 1;
    }
    const int32_t klo = s.lo[0], khi = s.hi[t.rows - 1];
    std::fill(s.m, s.m + size_t(H) * kMaxTileRows, kNegInf);
    std::fill(s.l, s.l + size_t(H) * kMaxTileRows, 0.0f);
    for (int32_t hh = 0; hh < H; ++hh) {
      float* acc = s.head(hh, d_).acc;
      std::fill(acc, acc + size_t(R) * d_, 0.0f);
    }

    const QkFn qk = kt_->qk[row_index(R)][kv_dt_];
    const QkBf16Fn qkb = dot_bf16_ ? qk_dot_[row_index(R)] : nullptr;
    const PvFn pv = kt_->pv[row_index(R)][kv_dt_];
    const int32_t* pages = plan_.page_indices + plan_.page_indptr[t.seq];
    const int64_t block_elems = int64_t(hkv_) * bs_ * d_;
    const size_t slice_bytes = size_t(bs_) * d_ * esize_;
    auto slice = [&](const char* plane, int32_t pg, int32_t hh) {
      return plane +
             (int64_t(pages[pg]) * block_elems + int64_t(t.head + hh) * bs_ * d_) * int64_t(esize_);
    };
    // The tile's work comes in units, (step, head) in step-major order: q.k,
    // softmax and P V of one head over one step's pages. Pages sit at random
    // places, so the hardware prefetcher cannot run ahead across them. Each
    // phase fetches what the next one reads: q.k of a unit fetches its V
    // slices, P V the next unit's K slices, so that L1 holds little more
    // than one unit's K and V.
    Prefetcher pf;
    auto add_unit = [&](int32_t c0, int32_t hh, const char* plane) {
      for (int32_t pg = c0; pg < std::min(c0 + sp, t.page_end); ++pg) {
        pf.add(slice(plane, pg, hh));
      }
    };
    // The L2 stream of a one-head tile: q.k of page i of a step fetches
    // page i of the step l2_ahead_steps_ later (the first step also covers
    // the steps between). A tile of several heads reads runs of adjacent
    // slices, and this stream's bursts only slowed it (bench/README.md).
    auto fetch_ahead = [&](int32_t c0, int32_t i) {
      for (int32_t a = c0 == t.page_begin ? 1 : l2_ahead_steps_; a <= l2_ahead_steps_; ++a) {
        const int32_t pg = c0 + a * sp + i;
        if (pg >= t.page_end) break;
        fetch_l2(slice(kplane_, pg, 0), slice_bytes);
        fetch_l2(slice(vplane_, pg, 0), slice_bytes);
      }
    };
    pf.reset(slice_bytes);
    add_unit(t.page_begin, 0, kplane_);
    pf.flush();
    const char* kpage[kMaxStepPages];
    const char* vpage[kMaxStepPages];
    for (int32_t c0 = t.page_begin; c0 < t.page_end; c0 += sp) {
      const int32_t n = std::min(sp, t.page_end - c0);
      const int32_t j0 = std::max(klo - c0 * bs_, 0);
      const int32_t j1 = std::min(khi - (c0 + n - 1) * bs_, bs_);
      if (n == 1 && j0 >= j1) continue;
      const int32_t g0 = c0 * bs_ + j0, g1 = (c0 + n - 1) * bs_ + j1;
      for (int32_t hh = 0; hh < H; ++hh) {
        const Scratch hs = s.head(hh, d_);
        const uint16_t* qb = reinterpret_cast<const uint16_t*>(hs.q);
        pf.reset(slice_bytes);
        add_unit(c0, hh, vplane_);
        pf.plan(int64_t(n) * bs_);
        for (int32_t i = 0; i < n; ++i) {
          const int32_t base = (c0 + i) * bs_;
          const int32_t pj0 = i == 0 ? j0 : 0, pj1 = i == n - 1 ? j1 : bs_;
          kpage[i] = slice(kplane_, c0 + i, hh);
          vpage[i] = slice(vplane_, c0 + i, hh);
          float* x = s.logits + i * ldpg_;
          if (qkb != nullptr) {
            // The dot products are unscaled: qscale (the softmax scale, and an
            // FP8 cache's K scale) multiplies their sums.
            qkb(qb, d_, kpage[i], pj0, pj1, x, ldl_, qscale[hh], args_.logit_softcap, &pf);
          } else {
            qk(hs.q, d_, kpage[i], pj0, pj1, x, ldl_, args_.logit_softcap, &pf);
          }
          if (H == 1) fetch_ahead(c0, i);
          // Invisible keys of this page's segment (and its padding) get -inf.
          for (int32_t r = 0; r < R; ++r) {
            float* xr = x + size_t(r) * ldl_;
            const int32_t vis0 = std::min(pj1, std::max(pj0, s.lo[r] - base));
            const int32_t vis1 = std::max(vis0, std::min(pj1, s.hi[r] - base));
            std::fill(xr, xr + vis0, kNegInf);
            std::fill(xr + vis1, xr + ldpg_, kNegInf);
          }
        }
        pf.flush();
        kt_->softmax(s.logits, ldl_, R, 0, n * ldpg_, hs.m, hs.l, hs.alpha);
        if (p_scale_ != 1.0f) {  // build_tiles: P V must not overflow
          for (int32_t r = 0; r < R; ++r) {
            float* xr = s.logits + size_t(r) * ldl_;
            for (int32_t e = 0; e < n * ldpg_; ++e) xr[e] *= p_scale_;
          }
        }
        pf.reset(slice_bytes);
        if (hh + 1 < H) {
          add_unit(c0, hh + 1, kplane_);
        } else {
          add_unit(c0 + sp, 0, kplane_);
        }
        pv_step(pv, hs, t.rows, vpage, c0, g0, g1, &pf);
        pf.flush();
      }
    }

    if (t.part >= 0) {  // a split tile has one head
      float* pacc = part_acc_.data() + size_t(t.part) * kMaxTileRows * d_;
      float* pml = part_ml_.data() + size_t(t.part) * kMaxTileRows * 2;
      std::memcpy(pacc, s.acc, sizeof(float) * size_t(t.rows) * d_);
      for (int32_t r = 0; r < t.rows; ++r) {
        pml[2 * r] = s.m[r];
        pml[2 * r + 1] = s.l[r];
      }
      return;
    }
    for (int32_t hh = 0; hh < H; ++hh) {
      const Scratch hs = s.head(hh, d_);
      for (int32_t r = 0; r < t.rows; ++r) {
        finish_row(t, t.head + hh, r, hs.acc + size_t(r) * d_, hs.m[r], hs.l[r], s.row);
      }
    }
  }

  // Rows [0, R) of the tile's q for KV head `head` into q (R x head_dim):
  // bf16 as given when the ISA's bf16 dot product runs q.k, else f32 scaled
  // by qscale (paired if pair_ > 0). Rows from t.rows on repeat the last.
  void load_q(const Tile& t, int32_t head, int32_t R, float qscale, float* q, float* tmp) const {
    const int32_t qbeg = plan_.query_indptr[t.seq];
    uint16_t* qb = reinterpret_cast<uint16_t*>(q);
    for (int32_t r = 0; r < R; ++r) {
      if (r >= t.rows) {
        if (dot_bf16_) {
          std::memcpy(qb + size_t(r) * d_, qb + size_t(t.rows - 1) * d_, sizeof(uint16_t) * d_);
        } else {
          std::memcpy(q + size_t(r) * d_, q + size_t(t.rows - 1) * d_, sizeof(float) * d_);
        }
        continue;
      }
      const int32_t ri = t.row0 + r, i = ri / group_, g = ri % group_;
      const char* src = q_row(qbeg + i, head * group_ + g);
      if (dot_bf16_) {
        std::memcpy(qb + size_t(r) * d_, src, sizeof(uint16_t) * d_);
      } else {
        float* qr = q + size_t(r) * d_;
        kt_->to_f32[dtype_index(q_.dtype)](src, qr, d_);
        for (int32_t d = 0; d < d_; ++d) qr[d] *= qscale;
        if (pair_ > 0) to_paired(qr, tmp);
      }
    }
  }

  // P V over the step's keys [g0, g1) (global positions; pages from c0).
  // A masked key has p = 0, but 0 * V is NaN when its slot holds NaN or
  // Inf (never written, or written by garbage), so a row must never be fed
  // keys it cannot see. Keys every row sees go through the R-row kernel (the
  // whole step in decode: no extra work there); the few keys only some rows
  // see (the causal diagonal, the window's first keys) go row by row.
  void pv_step(PvFn pv, const Scratch& s, int32_t rows, const char* const* vpage, int32_t c0,
               int32_t g0, int32_t g1, Prefetcher* pf) const {
    int32_t clo = g0, chi = g1;
    for (int32_t r = 0; r < rows; ++r) {
      clo = std::max(clo, s.lo[r]);
      chi = std::min(chi, s.hi[r]);
    }
    chi = std::max(chi, clo);
    auto run = [&](PvFn fn, int32_t r, int32_t a, int32_t b, const float* alpha) {
      PvPages pg{vpage, 1, 0, 0, bs_, ldpg_};  // no key: still applies alpha
      int32_t i0 = 0;
      if (a < b) {
        i0 = a / bs_ - c0;
        const int32_t i1 = (b - 1) / bs_ - c0;
        pg = PvPages{vpage + i0, i1 - i0 + 1, a - (c0 + i0) * bs_, b - (c0 + i1) * bs_, bs_, ldpg_};
      }
      fn(s.logits + size_t(r) * ldl_ + size_t(i0) * ldpg_, ldl_, pg, d_, s.acc + size_t(r) * d_,
         alpha, pf);
    };
    run(pv, 0, clo, chi, s.alpha);
    if (clo == g0 && chi == g1) return;
    const PvFn pv1 = kt_->pv[0][kv_dt_];
    static const float kOne = 1.0f;
    for (int32_t r = 0; r < rows; ++r) {
      const int32_t vlo = std::max(g0, s.lo[r]), vhi = std::min(g1, s.hi[r]);
      if (vlo < std::min(vhi, clo)) run(pv1, r, vlo, std::min(vhi, clo), &kOne);
      if (std::max(vlo, chi) < vhi) run(pv1, r, std::max(vlo, chi), vhi, &kOne);
    }
  }

  // The paired layout of KernelTable::pair_width, in place (tmp: scratch).
  void to_paired(float* x, float* tmp) const {
    const int32_t w = pair_;
    for (int32_t c = 0; c < d_; c += 2 * w) {
      for (int32_t i = 0; i < w; ++i) {
        tmp[c + i] = x[c + 2 * i];
        tmp[c + w + i] = x[c + 2 * i + 1];
      }
    }
    std::memcpy(x, tmp, sizeof(float) * d_);
  }
  void from_paired(const float* x, float* out) const {
    const int32_t w = pair_;
    for (int32_t c = 0; c < d_; c += 2 * w) {
      for (int32_t i = 0; i < w; ++i) {
        out[c + 2 * i] = x[c + i];
        out[c + 2 * i + 1] = x[c + w + i];
      }
    }
  }

  // acc is unnormalised (and in paired order if pair_ > 0); l == 0 only for a row that saw no key,
  // which the pool never plans (it would need n_q > L): zeros and -inf then. A NaN l (a visible
  // key held NaN) stays NaN in the output and the LSE.
  void finish_row(const Tile& t, int32_t kv_head, int32_t r, const float* acc, float m, float l,
                  float* tmp) {
    const int32_t ri = t.row0 + r, i = ri / group_, g = ri % group_;
    const int32_t token = plan_.query_indptr[t.seq] + i, head = kv_head * group_ + g;
    float inv = l == 0.0f ? 0.0f : 1.0f / l * p_unscale_;
    if (v_scales_) inv *= v_scales_[kv_head] * load_factor_;
    if (pair_ > 0) {
      from_paired(acc, tmp);
    } else {
      std::memcpy(tmp, acc, sizeof(float) * size_t(d_));
    }
    if (v_scales_ == nullptr) {
      // f32/bf16/f16 values: the output is a convex combination of finite
      // values, so at most FLT_MAX; acc * inv rounds a few ulps either side
      // of it when V holds values at FLT_MAX, and past it would be inf. A
      // finite acc stays finite (an infinite one, from an infinite V, not).
      for (int32_t d = 0; d < d_; ++d) tmp[d] = normalised(tmp[d], inv);
    } else {  // FP8: code sums times the V scale, which may truly pass FLT_MAX
      for (int32_t d = 0; d < d_; ++d) tmp[d] *= inv;
    }
    kt_->from_f32[dtype_index(out_.dtype)](tmp, out_row(token, head), d_);
    if (args_.lse != nullptr) {
      args_.lse[int64_t(token) * args_.lse_stride0 + head] = l == 0.0f ? kNegInf : m + std::log(l);
    }
  }

  void merge(const MergeGroup& g, Scratch s) {
    Tile t{g.seq, g.head, g.row0, g.rows, 0, 0, -1};
    for (int32_t r = 0; r < g.rows; ++r) {
      float mx = kNegInf;
      for (int32_t p = 0; p < g.num_parts; ++p) {
        const float pm = part_ml_[(size_t(g.part_begin + p) * kMaxTileRows + r) * 2];
        // A NaN part (NaN logits: softmax_step) makes the row NaN; std::max would drop it.
        mx = std::isnan(pm) || std::isnan(mx) ? pm + mx : std::max(mx, pm);
      }
      float* acc = s.acc;
      std::fill(acc, acc + d_, 0.0f);
      float l = 0.0f;
      if (mx != kNegInf) {
        for (int32_t p = 0; p < g.num_parts; ++p) {
          const size_t idx = size_t(g.part_begin + p) * kMaxTileRows + r;
          const float pm = part_ml_[idx * 2], pl = part_ml_[idx * 2 + 1];
          if (pm == kNegInf) continue;  // this part saw no visible key
          const float wgt = std::exp(pm - mx);
          l += pl * wgt;
          const float* pa = part_acc_.data() + idx * d_;
          for (int32_t d = 0; d < d_; ++d) acc[d] += pa[d] * wgt;
        }
      }
      finish_row(t, g.head, r, acc, mx, l, s.row);
    }
  }

  const KvArena& arena_;
  const PlanView& plan_;
  const Tensor3& q_;
  const Tensor3& out_;
  const AttentionArgs& args_;
  const KernelTable* kt_;
  int32_t d_, bs_, hkv_, group_, ldl_, max_rows_, min_split_keys_;
  int32_t ldpg_;        // logits per page in a step (bs rounded up to 16)
  int32_t step_pages_;  // pages per online-softmax step
  bool dot_bf16_;       // bf16 q, bf16 or FP8 cache: q . k with the ISA's bf16 dot product
  const QkBf16Fn* qk_dot_ = nullptr;        // by row size, when dot_bf16_
  QkBf16Fn qk_fp8_dot_[kNumRowSizes] = {};  // the FP8 format's dot kernels
  const float* k_scales_ = nullptr;         // FP8 cache: this layer's per-head scales
  const float* v_scales_ = nullptr;
  float load_factor_ = 1.0f;  // 1 / fp8_load_factor of the cache's format
  int kv_dt_;                 // kernel variant: dtype index, FP8 kind, or a paired kind
  int32_t pair_ = 0;          // > 0: q and acc rows in paired order of this width
  size_t esize_;
  const char* kplane_;
  const char* vplane_;
  std::vector<Tile> tiles_;
  std::vector<MergeGroup> groups_;
  int32_t num_parts_ = 0;
  std::vector<float> part_acc_, part_ml_;
  std::unique_ptr<float, FreeDeleter> scratch_;
  size_t per_worker_ = 0;
  // Steps between a page's L2 prefetch and its use (one-head tiles).
  int32_t l2_ahead_steps_ = 2;
  int32_t head_step_pages_ = 1;  // pages per step of a tile of several heads
  int32_t heads_per_tile_ = 1;   // KV heads per decode tile (build_tiles)
  float p_scale_ = 1.0f;         // softmax weights' factor in P V (build_tiles), and its inverse
  float p_unscale_ = 1.0f;
};

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }
bool is_cache_dtype(DType t) { return is_float_dtype(t) || (is_fp8(t)); }

void check_pages(const KvArena& arena, const PlanView& plan) {
  const int64_t num_pages = plan.num_seqs > 0 ? plan.page_indptr[plan.num_seqs] : 0;
  for (int64_t i = 0; i < num_pages; ++i) {
    if (plan.page_indices[i] < 0 || plan.page_indices[i] >= arena.layout.num_blocks) {
      fail(Errc::kInvalidArgument, "plan: page_indices[" + std::to_string(i) + "] = " +
                                       std::to_string(plan.page_indices[i]) + " is not a block id");
    }
  }
  for (int32_t s = 0; s < plan.num_seqs; ++s) {
    const int32_t nq = plan.query_indptr[s + 1] - plan.query_indptr[s];
    const int32_t len = plan.context_lens[s];
    const int64_t pages = plan.page_indptr[s + 1] - plan.page_indptr[s];
    if (nq < 0 || nq > len || pages * arena.layout.block_size < len) {
      fail(Errc::kInvalidArgument, "plan: sequence " + std::to_string(s) +
                                       " has inconsistent query count, context length or pages");
    }
  }
}

}  // namespace

void attend(ThreadPool& pool, const AttentionConfig& config, const KvArena& arena, int32_t layer,
            const PlanView& plan, const Tensor3& q, const Tensor3& out, const AttentionArgs& args) {
  const KvLayout& lay = arena.layout;
  if (!is_cache_dtype(lay.dtype) || !is_float_dtype(q.dtype) || !is_float_dtype(out.dtype)) {
    fail(Errc::kInvalidArgument,
         "attention: q and out must be f32, f16 or bf16, the cache that or fp8");
  }
  if (is_fp8(lay.dtype) && arena.scales == nullptr) {
    fail(Errc::kInvalidArgument, "attention: an fp8 cache needs scales");
  }
  if (q.n2 != lay.head_dim || out.n2 != lay.head_dim || q.n1 != out.n1 || q.n0 != out.n0 ||
      q.n1 <= 0 || q.n1 % lay.num_kv_heads != 0 || q.n0 < plan.num_tokens) {
    fail(Errc::kInvalidArgument, "attention: q/out shape does not match the cache and plan");
  }
  if (layer < 0 || layer >= arena.num_layers) fail(Errc::kInvalidArgument, "attention: layer");
  if (!(args.softmax_scale > 0.0f || args.softmax_scale < 0.0f) || args.sliding_window < 0 ||
      args.logit_softcap < 0.0f) {
    fail(Errc::kInvalidArgument, "attention: softmax_scale, sliding_window or logit_softcap");
  }
  check_pages(arena, plan);
  Attention(config, arena, layer, plan, q, out, args).run(pool);
}

}  // namespace cpu
}  // namespace pagedkv
