#include "cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

namespace pagedkv {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options) : options_(options) {}

  // impl/ sees no C ABI header; 1 is PKV_DEVICE_CPU (capi/ checks it).
  int32_t device_type() const override { return 1; }
  int32_t device_id() const override { return 0; }

  void* allocate(size_t bytes) override {
    // Cache-line alignment keeps every block head on its own lines for the
    // vector loads; aligned_alloc wants a size that is a multiple of it.
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded == 0) rounded = 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr)
      fail(Errc::kOutOfMemory,
           "cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    return p;
  }
  void deallocate(void* ptr) noexcept override { std::free(ptr); }
  void upload(void* dst, const void* src, size_t bytes, void*) override {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }

  void write(const KvArena&, int32_t, const PlanView&, const Tensor3&, const Tensor3&,
             void*) override {
    fail(Errc::kUnsupported, "CPU cache write is not implemented yet");
  }
  void attend(const KvArena&, int32_t, const PlanView&, const Tensor3&, const Tensor3&,
              const AttentionArgs&, void*) override {
    fail(Errc::kUnsupported, "CPU attention is not implemented yet");
  }

  void copy_blocks(const KvArena& arena, const int32_t* src, const int32_t* dst, int64_t num_pairs,
                   void*) override {
    const size_t bb = arena.layout.block_bytes();
    for (int32_t layer = 0; layer < arena.num_layers; ++layer) {
      for (int32_t which = 0; which < 2; ++which) {
        char* plane = static_cast<char*>(arena.plane(layer, which));
        for (int64_t i = 0; i < num_pairs; ++i) {
          if (src[i] == dst[i]) continue;
          std::memcpy(plane + size_t(dst[i]) * bb, plane + size_t(src[i]) * bb, bb);
        }
      }
    }
  }

  void swap(const KvArena& arena, const int32_t* blocks, int64_t num_blocks, void* host,
            bool to_host, void*) override {
    const size_t bb = arena.layout.block_bytes();
    char* h = static_cast<char*>(host);
    for (int64_t i = 0; i < num_blocks; ++i) {
      for (int32_t layer = 0; layer < arena.num_layers; ++layer) {
        for (int32_t which = 0; which < 2; ++which) {
          char* dev = static_cast<char*>(arena.plane(layer, which)) + size_t(blocks[i]) * bb;
          char* hb = h + ((size_t(i) * arena.num_layers + layer) * 2 + which) * bb;
          if (to_host) {
            std::memcpy(hb, dev, bb);
          } else {
            std::memcpy(dev, hb, bb);
          }
        }
      }
    }
  }

  void synchronize(void*) override {}

 private:
  CpuBackendOptions options_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

std::unique_ptr<Backend> make_cpu_backend(int32_t num_threads) {
  CpuBackendOptions options;
  options.num_threads = num_threads;
  return make_cpu_backend(options);
}

}  // namespace pagedkv
