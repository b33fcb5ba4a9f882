// The quantising cache write of FP8 pools: rows widened to f32 with the
// kernel table's conversions, divided by their head's scale and encoded by
// its vectorised quantize_fp8 (fp8.h semantics).
#include <algorithm>
#include <string>

#include "cpu/attention.h"
#include "cpu/fp8.h"
#include "error.h"

namespace pagedkv {
namespace cpu {
namespace {

constexpr int kMaxRow = 4096;  // head_dim limit (pool options)

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

}  // namespace

void write_kv_fp8(ThreadPool& pool, const KernelTable& table, const KvArena& arena, int32_t layer,
                  const PlanView& plan, const Tensor3& k, const Tensor3& v) {
  const KvLayout& lay = arena.layout;
  if (layer < 0 || layer >= arena.num_layers) fail(Errc::kInvalidArgument, "cache write: layer");
  if (!is_fp8(lay.dtype) || arena.scales == nullptr || lay.head_dim > kMaxRow)
    fail(Errc::kInvalidArgument, "cache write: not an fp8 cache with scales");
  for (const Tensor3* t : {&k, &v}) {
    if (!is_float(t->dtype) || t->n1 != lay.num_kv_heads || t->n2 != lay.head_dim ||
        t->n0 < plan.num_tokens) {
      fail(Errc::kInvalidArgument, std::string("cache write: ") + (t == &k ? "k" : "v") +
                                       " is not f32, f16 or bf16 of the cache's shape and plan");
    }
  }
  check_write_slots(arena, plan);
  const int fmt = lay.dtype == DType::kFp8E4m3 ? kFp8E4m3 : kFp8E5m2;
  const QuantizeFp8Fn quantize = table.quantize_fp8[fmt];
  const int64_t d = lay.head_dim;
  const Tensor3* ts[2] = {&k, &v};
  auto write_tokens = [&](int64_t begin, int64_t end) {
    alignas(64) float row[kMaxRow];
    for (int w = 0; w < 2; ++w) {
      const Tensor3& src = *ts[w];
      const ToF32Fn widen = table.to_f32[dtype_index(src.dtype)];
      const size_t es = dtype_size(src.dtype);
      uint8_t* plane = static_cast<uint8_t*>(arena.plane(layer, w));
      const float* scales = arena.plane_scales(layer, w);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t slot = plan.slot_mapping[t];
        if (slot < 0) continue;
        const int64_t block = slot / lay.block_size, off = slot % lay.block_size;
        for (int32_t h = 0; h < lay.num_kv_heads; ++h) {
          const char* s =
              static_cast<const char*>(src.data) + (t * src.s0 + int64_t(h) * src.s1) * int64_t(es);
          widen(s, row, d);
          quantize(row, plane + ((block * lay.num_kv_heads + h) * lay.block_size + off) * d, d,
                   scales[h]);
        }
      }
    }
  };
  // Parallel when there is enough to convert (the conversion, not the
  // bytes, is the cost).
  constexpr int64_t kChunk = 64;
  const int64_t chunks = (plan.num_tokens + kChunk - 1) / kChunk;
  if (chunks < 2 || plan.num_tokens * lay.num_kv_heads * d < (int64_t(1) << 16)) {
    write_tokens(0, plan.num_tokens);
    return;
  }
  pool.parallel_for(chunks, [&](int64_t c, int32_t) {
    write_tokens(c * kChunk, std::min(plan.num_tokens, (c + 1) * kChunk));
  });
}

}  // namespace cpu
}  // namespace pagedkv
