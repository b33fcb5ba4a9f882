// Host emulation of the few CUDA primitives the kernels use, so that the
// kernel templates in *.cuh compile with the host compiler and run, unchanged,
// on the CPU (tests/gpu/emulation_test.cpp compares them with the CPU backend
// on machines without a GPU). Included by common.cuh when
// PKV_CUDA_EMULATION is defined; never part of the library.
//
// A CTA's threads are fibers on one OS thread, run in thread order between
// barriers (x86-64 only: a 6-register stack switch, see PKV_EMU_DEFINE_SWITCH).
// __syncthreads parks a fiber until every live fiber of the block is parked.
// Warp reductions go through a block-wide exchange (they are called
// uniformly by every thread in the kernels). cp.async copies synchronously.
// WMMA fragments hold whole 16x16 tiles; lane 0 of a warp computes and stores
// them. Shared memory starts as 0xFF bytes (NaN in every float type), so a
// read of anything not written shows up in the results. Misaligned cp.async
// or WMMA addresses and bad ldm values are recorded as errors.
#pragma once

#if !defined(__x86_64__)
#error "the CUDA kernel emulation needs x86-64"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#define __launch_bounds__(...)
#define PKV_EXTERN_SMEM(name) unsigned char* name = ::pkv_emu::state().smem

extern "C" void pkv_emu_switch(void** save_sp, void* load_sp);

// Exactly one translation unit of a test defines the stack switch.
#define PKV_EMU_DEFINE_SWITCH            \
  asm(".text\n"                          \
      ".globl pkv_emu_switch\n"          \
      ".type pkv_emu_switch,@function\n" \
      "pkv_emu_switch:\n"                \
      "  pushq %rbp\n"                   \
      "  pushq %rbx\n"                   \
      "  pushq %r12\n"                   \
      "  pushq %r13\n"                   \
      "  pushq %r14\n"                   \
      "  pushq %r15\n"                   \
      "  movq %rsp, (%rdi)\n"            \
      "  movq %rsi, %rsp\n"              \
      "  popq %r15\n"                    \
      "  popq %r14\n"                    \
      "  popq %r13\n"                    \
      "  popq %r12\n"                    \
      "  popq %rbx\n"                    \
      "  popq %rbp\n"                    \
      "  ret\n"                          \
      ".size pkv_emu_switch, .-pkv_emu_switch\n");

namespace pkv_emu {

struct State {
  dim3 grid{1, 1, 1}, block{1, 1, 1}, block_idx{0, 0, 0};
  int nthreads = 0;
  int cur = 0;
  void* main_sp = nullptr;
  std::vector<void*> sp;
  std::vector<int> status;  // 0 runnable, 1 at a barrier, 2 finished
  std::vector<char> stacks;
  std::vector<unsigned char> smem_store;
  unsigned char* smem = nullptr;
  std::vector<float> xchg;
  std::vector<uint32_t> xchg_u;     // mma operands (6) and accumulators (4) per thread
  std::vector<float> mma_d;         // mma results, 4 per thread
  std::vector<char> mma_done;       // per warp: this mma's results are computed
  std::vector<const void*> xchg_p;  // ldmatrix row addresses
  std::function<void()> body;
  long errors = 0;
  std::string first_error;
  static constexpr size_t kStack = size_t(1) << 18;
};

inline State& state() {
  static State s;
  return s;
}

inline void report(const std::string& what) {
  State& s = state();
  if (s.errors++ == 0) s.first_error = what;
}

inline uint3 thread_idx() {
  const State& s = state();
  const unsigned t = unsigned(s.cur);
  return uint3{t % s.block.x, (t / s.block.x) % s.block.y, t / (s.block.x * s.block.y)};
}

inline void park(int status) {
  State& s = state();
  s.status[s.cur] = status;
  pkv_emu_switch(&s.sp[s.cur], s.main_sp);
}

inline void fiber_entry() {
  state().body();
  park(2);
  for (;;) {
  }  // never resumed
}

// Runs body() as every thread of every block of the grid.
inline void launch(dim3 grid, dim3 block, size_t smem_bytes, std::function<void()> body) {
  State& s = state();
  s.grid = grid;
  s.block = block;
  s.nthreads = int(block.x * block.y * block.z);
  s.body = std::move(body);
  s.sp.assign(s.nthreads, nullptr);
  s.status.assign(s.nthreads, 0);
  s.stacks.resize(size_t(s.nthreads) * State::kStack);
  s.smem_store.assign(smem_bytes + 256, 0);
  s.smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(s.smem_store.data()) + 127) & ~uintptr_t(127));
  s.xchg.assign(s.nthreads, 0.f);
  s.xchg_u.assign(size_t(s.nthreads) * 10, 0u);
  s.mma_d.assign(size_t(s.nthreads) * 4, 0.f);
  s.mma_done.assign(size_t(s.nthreads + 31) / 32, 0);
  s.xchg_p.assign(s.nthreads, nullptr);
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        s.block_idx = dim3(x, y, z);
        std::memset(s.smem, 0xFF, smem_bytes);
        for (int t = 0; t < s.nthreads; ++t) {
          char* top = s.stacks.data() + size_t(t + 1) * State::kStack;
          void** p = reinterpret_cast<void**>(reinterpret_cast<uintptr_t>(top) & ~uintptr_t(15));
          *--p = nullptr;  // fiber_entry's (never used) return address
          *--p = reinterpret_cast<void*>(&fiber_entry);
          for (int r = 0; r < 6; ++r) *--p = nullptr;  // callee-saved registers
          s.sp[t] = p;
          s.status[t] = 0;
        }
        for (;;) {
          for (int t = 0; t < s.nthreads; ++t) {
            if (s.status[t] != 0) continue;
            s.cur = t;
            pkv_emu_switch(&s.main_sp, s.sp[t]);
          }
          bool waiting = false;
          for (int& st : s.status) {
            if (st == 1) {
              st = 0;
              waiting = true;
            }
          }
          if (!waiting) break;
        }
      }
    }
  }
}

