// Seeded pseudo-random numbers with our own distributions, so that a seed
// gives the same workload with every C++ standard library (std::*
// distributions are implementation-defined).
#pragma once

#include <cmath>
#include <cstdint>

namespace sim {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// splitmix64: small state, good enough for a workload and random K/V.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return mix64(state_);
  }
  // Uniform in [0, 1).
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  double normal() {
    // Box-Muller; 1 - u keeps the log argument in (0, 1].
    const double u = 1.0 - uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
  double lognormal(double median, double sigma) { return median * std::exp(sigma * normal()); }
  double exponential(double mean) { return -mean * std::log(1.0 - uniform()); }

 private:
  uint64_t state_;
};

}  // namespace sim
