// Host-side launch planning (see plan.h).
#include "plan.h"

#include <algorithm>
#include <string>

namespace pagedkv {
namespace cuda {

namespace {

constexpr int kMinSplitKeys = 256;
constexpr int kMaxSplits = 64;

std::string str(int64_t v) { return std::to_string(v); }

// Widest power-of-two access (<= 16 bytes) every address of a row allows.
int access_unit(const void* base, int64_t s0_bytes, int64_t s1_bytes, int64_t row_bytes) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(base) | uint64_t(s0_bytes) |
                        uint64_t(s1_bytes) | uint64_t(row_bytes) | 16u;
  return int(bits & (~bits + 1));  // lowest set bit
}

void check_rows(const Tensor3& t, const KvLayout& lay, const char* name) {
  if (t.dtype != lay.dtype || t.n1 != lay.num_kv_heads || t.n2 != lay.head_dim) {
    fail(Errc::kInvalidArgument,
         std::string(name) + " must be [num_tokens, num_kv_heads, head_dim] of the pool's dtype");
  }
}

// Split-KV: when the (sequence, KV head, row tile) CTAs cannot fill the GPU
// twice over, split each one's keys into chunks of at least kMinSplitKeys so
// that about two CTAs per SM run; the partials are merged afterwards.
int plan_splits(int64_t ctas, const PlanView& plan, const AttentionArgs& args, int sm_count) {
  const int forced = forced_splits();
  if (forced > 0) return std::min(forced, kMaxSplits);
  const int64_t target = 2 * int64_t(std::max(sm_count, 1));
  if (ctas >= target) return 1;
  int64_t keys = plan.max_context;
  if (args.sliding_window > 0) {
    keys = std::min<int64_t>(keys, int64_t(args.sliding_window) + plan.max_query);
  }
  const int64_t by_len = keys / kMinSplitKeys;
  const int64_t want = (target + ctas - 1) / ctas;
  return int(std::max<int64_t>(1, std::min<int64_t>({want, by_len, kMaxSplits})));
}

}  // namespace

AttnPlan plan_attention(const KvArena& arena, int32_t layer, const PlanView& plan, const Tensor3& q,
                        const Tensor3& out, const AttentionArgs& args, int sm_count,
                        size_t max_smem) {
  const KvLayout& lay = arena.layout;
  const int D = lay.head_dim;
  if (!cuda_head_dim_supported(uint64_t(D))) {
    fail(Errc::kUnsupported, "head_dim " + str(D) + ": the CUDA attention kernels support " +
                                 std::string(kCudaHeadDims));
  }
  const bool fp8 = is_fp8(lay.dtype);
  if (lay.dtype != DType::kF32 && lay.dtype != DType::kF16 && lay.dtype != DType::kBF16 && !fp8) {
    fail(Errc::kUnsupported, "attention: the cache dtype must be f32, f16, bf16 or fp8");
  }
  if (fp8) {
    // FP8 tiles are widened to q's dtype for the tensor cores.
    if ((q.dtype != DType::kF16 && q.dtype != DType::kBF16) || out.dtype != q.dtype) {
      fail(Errc::kUnsupported,
           "q and out of attention over an fp8 CUDA pool must both be f16 or both bf16 (f32 "
           "queries over fp8 pages are CPU-only)");
    }
    if (arena.scales == nullptr)
      fail(Errc::kInvalidArgument, "attention: an fp8 cache needs scales");
  } else if (q.dtype != lay.dtype || out.dtype != lay.dtype) {
    fail(Errc::kInvalidArgument, "q and out must have the pool's dtype");
  }
  if (q.n2 != D || out.n2 != D || q.n1 != out.n1 || q.n0 != out.n0 || q.n0 != plan.num_tokens) {
    fail(Errc::kInvalidArgument, "q/out shape does not match the plan and the pool");
  }
  if (q.n1 <= 0 || q.n1 % lay.num_kv_heads != 0) {
    fail(Errc::kInvalidArgument, "num_q_heads " + str(q.n1) +
                                     " is not a multiple of num_kv_heads " + str(lay.num_kv_heads));
  }

  const int elt = int(dtype_size(q.dtype));  // of the shared-memory tiles
  const int group = int(q.n1 / lay.num_kv_heads);
  const int64_t max_rows = int64_t(std::max(plan.max_query, 1)) * group;
  const bool large = max_rows > attn_small_rows();
  // f16/bf16 pages take the mma.sync kernel (attention_mma.cuh), unless its
  // tile does not fit the device (head dim 256 on sm_86/sm_89).
  const bool mma_kernel =
      !fp8 && elt == 2 && (D != 256 || attn_mma_smem_bytes(D, large) <= max_smem);
  const int rows = !large       ? attn_small_rows()
                   : mma_kernel ? attn_mma_large_rows(D)
                                : attn_large_rows(elt, D);

  // One CTA row per (sequence, tile of the longest query): gridDim.x holds
  // at most 2^31 - 1, and the launch computes it in 32 bits, so a larger
  // product would fail to launch or wrap and leave outputs unwritten.
  const int64_t tiles = (max_rows + rows - 1) / rows;
  if (int64_t(plan.num_seqs) * tiles > int64_t(INT32_MAX)) {
    fail(Errc::kUnsupported,
         "attention: " + str(plan.num_seqs) + " sequences x " + str(tiles) +
             " query tiles of the longest query (" + str(max_rows) +
             " rows per KV head) exceed the CUDA grid's 2^31 - 1 blocks; split the step");
  }

  AttnPlan r{};
  AttnParams& p = r.params;
  p.k_plane = arena.plane(layer, 0);
  p.v_plane = arena.plane(layer, 1);
  p.num_kv_heads = lay.num_kv_heads;
  p.block_size = lay.block_size;
  p.query_indptr = plan.query_indptr;
  p.page_indptr = plan.page_indptr;
  p.page_indices = plan.page_indices;
  p.context_lens = plan.context_lens;
  p.q = q.data;
  p.q_s0 = q.s0;
  p.q_s1 = q.s1;
  p.out = out.data;
  p.o_s0 = out.s0;
  p.o_s1 = out.s1;
  p.lse = args.lse;
  p.lse_s0 = args.lse_stride0;
  p.num_q_heads = int32_t(q.n1);
  p.group = group;
  p.softmax_scale = args.softmax_scale;
  p.softcap = args.logit_softcap;
  p.window = args.sliding_window;
  p.tiles_per_seq = int32_t(tiles);
  p.num_tokens = plan.num_tokens;
  const int64_t ctas = int64_t(plan.num_seqs) * p.tiles_per_seq * lay.num_kv_heads;
  p.num_splits = plan_splits(ctas, plan, args, sm_count);

  r.launch.head_dim = D;
  r.launch.large_tile = large;
  r.launch.num_seqs = plan.num_seqs;
  r.launch.generic = !fp8 && elt == 2 && !mma_kernel;
  r.smem_bytes = fp8          ? attn_smem_bytes_fp8(D, large)
                 : mma_kernel ? attn_mma_smem_bytes(D, large)
                              : attn_smem_bytes(elt, D, large);
  if (fp8) {
    p.k_scales = arena.plane_scales(layer, 0);
    p.v_scales = arena.plane_scales(layer, 1);
  }
  if (p.num_splits > 1) {
    r.scratch_bytes = size_t(plan.num_tokens) * size_t(q.n1) * size_t(p.num_splits) *
                      (size_t(D) + 1) * sizeof(float);
  }
  return r;
}

void attach_scratch(AttnPlan& plan, void* scratch) {
  AttnParams& p = plan.params;
  if (p.num_splits <= 1) return;
  const size_t rows = size_t(p.num_tokens) * size_t(p.num_q_heads) * size_t(p.num_splits);
  p.part_o = static_cast<float*>(scratch);
  p.part_lse = p.part_o + rows * size_t(plan.launch.head_dim);
}

namespace {

// The fields every write shares: planes, sources (strides in bytes of each
// source's dtype), slots, shape.
WriteParams write_params(const KvArena& arena, int32_t layer, const PlanView& plan,
                         const Tensor3& k, const Tensor3& v) {
  const KvLayout& lay = arena.layout;
  const int64_t ke = int64_t(dtype_size(k.dtype)), ve = int64_t(dtype_size(v.dtype));
  WriteParams p{};
  p.k_plane = static_cast<char*>(arena.plane(layer, 0));
  p.v_plane = static_cast<char*>(arena.plane(layer, 1));
  p.k = static_cast<const char*>(k.data);
  p.v = static_cast<const char*>(v.data);
  p.k_s0 = k.s0 * ke;
  p.k_s1 = k.s1 * ke;
  p.v_s0 = v.s0 * ve;
  p.v_s1 = v.s1 * ve;
  p.slot_mapping = plan.slot_mapping;
  p.num_tokens = plan.num_tokens;
  p.num_kv_heads = lay.num_kv_heads;
  p.block_size = lay.block_size;
  return p;
}

// FP8 pools: k and v are f32/f16/bf16 rows, quantised by the write kernel.
WriteParams plan_write_fp8(const KvArena& arena, int32_t layer, const PlanView& plan,
                           const Tensor3& k, const Tensor3& v) {
  const KvLayout& lay = arena.layout;
  for (const Tensor3* t : {&k, &v}) {
    if ((t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16) ||
        t->n1 != lay.num_kv_heads || t->n2 != lay.head_dim) {
      fail(Errc::kInvalidArgument,
           std::string(t == &k ? "k" : "v") +
               " must be [num_tokens, num_kv_heads, head_dim] of f32, f16 or bf16 (fp8 pool)");
    }
  }
  if (arena.scales == nullptr)
    fail(Errc::kInvalidArgument, "cache write: an fp8 cache needs scales");
  WriteParams p = write_params(arena, layer, plan, k, v);
  p.row_bytes = lay.head_dim;
  p.unit = 1;
  p.fp8 = int32_t(lay.dtype);
  p.k_dtype = int32_t(k.dtype);
  p.v_dtype = int32_t(v.dtype);
  p.k_scales = arena.plane_scales(layer, 0);
  p.v_scales = arena.plane_scales(layer, 1);
  return p;
}

}  // namespace

WriteParams plan_write(const KvArena& arena, int32_t layer, const PlanView& plan, const Tensor3& k,
                       const Tensor3& v) {
  const KvLayout& lay = arena.layout;
  if (is_fp8(lay.dtype)) return plan_write_fp8(arena, layer, plan, k, v);
  check_rows(k, lay, "k");
  check_rows(v, lay, "v");
  WriteParams p = write_params(arena, layer, plan, k, v);
  p.row_bytes = int32_t(lay.head_dim * dtype_size(lay.dtype));
  p.unit = std::min(access_unit(k.data, p.k_s0, p.k_s1, p.row_bytes),
                    access_unit(v.data, p.v_s0, p.v_s1, p.row_bytes));
  return p;
}

}  // namespace cuda
}  // namespace pagedkv
