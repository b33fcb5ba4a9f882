#!/usr/bin/env bash
# Bounded libFuzzer runs of the four harnesses (tests/fuzz/): configures a
# clang build with ASan+UBSan and libFuzzer coverage, builds fuzz_ops,
# fuzz_tensors, fuzz_groups and fuzz_wire only, fuzzes the operation-sequence harness for
# PKV_FUZZ_SECONDS (default 90), the tensor/attention entry-point harness
# for PKV_FUZZ_TENSOR_SECONDS (default 15) and the multi-group pool harness
# for PKV_FUZZ_GROUPS_SECONDS (default 15) and the transfer-descriptor
# harness for PKV_FUZZ_WIRE_SECONDS (default 15), each from its committed seed
# corpus, and fails on any crash, leak, timeout or disagreement. Skips (exit
# 0, with a notice) when clang cannot link -fsanitize=fuzzer. Long runs:
# tests/fuzz/README.md. PKV_FUZZ_STEP=build only builds, =run only fuzzes
# what a build step built (test-sanitizers.sh fuzzes while TSan builds),
# =probe only says (exit status) whether fuzzing can be built here.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${PKV_FUZZ_BUILD_DIR:-$root/build-fuzz}
seconds=${PKV_FUZZ_SECONDS:-90}
tensor_seconds=${PKV_FUZZ_TENSOR_SECONDS:-15}
groups_seconds=${PKV_FUZZ_GROUPS_SECONDS:-15}
wire_seconds=${PKV_FUZZ_WIRE_SECONDS:-15}
step=${PKV_FUZZ_STEP:-all}
cc=${PKV_FUZZ_CC:-clang}
cxx=${PKV_FUZZ_CXX:-clang++}

if ! command -v "$cxx" >/dev/null; then
  echo "test-fuzz: $cxx not found; fuzzing skipped"
  [ "$step" = probe ] && exit 1
  exit 0
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' \
  >"$probe/p.cpp"
if ! "$cxx" -fsanitize=fuzzer "$probe/p.cpp" -o "$probe/p" 2>/dev/null; then
  echo "test-fuzz: $cxx cannot link -fsanitize=fuzzer (libclang-rt-dev missing?); fuzzing skipped"
  [ "$step" = probe ] && exit 1
  exit 0
fi
if [ "$step" = probe ]; then exit 0; fi

if [ "$step" != run ]; then
  # PAGEDKV_FUZZER=ON: the library gets coverage instrumentation, so
  # libFuzzer steers by what happens inside pagedkv. As in the sanitizer
  # stage: -O1 -g1, and only the CPU kernel sets this CPU can run.
  CC=$cc CXX=$cxx cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1" \
    "-DPAGEDKV_CPU_KERNELS=$(bash "$root/scripts/cpu-kernels.sh")" \
    -DPAGEDKV_CUDA=OFF -DPAGEDKV_BUILD_BENCH=OFF -DPAGEDKV_BUILD_BINDINGS=OFF \
    -DPAGEDKV_BUILD_EXAMPLES=OFF -DPAGEDKV_SANITIZE=address -DPAGEDKV_FUZZER=ON >/dev/null
  cmake --build "$build" -j"$(nproc)" --target fuzz_ops fuzz_tensors fuzz_groups fuzz_wire
fi
if [ "$step" = build ]; then exit 0; fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# fuzz TARGET SEEDS SECONDS [FLAGS...]: new inputs go to a scratch corpus; the
# committed seeds are only read. -timeout: one input running over 10 s is a hang.
fuzz() {
  local target=$1 seeds=$2 secs=$3
  shift 3
  local work="$build/fuzz-work/$target"
  mkdir -p "$work/corpus" "$work/artifacts"
  local status=0
  "$build/tests/fuzz/$target" "$work/corpus" "$seeds" \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
    -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$@" >"$work/log.txt" 2>&1 || status=$?
  grep -E "^#[0-9]+ +(INITED|DONE)|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss|ERROR|SUMMARY|pkv_fuzz|Test unit written" \
    "$work/log.txt" || true
  if [ "$status" -ne 0 ]; then
    echo "test-fuzz: $target failed (exit $status); log: $work/log.txt, reproducer in $work/artifacts/"
    echo "  replay: $build/tests/fuzz/$target $work/artifacts/<file>  (PKV_FUZZ_TRACE=1 prints fuzz_ops' and fuzz_groups' ops)"
    tail -40 "$work/log.txt"
    exit 1
  fi
  echo "test-fuzz: $target: no crash in ${secs}s"
}

fuzz fuzz_ops "$root/tests/fuzz/corpus" "$seconds"
fuzz fuzz_tensors "$root/tests/fuzz/corpus_tensors" "$tensor_seconds"
fuzz fuzz_groups "$root/tests/fuzz/corpus_groups" "$groups_seconds"
# fuzz_wire imports over UCX (TCP loopback, in-process): UCX's connection
# state is invisible to LeakSanitizer (tests/fuzz/wire_lsan.supp) and is
# allocated during whichever input progresses the worker, so libFuzzer's
# per-input leak check is off for it; LeakSanitizer still runs at exit
# (intercept_tls_get_addr=0 as in test-sanitizers.sh: else its tracer can
# fault on UCX's threads).
ASAN_OPTIONS=$ASAN_OPTIONS:intercept_tls_get_addr=0 \
  LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/fuzz/wire_lsan.supp} \
  fuzz fuzz_wire "$root/tests/fuzz/corpus_wire" "$wire_seconds" -detect_leaks=0
