// The Backend interface: where KV storage lives and how the kernels that
// touch it run. The CPU backend (impl/cpu/) is the reference; the CUDA
// backend (cuda/) implements the same semantics on a GPU. The pool calls a
// backend only with arguments it has already validated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "error.h"
#include "kernel_types.h"

namespace pagedkv {

// Storage for all layers: plane p = planes_per_layer * layer + (0 for K, 1
// for V) starts at base + p * layout.layer_bytes(). MLA pools have one plane
// per layer (the latent, layout num_kv_heads 1, head_dim = rank + rope).
// FP8 pools: scales[(2 * layer + which) * num_kv_heads + head] is the
// dequantisation scale of that plane's head (per-tensor scales repeated),
// in the same memory as the planes (device memory on CUDA); else null.
struct KvArena {
  void* base;
  int32_t num_layers;
  KvLayout layout;
  const float* scales;
  int32_t planes_per_layer = 2;  // 1: MLA latent

  int32_t num_planes() const { return planes_per_layer * num_layers; }
  void* plane_at(int64_t p) const {
    return static_cast<char*>(base) + size_t(p) * layout.layer_bytes();
  }
  void* plane(int32_t layer, int32_t which) const {
    return plane_at(int64_t(planes_per_layer) * layer + which);
  }
  const float* plane_scales(int32_t layer, int32_t which) const {
    return scales + (size_t(2) * layer + which) * size_t(layout.num_kv_heads);
  }
  // Offset of the scales from base, and the bytes of the whole allocation.
  static size_t scales_offset(size_t planes_bytes) { return (planes_bytes + 63) / 64 * 64; }
  size_t bytes() const {
    const size_t planes = size_t(num_planes()) * layout.layer_bytes();
    return scales == nullptr ? planes
                             : scales_offset(planes) + sizeof(float) * 2 * size_t(num_layers) *
                                                           size_t(layout.num_kv_heads);
  }
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual int32_t device_type() const = 0;  // PKV_DEVICE_* value
  virtual int32_t device_id() const = 0;

  // Device (or host) memory; throws Error(kOutOfMemory / kCuda).
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr) noexcept = 0;
  // Owns ptr (from allocate()): deallocated when the last copy goes. self
  // is this backend. The default keeps the backend alive until then; a
  // backend whose memory outlives it cheaply overrides this so that an
  // arena held past its pool (a transfer engine keeps a swept export's
  // arena reserved) does not keep the backend's threads. Throws
  // kOutOfMemory having deallocated ptr.
  virtual std::shared_ptr<void> hold(void* ptr, const std::shared_ptr<Backend>& self);
  // Step-plan memory, allocated and released every engine step: stream-ordered
  // where the device supports it, so neither call synchronises the device.
  // Defaults to allocate/deallocate (CPU).
  virtual void* allocate_async(size_t bytes, void* stream) {
    (void)stream;
    return allocate(bytes);
  }
  virtual void deallocate_async(void* ptr, void* stream) noexcept {
    (void)stream;
    deallocate(ptr);
  }
  // Host -> backend memory, ordered on stream. CPU: memcpy.
  virtual void upload(void* dst, const void* src, size_t bytes, void* stream) = 0;

  // Scatter k, v [num_tokens, num_kv_heads, head_dim] into their slots.
  virtual void write(const KvArena& arena, int32_t layer, const PlanView& plan, const Tensor3& k,
                     const Tensor3& v, void* stream) = 0;

  // Paged attention of q [num_tokens, num_q_heads, head_dim] into out.
  virtual void attend(const KvArena& arena, int32_t layer, const PlanView& plan, const Tensor3& q,
                      const Tensor3& out, const AttentionArgs& args, void* stream) = 0;

  // MLA (impl/cpu/mla.h documents the semantics): scatter kv_c [tokens,
  // rank] and k_pe [tokens, rope] into the latent plane of layer, and
  // absorbed attention of q_latent/q_pe [tokens, heads, rank/rope] into out
  // [tokens, heads, rank]. Backends without MLA kernels throw kUnsupported.
  virtual void mla_write(const KvArena&, int32_t, const PlanView&, const Tensor3&, const Tensor3&,
                         void*) {
    fail(Errc::kUnsupported, "this backend has no MLA cache write");
  }
  virtual void mla_attend(const KvArena&, int32_t, const PlanView&, const Tensor3&, const Tensor3&,
                          const Tensor3&, const AttentionArgs&, void*) {
    fail(Errc::kUnsupported, "this backend has no MLA attention");
  }

