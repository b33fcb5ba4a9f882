// A step plan (pkv_batch): slot mapping and CSR page table for one engine
// step, built on the host and uploaded once to the pool's device. It keeps
// the pool alive (shared_ptr) and the table versions of its sequences, so a
// plan whose sequence changed, or whose pool was destroyed, fails cleanly.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kernel_types.h"
#include "kv_pool.h"
#include "step_plan_rows.h"
#include "step_plan_table.h"
#include "tensor_arg.h"

namespace pagedkv {

struct BatchInfo {
  uint32_t num_seqs = 0;
  uint64_t num_tokens = 0;
  uint64_t num_pages = 0;
  uint64_t max_context = 0;
  uint32_t max_query = 0;
  uint32_t block_size = 0;
};

struct AttentionParams {
  float softmax_scale = 0;  // 0 = 1/sqrt(head_dim)
  uint32_t sliding_window = 0;
  float logit_softcap = 0;
};

enum class PlanArray : uint32_t {  // PKV_PLAN_*
  kSlotMapping = 0,
  kQueryIndptr = 1,
  kPageIndptr = 2,
  kPageIndices = 3,
  kLastPageLen = 4,
  kContextLens = 5,
};

class Batch {
 public:
  // Validates every id and query count (Error naming the index), runs the
  // pool's pending copy-on-write copies on stream, uploads the plan.
  // persistent_table: the page table as padded rows kept by the pool
  // across steps (step_plan_table.h) instead of CSR.
  static std::unique_ptr<Batch> prepare(const std::shared_ptr<Pool>& pool, const SeqId* seqs,
                                        const uint32_t* query_counts, uint32_t num_seqs,
                                        void* stream, bool persistent_table = false);
  // One decode step in one pass (step_plan_decode.cpp): appends tokens[i]
  // to seqs[i] and builds the plan whose queries are those tokens, as
  // Pool::append_batch then prepare with query counts 1 would, but all or
  // nothing: every check of both comes before any change.
  static std::unique_ptr<Batch> prepare_decode(const std::shared_ptr<Pool>& pool, const SeqId* seqs,
                                               const int32_t* tokens, uint32_t num_seqs,
                                               void* stream, bool persistent_table = false);
  ~Batch();
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  const BatchInfo& info() const { return info_; }
  TensorArg plan_tensor(uint32_t which) const;
  const PlanView& view() const { return view_; }            // pool-device pointers
  const PlanView& host_view() const { return host_view_; }  // host copies
  // Page-table rows this plan copied from the previous plan (the rest were
  // read from the sequences' tables), for tests and benchmarks.
  // With a persistent table: the rows it did not rewrite.
  size_t rows_reused() const { return rows_reused_; }
  // Built by the steady decode path (step_plan_steady.cpp), for tests.
  bool steady_for_testing() const { return steady_; }
  bool lane_for_testing() const { return lane_; }
  // The persistent table's row stride (pages per row); 0 for CSR plans.
  uint32_t page_row_stride() const { return table_ ? table_->stride : 0; }

  // What a model needs besides the page table (step_plan_positions.cpp):
  // i64 [num_tokens] position of each query row in its sequence, and i64
  // [num_seqs] the row of each sequence's last query (its logits row).
  // Built from the host plan on first request, so steps that never ask
  // pay nothing; on device pools uploaded then on the prepare stream.
  TensorArg token_positions() const;
  TensorArg last_token_indices() const;

  // The step's writes happened: its query tokens count as computed (their
  // slots written, full blocks hittable, the sliding window advances).
  // Idempotent; fails (kInvalidState) after abort() or on a closed pool.
  void commit();
  // Tests: commit() through the general path only (the decode fast path's
  // reference).
  void commit_general_for_testing();
  // The step's writes did not happen: nothing counts. Fails (kInvalidState)
  // after a commit; idempotent otherwise.
  void abort();
  bool committed() const { return state_ == State::kCommitted; }
  bool aborted() const { return state_ == State::kAborted; }

