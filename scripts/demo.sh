#!/usr/bin/env bash
# The demo command: sets up, builds, and runs the serving simulation
# (examples/serving_sim). Arguments go to the simulation; --help lists them.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh"
exec bash "$root/scripts/run-demo.sh" "$@"