  // Copy block src[i] to dst[i] in every plane. src/dst are host arrays.
  virtual void copy_blocks(const KvArena& arena, const int32_t* src, const int32_t* dst,
                           int64_t num_pairs, void* stream) = 0;

  // to_host: blocks -> host buffer laid out [n][num_layers][2][block bytes];
  // otherwise the reverse. blocks is a host array.
  virtual void swap(const KvArena& arena, const int32_t* blocks, int64_t num_blocks, void* host,
                    bool to_host, void* stream) = 0;

  // Blocks until work queued on stream is done (CPU: no-op).
  virtual void synchronize(void* stream) = 0;
  // Blocks until work queued on every stream of the device is done.
  virtual void synchronize_device() { synchronize(nullptr); }

  // --- Offload tiers (impl/tier/tier_set.h). A backend whose storage the
  // host cannot read directly (CUDA) moves blocks between its storage and
  // host tier slots with queued copies ordered by streams and events; the
  // CPU backend keeps the defaults below and TierSet copies on its own
  // thread. Handles (streams, events) are opaque; null is never a valid
  // event but is the default stream.
  //
  // true: the tiers use the calls below (async_* return with the copy
  // queued, not done).
  virtual bool async_host_copies() const { return false; }
  // Called once on the tiers' copy thread before any other call from it
  // (CUDA: makes the pool's device current there, so that the calls below
  // never switch devices on that thread, nor create a context on device 0
  // when restoring the "previous" device a fresh thread reports).
  virtual void bind_thread() {}
  // Host memory the device can copy to and from asynchronously (CUDA:
  // page-locked); throws Error(kOutOfMemory). CPU: aligned malloc.
  virtual void* host_alloc_pinned(size_t bytes);
  virtual void host_free_pinned(void* p) noexcept;
  // A stream of the backend's own (the tiers' offload copies); CPU: null.
  virtual void* stream_create() { return nullptr; }
  virtual void stream_destroy(void* stream) noexcept { (void)stream; }
  // Events mark a point in a stream. timing: elapsed_ns can measure them.
  virtual void* event_create(bool timing) {
    (void)timing;
    fail(Errc::kUnsupported, "this backend has no events");
  }
  virtual void event_destroy(void* ev) noexcept { (void)ev; }
  virtual void event_record(void* ev, void* stream) { (void)ev, (void)stream; }
  // Later work on stream waits (on the device) for ev's last record.
  virtual void stream_wait_event(void* stream, void* ev) { (void)stream, (void)ev; }
  // true: the work before ev's last record is done (never blocks).
  virtual bool event_query(void* ev) {
    (void)ev;
    return true;
  }
  virtual void event_synchronize(void* ev) { (void)ev; }
  // Device time between two completed timing events, in nanoseconds.
  virtual uint64_t event_elapsed_ns(void* start, void* end) {
    (void)start, (void)end;
    return 0;
  }
  // Block `block` of every plane (plane_at(p) + block * block_bytes) to
  // host [num_planes][block_bytes] and back, queued on stream. host must be
  // host_alloc_pinned memory and stay untouched until the copy completed.
  virtual void copy_block_to_host_async(const KvArena& arena, int32_t block, void* host,
                                        void* stream) {
    (void)arena, (void)block, (void)host, (void)stream;
    fail(Errc::kUnsupported, "this backend has no asynchronous host copies");
  }
  virtual void copy_block_from_host_async(const KvArena& arena, int32_t block, const void* host,
                                          void* stream) {
    (void)arena, (void)block, (void)host, (void)stream;
    fail(Errc::kUnsupported, "this backend has no asynchronous host copies");
  }
};

// num_threads 0 = hardware concurrency.
std::unique_ptr<Backend> make_cpu_backend(int32_t num_threads);

// Defined in cuda/ when CUDA is compiled in; otherwise throws
// Error(kUnsupported). Throws Error(kCuda) if the device cannot be used.
std::unique_ptr<Backend> make_cuda_backend(int32_t device_id);
int32_t cuda_device_count() noexcept;
bool cuda_compiled_in() noexcept;

}  // namespace pagedkv
