#!/usr/bin/env bash
# Prints the x86 CPU kernel sets this machine can run, as a CMake list for
# PAGEDKV_CPU_KERNELS (empty on a CPU without AVX2, or not x86). The
# sanitizer and fuzz stages build only these: a test cannot run the others
# here, and compiling them under ASan is minutes of CI time.
# PAGEDKV_CI_CPU_KERNELS overrides it (e.g. "avx2;avx512;avx512bf16").
set -euo pipefail
if [ -n "${PAGEDKV_CI_CPU_KERNELS+x}" ]; then
  echo "$PAGEDKV_CI_CPU_KERNELS"
  exit 0
fi
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true) "
has() {
  local f
  for f; do [[ "$flags" == *" $f "* ]] || return 1; done
}
sets=()
if has avx2 fma f16c; then
  sets+=(avx2)
  if has avx512f avx512bw avx512vl; then
    sets+=(avx512)
    if has avx512_bf16; then sets+=(avx512bf16); fi
  fi
fi
(IFS=';'; echo "${sets[*]}")
