// Which kernel set a pool gets by default (cpu::resolve_cpu_isa with
// kAuto): the widest the CPU runs, except avx512 rather than avx512bf16
// where the bf16 dot product measured slower, and what PAGEDKV_CPU_ISA
// changes. Each test runs in a process of its own (gtest_discover_tests),
// so setting the variable here reaches no other test.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <string>

#include "cpu/kernels.h"
#include "test_util.h"

namespace pagedkv {
namespace test {
namespace {

// The widest supported ISA, not above cap.
CpuIsa widest(CpuIsa cap) {
  for (CpuIsa isa : {CpuIsa::kAvx512Bf16, CpuIsa::kAvx512, CpuIsa::kAvx2}) {
    if (int32_t(isa) <= int32_t(cap) && cpu::cpu_isa_supported(isa)) return isa;
  }
  return CpuIsa::kScalar;
}

class Isa : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* e = getenv("PAGEDKV_CPU_ISA")) saved_ = e, had_ = true;
    unsetenv("PAGEDKV_CPU_ISA");
  }
  void TearDown() override {
    if (had_)
      setenv("PAGEDKV_CPU_ISA", saved_.c_str(), 1);
    else
      unsetenv("PAGEDKV_CPU_ISA");
  }
  std::string saved_;
  bool had_ = false;
};

TEST_F(Isa, AutoTakesTheDotProductOnlyWhereItMeasuresFaster) {
  const bool has_dot = cpu::cpu_isa_supported(CpuIsa::kAvx512Bf16);
  const bool pays = cpu::bf16_dot_pays();
  EXPECT_EQ(cpu::bf16_dot_pays(), pays) << "measured once per process: the same answer";
  if (!has_dot) EXPECT_FALSE(pays) << "no AVX512_BF16: nothing to measure";
  const CpuIsa got = cpu::resolve_cpu_isa(CpuIsa::kAuto);
  if (has_dot && !pays)
    EXPECT_EQ(got, CpuIsa::kAvx512);
  else
    EXPECT_EQ(got, widest(CpuIsa::kAvx512Bf16));
  std::printf("default ISA here: %s (bf16 dot product %s)\n", isa_name(got),
              has_dot ? (pays ? "measured faster" : "measured slower") : "absent");
}

TEST_F(Isa, EnvironmentLowersOrPinsTheDefault) {
  setenv("PAGEDKV_CPU_ISA", "avx512bf16", 1);
  EXPECT_EQ(cpu::resolve_cpu_isa(CpuIsa::kAuto), widest(CpuIsa::kAvx512Bf16))
      << "named: taken wherever the CPU has it, whatever it measured";
  setenv("PAGEDKV_CPU_ISA", "avx512", 1);
  EXPECT_EQ(cpu::resolve_cpu_isa(CpuIsa::kAuto), widest(CpuIsa::kAvx512));
  setenv("PAGEDKV_CPU_ISA", "avx2", 1);
  EXPECT_EQ(cpu::resolve_cpu_isa(CpuIsa::kAuto), widest(CpuIsa::kAvx2));
  setenv("PAGEDKV_CPU_ISA", "scalar", 1);
  EXPECT_EQ(cpu::resolve_cpu_isa(CpuIsa::kAuto), CpuIsa::kScalar);
  // An explicit request ignores the variable and the measurement.
  for (CpuIsa isa : supported_isas()) EXPECT_EQ(cpu::resolve_cpu_isa(isa), isa) << isa_name(isa);
}

}  // namespace
}  // namespace test
}  // namespace pagedkv
