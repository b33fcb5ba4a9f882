#include "options.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

namespace sim {
namespace {

const char* kUsage = R"(usage: serving_sim [options]

Simulates a continuous-batching LLM server on pagedkv, twice on the same
request stream: once with paged KV memory (blocks as tokens arrive, prefix
cache) and once with static max-context reservations (floor(budget /
max-context bytes) sequences run, the rest wait). Requests with lognormal
prompt and output lengths arrive, the same scheduler admits them (prefix-cache
lookup, chunked prefill), decodes one token per running sequence per step,
preempts on PKV_E_OUT_OF_BLOCKS and recomputes later. Every step writes random
K/V and runs paged attention on a small model; sampled outputs are checked
against a float64 reference. Prints both servers' figures side by side and
writes an SVG chart.

workload:
  --requests N          requests to serve                          [1000]
  --shared-prefix F     share (0..1) starting with a system prompt [0.5]
  --system-prompts N    distinct system prompts                    [4]
  --prompt-len N        median user-prompt tokens (lognormal)      [192]
  --output-len N        median generated tokens (lognormal)        [128]
  --arrival-rate R      requests arriving per step, 0 = all at once [0]
  --seed N              RNG seed (workload, tokens, K/V, queries)  [1]
server:
  --memory-budget SIZE  KV-cache bytes per server, e.g. 64MiB, 1GiB [64MiB]
  --block-size N        tokens per block: 8, 16, 32 or 64          [16]
  --max-context N       tokens per sequence at most (prompt+output);
                        what the static server reserves per sequence [4096]
  --step-tokens N       tokens computed per step (prefill chunks)  [512]
  --max-seqs N          running sequences at most                  [256]
  --host-tier SIZE      host-memory tier under the paged server's prefix
                        cache: evicted blocks are offloaded there and
                        loaded back on a hit (CPU, or pinned memory with
                        --device cuda), e.g. 256MiB                [0 = none]
model and device:
  --layers N --q-heads N --kv-heads N --head-dim N        [4, 8, 2, 64]
  --dtype bf16|f16|f32  KV, query and output element type          [bf16]
  --kv-dtype fp8_e4m3|fp8_e5m2  FP8 KV storage (scale 1/256), --dtype
                        activations                                [as --dtype]
  --device cpu|cuda     where the cache and kernels live           [cpu]
  --device-id N         CUDA device ordinal                        [0]
  --threads N           CPU kernel threads, 0 = all cores          [0]
checks and output:
  --check-rows N        attention rows checked per step-tokens rows [2]
  --out PATH            SVG chart path                             [demo-report.svg]
  --quiet               no progress line
  --expect-preemption   fail unless at least one preemption happened (tests)
  --help                this text

exit status: 0 all checks passed on both servers; 1 the attention check, a pool
invariant or a library call failed, a request did not finish, or the static
server preempted; 2 bad usage, or --device cuda without a usable GPU.
)";

bool parse_u64(const std::string& s, uint64_t* out) {
  if (s.empty() || s[0] == '-') return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

bool parse_double(const std::string& s, double* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

}  // namespace

bool parse_size(const std::string& text, uint64_t* out) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  double number = 0;
  if (!parse_double(text.substr(0, i), &number) || number < 0) return false;
  std::string unit = text.substr(i);
  for (auto& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> kUnits = {
      {"", 1},        {"b", 1},         {"k", 1024.0},  {"kib", 1024.0},
      {"m", 1 << 20}, {"mib", 1 << 20}, {"g", 1 << 30}, {"gib", 1 << 30},
      {"kb", 1e3},    {"mb", 1e6},      {"gb", 1e9}};
  const auto it = kUnits.find(unit);
  if (it == kUnits.end()) return false;
  const double bytes = number * it->second;
  if (bytes >= 1.8e19) return false;
  *out = uint64_t(bytes);
  return true;
}

std::string format_bytes(double bytes) {
  char buf[64];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

int parse_options(int argc, char** argv, Options* o) {
  using Setter = std::function<bool(const std::string&)>;
  auto u32 = [](uint32_t* dst, uint64_t lo, uint64_t hi) -> Setter {
    return [=](const std::string& s) {
      uint64_t v;
      if (!parse_u64(s, &v) || v < lo || v > hi) return false;
      *dst = uint32_t(v);
      return true;
    };
  };
  auto real = [](double* dst, double lo, double hi) -> Setter {
    return [=](const std::string& s) {
      double v;
      if (!parse_double(s, &v) || v < lo || v > hi) return false;
      *dst = v;
      return true;
    };
  };
  const std::map<std::string, std::pair<Setter, const char*>> with_value = {
      {"--requests", {u32(&o->requests, 1, 10000000), "an integer >= 1"}},
      {"--shared-prefix", {real(&o->shared_prefix, 0, 1), "a number in [0, 1]"}},
      {"--system-prompts", {u32(&o->system_prompts, 1, 1000), "an integer in [1, 1000]"}},
      {"--prompt-len", {real(&o->prompt_median, 1, 1e6), "a number >= 1"}},
      {"--output-len", {real(&o->output_median, 1, 1e6), "a number >= 1"}},
      {"--arrival-rate", {real(&o->arrival_rate, 0, 1e6), "a number >= 0"}},
      {"--seed",
       {[o](const std::string& s) { return parse_u64(s, &o->seed); }, "an unsigned integer"}},
      {"--memory-budget",
       {[o](const std::string& s) {
          return parse_size(s, &o->memory_budget) && o->memory_budget > 0;
        },
        "a size such as 64MiB, 1GiB or 500MB"}},
      {"--host-tier",
       {[o](const std::string& s) { return parse_size(s, &o->host_tier); },
        "a size such as 256MiB, 1GiB or 0"}},
      {"--block-size", {u32(&o->block_size, 1, 1024), "8, 16, 32 or 64"}},
      {"--max-context", {u32(&o->max_context, 16, 1u << 20), "an integer in [16, 1048576]"}},
      {"--step-tokens", {u32(&o->step_tokens, 1, 1u << 20), "an integer >= 1"}},
      {"--max-seqs", {u32(&o->max_seqs, 1, 1u << 20), "an integer >= 1"}},
      {"--layers", {u32(&o->layers, 1, 256), "an integer in [1, 256]"}},
      {"--q-heads", {u32(&o->q_heads, 1, 256), "an integer in [1, 256]"}},
      {"--kv-heads", {u32(&o->kv_heads, 1, 256), "an integer in [1, 256]"}},
      {"--head-dim", {u32(&o->head_dim, 8, 1024), "64, 80, 96, 128 or 256"}},
      {"--dtype",
       {[o](const std::string& s) {
          o->dtype = s;
          o->dtype_given = true;
          return s == "bf16" || s == "f16" || s == "f32";
        },
        "bf16, f16 or f32"}},
      {"--kv-dtype",
       {[o](const std::string& s) {
          o->kv_dtype = s;
          return s == "fp8_e4m3" || s == "fp8_e5m2";
        },
        "fp8_e4m3 or fp8_e5m2"}},
      {"--device",
       {[o](const std::string& s) {
          o->device = s;
          return s == "cpu" || s == "cuda";
        },
        "cpu or cuda"}},
      {"--device-id",
       {[o](const std::string& s) {
          uint64_t v;
          if (!parse_u64(s, &v) || v > 1024) return false;
          o->device_id = int32_t(v);
          return true;
        },
        "a device ordinal"}},
      {"--threads", {u32(&o->threads, 0, 4096), "an integer >= 0"}},
      {"--check-rows", {u32(&o->check_rows, 0, 1u << 16), "an integer >= 0"}},
      {"--out",
       {[o](const std::string& s) {
          o->out = s;
          return !s.empty();
        },
        "a file path"}},
  };

  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--quiet" || arg == "-q") {
      o->quiet = true;
      continue;
    }
    if (arg == "--expect-preemption") {
      o->expect_preemption = true;
      continue;
    }
    std::string value;
    bool has_value = false;
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    const auto it = with_value.find(arg);
    if (it == with_value.end()) {
      std::fprintf(stderr, "serving_sim: unknown option '%s' (see --help)\n", arg.c_str());
      return 2;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "serving_sim: %s needs a value: %s\n", arg.c_str(), it->second.second);
        return 2;
      }
      value = argv[++i];
    }
    if (!it->second.first(value)) {
      std::fprintf(stderr, "serving_sim: %s '%s' is not valid: expected %s\n", arg.c_str(),
                   value.c_str(), it->second.second);
      return 2;
    }
  }
  if (o->q_heads % o->kv_heads != 0) {
    std::fprintf(stderr, "serving_sim: --q-heads %u must be a multiple of --kv-heads %u\n",
                 o->q_heads, o->kv_heads);
    return 2;
  }
  return -1;
}

}  // namespace sim
