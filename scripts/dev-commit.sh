#!/usr/bin/env bash
# For developers working in parallel in one checkout: commits only the given
# paths, retrying while another commit holds the index lock.
# Usage: scripts/dev-commit.sh "message" path...
set -u
msg=$1; shift
for i in $(seq 1 30); do
  if git add -A -- "$@" 2>/dev/null && git commit -q -m "$msg" -- "$@"; then exit 0; fi
  [ -e "$(git rev-parse --git-dir)/index.lock" ] || { git status --short -- "$@"; exit 1; }
  sleep 2
done
exit 1
