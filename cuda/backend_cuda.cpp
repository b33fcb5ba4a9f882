// The CUDA backend: device arena, stream-ordered scratch memory, pinned
// staging for host->device uploads, and the host side of every kernel launch
// (argument checks, tile and split planning). Kernels are in *.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend.h"
#include "check.h"
#include "launch.h"
#include "mla_plan.h"
#include "plan.h"

namespace pagedkv {

namespace {

using cuda::check;
using cuda::DeviceGuard;

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

std::string str(int64_t v) { return std::to_string(v); }

// Host->device copies must not depend on the caller keeping its source alive
// or on a stream synchronisation: the source is first copied into a pinned
// buffer, the device copy is queued from there, and an event tells when the
// buffer may be reused. Only when every buffer is still in flight and the
// pool is at its cap does acquire() wait, and then on one copy's event only.
class PinnedStaging {
 public:
  ~PinnedStaging() {
    for (Buffer& b : buffers_) {
      (void)cudaEventSynchronize(b.done);
      (void)cudaEventDestroy(b.done);
      (void)cudaFreeHost(b.data);
    }
  }

  void upload(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    Buffer& b = acquire(bytes);
    std::memcpy(b.data, src, bytes);
    check(cudaMemcpyAsync(dst, b.data, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    check(cudaEventRecord(b.done, stream), "cudaEventRecord");
  }

 private:
  struct Buffer {
    void* data;
    size_t capacity;
    cudaEvent_t done;
  };
  static constexpr size_t kMaxBuffers = 16;

  Buffer& acquire(size_t bytes) {
    for (Buffer& b : buffers_) {
      if (b.capacity < bytes) continue;
      const cudaError_t q = cudaEventQuery(b.done);
      if (q == cudaSuccess) return b;
      if (q != cudaErrorNotReady) check(q, "cudaEventQuery");
      // Not ready (a copy still in flight) is kept as the thread's last
      // error, which the next launch's cudaGetLastError would report as its
      // own failure (see event_query): cleared.
      (void)cudaGetLastError();
    }
    if (buffers_.size() >= kMaxBuffers) {
      // Recycle the smallest buffer: wait for its copy, grow it if needed.
      auto it = std::min_element(
          buffers_.begin(), buffers_.end(),
          [](const Buffer& a, const Buffer& c) { return a.capacity < c.capacity; });
      check(cudaEventSynchronize(it->done), "cudaEventSynchronize");
      if (it->capacity < bytes) {
        check(cudaFreeHost(it->data), "cudaFreeHost");
        it->data = nullptr;
        it->capacity = round(bytes);
        check(cudaMallocHost(&it->data, it->capacity), "cudaMallocHost");
      }
      return *it;
    }
    Buffer b{nullptr, round(bytes), nullptr};
    check(cudaMallocHost(&b.data, b.capacity), "cudaMallocHost");
    const cudaError_t e = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      (void)cudaFreeHost(b.data);
      check(e, "cudaEventCreateWithFlags");
    }
    buffers_.push_back(b);
    return buffers_.back();
  }

  static size_t round(size_t bytes) {
    size_t c = 64 * 1024;
    while (c < bytes) c *= 2;
    return c;
  }

  std::mutex mu_;
  std::vector<Buffer> buffers_;
};

// Scratch device memory that lives for one call: stream-ordered allocation
// from the backend's own memory pool, so neither allocating nor freeing
// synchronises the device, and concurrent streams never share scratch.
class Scratch {
 public:
  explicit Scratch(int device) {
    int supported = 0;
    check(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device),
          "cudaDeviceGetAttribute(MemoryPoolsSupported)");
    if (!supported) return;
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    check(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate");
    // Keep freed memory in the pool instead of returning it at every sync.
    uint64_t keep = std::numeric_limits<uint64_t>::max();
    check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep),
          "cudaMemPoolSetAttribute(ReleaseThreshold)");
  }
  ~Scratch() {
    if (pool_ != nullptr) (void)cudaMemPoolDestroy(pool_);
  }

