#!/usr/bin/env bash
# Idempotent set-up for building and testing pagedkv on a Debian machine.
# Each component lists what it needs in scripts/deps/: <name>.apt (Debian
# packages, one per line), <name>.pip (pip requirements), <name>.sh (extra
# steps, run last). Already-present packages are not reinstalled.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps=$root/scripts/deps

sudo=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then sudo=sudo; fi

missing=()
for p in $(cat "$deps"/*.apt 2>/dev/null | sed 's/#.*//' | tr -s ' \n' '\n' | sort -u); do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

reqs=$(cat "$deps"/*.pip 2>/dev/null | sed 's/#.*//' | grep -v '^\s*$' | sort -u || true)
if [ -n "$reqs" ]; then
  # pip answers quickly when everything is already satisfied.
  echo "$reqs" > /tmp/pagedkv-requirements.txt
  python3 -m pip install -q --disable-pip-version-check -r /tmp/pagedkv-requirements.txt
fi

for hook in "$deps"/*.sh; do
  [ -e "$hook" ] && bash "$hook"
done
echo "setup: done"
