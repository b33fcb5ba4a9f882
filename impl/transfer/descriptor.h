// The bytes one pool hands another to move a sequence (pkv_transfer_export
// -> pkv_transfer_import): who to read from (a UCX worker address and a
// remote key), where (the exporter's arena), what (block ids, tokens, block
// hashes) and in which layout. Little-endian, versioned, and ending with
// an XXH3-64 checksum of the bytes before it (version 2): decode() refuses a
// descriptor cut or corrupted in transit, then trusts nothing in it that it
// can check and names the first field that is wrong. What it cannot check
// are the exporter's addresses (remote_base and the arena's extent, read
// through the remote key): a descriptor crafted to lie about them is the
// trusted-network caveat of pagedkv/transfer.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hash/block_hash.h"

namespace pagedkv {

struct TransferDescriptor {
  static constexpr uint32_t kMagic = 0x58564b50;  // "PKVX"
  static constexpr uint32_t kVersion = 2;  // 2: trailing checksum

  // Layout of the exporter's pool; an importer must match it exactly.
  uint32_t num_layers = 0, num_kv_heads = 0, block_size = 0, head_dim = 0, dtype = 0;
  int32_t device_type = 0;
  uint32_t kv_scale_granularity = 0;
  std::vector<float> k_scales, v_scales;  // FP8 pools: the exporter's scales
  // The exporter's arena: plane p = 2 * layer + which starts at
  // remote_base + p * plane_bytes; block b of it at + b * block_bytes.
  uint64_t remote_base = 0, plane_bytes = 0, block_bytes = 0, arena_blocks = 0;
  uint64_t export_id = 0;
  uint64_t lora_id = 0;
  uint32_t hash_algo = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;  // exporter's block ids, ceil(tokens / block_size)
  std::vector<BlockHash> hashes;
  std::string worker_address, rkey;  // opaque UCX blobs

  std::vector<uint8_t> encode() const;
  // Throws Error(kInvalidArgument) naming what is malformed.
  static TransferDescriptor decode(const uint8_t* data, uint64_t size);
};

}  // namespace pagedkv