  void* get(size_t bytes, cudaStream_t stream) {
    void* p = nullptr;
    if (pool_ != nullptr) {
      check(cudaMallocFromPoolAsync(&p, bytes, pool_, stream), "cudaMallocFromPoolAsync");
    } else {
      check(cudaMalloc(&p, bytes), "cudaMalloc");
    }
    return p;
  }
  void put(void* p, cudaStream_t stream) noexcept {
    if (p == nullptr) return;
    if (pool_ != nullptr) {
      (void)cudaFreeAsync(p, stream);
    } else {
      // No stream-ordered allocator on this device: wait for this stream only.
      (void)cudaStreamSynchronize(stream);
      (void)cudaFree(p);
    }
  }

 private:
  cudaMemPool_t pool_ = nullptr;
};

// Scratch memory released on scope exit (also when a later step throws),
// ordered after everything queued on the stream so far.
class ScratchBuffer {
 public:
  ScratchBuffer(Scratch& s, size_t bytes, cudaStream_t stream)
      : scratch_(s), stream_(stream), ptr_(s.get(bytes, stream)) {}
  ~ScratchBuffer() { scratch_.put(ptr_, stream_); }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  Scratch& scratch_;
  cudaStream_t stream_;
  void* ptr_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int32_t device) : device_(device), scratch_(init_device(device)) {}

  ~CudaBackend() override = default;

  int32_t device_type() const override { return 2; }  // PKV_DEVICE_CUDA
  int32_t device_id() const override { return device_; }

