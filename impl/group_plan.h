// A step plan over a multi-group pool (pkv_batch_prepare on a pool from
// pkv_pool_create_groups): the shared arrays of a plan (query offsets,
// context lengths, positions) and, per group, its page table and slot
// mapping, read from the sequences' per-group block tables. These pools
// are manager only, so the plan is host arrays for the engine's kernels;
// the library never reads them back. Commit and abort follow manager-only
// single-group plans (batch.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "group_plan_table.h"
#include "kv_groups.h"
#include "step_plan.h"
#include "tensor_arg.h"

namespace pagedkv {

// Group arrays of a plan beyond PKV_PLAN_* (values of PKV_PLAN_SNAPSHOT_*).
constexpr uint32_t kPlanSnapshotIndptr = 16, kPlanSnapshotRows = 17, kPlanSnapshotBlocks = 18;

class GroupBatch {
 public:
  // Validates every id and query count (Error naming seqs[i] or
  // query_counts[i]); changes nothing on failure.
  // persistent: each group's page table is the pool's kept table of padded
  // rows (PKV_PREPARE_PERSISTENT_TABLE, group_plan_table.h), not CSR.
  static std::unique_ptr<GroupBatch> prepare(const std::shared_ptr<GroupPool>& pool,
                                             const SeqId* seqs, const uint32_t* query_counts,
                                             uint32_t num_seqs, bool persistent = false);
  // Rows of group g's persistent table this plan wrote (0 for CSR plans).
  size_t rows_rewritten(uint32_t g) const { return g < groups_.size() ? groups_[g].rewritten : 0; }
  // Without commit or abort: committed, as manager-only plans (ABI 1).
  ~GroupBatch();
  GroupBatch(const GroupBatch&) = delete;
  GroupBatch& operator=(const GroupBatch&) = delete;

  const BatchInfo& info() const { return info_; }  // num_pages: group 0's
  // PKV_PLAN_* array `which` of group g (the shared ones are the same for
  // every group).
  TensorArg plan_tensor(uint32_t g, uint32_t which) const;
  TensorArg token_positions() const;
  TensorArg last_token_indices() const;
  void commit();
  void abort();

 private:
  GroupBatch() = default;
  void commit_locked();  // holds pool_->mu_
  // State snapshots at block boundaries inside the query chunks of groups
  // with PKV_GROUP_SNAPSHOT_EVERY_BLOCK (group_snapshots.cpp). plan_: fills
  // the arrays (may throw; changes nothing) and returns the slots needed;
  // take_: allocates them (cannot throw; the caller checked the blocks);
  // keep_ (commit): caches each under its block's hash unless one is
  // cached already; both keep_ and drop_ (abort) hand the slots back.
  uint64_t plan_snapshots(const std::vector<GroupPool::Seq*>& live, const uint32_t* query_counts);
  void take_snapshots();
  void keep_snapshots();
  void drop_snapshots();
  // A 1-D view of len elements of this plan's host memory.
  TensorArg host_array(const void* data, size_t len, DType dtype) const;

  enum class State : uint8_t { kOpen, kCommitted, kAborted };
  State state_ = State::kAborted;  // until prepare succeeds
  // prepare succeeded: the destructor may lock the pool (a failed prepare
  // destroys its half-built plan while it holds the lock).
  bool recyclable_ = false;
  std::shared_ptr<GroupPool> pool_;
  std::vector<SeqId> seqs_;
  std::vector<uint32_t> epochs_;  // Seq::epoch at prepare
  std::vector<uint64_t> ends_;    // token count at prepare
  BatchInfo info_;
  std::vector<int32_t> qptr_, ctx_;
  std::vector<int64_t> positions_, last_rows_;
  struct Arrays {
    std::vector<int64_t> slots;
    std::vector<int32_t> pptr, pidx, last;
    // Persistent plans: the kept table (PAGE_INDICES is its first
    // num_seqs * stride entries; pidx stays empty).
    std::shared_ptr<GroupPageTable> table;
    size_t rewritten = 0;
    // Recurrent groups: CSR over the plan's sequences of the snapshots to
    // write (PKV_PLAN_SNAPSHOT_*), with each one's key and sequence.
    std::vector<int32_t> snap_ptr, snap_blocks;
    std::vector<int64_t> snap_rows;
    std::vector<BlockHash> snap_keys;
    std::vector<uint32_t> snap_seq;
  };
  std::vector<Arrays> groups_;
};

}  // namespace pagedkv
