// Byte-moving kernels: slot-mapped cache writes, block copies, swaps.
// Every index is checked before anything is written, so a bad argument
// changes nothing.
#include <algorithm>
#include <cstring>
#include <string>

#include "cpu/attention.h"
#include "error.h"

namespace pagedkv {
namespace cpu {
namespace {

// Below this many bytes a job is not worth waking the workers for.
constexpr size_t kParallelBytes = size_t(1) << 18;

void check_block(const KvArena& arena, int32_t id, const char* what, int64_t i) {
  if (id < 0 || id >= arena.layout.num_blocks) {
    fail(Errc::kInvalidArgument, std::string(what) + "[" + std::to_string(i) +
                                     "] = " + std::to_string(id) + " is not a block id");
  }
}

}  // namespace

void check_write_slots(const KvArena& arena, const PlanView& plan) {
  const int64_t num_slots = int64_t(arena.layout.num_blocks) * arena.layout.block_size;
  for (int64_t t = 0; t < plan.num_tokens; ++t) {
    const int64_t slot = plan.slot_mapping[t];
    if (slot < -1 || slot >= num_slots) {
      fail(Errc::kInvalidArgument, "cache write: slot_mapping[" + std::to_string(t) +
                                       "] = " + std::to_string(slot) + " is out of range");
    }
  }
}

void write_kv(ThreadPool& pool, const KvArena& arena, int32_t layer, const PlanView& plan,
              const Tensor3& k, const Tensor3& v) {
  const KvLayout& lay = arena.layout;
  if (layer < 0 || layer >= arena.num_layers) fail(Errc::kInvalidArgument, "cache write: layer");
  for (const Tensor3* t : {&k, &v}) {
    if (t->dtype != lay.dtype || t->n1 != lay.num_kv_heads || t->n2 != lay.head_dim ||
        t->n0 < plan.num_tokens) {
      fail(Errc::kInvalidArgument, std::string("cache write: ") + (t == &k ? "k" : "v") +
                                       " does not match the cache dtype/shape or the plan");
    }
  }
  check_write_slots(arena, plan);
  const size_t es = dtype_size(lay.dtype);
  const size_t row_bytes = size_t(lay.head_dim) * es;
  char* planes[2] = {static_cast<char*>(arena.plane(layer, 0)),
                     static_cast<char*>(arena.plane(layer, 1))};
  const char* srcs[2] = {static_cast<const char*>(k.data), static_cast<const char*>(v.data)};
  const Tensor3* ts[2] = {&k, &v};
  auto write_tokens = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = plan.slot_mapping[t];
      if (slot < 0) continue;
      const int64_t block = slot / lay.block_size, off = slot % lay.block_size;
      for (int32_t h = 0; h < lay.num_kv_heads; ++h) {
        const int64_t dst = ((block * lay.num_kv_heads + h) * lay.block_size + off) * lay.head_dim;
        for (int w = 0; w < 2; ++w) {
          const int64_t src = t * ts[w]->s0 + int64_t(h) * ts[w]->s1;
          std::memcpy(planes[w] + dst * int64_t(es), srcs[w] + src * int64_t(es), row_bytes);
        }
      }
    }
  };
  const size_t total = size_t(plan.num_tokens) * lay.num_kv_heads * row_bytes * 2;
  constexpr int64_t kChunk = 64;
  const int64_t chunks = (plan.num_tokens + kChunk - 1) / kChunk;
  if (total < kParallelBytes || chunks < 2) {
    write_tokens(0, plan.num_tokens);
    return;
  }
  pool.parallel_for(chunks, [&](int64_t c, int32_t) {
    write_tokens(c * kChunk, std::min(plan.num_tokens, (c + 1) * kChunk));
  });
}

void copy_blocks(ThreadPool& pool, const KvArena& arena, const int32_t* src, const int32_t* dst,
                 int64_t num_pairs) {
  for (int64_t i = 0; i < num_pairs; ++i) {
    check_block(arena, src[i], "src", i);
    check_block(arena, dst[i], "dst", i);
  }
  const size_t bb = arena.layout.block_bytes();
  const int64_t planes = arena.num_planes();
  auto one = [&](int64_t item) {
    const int64_t p = item / num_pairs, i = item % num_pairs;
    if (src[i] == dst[i]) return;
    char* base = static_cast<char*>(arena.plane_at(p));
    std::memcpy(base + size_t(dst[i]) * bb, base + size_t(src[i]) * bb, bb);
  };
  const int64_t items = planes * num_pairs;
  if (size_t(items) * bb < kParallelBytes) {
    for (int64_t i = 0; i < items; ++i) one(i);
    return;
  }
  pool.parallel_for(items, [&](int64_t i, int32_t) { one(i); });
}

void swap_blocks(ThreadPool& pool, const KvArena& arena, const int32_t* blocks, int64_t num_blocks,
                 void* host, bool to_host) {
  for (int64_t i = 0; i < num_blocks; ++i) check_block(arena, blocks[i], "blocks", i);
  const size_t bb = arena.layout.block_bytes();
  const int64_t planes = arena.num_planes();
  char* h = static_cast<char*>(host);
  auto one = [&](int64_t item) {
    const int64_t i = item / planes, p = item % planes;
    char* dev = static_cast<char*>(arena.plane_at(p)) + size_t(blocks[i]) * bb;
    char* hb = h + (size_t(i) * planes + p) * bb;  // [n][num_layers][planes][block]
    if (to_host) {
      std::memcpy(hb, dev, bb);
    } else {
      std::memcpy(dev, hb, bb);
    }
  };
  const int64_t items = planes * num_blocks;
  if (size_t(items) * bb < kParallelBytes) {
    for (int64_t i = 0; i < items; ++i) one(i);
    return;
  }
  pool.parallel_for(items, [&](int64_t i, int32_t) { one(i); });
}

}  // namespace cpu
}  // namespace pagedkv