  void* allocate(size_t bytes) override {
    DeviceGuard g(device_);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail(e == cudaErrorMemoryAllocation ? Errc::kOutOfMemory : Errc::kCuda,
           "cudaMalloc(" + str(int64_t(bytes)) + " bytes) on CUDA device " + str(device_) + ": " +
               cudaGetErrorString(e));
    }
    // The KV arena starts as zeros, not whatever the allocator hands back: a
    // copy-on-write copy moves whole blocks, unwritten slots included, and
    // pkv_pool_kv_tensor exposes the planes, so no byte of them is ever
    // undefined (compute-sanitizer initcheck flagged the copies). One
    // memset at pool creation.
    cudaError_t z = cudaMemsetAsync(p, 0, bytes == 0 ? 1 : bytes, nullptr);
    if (z == cudaSuccess) z = cudaStreamSynchronize(nullptr);
    if (z != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaFree(p);
      fail(Errc::kCuda, "cudaMemset of the new KV arena (" + str(int64_t(bytes)) +
                            " bytes) on CUDA device " + str(device_) + ": " +
                            cudaGetErrorString(z));
    }
    return p;
  }

  void deallocate(void* ptr) noexcept override {
    if (ptr == nullptr) return;
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) return;
    if (prev != device_) (void)cudaSetDevice(device_);
    (void)cudaFree(ptr);
    if (prev != device_) (void)cudaSetDevice(prev);
  }

  void* allocate_async(size_t bytes, void* stream) override {
    DeviceGuard g(device_);
    return scratch_.get(bytes == 0 ? 1 : bytes, as_stream(stream));
  }

  void deallocate_async(void* ptr, void* stream) noexcept override {
    if (ptr == nullptr) return;
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) return;
    if (prev != device_) (void)cudaSetDevice(device_);
    scratch_.put(ptr, as_stream(stream));
    if (prev != device_) (void)cudaSetDevice(prev);
  }

  void upload(void* dst, const void* src, size_t bytes, void* stream) override {
    if (bytes == 0) return;
    DeviceGuard g(device_);
    staging_.upload(dst, src, bytes, as_stream(stream));
  }

  void write(const KvArena& arena, int32_t layer, const PlanView& plan, const Tensor3& k,
             const Tensor3& v, void* stream) override {
    const cuda::WriteParams p = cuda::plan_write(arena, layer, plan, k, v);
    if (plan.num_tokens == 0) return;
    DeviceGuard g(device_);
    check(cuda::launch_write(p, as_stream(stream)), "write_kv_kernel launch");
  }

  void mla_write(const KvArena& arena, int32_t layer, const PlanView& plan, const Tensor3& kv_c,
                 const Tensor3& k_pe, void* stream) override {
    const cuda::MlaWriteParams p = cuda::mla_write_params(arena, layer, plan, kv_c, k_pe);
    if (plan.num_tokens == 0) return;
    DeviceGuard g(device_);
    check(cuda::launch_mla_write(p, as_stream(stream)), "mla_write_kernel launch");
  }

  void mla_attend(const KvArena& arena, int32_t layer, const PlanView& plan,
                  const Tensor3& q_latent, const Tensor3& q_pe, const Tensor3& out,
                  const AttentionArgs& args, void* stream) override {
    const cuda::MlaParams p =
        cuda::mla_attention_params(arena, layer, plan, q_latent, q_pe, out, args);
    if (plan.num_seqs <= 0 || plan.num_tokens <= 0) return;
    DeviceGuard g(device_);
    check(cuda::launch_mla_attention(p, int32_t(arena.layout.dtype), as_stream(stream)),
          "mla_attention_kernel launch");
  }

  void attend(const KvArena& arena, int32_t layer, const PlanView& plan, const Tensor3& q,
              const Tensor3& out, const AttentionArgs& args, void* stream) override {
    cuda::AttnPlan ap =
        cuda::plan_attention(arena, layer, plan, q, out, args, sm_count_, max_smem_);
    if (plan.num_seqs <= 0 || plan.num_tokens <= 0) return;
    if (ap.smem_bytes > max_smem_) {
      fail(Errc::kUnsupported, "CUDA device " + str(device_) + " offers " +
                                   str(int64_t(max_smem_)) +
                                   " bytes of shared memory per block; attention needs " +
                                   str(int64_t(ap.smem_bytes)) + " (sm_80 or newer)");
    }
    DeviceGuard g(device_);
    const cudaStream_t s = as_stream(stream);
    std::unique_ptr<ScratchBuffer> work;
    if (ap.scratch_bytes > 0) {
      work = std::make_unique<ScratchBuffer>(scratch_, ap.scratch_bytes, s);
      cuda::attach_scratch(ap, work->as<void>());
    }
    cudaError_t e = cudaSuccess;
    const bool q_bf16 = q.dtype == DType::kBF16;
    switch (arena.layout.dtype) {
      case DType::kFp8E4m3:
        e = q_bf16 ? cuda::launch_attention_e4m3_bf16(ap.params, ap.launch, s)
                   : cuda::launch_attention_e4m3_f16(ap.params, ap.launch, s);
        break;
      case DType::kFp8E5m2:
        e = q_bf16 ? cuda::launch_attention_e5m2_bf16(ap.params, ap.launch, s)
                   : cuda::launch_attention_e5m2_f16(ap.params, ap.launch, s);
        break;
      case DType::kF32:
        e = cuda::launch_attention_f32(ap.params, ap.launch, s);
        break;
      case DType::kF16:
        e = cuda::launch_attention_f16(ap.params, ap.launch, s);
        break;
      default:
        e = cuda::launch_attention_bf16(ap.params, ap.launch, s);
        break;
    }
    check(e, "paged_attention_kernel launch");
  }

  void copy_blocks(const KvArena& arena, const int32_t* src, const int32_t* dst, int64_t num_pairs,
                   void* stream) override {
    if (num_pairs <= 0 || arena.num_layers <= 0) return;
    check_block_count(num_pairs, "num_pairs");
    std::vector<int32_t> pairs(size_t(num_pairs) * 2);
    for (int64_t i = 0; i < num_pairs; ++i) {
      pairs[2 * i] = src[i];
      pairs[2 * i + 1] = dst[i];
    }
    DeviceGuard g(device_);
    const cudaStream_t s = as_stream(stream);
    ScratchBuffer ids(scratch_, pairs.size() * sizeof(int32_t), s);
    staging_.upload(ids.as<void>(), pairs.data(), pairs.size() * sizeof(int32_t), s);
    check(cuda::launch_copy_blocks(static_cast<char*>(arena.base), arena.num_planes(),
                                   int64_t(arena.layout.layer_bytes()),
                                   int64_t(arena.layout.block_bytes()), ids.as<int32_t>(),
                                   num_pairs, s),
          "copy_blocks_kernel launch");
  }

  // Device-side gather into (or scatter from) a contiguous scratch buffer,
  // and one bulk copy per chunk between it and the host buffer: the copy
  // engine runs at full link speed whatever the block layout, and pinned
  // host buffers make the whole swap asynchronous.
  void swap(const KvArena& arena, const int32_t* blocks, int64_t num_blocks, void* host,
            bool to_host, void* stream) override {
    if (num_blocks <= 0 || arena.num_layers <= 0) return;
    check_block_count(num_blocks, "num_blocks");
    const int32_t planes = arena.num_planes();
    const int64_t block_bytes = int64_t(arena.layout.block_bytes());
    const int64_t per_block = planes * block_bytes;
    const int64_t chunk = std::max<int64_t>(1, kSwapChunkBytes / per_block);
    DeviceGuard g(device_);
    const cudaStream_t s = as_stream(stream);
    for (int64_t first = 0; first < num_blocks; first += chunk) {
      const int64_t n = std::min(chunk, num_blocks - first);
      char* h = static_cast<char*>(host) + first * per_block;
      ScratchBuffer ids(scratch_, size_t(n) * sizeof(int32_t), s);
      ScratchBuffer buf(scratch_, size_t(n * per_block), s);
      staging_.upload(ids.as<void>(), blocks + first, size_t(n) * sizeof(int32_t), s);
      if (!to_host) {
        check(cudaMemcpyAsync(buf.as<void>(), h, size_t(n * per_block), cudaMemcpyHostToDevice, s),
              "cudaMemcpyAsync(host -> device)");
      }
      check(cuda::launch_gather_blocks(static_cast<char*>(arena.base), planes,
                                       int64_t(arena.layout.layer_bytes()), block_bytes,
                                       ids.as<int32_t>(), n, buf.as<char>(), to_host, s),
            "gather_blocks_kernel launch");
      if (to_host) {
        check(cudaMemcpyAsync(h, buf.as<void>(), size_t(n * per_block), cudaMemcpyDeviceToHost, s),
              "cudaMemcpyAsync(device -> host)");
      }
    }
  }

  void synchronize(void* stream) override {
    DeviceGuard g(device_);
    check(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
  }

  // --- Offload tiers (impl/tier/tier_set_async.cpp): page-locked host
  // slots, so that copies to and from them are DMA the host does not wait
  // for, ordered by streams and events.
  bool async_host_copies() const override { return true; }
  // The copy thread: the pool's device, once. Without it the first
  // DeviceGuard there would restore device 0 (what cudaGetDevice reports on
  // a fresh thread), and cudaSetDevice(0) creates device 0's primary
  // context (CUDA 12) in a process that may never use that GPU.
  void bind_thread() override { check(cudaSetDevice(device_), "cudaSetDevice"); }

  void* host_alloc_pinned(size_t bytes) override {
    DeviceGuard g(device_);
    void* p = nullptr;
    // Portable: page-locked for every context, whichever device the caller
    // has current later.
    const cudaError_t e = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail(Errc::kOutOfMemory, "cudaHostAlloc(" + str(int64_t(bytes)) +
                                   " bytes) of page-locked host memory: " + cudaGetErrorString(e));
    }
    return p;
  }
  void host_free_pinned(void* p) noexcept override {
    if (p != nullptr) (void)cudaFreeHost(p);
  }

  void* stream_create() override {
    DeviceGuard g(device_);
    cudaStream_t s = nullptr;
    // Non-blocking: no implicit order with the legacy default stream;
    // the tiers order their copies with events only.
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void stream_destroy(void* stream) noexcept override {
    if (stream != nullptr) (void)cudaStreamDestroy(as_stream(stream));
  }

  void* event_create(bool timing) override {
    DeviceGuard g(device_);
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
    return e;
  }
  void event_destroy(void* ev) noexcept override {
    if (ev != nullptr) (void)cudaEventDestroy(as_event(ev));
  }
  void event_record(void* ev, void* stream) override {
    DeviceGuard g(device_);
    check(cudaEventRecord(as_event(ev), as_stream(stream)), "cudaEventRecord");
  }
  void stream_wait_event(void* stream, void* ev) override {
    DeviceGuard g(device_);
    check(cudaStreamWaitEvent(as_stream(stream), as_event(ev), 0), "cudaStreamWaitEvent");
  }
  bool event_query(void* ev) override {
    const cudaError_t q = cudaEventQuery(as_event(ev));
    if (q == cudaErrorNotReady) {
      // Not an error, but the runtime keeps it as the thread's last error:
      // cleared, or the caller's next kernel launch (checked with
      // cudaGetLastError, here and in the engine) would report it. The
      // pool's own thread queries load events in every prepare.
      (void)cudaGetLastError();
      return false;
    }
    check(q, "cudaEventQuery");
    return true;
  }
  void event_synchronize(void* ev) override {
    check(cudaEventSynchronize(as_event(ev)), "cudaEventSynchronize");
  }
  uint64_t event_elapsed_ns(void* start, void* end) override {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, as_event(start), as_event(end)), "cudaEventElapsedTime");
    return ms > 0 ? uint64_t(double(ms) * 1e6) : 0;
  }

  void copy_block_to_host_async(const KvArena& arena, int32_t block, void* host,
                                void* stream) override {
    copy_block_host(arena, block, host, true, stream);
  }
  void copy_block_from_host_async(const KvArena& arena, int32_t block, const void* host,
                                  void* stream) override {
    copy_block_host(arena, block, const_cast<void*>(host), false, stream);
  }

  void synchronize_device() override {
    DeviceGuard g(device_);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

 private:
  static constexpr int64_t kSwapChunkBytes = int64_t(64) << 20;

  // Runs before the members that need the device (the scratch pool).
  int init_device(int32_t device) {
    const int32_t n = cuda_device_count();
    if (n == 0) fail(Errc::kCuda, "no CUDA device is available (no driver or no GPU)");
    if (device < 0 || device >= n) {
      fail(Errc::kInvalidArgument,
           "device_id " + str(device) + " is out of range: " + str(n) + " CUDA device(s)");
    }
    DeviceGuard g(device);
    int v = 0;
    check(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device),
          "cudaDeviceGetAttribute(MultiProcessorCount)");
    sm_count_ = v;
    check(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
          "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
    max_smem_ = size_t(v);
    check(cudaDeviceGetAttribute(&v, cudaDevAttrMaxPitch, device),
          "cudaDeviceGetAttribute(MaxPitch)");
    max_pitch_ = size_t(v);
    return device;
  }

  // One block's bytes are num_planes rows of block_bytes, layer_bytes
  // apart in the arena and packed in the host slot: one cudaMemcpy2DAsync
  // moves them all (one call, one copy-engine job, no kernel and no
  // scratch memory, so an offload takes no SM time from the engine's
  // kernels, unlike swap()'s gather kernel, which pays off for many blocks
  // at once, not for one). A plane pitch beyond the device's limit for 2D
  // copies (about 2 GiB) falls back to one copy per plane.
  void copy_block_host(const KvArena& arena, int32_t block, void* host, bool to_host,
                       void* stream) {
    const size_t bb = arena.layout.block_bytes(), pitch = arena.layout.layer_bytes();
    const int32_t planes = arena.num_planes();
    if (planes <= 0 || bb == 0) return;
    char* dev = static_cast<char*>(arena.base) + size_t(block) * bb;
    char* h = static_cast<char*>(host);
    DeviceGuard g(device_);
    const cudaStream_t s = as_stream(stream);
    if (pitch <= max_pitch_) {
      check(
          to_host
              ? cudaMemcpy2DAsync(h, bb, dev, pitch, bb, size_t(planes), cudaMemcpyDeviceToHost, s)
              : cudaMemcpy2DAsync(dev, pitch, h, bb, bb, size_t(planes), cudaMemcpyHostToDevice, s),
          to_host ? "cudaMemcpy2DAsync(device -> host tier)"
                  : "cudaMemcpy2DAsync(host tier -> device)");
      return;
    }
    for (int32_t p = 0; p < planes; ++p) {
      char* d = dev + size_t(p) * pitch;
      char* hp = h + size_t(p) * bb;
      check(to_host ? cudaMemcpyAsync(hp, d, bb, cudaMemcpyDeviceToHost, s)
                    : cudaMemcpyAsync(d, hp, bb, cudaMemcpyHostToDevice, s),
            to_host ? "cudaMemcpyAsync(device -> host tier)"
                    : "cudaMemcpyAsync(host tier -> device)");
    }
  }

  static void check_block_count(int64_t n, const char* name) {
    if (n > int64_t(std::numeric_limits<int32_t>::max())) {
      fail(Errc::kInvalidArgument, std::string(name) + " is too large for one launch");
    }
  }

  int32_t device_;
  int sm_count_ = 1;
  size_t max_smem_ = 0;
  size_t max_pitch_ = 0;  // largest pitch of a 2D copy
  Scratch scratch_;
  PinnedStaging staging_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int32_t device_id) {
  return std::make_unique<CudaBackend>(device_id);
}

int32_t cuda_device_count() noexcept {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

bool cuda_compiled_in() noexcept { return true; }

}  // namespace pagedkv
