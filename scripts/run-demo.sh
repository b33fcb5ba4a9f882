#!/usr/bin/env bash
# Runs the serving simulation built by scripts/build.sh (scripts/demo.sh
# sets up and builds first). Arguments go to the program: see --help.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${PAGEDKV_BUILD_DIR:-$root/build}
bin=$build/examples/serving_sim/serving_sim
if [ ! -x "$bin" ]; then
  echo "run-demo: $bin is not built; run: bash scripts/build.sh (or bash scripts/demo.sh)" >&2
  exit 2
fi
exec "$bin" "$@"
