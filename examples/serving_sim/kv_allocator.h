// The two memory policies the demo compares, behind one interface the
// scheduler calls: paged (pagedkv blocks taken as tokens arrive, prefix
// cache on) and static (a fixed table of max-context reservations, one per
// running sequence, the rest wait). Both servers keep their K/V in a
// pagedkv pool so that the same kernels run on both; what differs is who
// decides how many sequences may run and what memory each one holds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "options.h"
#include "pagedkv/pagedkv.h"
#include "workload.h"

namespace sim {

enum class ServerKind { kPaged, kStatic };

using PoolPtr = std::unique_ptr<pkv_pool, void (*)(pkv_pool*)>;

class KvAllocator {
 public:
  virtual ~KvAllocator() = default;
  pkv_pool* pool() const { return pool_.get(); }
  uint64_t bytes_per_block() const { return bytes_per_block_; }
  // Blocks of the pool, null block excluded.
  uint64_t usable_blocks() const { return usable_blocks_; }
  virtual ServerKind kind() const = 0;
  virtual bool prefix_caching() const = 0;
  // Whether the pool has offload tiers (--host-tier): prefix lookups then
  // go through pkv_seq_match_prefix_tiered.
  bool tiered() const { return tiered_; }
  void attach_host_tier(uint64_t bytes);

  // Cheap refusal before any lookup: could a request whose first chunk
  // (without cache hits) is first_tokens long be admitted now?
  virtual bool may_admit(uint64_t first_tokens, bool others_running) = 0;
  // After the prefix lookup attached the cached blocks to seq: do n more
  // tokens fit?
  virtual bool fits(pkv_seq_id seq, uint32_t n, bool others_running) = 0;
  // The request was admitted (takes its reservation) or left the running
  // set, finished or preempted (gives it back).
  virtual void on_admit(Request* r) = 0;
  virtual void on_release(Request* r) = 0;
  // KV bytes this policy holds for the running sequences now.
  virtual uint64_t reserved_bytes() const = 0;

 protected:
  explicit KvAllocator(PoolPtr pool);
  PoolPtr pool_;
  uint64_t bytes_per_block_ = 0;
  uint64_t usable_blocks_ = 0;
  bool tiered_ = false;
};

// Blocks on demand from the whole budget; admission keeps a 1% watermark
// of free blocks (as vLLM does) so running sequences can grow a while
// before anything is preempted.
class PagedAllocator : public KvAllocator {
 public:
  explicit PagedAllocator(PoolPtr pool);
  ServerKind kind() const override { return ServerKind::kPaged; }
  bool prefix_caching() const override { return true; }
  bool may_admit(uint64_t first_tokens, bool others_running) override;
  bool fits(pkv_seq_id seq, uint32_t n, bool others_running) override;
  void on_admit(Request*) override {}
  void on_release(Request*) override {}
  uint64_t reserved_bytes() const override;

 private:
  uint64_t free_blocks() const;
  uint64_t watermark_blocks_;
  uint32_t block_size_;
};

// floor(budget / max-context bytes) reservation slots. A request is
// admitted only into a free slot and holds all of it, max_context tokens,
// until it finishes. Its pool holds exactly the slots' blocks (prefix cache
// off, as in servers that reserve per request), so an append can never run
// out of blocks: a preemption here would be a bug, and the report would
// show it.
class StaticAllocator : public KvAllocator {
 public:
  StaticAllocator(PoolPtr pool, uint32_t slots, uint64_t slot_bytes);
  ServerKind kind() const override { return ServerKind::kStatic; }
  bool prefix_caching() const override { return false; }
  bool may_admit(uint64_t, bool) override { return !free_slots_.empty(); }
  bool fits(pkv_seq_id, uint32_t, bool) override { return !free_slots_.empty(); }
  void on_admit(Request* r) override;
  void on_release(Request* r) override;
  uint64_t reserved_bytes() const override;
  uint32_t slots() const { return slots_; }

 private:
  uint32_t slots_;
  uint64_t slot_bytes_;
  std::vector<uint32_t> free_slots_;  // a stack: the lowest-numbered slot on top
};

struct PoolShape {
  uint32_t dtype = PKV_DTYPE_F32;  // the model's K/V/q dtype
  uint32_t kv_dtype = 0;           // storage dtype when it differs (FP8), else 0
  int32_t device_type = PKV_DEVICE_CPU;
};

// The pagedkv pool of the budget, prefix caching on. nullptr with *status
// set (and pkv_last_error_message()) when the pool cannot be created.
std::unique_ptr<KvAllocator> make_paged_allocator(const Options& o, const PoolShape& shape,
                                                  pkv_status* status);
// floor(budget / slot bytes) slots of ceil(max_context / block_size) blocks
// of bytes_per_block each. nullptr with *status PKV_OK when not even one
// slot fits the budget.
std::unique_ptr<StaticAllocator> make_static_allocator(const Options& o, const PoolShape& shape,
                                                       uint64_t bytes_per_block,
                                                       pkv_status* status);

const char* server_name(ServerKind kind);

}  // namespace sim
