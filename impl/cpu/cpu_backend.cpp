#include "cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "cpu/attention.h"
#include "cpu/kernels.h"
#include "cpu/mla.h"
#include "cpu/thread_pool.h"

namespace pagedkv {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;

// Frees what CpuBackend::allocate returned: a mapping of map_zeroed (found
// in maps) or heap memory.
struct HostMaps {
#if defined(__linux__)
  std::mutex mu;
  std::unordered_map<void*, size_t> maps;
#endif
  void deallocate(void* ptr) noexcept {
#if defined(__linux__)
    {
      std::lock_guard<std::mutex> lock(mu);
      const auto it = maps.find(ptr);
      if (it != maps.end()) {
        munmap(ptr, it->second);
        maps.erase(it);
        return;
      }
    }
#endif
    std::free(ptr);
  }
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options)
      : CpuBackend(options, cpu::resolve_cpu_isa(options.isa)) {}
  CpuBackend(const CpuBackendOptions& options, CpuIsa isa)
      : table_(&cpu::kernel_table(isa)),
        mla_ops_(&cpu::mla_ops(isa)),
        min_split_keys_(options.min_split_keys),
        pool_(options.num_threads) {}

  // impl/ sees no C ABI header; 1 is PKV_DEVICE_CPU (capi/ checks it).
  int32_t device_type() const override { return 1; }
  int32_t device_id() const override { return 0; }

  // The KV arena starts as zeros, as on CUDA (backend_cuda.cpp): the heap
  // may hand back memory another pool (or anything else in the process)
  // freed, and pkv_pool_kv_tensor, swap-outs and block copies expose
  // unwritten slots. A large arena is a fresh anonymous mapping, which the
  // kernel zero-fills page by page as it is first touched (no cost and no
  // resident memory up front); a small one is cleared.
  void* allocate(size_t bytes) override {
#if defined(__linux__)
    if (bytes >= kHugePage) return map_zeroed(bytes);
#endif
    size_t rounded = 0;
    void* p = allocate_raw(bytes, &rounded);
    std::memset(p, 0, rounded);
    return p;
  }
  // Step-plan memory: every element read is written first, and it is
  // allocated every step, so it is neither cleared nor mapped afresh.
  void* allocate_async(size_t bytes, void*) override {
    size_t rounded = 0;
    return allocate_raw(bytes, &rounded);
  }
  void deallocate(void* ptr) noexcept override { maps_->deallocate(ptr); }
  // The memory needs only maps_, not the thread pool: an arena held past
  // its pool (a transfer engine's retired arena) keeps no threads.
  std::shared_ptr<void> hold(void* ptr, const std::shared_ptr<Backend>&) override {
    std::shared_ptr<HostMaps> maps = maps_;
    try {
      return std::shared_ptr<void>(ptr, [maps](void* m) { maps->deallocate(m); });
    } catch (const std::bad_alloc&) {  // the control block: shared_ptr called the deleter
      fail(Errc::kOutOfMemory, "out of host memory");
    }
  }
  void upload(void* dst, const void* src, size_t bytes, void*) override {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }

  void write(const KvArena& arena, int32_t layer, const PlanView& plan, const Tensor3& k,
             const Tensor3& v, void*) override {
    if (is_fp8(arena.layout.dtype)) {
      cpu::write_kv_fp8(pool_, *table_, arena, layer, plan, k, v);
    } else {
      cpu::write_kv(pool_, arena, layer, plan, k, v);
    }
  }
  void attend(const KvArena& arena, int32_t layer, const PlanView& plan, const Tensor3& q,
              const Tensor3& out, const AttentionArgs& args, void*) override {
    cpu::attend(pool_, {table_, min_split_keys_}, arena, layer, plan, q, out, args);
  }
  void mla_write(const KvArena& arena, int32_t layer, const PlanView& plan, const Tensor3& kv_c,
                 const Tensor3& k_pe, void*) override {
    cpu::mla_write(pool_, cpu::mla_cache(arena, layer, int32_t(kv_c.n2)), plan, kv_c, k_pe);
  }
  void mla_attend(const KvArena& arena, int32_t layer, const PlanView& plan,
                  const Tensor3& q_latent, const Tensor3& q_pe, const Tensor3& out,
                  const AttentionArgs& args, void*) override {
    cpu::mla_attend(pool_, *mla_ops_, cpu::mla_cache(arena, layer, int32_t(q_latent.n2)), plan,
                    q_latent, q_pe, out, args);
  }
  void copy_blocks(const KvArena& arena, const int32_t* src, const int32_t* dst, int64_t num_pairs,
                   void*) override {
    cpu::copy_blocks(pool_, arena, src, dst, num_pairs);
  }
  void swap(const KvArena& arena, const int32_t* blocks, int64_t num_blocks, void* host,
            bool to_host, void*) override {
    cpu::swap_blocks(pool_, arena, blocks, num_blocks, host, to_host);
  }
  void synchronize(void*) override {}

 private:
#if defined(__linux__)
  // bytes (>= kHugePage) of fresh zero pages at a 2 MiB boundary, advised
  // as transparent huge pages: spare a TLB miss per block read at random
  // offsets, where the kernel grants them on request.
  void* map_zeroed(size_t bytes) {
    if (bytes > SIZE_MAX - 2 * kHugePage) fail(Errc::kOutOfMemory, "allocation size overflows");
    const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    const size_t len = rounded + kHugePage;  // room to align
    void* raw = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
      fail(Errc::kOutOfMemory,
           "cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    const uintptr_t r = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t a = (r + kHugePage - 1) / kHugePage * kHugePage;
    if (a > r) munmap(raw, a - r);
    if (r + len > a + rounded) munmap(reinterpret_cast<void*>(a + rounded), r + len - a - rounded);
    void* p = reinterpret_cast<void*>(a);
#ifdef MADV_HUGEPAGE
    madvise(p, rounded, MADV_HUGEPAGE);  // advisory only
#endif
    try {
      std::lock_guard<std::mutex> lock(maps_->mu);
      maps_->maps.emplace(p, rounded);
    } catch (...) {
      munmap(p, rounded);
      fail(Errc::kOutOfMemory, "cannot record a host mapping");
    }
    return p;
  }
#endif

  // Cache-line alignment for the vector loads. Large arenas are read at
  // random block offsets: 2 MiB alignment plus transparent huge pages
  // (where the kernel grants them on request) spare a TLB miss per block.
  // *rounded: the bytes allocated (a multiple of the alignment).
  static void* allocate_raw(size_t bytes, size_t* rounded) {
    const size_t align = bytes >= kHugePage ? kHugePage : 64;
    if (bytes > SIZE_MAX - align) fail(Errc::kOutOfMemory, "allocation size overflows");
    *rounded = (bytes + align - 1) / align * align;
    if (*rounded == 0) *rounded = align;
    void* p = std::aligned_alloc(align, *rounded);  // wants a size multiple of align
    if (p == nullptr) {
      fail(Errc::kOutOfMemory,
           "cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    }
#ifdef MADV_HUGEPAGE
    if (align == kHugePage) madvise(p, *rounded, MADV_HUGEPAGE);  // advisory only
#endif
    return p;
  }

  const cpu::KernelTable* table_;
  const cpu::MlaOps* mla_ops_;
  int32_t min_split_keys_;
  // map_zeroed's mappings, by address: shared with the holds of the arenas
  // (hold()), which may outlive this backend.
  std::shared_ptr<HostMaps> maps_ = std::make_shared<HostMaps>();
  ThreadPool pool_;
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
