#!/usr/bin/env bash
# Sanitizer stages of the test command (run by scripts/test.sh after the main
# build): every C/C++ test under ASan+UBSan (LeakSanitizer included; built
# with clang where clang can link libFuzzer, else GCC), the threading tests
# under TSan (GCC), and the bounded fuzz run (scripts/test-fuzz.sh) from the
# ASan build, alongside TSan.
# CUDA and the language bindings are left out of these builds: their host
# runtimes cannot load an instrumented library.
#
# TSan builds only the threading test executables: targets whose name
# contains "threads" (test_kernels_threads, capi_threads_test,
# test_reliability_threads, test_reliability_races_threads, ...). Name a new threading test executable that way,
# or it is not run under TSan. Each stage prints its time.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=$(nproc)
# -O1 -g1 (sanitizers' usual level, line tables for their reports), and
# only the CPU kernel sets this CPU can run (scripts/cpu-kernels.sh): no test
# could run the others here.
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPAGEDKV_CUDA=OFF -DPAGEDKV_BUILD_BENCH=OFF
        -DPAGEDKV_BUILD_BINDINGS=OFF -DPAGEDKV_BUILD_EXAMPLES=OFF
        "-DPAGEDKV_CPU_KERNELS=$(bash "$root/scripts/cpu-kernels.sh")"
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1")

# intercept_tls_get_addr=0: GCC 12's runtime (up to GCC 13 / LLVM 16) takes a
# dynamic TLS block whose address is 16 past a page boundary for one with a
# pre-2.25 glibc header and reads the two words before it as a range; when a
# heap block lands there, LeakSanitizer's tracer faults at exit ("Tracer
# caught signal 11" in ScanRangeForPointers), the same way on every run of
# that binary in that environment. glibc mallocs the dynamic TLS of dlopen'ed
# libraries (UCX's), so the address depends on the heap layout.
# Static TLS is still scanned.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:intercept_tls_get_addr=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

stage_start=$SECONDS
stage_done() { echo "== $1: $((SECONDS - stage_start)) s"; stage_start=$SECONDS; }

echo "== ASan+UBSan: all C/C++ tests"
# With clang where it can link libFuzzer: the fuzz harnesses are then built
# in this same tree (one library build fewer), and clang compiles UBSan's
# checks in a fraction of GCC 12's time (tests/core/tiers_test.cpp under
# ASan+UBSan: clang 14 15.9 s, GCC 12 39.8 s). Otherwise with GCC, the
# tests' own code getting ASan but not UBSan (the library gets both), for
# the same reason. With clang the tests' own code is compiled at -O0, but
# tests/kernels and tests/fuzz at -O1 (PAGEDKV_TEST_HOT_OPT, tests/CMakeLists.txt).
fuzz=0
if [ -x "$root/scripts/test-fuzz.sh" ] && PKV_FUZZ_STEP=probe bash "$root/scripts/test-fuzz.sh"; then
  fuzz=1
  asan_cxx=clang++
  asan_cc=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DPAGEDKV_FUZZER=ON
           -DPAGEDKV_TEST_OPT=-O0 -DPAGEDKV_TEST_HOT_OPT=-O1)
else
  asan_cxx=g++
  asan_cc=(-DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ -DPAGEDKV_FUZZER=OFF
           "-DPAGEDKV_TEST_OPT=-fno-sanitize=undefined" -DPAGEDKV_TEST_HOT_OPT=)
fi
# A build-asan/ configured with another compiler is removed first: CMake
# would start its cache afresh without this command's -D options, i.e. an
# unsanitized build.
if [ -f "$root/build-asan/CMakeCache.txt" ] &&
  ! grep -q "^CMAKE_CXX_COMPILER:[A-Z]*=\(.*/\)\?$asan_cxx\$" "$root/build-asan/CMakeCache.txt"; then
  rm -rf "$root/build-asan"
fi
cmake -S "$root" -B "$root/build-asan" "${common[@]}" -DPAGEDKV_SANITIZE=address "${asan_cc[@]}" >/dev/null
cmake --build "$root/build-asan" -j"$jobs"
ctest --test-dir "$root/build-asan" --output-on-failure -j"$jobs" -LE "gpu|python|rust|go|fuzz|bench" \
  --timeout 900
stage_done "ASan+UBSan"

# The fuzzers run on one core, for a fixed time, while TSan builds and runs.
fuzz_pid=
if [ "$fuzz" = 1 ]; then
  fuzz_log=$(mktemp)
  # 60 + 15 + 15 + 15 s (fuzz_wire's 15 added): about as long as the TSan stage beside it (92 s at
  # 2d6191e), so neither waits long for the other. PKV_FUZZ_SECONDS overrides.
  PKV_FUZZ_SECONDS=${PKV_FUZZ_SECONDS:-60} PKV_FUZZ_STEP=run PKV_FUZZ_BUILD_DIR="$root/build-asan" \
    bash "$root/scripts/test-fuzz.sh" >"$fuzz_log" 2>&1 &
  fuzz_pid=$!
  # On a failure before the wait, the fuzzer (bounded anyway) is stopped.
  # (|| true: set -e applies inside the trap too.)
  trap 'pkill -P "$fuzz_pid" 2>/dev/null || true; kill "$fuzz_pid" 2>/dev/null || true
        rm -f "$fuzz_log"' EXIT
fi

echo "== TSan: threading tests"
cmake -S "$root" -B "$root/build-tsan" "${common[@]}" -DPAGEDKV_SANITIZE=thread >/dev/null
mapfile -t tsan_targets < <(cmake --build "$root/build-tsan" --target help |
  sed -n 's/^\([A-Za-z0-9_.-]*threads[A-Za-z0-9_.-]*\): phony$/\1/p' | sort -u)
if [ "${#tsan_targets[@]}" -eq 0 ]; then
  echo "test-sanitizers: no threading test targets found" >&2
  exit 1
fi
echo "   targets: ${tsan_targets[*]}"
cmake --build "$root/build-tsan" -j"$jobs" --target "${tsan_targets[@]}"
ctest --test-dir "$root/build-tsan" --output-on-failure -j"$jobs" -L threads -LE "gpu|python|rust|go" \
  --no-tests=error --timeout 900
stage_done "TSan"

if [ -n "$fuzz_pid" ]; then
  echo "== libFuzzer: bounded run (alongside TSan)"
  fuzz_status=0
  wait "$fuzz_pid" || fuzz_status=$?
  trap - EXIT
  cat "$fuzz_log"
  rm -f "$fuzz_log"
  if [ "$fuzz_status" -ne 0 ]; then exit "$fuzz_status"; fi
  stage_done "libFuzzer, after TSan"
fi
