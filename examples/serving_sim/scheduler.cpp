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

Scheduler::Scheduler(KvAllocator* alloc, Workload* workload, const Options& opts)
    : alloc_(alloc),
      pool_(alloc->pool()),
      workload_(workload),
      opts_(opts),
      total_(uint32_t(workload->requests.size())) {
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

void Scheduler::release(Request* r) {
  check_status(pkv_seq_free(pool_, r->seq), "pkv_seq_free");
  r->seq = PKV_SEQ_ID_INVALID;
  r->running = false;
  alloc_->on_release(r);
}

void Scheduler::preempt_last() {
  Request* victim = running_.back();
  running_.pop_back();
  release(victim);
  victim->num_computed = 0;
  victim->num_appended = 0;
  victim->preemptions++;
  counters_.preemptions++;
  // Recompute later: first in line for readmission, as vLLM does.
  waiting_.push_front(victim);
}

void Scheduler::count_lookup(const Request* r, uint64_t cached) {
  const uint64_t system_len =
      r->system_prompt < 0 ? 0 : workload_->system_prompts[size_t(r->system_prompt)].size();
  const uint64_t in_system = std::min(cached, system_len);
  const uint64_t beyond = cached - in_system;
  if (r->preemptions == 0) {
    counters_.first_lookup_tokens += r->tokens.size();
    counters_.first_hits_system += in_system;
    counters_.first_hits_other += beyond;
  } else {
    counters_.readmissions++;
    counters_.readmit_lookup_tokens += r->tokens.size();
    counters_.readmit_hits_system += in_system;
    counters_.readmit_hits_own += beyond;
  }
}

bool Scheduler::try_admit(Request* r, int64_t step, uint32_t budget, std::vector<Chunk>* chunks) {
  const bool others = !running_.empty();
  if (!alloc_->may_admit(std::min<uint64_t>(r->tokens.size(), budget), others)) return false;
  pkv_seq_options so;
  pkv_seq_options_init(&so);
  so.priority = r->priority;
  pkv_seq_id seq = PKV_SEQ_ID_INVALID;
  check_status(pkv_seq_create(pool_, &so, &seq), "pkv_seq_create");
  uint64_t cached = 0;
  uint64_t tier_hits = 0;
  if (alloc_->tiered()) {
    // Device hits, then blocks found in the host tier: the next plan loads
    // those before attention reads them.
    pkv_tier_match m;
    pkv_tier_match_init(&m);
    check_status(pkv_seq_match_prefix_tiered(pool_, seq, r->tokens.data(), r->tokens.size(), &m),
                 "pkv_seq_match_prefix_tiered");
    cached = m.num_cached;
    tier_hits = m.host_tokens + m.file_tokens;
  } else if (alloc_->prefix_caching()) {
    check_status(pkv_seq_match_prefix(pool_, seq, r->tokens.data(), r->tokens.size(), &cached),
                 "pkv_seq_match_prefix");
  }
  const uint32_t n = uint32_t(std::min<uint64_t>(r->tokens.size() - cached, budget));

  bool fits = alloc_->fits(seq, n, others);
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
    if (alloc_->prefix_caching()) {
      counters_.failed_lookup_tokens += r->tokens.size();
      counters_.failed_lookup_hits += cached;
    }
    return false;
  }
  alloc_->on_admit(r);
  if (alloc_->prefix_caching()) count_lookup(r, cached);
  counters_.tier_hit_tokens += tier_hits;
  r->seq = seq;
  r->running = true;
  if (r->first_admit_step < 0) r->first_admit_step = step;
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
      if (!try_admit(r, step, budget, &chunks)) break;
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
    r->finish_step = step;
    release(r);
    running_.erase(std::find(running_.begin(), running_.end(), r));
    counters_.finished++;
  }
}

}  // namespace sim
