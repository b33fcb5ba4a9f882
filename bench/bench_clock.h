// Timing helpers shared by the table-printing benchmarks.
#pragma once

#include <time.h>

#include <chrono>
#include <fstream>
#include <string>

namespace pkv_bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU seconds of every thread of the process: on a shared machine, a rate
// per CPU-second times the thread count is what the run would reach with
// its cores to itself.
inline double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The CPU's model name from /proc/cpuinfo, for the tables' headers.
inline std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  }
  return "unknown CPU";
}

}  // namespace pkv_bench