  // A successful write of the last unwritten layer commits the step.
  void write(uint32_t layer, const TensorArg* k, const TensorArg* v, void* stream);
  void attend(uint32_t layer, const TensorArg* q, const TensorArg* out, const TensorArg* lse,
              const AttentionParams& params, void* stream);
  // MLA pools (step_plan_mla.cpp): the latent write (counts towards the
  // commit like write()) and absorbed attention. kInvalidState on a pool
  // that is not MLA; write() and attend() fail on an MLA pool.
  void mla_write(uint32_t layer, const TensorArg* kv_c, const TensorArg* k_pe, void* stream);
  void mla_attend(uint32_t layer, const TensorArg* q_latent, const TensorArg* q_pe,
                  const TensorArg* out, const TensorArg* lse, const AttentionParams& params,
                  void* stream);

 private:
  Batch() = default;
  void check_fresh() const;  // pool open and every sequence unchanged; holds pool->mu_
  // check_fresh, storage, layer in range and the pool's layout is (not)
  // MLA as the call needs; holds pool->mu_.
  void check_layer_call(uint32_t layer, bool mla, const char* call) const;
  // After a successful write of layer: the last layer commits; holds mu_.
  void mark_layer_written(uint32_t layer);
  void mark_layer_written_keeping_lane(uint32_t layer);  // the write's second section
  void commit_checked(bool fast);        // commit(), with or without the decode fast path
  void commit_locked(bool fast = true);  // holds pool->mu_
  bool decode_shaped() const;            // one query per sequence, ranges in order
  void commit_decode_locked(bool same);
  struct CommitRows;
  // prepare's work once the batch holds its plan memory; holds pool->mu_.
  void build(const SeqId* seqs, const uint32_t* query_counts, uint32_t num_seqs, void* stream,
             bool persistent_table);
  void build_decode(const SeqId* seqs, const int32_t* tokens, uint32_t num_seqs, void* stream,
                    bool persistent_table);
  // build_decode for a step whose every sequence is steady (its tail its
  // own, its context computed), in lean passes (step_plan_steady.cpp);
  // false, with nothing changed, when the step needs the general path.
  bool build_decode_steady(const SeqId* seqs, const int32_t* tokens, uint32_t num_seqs,
                           void* stream, bool persistent_table);
  // Its appends and plan rows (step_plan_steady.cpp).
  struct SteadyRows;
  // A new plan over num_seqs sequences made by build(batch) under the
  // pool's lock, in recycled plan memory (returned to the pool if build
  // throws).
  template <class Build>
  static std::unique_ptr<Batch> make(const std::shared_ptr<Pool>& pool, uint32_t num_seqs,
                                     Build&& build);
  // The plan's per-sequence state sized for seqs (contents left to build).
  void start_host(const SeqId* seqs, uint32_t num_seqs);
  // The first position in [from block of first_key, ctx_end) of s whose
  // slot holds no written K/V, counting what the plan writes first (the
  // written counts after its own writes: ranges(), a vector of
  // WrittenRange, built only when a block is not written yet); ctx_end
  // when every one is written. Holds pool->mu_.
  template <class Ranges>
  uint64_t first_unwritten(const Sequence& s, uint64_t ctx_end, uint64_t first_key,
                           std::vector<std::pair<int32_t, uint32_t>>& after, bool& have_after,
                           Ranges&& ranges) const {
    const Pool& p = *pool_;
    const uint64_t bs = p.opts_.block_size, w = p.opts_.sliding_window;
    // With a window, the check reads at most the window.
    uint64_t j =
        std::max<uint64_t>({s.num_null, p.div_bs(first_key), w ? 0 : p.div_bs(s.num_committed)});
    for (; j * bs < ctx_end; ++j) {
      const int32_t blk = s.blocks[j];
      const uint32_t need = uint32_t(std::min(bs, ctx_end - j * bs));
      uint32_t wr = p.blocks_.written(blk);
      if (wr < need) {
        if (!have_after) {
          after = p.written_after(ranges());
          have_after = true;
        }
        auto it = std::lower_bound(after.begin(), after.end(), std::make_pair(blk, uint32_t(0)));
        if (it != after.end() && it->first == blk) wr = it->second;
      }
      if (wr < need) return j * bs + wr;
    }
    return ctx_end;
  }
  // build_decode's check that every query's context is written (or
  // written first by the plan), on the state before its appends.
  void check_decode_context(const SeqId* seqs);
  // The host arrays of a plan, in the plan memory (kernels' copy).
  struct PlanArrays {
    int64_t* slots;
    int32_t *qptr, *pptr, *pidx, *last, *ctx;
  };
  // Sizes the plan memory for the arrays (info_ set; may throw, before
  // any change). table_, if any, is already sized.
  PlanArrays lay_out(uint64_t tokens, uint64_t pages, uint64_t max_ctx, uint32_t max_q,
                     uint32_t num_seqs);
  // Once every array but the CSR page ids is written (and the persistent
  // table's rows, rewritten of them): the page ids, the callers' copy,
  // pending copy-on-write copies, the upload. The plan is open after it.
  void finish(const PlanArrays& a, const SeqId* seqs, size_t rewritten, void* stream);

