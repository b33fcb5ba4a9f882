#!/usr/bin/env bash
# Run HERE (not on the GPU machine): builds the GPU test binary, the library
# and the serving demo for sm_90 into build-gpu/ and copies them into
# .gpu-prebuilt/ (git-ignored), so that a device call spends no time
# compiling:
#
#   run(command="PKV_PREBUILT=.gpu-prebuilt bash scripts/gpu-check.sh",
#       carry=[".gpu-debs", ".gpu-prebuilt"])
#
# The device image has newer glibc and libstdc++ than Debian 12, so these
# binaries run there; the optional ZeroMQ and UCX features are left out
# (their libraries are not on the device), and gpu-check.sh builds from
# source instead if any needed library does not resolve.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
arch=${PKV_ARCH:-90}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGEDKV_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DPAGEDKV_BUILD_BINDINGS=OFF -DPAGEDKV_BUILD_BENCH=OFF \
  -DPAGEDKV_EVENTS=OFF -DPAGEDKV_UCX=OFF >/dev/null
ninja -C build-gpu pagedkv test_gpu serving_sim
grep -qx '/.gpu-prebuilt/' .git/info/exclude 2>/dev/null || echo '/.gpu-prebuilt/' >>.git/info/exclude
# One xz archive: about 12 MB instead of 53 (a device call carries at most
# 64 MiB with the working tree).
stage=$(mktemp -d)
cp build-gpu/tests/gpu/test_gpu build-gpu/examples/serving_sim/serving_sim "$stage/"
cp -a build-gpu/capi/libpagedkv.so* "$stage/"
strip --strip-debug "$stage/test_gpu" "$stage/serving_sim" "$stage"/libpagedkv.so.*.*
rm -rf .gpu-prebuilt && mkdir -p .gpu-prebuilt
tar -C "$stage" -cf - . | xz -T0 -3 >.gpu-prebuilt/prebuilt.tar.xz
rm -rf "$stage"
du -sh .gpu-prebuilt
