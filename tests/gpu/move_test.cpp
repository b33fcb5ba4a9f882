// The CUDA backend's byte-moving operations against the CPU backend: the
// slot-mapped write with padding slots and unaligned strides (every access
// width), batched block copy over every plane, swap out/in with pinned and
// pageable host buffers; plus upload semantics, device restoration and
// error reporting.
#include <algorithm>
#include <chrono>
#include <numeric>
#include <thread>

#include "gpu_test_util.h"

namespace pkvtest {
namespace {

using pagedkv::Backend;
using pagedkv::KvArena;
using pagedkv::KvLayout;
using pagedkv::PlanView;
using pagedkv::Tensor3;

// An arena with random content on both backends.
struct TwinArena {
  Backend& gpu;
  Backend& cpu;
  KvArena g{}, c{};
  size_t bytes = 0;

  TwinArena(Backend& gb, Backend& cb, const KvLayout& lay, int layers, std::mt19937_64& rng)
      : gpu(gb), cpu(cb) {
    bytes = lay.layer_bytes() * 2 * size_t(layers);
    std::vector<uint8_t> init(bytes);
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint8_t& x : init) x = uint8_t(byte(rng));
    g = KvArena{gpu.allocate(bytes), layers, lay};
    c = KvArena{cpu.allocate(bytes), layers, lay};
    gpu.upload(g.base, init.data(), bytes, nullptr);
    cpu.upload(c.base, init.data(), bytes, nullptr);
  }
  ~TwinArena() {
    gpu.deallocate(g.base);
    cpu.deallocate(c.base);
  }
  void expect_equal(const char* what) {
    gpu.synchronize(nullptr);
    const std::vector<uint8_t> a = read_device(g.base, bytes);
    const uint8_t* b = static_cast<const uint8_t*>(c.base);
    const auto m = std::mismatch(a.begin(), a.end(), b);
    EXPECT_TRUE(m.first == a.end()) << what << ": arenas differ at byte " << (m.first - a.begin());
  }
};

std::vector<int32_t> shuffled_blocks(int num_blocks, std::mt19937_64& rng) {
  std::vector<int32_t> ids(num_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

TEST(CudaWrite, SlotMappingPaddingAndEveryAccessWidth) {
  PKV_SKIP_WITHOUT_GPU();
  auto gpu = pagedkv::make_cuda_backend(0);
  auto cpu = pagedkv::make_cpu_backend(0);
  std::mt19937_64 rng(11);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const size_t es = pagedkv::dtype_size(dt);
    // pad (elements) chosen so the token stride is 16-, 8-, 4- or 2-byte aligned.
    for (int pad : {0, 8, 4, 2, 1}) {
      if (es == 4 && pad == 1) continue;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " pad " + std::to_string(pad));
      const int hkv = 3, D = 80, bs = 16, num_blocks = 12;
      const KvLayout lay{num_blocks, hkv, bs, D, dt};
      TwinArena arena(*gpu, *cpu, lay, 2, rng);
      const int64_t T = 37;
      const std::vector<int32_t> blocks = shuffled_blocks(num_blocks, rng);
      std::vector<int64_t> slots(T);
      std::vector<int64_t> all(size_t(num_blocks - 1) * bs);
      for (size_t i = 0; i < all.size(); ++i)
        all[i] = int64_t(blocks[i / bs]) * bs + int64_t(i % bs);
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t t = 0; t < T; ++t) slots[t] = (t % 5 == 3) ? -1 : all[t];  // padding tokens
      const int64_t s0 = int64_t(hkv) * D + pad;
      const std::vector<uint8_t> k = encode(uniform(rng, size_t(T * s0), -1.f, 1.f), dt);
      const std::vector<uint8_t> v = encode(uniform(rng, size_t(T * s0), -1.f, 1.f), dt);

      DevBuf dslots(slots.data(), slots.size() * 8), dk(k.data(), k.size()), dv(v.data(), v.size());
      PlanView gp{}, cp{};
      gp.num_tokens = cp.num_tokens = T;
      gp.slot_mapping = dslots.as<int64_t>();
      cp.slot_mapping = slots.data();
      gpu->write(arena.g, 1, gp, Tensor3{dk.get(), dt, T, hkv, D, s0, D},
                 Tensor3{dv.get(), dt, T, hkv, D, s0, D}, nullptr);
      cpu->write(arena.c, 1, cp, Tensor3{const_cast<uint8_t*>(k.data()), dt, T, hkv, D, s0, D},
                 Tensor3{const_cast<uint8_t*>(v.data()), dt, T, hkv, D, s0, D}, nullptr);
      arena.expect_equal("write");
    }
  }
}

