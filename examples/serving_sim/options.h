// Command-line options of serving_sim and their embedded defaults.
#pragma once

#include <cstdint>
#include <string>

namespace sim {

struct Options {
  // Workload.
  uint32_t requests = 1000;
  double shared_prefix = 0.5;   // share of requests starting with a system prompt
  uint32_t system_prompts = 4;  // distinct common system prompts
  double prompt_median = 192;   // user part of the prompt, tokens (lognormal)
  double output_median = 128;   // generated tokens (lognormal)
  double arrival_rate = 0;      // requests per step; 0 = all arrive at step 0
  uint64_t seed = 1;
  // Server.
  uint64_t memory_budget = 64ull << 20;  // KV bytes, each server
  uint32_t block_size = 16;
  uint32_t max_context = 4096;  // per-sequence limit; what static allocation reserves
  uint32_t step_tokens = 512;   // tokens computed per step (chunked prefill budget)
  uint32_t max_seqs = 256;      // running sequences at most
  uint64_t host_tier = 0;       // bytes of the paged server's host tier; 0 = none
  // Model shape and device.
  uint32_t layers = 4;
  uint32_t q_heads = 8;
  uint32_t kv_heads = 2;
  uint32_t head_dim = 64;
  std::string dtype = "bf16";
  bool dtype_given = false;
  std::string kv_dtype;  // "" = --dtype; fp8_e4m3 or fp8_e5m2: FP8 KV storage
  std::string device = "cpu";
  int32_t device_id = 0;
  uint32_t threads = 0;  // 0 = the library's default (hardware concurrency)
  // Checks and output.
  uint32_t check_rows = 2;  // rows checked against the reference per step_tokens rows computed
  std::string out = "demo-report.svg";
  bool quiet = false;
  bool expect_preemption = false;
};

// Parses argv into opts. Returns -1 to go on, otherwise the exit code (0
// after --help, 2 after a usage error, with the message already printed).
int parse_options(int argc, char** argv, Options* opts);

// "64MiB", "1.5GiB", "65536", "64MB" (decimal) -> bytes; false if malformed.
bool parse_size(const std::string& text, uint64_t* out);

std::string format_bytes(double bytes);

}  // namespace sim
