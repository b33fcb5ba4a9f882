// A continuous-batching scheduler in the style of vLLM v1, on the pagedkv
// C ABI: every step it extends the running sequences (one decode token, or
// the next prefill chunk) within a token budget, preempting on
// PKV_E_OUT_OF_BLOCKS, then admits waiting requests (prefix-cache lookup,
// first prefill chunk) while the memory policy (KvAllocator: paged or
// static reservations) and the budget allow. Both servers run this code.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "kv_allocator.h"
#include "options.h"
#include "pagedkv/pagedkv.h"
#include "workload.h"

namespace sim {

struct Chunk {
  Request* request;
  uint64_t start;  // first position computed this step
  uint32_t count;  // positions computed this step (= query rows)
};

struct Counters {
  uint64_t preemptions = 0;
  uint64_t prompt_tokens = 0;      // prompt positions computed the first time
  uint64_t decode_tokens = 0;      // generated positions computed the first time
  uint64_t recomputed_tokens = 0;  // positions computed again after a preemption
  uint64_t tier_hit_tokens = 0;    // prompt positions loaded from the host tier, not computed
  uint64_t generated_tokens = 0;   // tokens sampled
  uint64_t admissions = 0;
  uint32_t finished = 0;
  // Prefix lookups of admissions that then did not fit: the pool counts
  // them, the report's hit rate leaves them out (each request is counted
  // once per admission).
  uint64_t failed_lookup_tokens = 0;
  uint64_t failed_lookup_hits = 0;
  // Prefix lookups of admissions that went ahead, by cause of the hit. A
  // first admission can only hit a shared system prompt (user prompts are
  // random); a re-admission after a preemption also finds its own blocks
  // from before, still in the prefix cache unless evicted since.
  uint64_t first_lookup_tokens = 0;
  uint64_t first_hits_system = 0;
  uint64_t first_hits_other = 0;  // beyond the system prompt: none expected
  uint64_t readmit_lookup_tokens = 0;
  uint64_t readmit_hits_system = 0;
  uint64_t readmit_hits_own = 0;  // beyond the system prompt: its own earlier blocks
  uint64_t readmissions = 0;
};

class Scheduler {
 public:
  Scheduler(KvAllocator* alloc, Workload* workload, const Options& opts);

  bool done() const { return counters_.finished == total_; }
  // True when nothing runs and the next request arrives after step.
  bool idle(int64_t step) const;
  int64_t next_arrival() const;

  // Appends this step's tokens to the scheduled sequences (preempting and
  // admitting as needed) and returns the chunks to compute, in order.
  std::vector<Chunk> schedule(int64_t step);
  // After the step's K/V are written and attended: advances the requests,
  // samples their next tokens and frees the finished ones.
  void complete(const std::vector<Chunk>& chunks, int64_t step);

  const std::vector<Request*>& running() const { return running_; }
  uint32_t waiting(int64_t step) const;
  const Counters& counters() const { return counters_; }
  std::vector<int64_t> preemption_steps;

 private:
  void preempt_last();
  bool try_admit(Request* r, int64_t step, uint32_t budget, std::vector<Chunk>* chunks);
  void count_lookup(const Request* r, uint64_t cached);
  void insert_running(Request* r);

  void release(Request* r);

  KvAllocator* alloc_;
  pkv_pool* pool_;
  Workload* workload_;
  const Options& opts_;
  uint32_t total_;
  uint64_t next_admit_order_ = 0;
  // Arrival order; preempted requests go back to the front.
  std::deque<Request*> waiting_;
  // Highest priority first, then earliest admitted: the back is always the
  // preemption victim, and it has not been given tokens this step yet (so a
  // victim never leaves behind blocks registered but never written).
  std::vector<Request*> running_;
  Counters counters_;
};

// Throws std::runtime_error naming the call, the status and the library's
// message unless status is PKV_OK.
void check_status(pkv_status status, const char* call);

}  // namespace sim
