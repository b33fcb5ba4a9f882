// Requests of the simulated server: lengths, tokens, the pseudo-random
// "model" that samples their next tokens, and their scheduling state.
#pragma once

#include <cstdint>
#include <vector>

#include "options.h"
#include "pagedkv/pagedkv.h"

namespace sim {

struct Request {
  uint32_t id = 0;
  int32_t priority = 0;  // 0 (batch) .. 2 (interactive); preemption takes the lowest first
  int64_t arrival_step = 0;
  int32_t system_prompt = -1;  // index, or -1 for none
  uint32_t prompt_len = 0;
  uint32_t output_len = 0;
  // Every token known so far (prompt, then generated ones) and, per
  // position, a hash of the tokens up to it. The K/V of a position are a
  // function of that hash only, like a real model's, so a prefix-cache hit
  // must return exactly what this request would have computed.
  std::vector<int32_t> tokens;
  std::vector<uint64_t> context_hash;
  uint64_t sampler_state = 0;

  // Scheduling state.
  pkv_seq_id seq = PKV_SEQ_ID_INVALID;
  bool running = false;
  bool finished = false;
  uint64_t num_computed = 0;  // tokens whose K/V are in the cache
  uint64_t num_appended = 0;  // tokens the sequence holds slots for (computed + this step's)
  uint64_t high_water = 0;    // most tokens ever computed (recompute accounting)
  uint64_t cached_at_admit = 0;
  uint32_t generated = 0;
  uint64_t admit_order = 0;
  uint32_t preemptions = 0;
  int32_t slot = -1;  // the static server's reservation, -1 for none
  int64_t first_admit_step = -1;
  int64_t first_token_step = -1;
  int64_t finish_step = -1;

  // Appends a token and the hash of the context it closes.
  void push_token(int32_t token, uint64_t model_seed);
  // The "model": next token from the request's own sampler, independent of
  // scheduling, so a recomputed request produces the same text.
  int32_t sample_next();
};

struct Workload {
  uint64_t model_seed = 0;
  std::vector<std::vector<int32_t>> system_prompts;
  std::vector<Request> requests;
};

constexpr int32_t kVocabSize = 32000;

Workload make_workload(const Options& opts);

}  // namespace sim
