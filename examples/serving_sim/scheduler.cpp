#include "scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace sim {

void check_status(pkv_status status, const char* call) {
  if (status == PKV_OK) return;
  throw std::runtime_error(std::string(call) + " failed: " + pkv_status_string(status) + ": " +
                           pkv_last_error_message());
}

Scheduler::Scheduler(pkv_pool* pool, Workload* workload, const Options& opts,
                     uint64_t usable_blocks)
    : pool_(pool),
      workload_(workload),
      opts_(opts),
      total_(uint32_t(workload->requests.size())),
      // Like vLLM's watermark: admissions leave 1% of the blocks free, so
      // running sequences can grow a while before anything is preempted.
      watermark_blocks_(std::max<uint64_t>(1, usable_blocks / 100)) {
  for (auto& r : workload->requests) waiting_.push_back(&r);
  std::stable_sort(waiting_.begin(), waiting_.end(), [](const Request* a, const Request* b) {
    return a->arrival_step < b->arrival_step;
  });
}

bool Scheduler::idle(int64_t step) const {
  return running_.empty() && !waiting_.empty() && waiting_.front()->arrival_step > step;
}

int64_t Scheduler::next_arrival() const {
  return waiting_.empty() ? 0 : waiting_.front()->arrival_step;
}

uint32_t Scheduler::waiting(int64_t step) const {
  uint32_t n = 0;
  for (const Request* r : waiting_) n += r->arrival_step <= step;
  return n;
}

void Scheduler::insert_running(Request* r) {
  const auto pos =
      std::upper_bound(running_.begin(), running_.end(), r, [](const Request* a, const Request* b) {
        if (a->priority != b->priority) return a->priority > b->priority;
        return a->admit_order < b->admit_order;
      });
  running_.insert(pos, r);
}

void Scheduler::preempt_last() {
  Request* victim = running_.back();
  running_.pop_back();
  check_status(pkv_seq_free(pool_, victim->seq), "pkv_seq_free");
  victim->seq = PKV_SEQ_ID_INVALID;
  victim->running = false;
  victim->num_computed = 0;
  victim->num_appended = 0;
  victim->preemptions++;
  counters_.preemptions++;
  // Recompute later: first in line for readmission, as vLLM does.
  waiting_.push_front(victim);
}

bool Scheduler::try_admit(Request* r, uint32_t budget, std::vector<Chunk>* chunks) {
  const uint32_t bs = opts_.block_size;
  if (!running_.empty()) {
    // Cheap refusal before any lookup: the first chunk without cache hits
    // would not fit above the watermark.
    const uint64_t first = std::min<uint64_t>(r->tokens.size(), budget);
    pkv_pool_stats st;
    pkv_pool_stats_init(&st);
    check_status(pkv_pool_get_stats(pool_, &st), "pkv_pool_get_stats");
    if (st.num_free_blocks < (first + bs - 1) / bs + watermark_blocks_) return false;
  }
  pkv_seq_options so;
  pkv_seq_options_init(&so);
  so.priority = r->priority;
  pkv_seq_id seq = PKV_SEQ_ID_INVALID;
  check_status(pkv_seq_create(pool_, &so, &seq), "pkv_seq_create");
  uint64_t cached = 0;
  check_status(pkv_seq_match_prefix(pool_, seq, r->tokens.data(), r->tokens.size(), &cached),
               "pkv_seq_match_prefix");
  const uint32_t n = uint32_t(std::min<uint64_t>(r->tokens.size() - cached, budget));

  bool fits = true;
  if (!running_.empty()) {
    uint64_t needed = 0;
    check_status(pkv_seq_blocks_needed(pool_, seq, n, 0, &needed), "pkv_seq_blocks_needed");
    pkv_pool_stats st;
    pkv_pool_stats_init(&st);
    check_status(pkv_pool_get_stats(pool_, &st), "pkv_pool_get_stats");
    fits = st.num_free_blocks >= needed + watermark_blocks_;
  }
  if (fits) {
    const pkv_status s = pkv_seq_append(pool_, seq, r->tokens.data() + cached, n, 0);
    if (s == PKV_E_OUT_OF_BLOCKS) {
      fits = false;
    } else {
      check_status(s, "pkv_seq_append");
    }
  }
  if (!fits) {
    // Gives back the prefix blocks it attached; they stay cached.
    check_status(pkv_seq_free(pool_, seq), "pkv_seq_free");
    counters_.failed_lookup_tokens += r->tokens.size();
    counters_.failed_lookup_hits += cached;
    return false;
  }
  r->seq = seq;
  r->running = true;
  r->num_computed = cached;
  r->num_appended = cached + n;
  r->cached_at_admit = cached;
  r->admit_order = next_admit_order_++;
  counters_.admissions++;
  insert_running(r);
  chunks->push_back({r, cached, n});
  return true;
}

