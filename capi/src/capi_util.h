// Shared by every capi/src/*.cpp: the exception barrier, the thread-local
// error message, versioned-struct checks and the handle types. capi/ holds
// no logic: it checks pointers and sizes, converts, and calls impl/.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "error.h"
#include "group_plan.h"
#include "kv_groups.h"
#include "kv_pool.h"
#include "pagedkv/pagedkv.h"
#include "step_plan.h"

struct pkv_pool {
  std::shared_ptr<pagedkv::Pool> impl;         // null for a multi-group pool
  std::shared_ptr<pagedkv::GroupPool> groups;  // pkv_pool_create_groups only
};

struct pkv_batch {
  std::unique_ptr<pagedkv::Batch> impl;
  std::unique_ptr<pagedkv::GroupBatch> groups;  // a plan over a multi-group pool
};

namespace pkv_capi {

using pagedkv::Errc;
using pagedkv::fail;

std::string& last_error();  // this thread's message

// Runs body; turns every exception into a status and message. Nothing
// escapes: this is the only way a fallible pkv_* function returns.
template <class F>
pkv_status guard(const char* fn, F&& body) noexcept {
  try {
    body();
    last_error().clear();
    return PKV_OK;
  } catch (const pagedkv::Error& e) {
    try {
      last_error() = std::string(fn) + ": " + e.what();
    } catch (...) {
    }
    return static_cast<pkv_status>(e.code());
  } catch (const std::bad_alloc&) {
    try {
      last_error() = std::string(fn) + ": out of host memory";
    } catch (...) {
    }
    return PKV_E_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    try {
      last_error() = std::string(fn) + ": internal error: " + e.what();
    } catch (...) {
    }
    return PKV_E_INTERNAL;
  } catch (...) {
    try {
      last_error() = std::string(fn) + ": internal error (unknown exception)";
    } catch (...) {
    }
    return PKV_E_INTERNAL;
  }
}

#define PKV_GUARD(...) return ::pkv_capi::guard(__func__, [&]() { __VA_ARGS__; })

template <class T>
void require(const T* p, const char* name) {
  if (!p) fail(Errc::kInvalidArgument, std::string(name) + " is NULL");
}

// Versioned structs: struct_size must cover at least the first released
// version (v1_size); larger sizes come from newer headers and are fine.
constexpr uint32_t kMaxStructSize = 1u << 16;  // anything beyond is garbage
void check_struct_size(uint32_t size, uint32_t v1_size, const char* name, const char* type,
                       const char* init);

// Whether a caller's versioned struct (of its struct_size) holds `field`,
// appended after the first version.
#define PKV_HAS_FIELD(s, field) \
  ((s)->struct_size >= offsetof(std::remove_pointer_t<decltype(s)>, field) + sizeof((s)->field))

// Writes src into a caller's out-struct, no byte past its struct_size.
template <class T>
void write_out(T* out, const T& src) {
  uint32_t size = out->struct_size;
  std::memcpy(static_cast<void*>(out), &src, size < sizeof(T) ? size : sizeof(T));
  out->struct_size = size;
}

pagedkv::TensorArg to_arg(const pkv_tensor& t);
void from_arg(const pagedkv::TensorArg& a, pkv_tensor* out);
void copy_hash(const pagedkv::BlockHash& h, pkv_block_hash* out);
// A caller's pkv_seq_options (NULL = defaults), checked (capi/src/seq.cpp).
pagedkv::SeqOptions seq_options(const pkv_seq_options* opts);

// strict_key_domains (PKV_KEY_DOMAINS_*) of pkv_pool_options or
// pkv_hash_options into the pool's two flags; an unknown value is
// kInvalidArgument naming `name`.
void key_domains(uint32_t v, const char* name, bool* strict, bool* tagged);
// A caller's n block hashes at the pool's digest size (capi/src/seq.cpp);
// hashes NULL with n > 0 fails naming them.
// hashes[0, n) as the pool's hashes; n at most the full blocks of
// num_tokens (checked before any is read).
std::vector<pagedkv::BlockHash> block_hashes(const pagedkv::Pool& p, const pkv_block_hash* hashes,
                                             uint64_t n, uint64_t num_tokens);

// Runs f, naming errors of the options' contents as opts->field (the
// calls that take a pkv_seq_options).
template <class F>
auto with_opts_prefix(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const pagedkv::Error& e) {
    if (e.code() == Errc::kInvalidArgument && std::string(e.what()).rfind("mm_items", 0) == 0)
      fail(e.code(), std::string("opts->") + e.what());
    throw;
  }
}

inline pagedkv::Pool& pool_of(const pkv_pool* p) {
  require(p, "pool");
  if (!p->impl)
    fail(Errc::kUnsupported, "this call is not supported on a multi-group pool (pagedkv/groups.h)");
  return *p->impl;
}

// Calls f with the pool's core, single- or multi-group (the calls that
// pagedkv/groups.h lists as working on both; their methods share names).
template <class F>
void with_pool(const pkv_pool* p, F&& f) {
  require(p, "pool");
  if (p->groups)
    f(*p->groups);
  else
    f(*p->impl);
}

// First released sizes of the versioned structs (ABI 1).
constexpr uint32_t kPoolOptionsV1 = offsetof(pkv_pool_options, strict_key_domains);
constexpr uint32_t kSeqOptionsV1 = offsetof(pkv_seq_options, lora_name);
constexpr uint32_t kSeqInfoV1 = offsetof(pkv_seq_info, num_computed_tokens);
constexpr uint32_t kPoolStatsV1 = offsetof(pkv_pool_stats, num_partial_hits);
constexpr uint32_t kPrefixMatchV1 = sizeof(pkv_prefix_match);
constexpr uint32_t kHashOptionsV1 = offsetof(pkv_hash_options, lora_name);
constexpr uint32_t kBatchInfoV1 = sizeof(pkv_batch_info);
constexpr uint32_t kAttentionParamsV1 = sizeof(pkv_attention_params);
constexpr uint32_t kTierOptionsV1 = sizeof(pkv_tier_options);
constexpr uint32_t kTierMatchV1 = sizeof(pkv_tier_match);
constexpr uint32_t kTierStatsV1 = sizeof(pkv_tier_stats);

}  // namespace pkv_capi