template <typename F>
inline float warp_reduce(float v, F op) {
  State& s = state();
  s.xchg[s.cur] = v;
  park(1);
  const int base = s.cur & ~31;
  float r = s.xchg[base];
  for (int l = base + 1; l < std::min(base + 32, s.nthreads); ++l) r = op(r, s.xchg[l]);
  park(1);
  return r;
}

inline float shfl_xor(float v, int mask) {
  State& s = state();
  s.xchg[s.cur] = v;
  park(1);
  const float r = s.xchg[(s.cur & ~31) | ((s.cur & 31) ^ mask)];
  park(1);
  return r;
}

// ldmatrix .x4 (PTX semantics; rows must be 16-byte aligned shared memory).
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
  State& s = state();
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) report("ldmatrix: misaligned row");
  s.xchg_p[s.cur] = row;
  park(1);
  const int base = s.cur & ~31, lane = s.cur & 31, g = lane / 4, t = lane % 4;
  auto elt = [&](int m, int rr, int cc) {
    uint16_t x;
    std::memcpy(&x, static_cast<const char*>(s.xchg_p[base + 8 * m + rr]) + 2 * cc, 2);
    return uint32_t(x);
  };
  for (int m = 0; m < 4; ++m) {
    r[m] = trans ? elt(m, 2 * t, g) | (elt(m, 2 * t + 1, g) << 16)
                 : elt(m, g, 2 * t) | (elt(m, g, 2 * t + 1) << 16);
  }
  park(1);
}

template <typename T>
inline float half_of(uint32_t w, int hi) {
  const uint16_t bits = uint16_t(hi ? w >> 16 : w & 0xffffu);
  T x;
  std::memcpy(&x, &bits, 2);
  if constexpr (std::is_same<T, __half>::value) {
    return __half2float(x);
  } else {
    return __bfloat162float(x);
  }
}

// mma.sync m16n8k16 .row.col with f32 accumulation, fragments as in PTX.
// The warp's first lane to run after the barrier computes the whole 16x8
// tile for every lane (decoding A and B once, not once per lane: the
// emulation tests spend most of their time here); each lane then takes its
// four results. Each result is its lane's accumulator plus the 16 products
// summed in k order in double, as before.
template <typename T>
inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  State& s = state();
  uint32_t* mine = &s.xchg_u[size_t(s.cur) * 10];
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  mine[4] = b0;
  mine[5] = b1;
  std::memcpy(mine + 6, d, sizeof d);
  const int base = s.cur & ~31, warp = s.cur / 32;
  const int lanes = std::min(32, s.nthreads - base);
  s.mma_done[warp] = 0;
  park(1);
  if (!s.mma_done[warp]) {
    float A[16][16], B[16][8];
    for (int l = 0; l < lanes; ++l) {
      const uint32_t* y = &s.xchg_u[size_t(base + l) * 10];
      const int g = l / 4, t = l % 4;
      for (int h = 0; h < 2; ++h) {
        A[g][2 * t + h] = half_of<T>(y[0], h);
        A[g + 8][2 * t + h] = half_of<T>(y[1], h);
        A[g][2 * t + 8 + h] = half_of<T>(y[2], h);
        A[g + 8][2 * t + 8 + h] = half_of<T>(y[3], h);
        B[2 * t + h][g] = half_of<T>(y[4], h);
        B[2 * t + 8 + h][g] = half_of<T>(y[5], h);
      }
    }
    for (int l = 0; l < lanes; ++l) {
      const uint32_t* y = &s.xchg_u[size_t(base + l) * 10];
      float c[4];
      std::memcpy(c, y + 6, sizeof c);
      const int g = l / 4, t = l % 4;
      for (int i = 0; i < 4; ++i) {
        const int row = g + (i / 2) * 8, col = 2 * t + i % 2;
        double acc = c[i];
        for (int k = 0; k < 16; ++k) acc += double(A[row][k]) * double(B[k][col]);
        s.mma_d[size_t(base + l) * 4 + i] = float(acc);
      }
    }
    s.mma_done[warp] = 1;
  }
  for (int i = 0; i < 4; ++i) d[i] = s.mma_d[size_t(s.cur) * 4 + i];
  park(1);
}

