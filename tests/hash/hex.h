// Hex rendering of digests, shared by the hash tests and the Python
// cross-check helper (both compare against hexdigest() strings).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "hash/block_hash.h"

namespace pagedkv {
namespace test {

inline std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(d[p[i] >> 4]);
    s.push_back(d[p[i] & 15]);
  }
  return s;
}

inline std::string hex(const BlockHash& h) { return hex(h.bytes.data(), h.size); }

}  // namespace test
}  // namespace pagedkv