TEST(CudaCopyBlocks, AllPlanesAllPairsInOneCall) {
  PKV_SKIP_WITHOUT_GPU();
  auto gpu = pagedkv::make_cuda_backend(0);
  auto cpu = pagedkv::make_cpu_backend(0);
  std::mt19937_64 rng(12);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const int num_blocks = 40;
    const KvLayout lay{num_blocks, 2, 8, 64, dt};
    TwinArena arena(*gpu, *cpu, lay, 3, rng);
    const std::vector<int32_t> ids = shuffled_blocks(num_blocks, rng);
    // Disjoint sources and destinations, so the result does not depend on order.
    std::vector<int32_t> src(ids.begin(), ids.begin() + 15),
        dst(ids.begin() + 15, ids.begin() + 30);
    gpu->copy_blocks(arena.g, src.data(), dst.data(), int64_t(src.size()), nullptr);
    cpu->copy_blocks(arena.c, src.data(), dst.data(), int64_t(src.size()), nullptr);
    arena.expect_equal("copy_blocks");
  }
}

// Uploads (block ids, plans) go through pinned staging buffers; one whose
// copy is still queued answers cudaEventQuery with cudaErrorNotReady, which
// the runtime keeps as the thread's last error. Left there, the next
// launch's cudaGetLastError reported it as that launch's failure: with the
// stream busy (the engine running ahead of the GPU), the second copy_blocks
// (a fork's copy-on-write in prepare, a swap) failed with "device not ready".
TEST(CudaCopyBlocks, CallsWhileEarlierUploadsAreQueuedDoNotFail) {
  PKV_SKIP_WITHOUT_GPU();
  auto gpu = pagedkv::make_cuda_backend(0);
  auto cpu = pagedkv::make_cpu_backend(0);
  std::mt19937_64 rng(14);
  const int num_blocks = 40;
  const KvLayout lay{num_blocks, 2, 8, 64, DType::kBF16};
  TwinArena arena(*gpu, *cpu, lay, 2, rng);
  gpu->synchronize(nullptr);
  cudaStream_t stream = nullptr;
  PKV_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The stream is held up on the host for a while: every upload queued on it
  // stays in flight.
  PKV_CUDA_OK(cudaLaunchHostFunc(
      stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }, nullptr));
  const std::vector<int32_t> ids = shuffled_blocks(num_blocks, rng);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::vector<int32_t> src(ids.begin() + 4 * round, ids.begin() + 4 * round + 4);
    const std::vector<int32_t> dst(ids.begin() + 20 + 4 * round, ids.begin() + 24 + 4 * round);
    try {
      gpu->copy_blocks(arena.g, src.data(), dst.data(), 4, stream);
    } catch (const pagedkv::Error& e) {
      ADD_FAILURE() << e.what();
    }
    cpu->copy_blocks(arena.c, src.data(), dst.data(), 4, nullptr);
  }
  PKV_CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "no error left behind for the caller";
  arena.expect_equal("copy_blocks behind a busy stream");
  cudaStreamDestroy(stream);
}

