#include "kv_allocator.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "scheduler.h"

namespace sim {
namespace {

PoolPtr create_pool(const Options& o, const PoolShape& shape, uint64_t num_blocks,
                    bool prefix_caching, pkv_status* status) {
  pkv_pool_options po;
  pkv_pool_options_init(&po);
  po.block_size = o.block_size;
  po.num_blocks = num_blocks;  // 0: as many as the budget holds
  po.memory_budget_bytes = num_blocks ? 0 : o.memory_budget;
  po.enable_prefix_caching = prefix_caching ? 1 : 0;
  po.num_layers = o.layers;
  po.num_kv_heads = o.kv_heads;
  po.head_dim = o.head_dim;
  po.dtype = shape.dtype;
  // FP8 storage: one K and one V scale per layer, 1/256, so that the K/V
  // values (multiples of 1/128 in [-1, 1)) use the formats' upper range.
  const std::vector<float> kv_scales(o.layers, 1.0f / 256);
  if (shape.kv_dtype) {
    po.dtype = shape.kv_dtype;
    po.num_kv_scales = o.layers;
    po.k_scales = kv_scales.data();
    po.v_scales = kv_scales.data();
  }
  po.device_type = shape.device_type;
  po.device_id = shape.device_type == PKV_DEVICE_CUDA ? o.device_id : 0;
  po.num_threads = o.threads;
  pkv_pool* raw = nullptr;
  *status = pkv_pool_create(&po, &raw);
  return PoolPtr(*status == PKV_OK ? raw : nullptr, pkv_pool_destroy);
}

pkv_pool_stats pool_stats(pkv_pool* pool) {
  pkv_pool_stats st;
  pkv_pool_stats_init(&st);
  check_status(pkv_pool_get_stats(pool, &st), "pkv_pool_get_stats");
  return st;
}

}  // namespace

void KvAllocator::attach_host_tier(uint64_t bytes) {
  pkv_tier_options t;
  pkv_tier_options_init(&t);
  t.host_bytes = bytes;
  check_status(pkv_pool_attach_tiers(pool(), &t), "pkv_pool_attach_tiers");
  tiered_ = true;
}

const char* server_name(ServerKind kind) { return kind == ServerKind::kPaged ? "paged" : "static"; }

KvAllocator::KvAllocator(PoolPtr pool) : pool_(std::move(pool)) {
  pkv_pool_options got;
  pkv_pool_options_init(&got);
  check_status(pkv_pool_get_options(pool_.get(), &got), "pkv_pool_get_options");
  check_status(pkv_pool_bytes_per_block(pool_.get(), &bytes_per_block_),
               "pkv_pool_bytes_per_block");
  usable_blocks_ = got.num_blocks - 1;
}

PagedAllocator::PagedAllocator(PoolPtr pool)
    : KvAllocator(std::move(pool)), watermark_blocks_(std::max<uint64_t>(1, usable_blocks_ / 100)) {
  pkv_pool_options got;
  pkv_pool_options_init(&got);
  check_status(pkv_pool_get_options(pool_.get(), &got), "pkv_pool_get_options");
  block_size_ = got.block_size;
}

uint64_t PagedAllocator::free_blocks() const { return pool_stats(pool_.get()).num_free_blocks; }

bool PagedAllocator::may_admit(uint64_t first_tokens, bool others_running) {
  // With nothing running the request must go ahead (the pool holds one
  // max-context sequence), watermark or not.
  if (!others_running) return true;
  return free_blocks() >= (first_tokens + block_size_ - 1) / block_size_ + watermark_blocks_;
}

bool PagedAllocator::fits(pkv_seq_id seq, uint32_t n, bool others_running) {
  if (!others_running) return true;
  uint64_t needed = 0;
  check_status(pkv_seq_blocks_needed(pool_.get(), seq, n, 0, &needed), "pkv_seq_blocks_needed");
  return free_blocks() >= needed + watermark_blocks_;
}

uint64_t PagedAllocator::reserved_bytes() const {
  return pool_stats(pool_.get()).num_used_blocks * bytes_per_block_;
}

StaticAllocator::StaticAllocator(PoolPtr pool, uint32_t slots, uint64_t slot_bytes)
    : KvAllocator(std::move(pool)), slots_(slots), slot_bytes_(slot_bytes) {
  for (uint32_t i = slots; i-- > 0;) free_slots_.push_back(i);
}

void StaticAllocator::on_admit(Request* r) {
  if (free_slots_.empty())
    throw std::logic_error("static allocator: admission without a free reservation slot");
  r->slot = int32_t(free_slots_.back());
  free_slots_.pop_back();
}

void StaticAllocator::on_release(Request* r) {
  if (r->slot < 0) throw std::logic_error("static allocator: release without a reservation");
  free_slots_.push_back(uint32_t(r->slot));
  // Keep the lowest-numbered free slot on top, like a first-fit arena.
  std::sort(free_slots_.begin(), free_slots_.end(), std::greater<uint32_t>());
  r->slot = -1;
}

uint64_t StaticAllocator::reserved_bytes() const {
  return uint64_t(slots_ - free_slots_.size()) * slot_bytes_;
}

std::unique_ptr<KvAllocator> make_paged_allocator(const Options& o, const PoolShape& shape,
                                                  pkv_status* status) {
  PoolPtr pool = create_pool(o, shape, 0, true, status);
  if (!pool) return nullptr;
  auto a = std::make_unique<PagedAllocator>(std::move(pool));
  if (o.host_tier > 0) a->attach_host_tier(o.host_tier);
  return a;
}

std::unique_ptr<StaticAllocator> make_static_allocator(const Options& o, const PoolShape& shape,
                                                       uint64_t bytes_per_block,
                                                       pkv_status* status) {
  *status = PKV_OK;
  const uint64_t blocks_per_slot = (o.max_context + o.block_size - 1) / o.block_size;
  const uint64_t slot_bytes = blocks_per_slot * bytes_per_block;
  const uint64_t slots = std::min<uint64_t>(o.memory_budget / slot_bytes, o.max_seqs);
  if (slots == 0) return nullptr;
  // Exactly the slots' blocks, plus the null block.
  PoolPtr pool = create_pool(o, shape, slots * blocks_per_slot + 1, false, status);
  if (!pool) return nullptr;
  return std::make_unique<StaticAllocator>(std::move(pool), uint32_t(slots), slot_bytes);
}

}  // namespace sim
