#!/usr/bin/env bash
# The test command: sets up, builds, and runs every test (C++, C, Python,
# Rust, Go, examples) with CTest; then the install paths (test-install.sh),
# the sanitizer and fuzz stages.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup.sh"
# Two cuts to fit CI's time on 2 cores, neither in what the library does:
# the tests' own code at -O0, except the test code that does heavy work
# itself at -O1 (PAGEDKV_TEST_HOT_OPT, tests/CMakeLists.txt; -O0 compiles in
# about 0.55 of -O1's time; the library stays -O3), and Ampere's CUDA code
# as PTX only (sm_90 gets machine code as before; compute_80 is still
# compiled, so Ampere's headers and intrinsics are checked, but ptxas, a
# third of each kernel file's time, runs once).
bash "$root/scripts/build.sh" -DPAGEDKV_TEST_OPT=-O0 -DPAGEDKV_TEST_HOT_OPT=-O1 \
  "-DCMAKE_CUDA_ARCHITECTURES=90;80-virtual"
ctest --test-dir "$root/build" --output-on-failure -j"$(nproc)" --timeout 600
# The user's paths: install to a temporary prefix and build C, Rust and Go
# programs against it from outside the tree; pip install into a fresh venv.
bash "$root/scripts/test-install.sh"
if [ -x "$root/scripts/test-sanitizers.sh" ]; then
  bash "$root/scripts/test-sanitizers.sh"
fi
