#include "workload.h"

#include <algorithm>
#include <cmath>

#include "rng.h"

namespace sim {

void Request::push_token(int32_t token, uint64_t model_seed) {
  const uint64_t parent = context_hash.empty() ? mix64(model_seed) : context_hash.back();
  tokens.push_back(token);
  context_hash.push_back(mix64(parent ^ (uint64_t(uint32_t(token)) + 1) * 0x9E3779B97F4A7C15ull));
}

int32_t Request::sample_next() {
  sampler_state += 0x9E3779B97F4A7C15ull;
  return int32_t(mix64(sampler_state) % kVocabSize);
}

namespace {

uint32_t clamp_len(double x, uint32_t lo, uint32_t hi) {
  if (!(x >= lo)) return lo;
  if (x >= hi) return hi;
  return uint32_t(std::lround(x));
}

}  // namespace

Workload make_workload(const Options& opts) {
  Workload w;
  Rng rng(mix64(opts.seed ^ 0x5EC7E7A11ull));
  w.model_seed = mix64(opts.seed * 0x2545F4914F6CDD1Dull + 7);

  // System prompts: a few hundred tokens each, at most a quarter of the
  // context so that a user part and an answer still fit.
  const uint32_t max_system = std::max<uint32_t>(1, opts.max_context / 4);
  for (uint32_t i = 0; i < opts.system_prompts; ++i) {
    const uint32_t len = clamp_len(rng.lognormal(384, 0.5), 1, max_system);
    std::vector<int32_t> p(len);
    for (auto& t : p) t = int32_t(rng.below(kVocabSize));
    w.system_prompts.push_back(std::move(p));
  }

  double arrival = 0;
  w.requests.resize(opts.requests);
  for (uint32_t i = 0; i < opts.requests; ++i) {
    Request& r = w.requests[i];
    r.id = i;
    r.priority = int32_t(rng.below(3));
    if (opts.arrival_rate > 0) {
      arrival += rng.exponential(1.0 / opts.arrival_rate);
      r.arrival_step = int64_t(arrival);
    }
    if (rng.uniform() < opts.shared_prefix)
      r.system_prompt = int32_t(rng.below(opts.system_prompts));
    const uint32_t system_len =
        r.system_prompt < 0 ? 0 : uint32_t(w.system_prompts[r.system_prompt].size());
    // Prompts take at most 3/4 of max_context, leaving room to answer.
    const uint32_t room = opts.max_context * 3 / 4 - system_len;  // >= 1/2 of max_context
    const uint32_t user_len = clamp_len(rng.lognormal(opts.prompt_median, 1.0), 1, room);
    r.prompt_len = system_len + user_len;
    r.output_len =
        clamp_len(rng.lognormal(opts.output_median, 0.8), 1, opts.max_context - r.prompt_len);
    r.sampler_state = rng.next();
    r.tokens.reserve(r.prompt_len + r.output_len);
    r.context_hash.reserve(r.prompt_len + r.output_len);
    if (r.system_prompt >= 0)
      for (int32_t t : w.system_prompts[r.system_prompt]) r.push_token(t, w.model_seed);
    for (uint32_t j = 0; j < user_len; ++j)
      r.push_token(int32_t(rng.below(kVocabSize)), w.model_seed);
  }
  return w;
}

}  // namespace sim
