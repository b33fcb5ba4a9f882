#!/usr/bin/env bash
# The one command a GPU session runs on the device machine (see docs/cuda.md):
#
#   run(command="bash scripts/gpu-check.sh", carry=[".gpu-debs"], timeout_s=600)
#
# (run `bash scripts/gpu-deps-fetch.sh` here first so .gpu-debs exists; the
# script works without it where the image has the dev packages.)
#
# Steps, each logged to a file under $OUT (at most 8 files come back):
#   env.txt        GPU, driver, toolchain
#   build.log      configure + build (CUDA arch 90 only, for speed)
#   tests.log      the gpu-labelled GoogleTest binary, all tests
#   memcheck.log   compute-sanitizer --tool memcheck over a subset
#   racecheck.log  compute-sanitizer --tool racecheck over a smaller subset
#   bench.log      bench/gpu/bench_decode.py (stdout: the table)
#   bench.md       the results table, to commit as bench/results/<device>.md
#   summary.txt    one line per step: ok / FAILED / skipped, and timings
# Each step after the build gets a time limit from what is left of
# PKV_BUDGET seconds (default 570, inside the device call's 600), in the
# order tests, memcheck, bench, racecheck; a step that gets too little is
# skipped and says so in summary.txt (then run a second call with
# PKV_SKIP_BENCH=1 or PKV_SKIP_SANITIZERS=1).
# Env: PKV_ARCH (default 90), PKV_BUDGET, PKV_SKIP_BENCH=1,
#      PKV_SKIP_SANITIZERS=1, PKV_BENCH_ARGS (extra benchmark arguments),
#      PKV_INITCHECK=1 (compute-sanitizer initcheck too; initcheck.log),
#      PKV_DEMO=1 (serving_sim --device cuda, PKV_DEMO_ARGS; demo.log),
#      PKV_TIER_BENCH=1 (bench/tier_bandwidth_cuda.cpp against the built
#      libpagedkv.so; tier_bench.log; PKV_TIER_BENCH_ARGS),
#      PKV_NCU=1 (Nsight Compute's counters for the attention kernels of a
#      few decode cells, PKV_NCU_CELLS as Hq/Hkv/D@BATCHxCTX; ncu.log),
#      PKV_PREBUILT=.gpu-prebuilt (binaries from scripts/gpu-prebuild.sh,
#      carried: no build on the device), PKV_MEM_FILTER / PKV_RACE_FILTER
#      (GoogleTest filters of the memcheck / racecheck runs).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$root/gpu-check-out}
mkdir -p "$OUT"
summary=$OUT/summary.txt
: >"$summary"
t0=$(date +%s)
note() { echo "$(($(date +%s) - t0))s $*" | tee -a "$summary"; }
budget=${PKV_BUDGET:-570}
# Seconds a step may take: at most $1, leaving $2 for the steps after it.
limit() {
  local left=$((budget - ($(date +%s) - t0) - $2))
  [ "$left" -lt 1 ] && left=1  # timeout 0 would mean no limit
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

# ---------------------------------------------------------------- environment
{
  nvidia-smi || true
  nvcc --version || true
  cmake --version | head -1 || true
  g++ --version | head -1 || true
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' || true
  command -v compute-sanitizer || echo "compute-sanitizer: not on PATH"
} >"$OUT/env.txt" 2>&1

# Dev packages carried as .deb files (scripts/gpu-deps-fetch.sh) go into a
# private prefix, never into /.
if ls "$root"/.gpu-debs/*.deb >/dev/null 2>&1; then
  prefix=/tmp/pkvdeps
  mkdir -p $prefix
  for f in "$root"/.gpu-debs/*.deb; do dpkg -x "$f" $prefix; done
  for pc in $prefix/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do
    sed -i "s|^prefix=.*|prefix=$prefix/usr|" "$pc"
  done
  export CMAKE_PREFIX_PATH=$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export OPENSSL_ROOT_DIR=$prefix/usr
  export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  command -v pkg-config >/dev/null || export PATH=$PATH:$prefix/usr/bin
  note "deps: unpacked $(ls "$root"/.gpu-debs/*.deb | wc -l) carried packages into $prefix"
fi

# ---------------------------------------------------------------- build
# A private copy of the tree with only tests/gpu among the test folders, so
# that no other component's test dependencies are needed on this machine.
src=/tmp/pkv-gpu-src
build=/tmp/pkv-gpu-build
rm -rf "$src" && mkdir -p "$src"
(cd "$root" && tar --exclude='./build*' --exclude='./.git' --exclude='./.gpu-debs' --exclude='./tests' -cf - .) |
  (cd "$src" && tar -xf -)
mkdir -p "$src/tests" && cp "$root/tests/CMakeLists.txt" "$src/tests/" && cp -r "$root/tests/gpu" "$src/tests/"
arch=${PKV_ARCH:-90}
# PKV_PREBUILT=DIR: test_gpu, libpagedkv.so* and serving_sim built on the
# developer's machine (scripts/gpu-prebuild.sh) and carried, to spend no
# device time compiling; used only when every library they need resolves
# here, else the tree is built as below.
pre=${PKV_PREBUILT:+$root/$PKV_PREBUILT}
if [ -n "$pre" ] && [ -f "$pre/prebuilt.tar.xz" ]; then
  rm -rf /tmp/pkv-prebuilt && mkdir -p /tmp/pkv-prebuilt
  xz -dc "$pre/prebuilt.tar.xz" | tar -C /tmp/pkv-prebuilt -xf - && pre=/tmp/pkv-prebuilt
fi
if [ -n "$pre" ] && [ -x "$pre/test_gpu" ] &&
  ! LD_LIBRARY_PATH="$pre${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$pre/test_gpu" "$pre"/libpagedkv.so* |
    grep -q 'not found'; then
  export LD_LIBRARY_PATH="$pre${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  mkdir -p "$build/tests/gpu" "$build/examples/serving_sim"
  cp "$pre/test_gpu" "$build/tests/gpu/"
  cp -a "$pre"/libpagedkv.so* "$build/"
  [ -x "$pre/serving_sim" ] && cp "$pre/serving_sim" "$build/examples/serving_sim/"
  note "build: carried binaries from $PKV_PREBUILT"
elif cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGEDKV_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DPAGEDKV_BUILD_BINDINGS=OFF -DPAGEDKV_BUILD_EXAMPLES=OFF \
  -DPAGEDKV_BUILD_BENCH=OFF >"$OUT/build.log" 2>&1 &&
  cmake --build "$build" -j"$(nproc)" --target pagedkv test_gpu >>"$OUT/build.log" 2>&1; then
  note "build: ok (arch $arch)"
else
  note "build: FAILED (see build.log)"
  tail -40 "$OUT/build.log"
  exit 1
fi
tg=$build/tests/gpu/test_gpu
lib=$(find "$build" -name 'libpagedkv.so' | head -1)

# ---------------------------------------------------------------- tests
if timeout "$(limit 240 60)" "$tg" --gtest_brief=1 >"$OUT/tests.log" 2>&1; then
  note "tests: ok ($(grep -c '^\[  SKIPPED' "$OUT/tests.log") skipped) $(grep -E '^\[  PASSED' "$OUT/tests.log")"
else
  note "tests: FAILED (see tests.log)"
fi
if grep -q '^\[  SKIPPED' "$OUT/tests.log"; then note "tests: WARNING some tests skipped: no GPU seen?"; fi

# ---------------------------------------------------------------- sanitizers, bench
# Subsets keep the sanitizers short; API errors are not reported because the
# tests provoke some on purpose (impossible allocation, bad device).
sanitize() {  # tool, filter, log, cap seconds, seconds to leave for later steps
  local t
  t=$(limit "$4" "$5")
  if [ "${PKV_SKIP_SANITIZERS:-0}" = 1 ] || ! command -v compute-sanitizer >/dev/null; then
    note "$1: skipped"
    return
  fi
  if [ "$t" -lt 30 ]; then
    note "$1: skipped (time budget)"
    return
  fi
  if timeout "$t" compute-sanitizer --tool "$1" --report-api-errors no --error-exitcode 9 \
    $([ "$1" = racecheck ] && echo --racecheck-report all) \
    "$tg" --gtest_brief=1 --gtest_filter="$2" >"$OUT/$3" 2>&1; then
    note "$1: ok"
  else
    note "$1: FAILED or timed out after ${t}s (see $3)"
  fi
}
# CudaTiers (offload tiers: pinned host slots, copies on the tiers' stream
# and the plan's, pools destroyed with copies in flight) in both.
mem_filter=${PKV_MEM_FILTER:-'*f32_D80_G4*:*f16_D256_G1*:*bf16_D128_G8*:*bf16_D64_G4*:*f16_D96_G8*:AttentionShapes.*:CudaWrite.*:CudaCopyBlocks.*:*CudaSwap*:CudaBackendBasics.*:CudaCapi.*:CudaMla.*:*CudaTiers.*-*e5m2*:*e4m3_f16_D96*:*e4m3_bf16_D96*:*e4m3_bf16_D256*'}
race_filter=${PKV_RACE_FILTER:-'*bf16_D128_G8*:*f32_D64_G4*:*f16_D256_G4*:CudaWrite.*:CudaCopyBlocks.*:*CudaTiers.*/bf16-*e5m2*'}
sanitize memcheck "$mem_filter" memcheck.log 180 "$([ "${PKV_SKIP_BENCH:-0}" = 1 ] && echo 100 || echo 260)"

if [ "${PKV_SKIP_BENCH:-0}" != 1 ]; then
  t=$(limit 280 60)
  if [ "$t" -lt 60 ]; then
    note "bench: skipped (time budget)"
  else
    # shellcheck disable=SC2086
    if PYTHONUNBUFFERED=1 timeout "$t" python3 "$root/bench/gpu/bench_decode.py" --lib "$lib" \
      --out "$OUT/bench.md" --time-budget $((t - 50)) ${PKV_BENCH_ARGS:-} >"$OUT/bench.log" 2>&1; then
      note "bench: ok (bench.md)"
    else
      note "bench: FAILED or timed out after ${t}s (see bench.log)"
    fi
    tail -45 "$OUT/bench.log"
  fi
else
  note "bench: skipped"
fi

sanitize racecheck "$race_filter" racecheck.log 200 "$([ "${PKV_DEMO:-0}" = 1 ] && echo 150 || echo 0)"
# initcheck: device memory read before anything wrote it (a plan array or
# a workspace the kernels read unwritten). Off unless PKV_INITCHECK=1: it
# shares the time budget with the steps above.
if [ "${PKV_INITCHECK:-0}" = 1 ]; then
  sanitize initcheck "$mem_filter" initcheck.log 150 "$([ "${PKV_DEMO:-0}" = 1 ] && echo 120 || echo 0)"
fi

# ---------------------------------------------------------------- tier bench
# PKV_TIER_BENCH=1: offload/load bandwidth of a CUDA pool's pinned host tier
# against a plain cudaMemcpyAsync of the same bytes (no Google Benchmark
# needed: the program uses the C ABI and the CUDA runtime only).
if [ "${PKV_TIER_BENCH:-0}" = 1 ]; then
  if g++ -O2 -std=c++17 -I"$src/capi/include" -I/usr/local/cuda/include \
    "$src/bench/tier_bandwidth_cuda.cpp" -o /tmp/pkv-tier-bench -L"$(dirname "$lib")" -lpagedkv \
    -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,"$(dirname "$lib")":/usr/local/cuda/lib64 \
    >>"$OUT/build.log" 2>&1; then
    t=$(limit 120 "$([ "${PKV_DEMO:-0}" = 1 ] && echo 120 || echo 0)")
    # shellcheck disable=SC2086
    if timeout "$t" /tmp/pkv-tier-bench ${PKV_TIER_BENCH_ARGS:-} >"$OUT/tier_bench.log" 2>&1; then
      note "tier bench: ok (tier_bench.log)"
    else
      note "tier bench: FAILED or timed out (see tier_bench.log)"
    fi
    cat "$OUT/tier_bench.log"
  else
    note "tier bench: build FAILED (see build.log)"
  fi
fi

# ---------------------------------------------------------------- demo
# PKV_DEMO=1: the serving demo with the cache and kernels on the GPU (its
# attention check compares rows against a float64 reference; exit 0 = all
# checks passed on both servers).
if [ "${PKV_DEMO:-0}" = 1 ]; then
  if [ -x "$build/examples/serving_sim/serving_sim" ] ||
    { cmake -S "$src" -B "$build" -DPAGEDKV_BUILD_EXAMPLES=ON >>"$OUT/build.log" 2>&1 &&
      cmake --build "$build" -j"$(nproc)" --target serving_sim >>"$OUT/build.log" 2>&1; }; then
    t=$(limit 240 0)
    # shellcheck disable=SC2086
    if timeout "$t" "$build/examples/serving_sim/serving_sim" --device cuda ${PKV_DEMO_ARGS:-} \
      >"$OUT/demo.log" 2>&1; then
      note "demo --device cuda: ok (exit 0: attention check PASS)"
    else
      note "demo --device cuda: FAILED, exit $? (see demo.log)"
    fi
    tail -25 "$OUT/demo.log"
  else
    note "demo: build FAILED (see build.log)"
    tail -30 "$OUT/build.log"
  fi
fi
# ---------------------------------------------------------------- ncu
# PKV_NCU=1: why decode reads below the copy bandwidth. Nsight Compute's
# throughput, memory, occupancy and stall sections for the first attention
# launches of each cell (clocks left as found: --clock-control none).
if [ "${PKV_NCU:-0}" = 1 ]; then
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for cell in ${PKV_NCU_CELLS:-32/32/128@1x32768 32/8/128@64x4096 16/8/256@64x4096}; do
    t=$(limit 60 0)
    if [ -z "$ncu" ] || [ "$t" -lt 20 ]; then
      note "ncu $cell: skipped (${ncu:-no ncu}, ${t}s left)"
      continue
    fi
    echo "==== $cell" >>"$OUT/ncu.log"
    if timeout "$t" "$ncu" --clock-control none --kernel-name regex:'paged_attention|merge_splits' \
      --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section LaunchStats --section WarpStateStats --section SchedulerStats \
      python3 "$root/bench/gpu/bench_decode.py" --lib "$lib" --heads "${cell%@*}" --cells "${cell#*@}" \
      --reps 1 --skip-flex --skip-fp8 --time-budget 20 --out /tmp/pkv-ncu-bench.md >>"$OUT/ncu.log" 2>&1; then
      note "ncu $cell: ok (ncu.log)"
    else
      note "ncu $cell: FAILED or timed out after ${t}s (see ncu.log)"
    fi
  done
fi

note "done"
cat "$summary"