  enum class State : uint8_t { kOpen, kCommitted, kAborted };
  // Aborted until prepare succeeds, so that a batch dropped by a failing
  // prepare (which holds the pool's lock) never takes the lock again.
  State state_ = State::kAborted;
  std::vector<uint8_t> layer_written_;  // per layer, storage pools
  uint32_t layers_left_ = 0;
  // The pool's count of freed sequences at prepare (SeqTable::removals):
  // while it holds, the sequences prepare resolved are the plan's.
  uint64_t removals_ = 0;

  std::shared_ptr<Pool> pool_;
  BatchInfo info_;
  // Every array, 8-byte aligned, twice (kernel copy, callers' copy), and
  // the plan's per-sequence state (ids, versions, ranges), in memory
  // recycled between plans (step_plan_rows.h).
  std::shared_ptr<PlanHost> host_;
  bool recyclable_ = false;   // prepare succeeded: the destructor may lock the pool
  bool decode_step_ = false;  // built by build_decode: ranges are decode_shaped()
  bool steady_ = false;       // built by build_decode_steady
  bool lane_ = false;         // from the lane (Pool::DecodeMemo)
  // A lane step's sequences that entered or filled a block or needed room:
  // PlanHost::slow's first lane_slow_ entries (the rest continued inside
  // their block).
  uint32_t lane_slow_ = 0;
  // On the CPU the callers' copy is made when first asked for.
  mutable std::once_flag callers_copy_;
  size_t rows_reused_ = 0;  // page rows copied from the previous plan
  // The persistent page table (kernels' and callers' copies) on the host;
  // null for CSR plans. Device pools upload a copy with the plan.
  std::shared_ptr<PageTable> table_;
  void* device_ = nullptr;  // the same bytes on the device (non-CPU pools)
  void* stream_ = nullptr;  // device_ is released ordered on the prepare stream
  size_t bytes_ = 0;
  size_t offsets_[6] = {};  // byte offset of each PlanArray in the buffer
  PlanView view_{}, host_view_{};

  // token_positions() and last_token_indices(), one buffer: positions, then
  // last rows. Separate from the page-table arrays above (built lazily).
  const char* positions_base() const;  // pool-device pointer
  TensorArg positions_arg(size_t offset_elems, int64_t len) const;
  mutable std::once_flag positions_once_;
  mutable std::vector<int64_t> positions_host_;
  mutable void* positions_device_ = nullptr;
};

}  // namespace pagedkv