// A pool may have up to 65536 layers: 131072 planes (65536 with MLA). The
// copy and swap kernels put planes on gridDim.y, whose limit is 65535: with
// 32768 layers or more every copy-on-write and swap failed with "invalid
// configuration argument".
TEST(CudaCopyBlocks, MorePlanesThanGridYAllows) {
  PKV_SKIP_WITHOUT_GPU();
  auto gpu = pagedkv::make_cuda_backend(0);
  auto cpu = pagedkv::make_cpu_backend(0);
  std::mt19937_64 rng(15);
  const int num_blocks = 5, layers = 33000;  // 66000 planes of 128-byte blocks
  const KvLayout lay{num_blocks, 1, 1, 64, DType::kF16};
  TwinArena arena(*gpu, *cpu, lay, layers, rng);
  const std::vector<int32_t> src{1, 2}, dst{3, 4};
  try {
    gpu->copy_blocks(arena.g, src.data(), dst.data(), 2, nullptr);
  } catch (const pagedkv::Error& e) {
    ADD_FAILURE() << e.what();
  }
  cpu->copy_blocks(arena.c, src.data(), dst.data(), 2, nullptr);
  arena.expect_equal("copy_blocks over 66000 planes");

  const size_t bytes = 2 * lay.block_bytes() * 2 * size_t(layers);
  std::vector<uint8_t> host(bytes, 0xA5), cpu_host(bytes, 0x5A);
  const std::vector<int32_t> out_ids{4, 1}, in_ids{2, 3};
  try {
    gpu->swap(arena.g, out_ids.data(), 2, host.data(), true, nullptr);
    gpu->synchronize(nullptr);
  } catch (const pagedkv::Error& e) {
    ADD_FAILURE() << e.what();
  }
  cpu->swap(arena.c, out_ids.data(), 2, cpu_host.data(), true, nullptr);
  EXPECT_TRUE(host == cpu_host) << "swap out";
  try {
    gpu->swap(arena.g, in_ids.data(), 2, host.data(), false, nullptr);
  } catch (const pagedkv::Error& e) {
    ADD_FAILURE() << e.what();
  }
  cpu->swap(arena.c, in_ids.data(), 2, cpu_host.data(), false, nullptr);
  arena.expect_equal("swap in over 66000 planes");
}

class CudaSwap : public ::testing::TestWithParam<bool> {};  // pinned host buffer?

TEST_P(CudaSwap, OutAndInMatchCpu) {
  PKV_SKIP_WITHOUT_GPU();
  const bool pinned = GetParam();
  auto gpu = pagedkv::make_cuda_backend(0);
  auto cpu = pagedkv::make_cpu_backend(0);
  std::mt19937_64 rng(13);
  const int num_blocks = 50, layers = 3;
  const KvLayout lay{num_blocks, 4, 16, 96, DType::kF16};
  TwinArena arena(*gpu, *cpu, lay, layers, rng);
  const std::vector<int32_t> ids = shuffled_blocks(num_blocks, rng);
  const std::vector<int32_t> out_ids(ids.begin(), ids.begin() + 17);
  const std::vector<int32_t> in_ids(ids.begin() + 20, ids.begin() + 37);
  const size_t bytes = out_ids.size() * lay.block_bytes() * 2 * layers;

  void* host = nullptr;
  std::vector<uint8_t> pageable;
  if (pinned) {
    PKV_CUDA_OK(cudaMallocHost(&host, bytes));
  } else {
    pageable.resize(bytes);
    host = pageable.data();
  }
  std::memset(host, 0xA5, bytes);
  std::vector<uint8_t> cpu_host(bytes, 0x5A);

  gpu->swap(arena.g, out_ids.data(), int64_t(out_ids.size()), host, true, nullptr);
  cpu->swap(arena.c, out_ids.data(), int64_t(out_ids.size()), cpu_host.data(), true, nullptr);
  gpu->synchronize(nullptr);
  EXPECT_EQ(0, std::memcmp(host, cpu_host.data(), bytes)) << "swap out";

  // Swap the buffer back in to other blocks.
  gpu->swap(arena.g, in_ids.data(), int64_t(in_ids.size()), host, false, nullptr);
  cpu->swap(arena.c, in_ids.data(), int64_t(in_ids.size()), cpu_host.data(), false, nullptr);
  arena.expect_equal("swap in");
  if (pinned) cudaFreeHost(host);
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaSwap, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "Pinned" : "Pageable");
                         });