inline float emu_float(float x) { return x; }
inline float emu_float(__half x) { return __half2float(x); }
inline float emu_float(__nv_bfloat16 x) { return __bfloat162float(x); }

inline void check_align(const void* p, uintptr_t a, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % a != 0) report(std::string(what) + ": misaligned address");
}

}  // namespace pkv_emu

#define threadIdx (::pkv_emu::thread_idx())
#define blockIdx (::pkv_emu::state().block_idx)
#define blockDim (::pkv_emu::state().block)
#define gridDim (::pkv_emu::state().grid)

inline void __syncthreads() { ::pkv_emu::park(1); }
inline int __syncthreads_or(int v) {
  ::pkv_emu::State& s = ::pkv_emu::state();
  s.xchg[s.cur] = v != 0 ? 1.f : 0.f;
  ::pkv_emu::park(1);
  int r = 0;
  for (int i = 0; i < s.nthreads; ++i) r |= s.xchg[i] != 0.f;
  ::pkv_emu::park(1);
  return r;
}

namespace pagedkv {
namespace cuda {
using std::max;
using std::min;
}  // namespace cuda
}  // namespace pagedkv

// ------------------------------------------------------------------ WMMA
namespace nvcuda {
namespace wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "emulated shape");
  float x[16 * 16];  // element (row, col) of the tile at x[row * 16 + col]
};

template <typename Use, typename T, typename L>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, float v) {
  std::fill(f.x, f.x + 256, v);
}

// ldm: elements, a multiple of 16 bytes; pointers 32-byte aligned (PTX rules).
template <typename T>
inline void check_tile(const T* p, unsigned ldm, const char* what) {
  ::pkv_emu::check_align(p, 32, what);
  if ((ldm * sizeof(T)) % 16 != 0) ::pkv_emu::report(std::string(what) + ": bad ldm");
}

template <typename T>
inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, row_major>& f, const T* p,
                             unsigned ldm) {
  check_tile(p, ldm, "wmma load a");
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = ::pkv_emu::emu_float(p[r * ldm + c]);
}
template <typename T>
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, row_major>& f, const T* p,
                             unsigned ldm) {
  check_tile(p, ldm, "wmma load b (row major)");
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) f.x[k * 16 + n] = ::pkv_emu::emu_float(p[k * ldm + n]);
}
template <typename T>
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, col_major>& f, const T* p,
                             unsigned ldm) {
  check_tile(p, ldm, "wmma load b (col major)");
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) f.x[k * 16 + n] = ::pkv_emu::emu_float(p[n * ldm + k]);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout) {
  check_tile(p, ldm, "wmma load accumulator");
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.x[r * 16 + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  check_tile(p, ldm, "wmma store");
  if (::pkv_emu::state().cur % 32 != 0) return;  // one lane stores the warp's tile
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * 16 + c];
}
template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, T, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
  if (::pkv_emu::state().cur % 32 != 0) return;  // lane 0 computes for the warp
  float out[256];
  for (int r = 0; r < 16; ++r) {
    for (int n = 0; n < 16; ++n) {
      float acc = c.x[r * 16 + n];
      for (int k = 0; k < 16; ++k) acc = std::fma(a.x[r * 16 + k], b.x[k * 16 + n], acc);
      out[r * 16 + n] = acc;
    }
  }
  std::memcpy(d.x, out, sizeof(out));
}

}  // namespace wmma
}  // namespace nvcuda
