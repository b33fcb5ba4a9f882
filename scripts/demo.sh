#!/usr/bin/env bash
# The demo command: sets up, builds, and runs the serving simulation.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh"
if [ -x "$root/build/examples/c/quickstart" ] && [ ! -e "$root/examples/serving_sim" ]; then
  exec "$root/build/examples/c/quickstart" "$@"
fi
exec "$root/scripts/run-demo.sh" "$@"
