#!/usr/bin/env bash
# Run HERE (not on the GPU machine), before a GPU session's device call:
# downloads the Debian packages pagedkv's build needs that the device image
# may lack (GoogleTest, OpenSSL and xxHash headers, pkg-config) into
# .gpu-debs/, which git ignores. Pass `.gpu-debs` in the device call's
# `carry`; scripts/gpu-check.sh unpacks them into a private prefix there
# (never into /).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
grep -qx '/.gpu-debs/' .git/info/exclude 2>/dev/null || echo '/.gpu-debs/' >> .git/info/exclude
mkdir -p .gpu-debs
cd .gpu-debs
apt-get download libgtest-dev libgmock-dev libxxhash-dev libxxhash0 libssl-dev libssl3 \
  pkgconf pkgconf-bin libpkgconf3 pkg-config >/dev/null
ls -la
