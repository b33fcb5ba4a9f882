#!/usr/bin/env bash
# Alternating A/B of two bench_manager binaries on the decode-step rows of
# issue 16 item 4: the two run in turn, round after round (which goes first
# alternates too), so that a slow period of a shared machine hits both. One line per run: binary, round,
# 1-minute load, then the CPU time per step (µs) of each row.
#   bench/ab_manager.sh OLD_BENCH NEW_BENCH [ROUNDS] [FILTER]
set -euo pipefail
old=$1 new=$2 rounds=${3:-8}
filter=${4:-'decode_step_plan/(prepare_decode_xxh3|prepare_decode_reserved_xxh3|prepare_decode/)'}
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for r in $(seq 1 "$rounds"); do
  order="old new"
  [ $((r % 2)) -eq 0 ] && order="new old"  # neither side always runs first
  for which in $order; do
    bin=$old
    [ "$which" = new ] && bin=$new
    "$bin" --benchmark_filter="$filter" --benchmark_repetitions=1 --benchmark_format=json \
      2>/dev/null >"$tmp"
    python3 - "$tmp" "$which" "$r" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = " ".join("%s=%.1f" % (b["run_name"].split("/")[1], b["cpu_time"]) for b in d["benchmarks"])
print(sys.argv[2], sys.argv[3], sys.argv[4], rows)
PY
  done
done
