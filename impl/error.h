// Errors inside impl/. The C layer (capi/) turns an Error into the matching
// pkv_status and thread-local message; impl/ itself never sees the C ABI.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace pagedkv {

// Values equal the PKV_E_* codes; capi/ static_asserts that they agree.
enum class Errc : int32_t {
  kInvalidArgument = -1,
  kNotFound = -2,
  kOutOfBlocks = -3,
  kOutOfMemory = -4,
  kUnsupported = -5,
  kCuda = -6,
  kBufferTooSmall = -7,
  kInvalidState = -8,
  kInvariant = -9,
  kInternal = -10,
};

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Errc code() const noexcept { return code_; }

 private:
  Errc code_;
};

[[noreturn]] inline void fail(Errc code, const std::string& message) { throw Error(code, message); }

}  // namespace pagedkv