std::vector<Chunk> Scheduler::schedule(int64_t step) {
  std::vector<Chunk> chunks;
  uint32_t budget = opts_.step_tokens;
  bool preempted = false;

  // 1. Running sequences, most important first: a decode token each, or
  //    the next chunk of their (re)computed prompt.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    const uint32_t n = uint32_t(std::min<uint64_t>(r->tokens.size() - r->num_computed, budget));
    bool appended = false;
    while (true) {
      const pkv_status s = pkv_seq_append(pool_, r->seq, r->tokens.data() + r->num_computed, n, 0);
      if (s == PKV_OK) {
        appended = true;
        break;
      }
      if (s != PKV_E_OUT_OF_BLOCKS) check_status(s, "pkv_seq_append");
      // Nothing changed; make room by preempting the least important,
      // latest admitted sequence (possibly r itself) and retry.
      const bool self = running_.back() == r;
      preempt_last();
      preemption_steps.push_back(step);
      preempted = true;
      if (self) break;
    }
    if (!appended) break;  // r was the last running sequence
    r->num_appended = r->num_computed + n;
    chunks.push_back({r, r->num_computed, n});
    budget -= n;
    ++i;
  }

  // 2. Waiting requests, in order, unless memory was short this step.
  if (!preempted) {
    while (budget > 0 && running_.size() < opts_.max_seqs && !waiting_.empty() &&
           waiting_.front()->arrival_step <= step) {
      Request* r = waiting_.front();
      if (!try_admit(r, budget, &chunks)) break;
      waiting_.pop_front();
      budget -= chunks.back().count;
    }
  }
  return chunks;
}

void Scheduler::complete(const std::vector<Chunk>& chunks, int64_t step) {
  for (const Chunk& c : chunks) {
    Request* r = c.request;
    // Classify the computed positions: again after a preemption, prompt, or
    // generated.
    const uint64_t end = c.start + c.count;
    const uint64_t again = end <= r->high_water       ? c.count
                           : c.start >= r->high_water ? 0
                                                      : r->high_water - c.start;
    counters_.recomputed_tokens += again;
    for (uint64_t p = std::max(c.start, r->high_water); p < end; ++p)
      (p < r->prompt_len ? counters_.prompt_tokens : counters_.decode_tokens)++;
    r->high_water = std::max(r->high_water, end);
    r->num_computed = end;
    if (r->num_computed < r->tokens.size()) continue;  // prefill continues next step

    // The step computed the last known position: the "model" emits a token.
    r->generated++;
    counters_.generated_tokens++;
    if (r->first_token_step < 0) r->first_token_step = step;
    if (r->generated < r->output_len) {
      r->push_token(r->sample_next(), workload_->model_seed);
      continue;
    }
    r->finished = true;
    r->running = false;
    r->finish_step = step;
    check_status(pkv_seq_free(pool_, r->seq), "pkv_seq_free");
    r->seq = PKV_SEQ_ID_INVALID;
    running_.erase(std::find(running_.begin(), running_.end(), r));
    counters_.finished++;
  }
}

}  // namespace sim