TEST(CudaBackendBasics, UploadDoesNotNeedTheSourceAfterReturn) {
  PKV_SKIP_WITHOUT_GPU();
  auto gpu = pagedkv::make_cuda_backend(0);
  cudaStream_t stream = nullptr;
  PKV_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Many uploads in flight (more than the staging pool's cap), each source
  // overwritten right after the call returns.
  const int n = 40;
  const size_t len = 100000;
  std::vector<void*> dst(n);
  std::vector<int32_t> src(len);
  for (int i = 0; i < n; ++i) {
    dst[i] = gpu->allocate(len * 4);
    std::iota(src.begin(), src.end(), i * 7);
    gpu->upload(dst[i], src.data(), len * 4, stream);
    std::fill(src.begin(), src.end(), -1);
  }
  gpu->synchronize(stream);
  for (int i = 0; i < n; ++i) {
    const std::vector<uint8_t> h = read_device(dst[i], len * 4);
    const int32_t* v = reinterpret_cast<const int32_t*>(h.data());
    for (size_t j = 0; j < len; j += 997) ASSERT_EQ(v[j], int32_t(i * 7 + j)) << i << " " << j;
    gpu->deallocate(dst[i]);
  }
  cudaStreamDestroy(stream);
}

TEST(CudaBackendBasics, RestoresTheCallersDevice) {
  PKV_SKIP_WITHOUT_GPU();
  const int n = pagedkv::cuda_device_count();
  const int target = n - 1, other = 0;
  PKV_CUDA_OK(cudaSetDevice(other));
  auto gpu = pagedkv::make_cuda_backend(target);
  void* p = gpu->allocate(4096);
  std::vector<uint8_t> h(4096, 1);
  gpu->upload(p, h.data(), h.size(), nullptr);
  gpu->synchronize(nullptr);
  gpu->deallocate(p);
  int now = -1;
  PKV_CUDA_OK(cudaGetDevice(&now));
  EXPECT_EQ(now, other);
  EXPECT_EQ(gpu->device_id(), target);
  EXPECT_EQ(gpu->device_type(), 2);
}

TEST(CudaBackendBasics, BadDeviceAndHugeAllocationAreCleanErrors) {
  PKV_SKIP_WITHOUT_GPU();
  EXPECT_TRUE(pagedkv::cuda_compiled_in());
  try {
    pagedkv::make_cuda_backend(pagedkv::cuda_device_count());
    ADD_FAILURE() << "no error for an out-of-range device";
  } catch (const pagedkv::Error& e) {
    EXPECT_EQ(e.code(), pagedkv::Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("device_id"), std::string::npos) << e.what();
  }
  auto gpu = pagedkv::make_cuda_backend(0);
  try {
    gpu->allocate(size_t(1) << 50);  // a petabyte
    ADD_FAILURE() << "no error for an impossible allocation";
  } catch (const pagedkv::Error& e) {
    EXPECT_EQ(e.code(), pagedkv::Errc::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
  }
  // The failed allocation left no sticky error behind.
  void* p = gpu->allocate(256);
  gpu->deallocate(p);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Runs without a GPU too: the query must never throw or fail.
TEST(CudaBackendBasics, DeviceCountNeverFails) {
  EXPECT_GE(pagedkv::cuda_device_count(), 0);
  EXPECT_TRUE(pagedkv::cuda_compiled_in());
  if (pagedkv::cuda_device_count() == 0) {
    try {
      pagedkv::make_cuda_backend(0);
      ADD_FAILURE() << "a CUDA backend without a device";
    } catch (const pagedkv::Error& e) {
      EXPECT_EQ(e.code(), pagedkv::Errc::kCuda) << e.what();
    }
  }
}

}  // namespace
}  // namespace pkvtest
