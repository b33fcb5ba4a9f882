#include "transfer/layout_check.h"

#include <string>

namespace pagedkv {

void describe_layout(const Pool& pool, TransferDescriptor* d) {
  const PoolOptions& o = pool.options();
  d->num_layers = o.num_layers;
  d->num_kv_heads = o.num_kv_heads;
  d->block_size = o.block_size;
  d->head_dim = o.head_dim;
  d->dtype = uint32_t(o.dtype);
  d->device_type = o.device_type;
  d->kv_scale_granularity = o.kv_scale_granularity;
  d->hash_algo = uint32_t(o.hash_algo);
  if (is_fp8(o.dtype)) pool.kv_scales(&d->k_scales, &d->v_scales);
}

void check_importable(const TransferDescriptor& d, const Pool& pool) {
  if (!pool.has_storage())
    fail(Errc::kInvalidState, "the pool has no KV storage (num_layers 0): nothing to import into");
  // Descriptors describe K and V planes (2 per layer): an MLA pool's one
  // latent plane per layer neither exports nor imports (yet).
  if (pool.options().is_mla())
    fail(Errc::kUnsupported,
         "pool is an MLA pool (kv_layout PKV_KV_LAYOUT_MLA): its one latent plane per layer does "
         "not transfer (yet)");
  TransferDescriptor mine;
  describe_layout(pool, &mine);
  const auto differ = [](const char* field, uint64_t theirs, uint64_t ours) {
    fail(Errc::kInvalidArgument, std::string("descriptor layout does not match the pool: ") +
                                     field + " " + std::to_string(theirs) + " (exporter) vs " +
                                     std::to_string(ours) + " (this pool)");
  };
  if (d.num_layers != mine.num_layers) differ("num_layers", d.num_layers, mine.num_layers);
  if (d.num_kv_heads != mine.num_kv_heads)
    differ("num_kv_heads", d.num_kv_heads, mine.num_kv_heads);
  if (d.block_size != mine.block_size) differ("block_size", d.block_size, mine.block_size);
  if (d.head_dim != mine.head_dim) differ("head_dim", d.head_dim, mine.head_dim);
  if (d.dtype != mine.dtype) differ("dtype", d.dtype, mine.dtype);
  const uint64_t ours = pool.bytes_per_block() / (2 * uint64_t(mine.num_layers));
  if (d.block_bytes != ours) differ("block_bytes", d.block_bytes, ours);
  if (is_fp8(DType(mine.dtype))) {
    if (d.kv_scale_granularity != mine.kv_scale_granularity)
      differ("kv_scale_granularity", d.kv_scale_granularity, mine.kv_scale_granularity);
    // FP8 codes mean code * scale: bytes under other scales are other values.
    if (d.k_scales != mine.k_scales || d.v_scales != mine.v_scales)
      fail(Errc::kInvalidArgument,
           "descriptor layout does not match the pool: the exporter's FP8 k/v scales differ from "
           "this pool's (pkv_pool_set_kv_scales)");
  }
}

}  // namespace pagedkv
