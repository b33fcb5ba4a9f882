// KV events on the wire as vLLM publishes them (vllm/distributed/kv_events.py):
// a msgpack KVEventBatch [ts, [event...], data_parallel_rank] whose events
// are msgspec tagged structs, BlockStored / BlockRemoved / AllBlocksCleared.
// docs/scale-out.md names the vLLM versions each encoding matches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "event_queue.h"

namespace pagedkv::events {

struct WireOptions {
  // true: each event a map {"type": "BlockStored", "block_hashes": ...}
  // (vLLM after PR 42892); false: a tagged array ["BlockStored", ...]
  // (vLLM 0.9 to 0.23, what most deployed routers decode).
  bool map_events = true;
  // true: a block hash is the uint64 of its digest's last 8 bytes, big
  // endian (vLLM's default, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1);
  // false: the whole digest as msgpack bin.
  bool int_hashes = true;
  std::string medium[3] = {"GPU", "CPU", "DISK"};  // by Event::medium
};

// Appends the msgpack of one batch to out. events[i]'s token ids, when
// has_tokens, are tokens[i * block_size ...]. Runs of stored events that
// chain (each one's parent is the previous one's hash, same LoRA and
// medium) become one BlockStored with several hashes, as vLLM sends a
// request's newly full blocks; runs of removals of one medium become one
// BlockRemoved. Priority events have no vLLM counterpart and are skipped.
// Returns how many vLLM events the batch holds.
size_t encode_batch(const Event* events, size_t n, const int32_t* tokens, uint32_t block_size,
                    double ts, uint32_t dp_rank, const WireOptions& opts, std::string* out);

}  // namespace pagedkv::events
