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

// A 0/1 option field: any other value is INVALID_ARGUMENT naming it.
uint32_t flag(uint32_t v, const char* name);

// Versioned structs: struct_size must cover at least the first released
// version (v1_size); larger sizes come from newer headers and are fine.
constexpr uint32_t kMaxStructSize = 1u << 16;  // anything beyond is garbage
void check_struct_size(uint32_t size, uint32_t v1_size, const char* name, const char* type,
                       const char* init);

// pkv_X_init and pkv_X_init_sized (docs/conventions.md, "Versioned
// structs"). A struct's frozen size is its size through the field that was
// its last when pkv_X_init_sized was added, rounded up to its alignment:
// what pkv_X_init writes, forever. A binary compiled against that header
// passes pkv_X_init a struct of exactly that size, so once a field is
// appended, writing the new sizeof would overwrite the caller's memory past
// it. Never change a frozen size; fields appended later are reached through
// pkv_X_init_sized(s, sizeof *s).
constexpr size_t round_up(size_t n, size_t align) { return (n + align - 1) / align * align; }
#define PKV_FROZEN_SIZE(T, last) \
  static_cast<uint32_t>(::pkv_capi::round_up(offsetof(T, last) + sizeof(T::last), alignof(T)))

// A whole T of the library's defaults: zeros, struct_size = sizeof(T), then
// `fill` (NULL for the structs whose every default is 0) sets the others.
// Padding stays zero.
template <class T>
void fill_defaults(T* o, void (*fill)(T&)) {
  static_assert(std::is_trivially_copyable<T>::value, "a C struct");
  std::memset(static_cast<void*>(o), 0, sizeof *o);
  o->struct_size = sizeof *o;
  if (fill) fill(*o);
}

// pkv_X_init: the first Frozen bytes of the defaults, struct_size = Frozen.
// NULL is a no-op.
template <uint32_t Frozen, class T>
void init_frozen(T* s, void (*fill)(T&) = nullptr) {
  static_assert(Frozen <= sizeof(T), "a frozen size lies within its struct (fields are appended)");
  static_assert(Frozen >= sizeof(uint32_t) && Frozen % alignof(T) == 0, "not a frozen size");
  if (!s) return;
  T def;
  fill_defaults(&def, fill);
  std::memcpy(static_cast<void*>(s), &def, Frozen);
  s->struct_size = Frozen;
}

// pkv_X_init_sized: exactly `size` bytes at s: the defaults for the bytes
// the library knows (min(size, sizeof(T))), zeros past sizeof(T) (a newer
// header's fields: zero is off), struct_size = size. s NULL (named `name`)
// or a size outside [v1_size, kMaxStructSize] fails before any byte is
// written.
template <class T>
void init_sized(T* s, const char* name, size_t size, uint32_t v1_size, const char* type,
                void (*fill)(T&) = nullptr) {
  require(s, name);
  if (size < v1_size || size > kMaxStructSize)
    fail(Errc::kInvalidArgument, "size is " + std::to_string(size) + ", not a size of " + type +
                                     " (at least " + std::to_string(v1_size) + ", at most " +
                                     std::to_string(kMaxStructSize) + ")");
  T def;
  fill_defaults(&def, fill);
  const size_t known = size < sizeof(T) ? size : sizeof(T);
  unsigned char* bytes = reinterpret_cast<unsigned char*>(s);
  std::memcpy(bytes, &def, known);
  std::memset(bytes + known, 0, size - known);
  const uint32_t struct_size = static_cast<uint32_t>(size);
  std::memcpy(bytes, &struct_size, sizeof struct_size);
}

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

// Frozen sizes (PKV_FROZEN_SIZE above): never change them. Each names the
// last field of its struct in the release that added pkv_X_init_sized;
// init_frozen asserts each lies within its struct.
constexpr uint32_t kPoolOptionsFrozen = PKV_FROZEN_SIZE(pkv_pool_options, qk_rope_head_dim);
constexpr uint32_t kSeqOptionsFrozen = PKV_FROZEN_SIZE(pkv_seq_options, lora_path);
constexpr uint32_t kSeqInfoFrozen = PKV_FROZEN_SIZE(pkv_seq_info, num_computed_tokens);
constexpr uint32_t kPoolStatsFrozen = PKV_FROZEN_SIZE(pkv_pool_stats, num_pins_degraded);
constexpr uint32_t kPrefixMatchFrozen = PKV_FROZEN_SIZE(pkv_prefix_match, copy_dst);
constexpr uint32_t kHashOptionsFrozen = PKV_FROZEN_SIZE(pkv_hash_options, lora_path);
constexpr uint32_t kBatchInfoFrozen = PKV_FROZEN_SIZE(pkv_batch_info, block_size);
constexpr uint32_t kAttentionParamsFrozen = PKV_FROZEN_SIZE(pkv_attention_params, logit_softcap);
constexpr uint32_t kTierOptionsFrozen = PKV_FROZEN_SIZE(pkv_tier_options, file_bytes);
constexpr uint32_t kTierMatchFrozen = PKV_FROZEN_SIZE(pkv_tier_match, file_tokens);
constexpr uint32_t kTierStatsFrozen = PKV_FROZEN_SIZE(pkv_tier_stats, num_dropped);
constexpr uint32_t kPublisherOptionsFrozen =
    PKV_FROZEN_SIZE(pkv_event_publisher_options, device_medium);
constexpr uint32_t kPublisherStatsFrozen =
    PKV_FROZEN_SIZE(pkv_event_publisher_stats, replay_requests);
constexpr uint32_t kGroupSpecFrozen = PKV_FROZEN_SIZE(pkv_kv_group_spec, reserved1);
constexpr uint32_t kGroupStatsFrozen = PKV_FROZEN_SIZE(pkv_group_stats, bytes_per_block);
constexpr uint32_t kTransferOptionsFrozen = PKV_FROZEN_SIZE(pkv_transfer_options, reserved0);

}  // namespace pkv_capi
