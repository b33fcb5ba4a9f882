#!/usr/bin/env bash
# Selects where the Rust bindings get their crates from, for this checkout
# only: writes bindings/rust/.cargo/config.toml (git-ignored) replacing
# crates.io with Debian's packaged crates in /usr/share/cargo/registry and
# making cargo run offline. Nothing in the crates names a registry, so on a
# machine that can reach crates.io (or with PAGEDKV_RUST_REGISTRY=crates-io)
# no config is written and cargo uses crates.io as usual.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# The toolchain: rustup's cargo where there is one (the CI image), else
# Debian's `cargo` package (rustc 1.63 on bookworm, the crates'
# rust-version), so that a fresh Debian machine runs the Rust tests instead
# of skipping them.
if ! command -v cargo >/dev/null && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ] &&
  ! dpkg-query -W -f='${Status}' cargo 2>/dev/null | grep -q "install ok installed"; then
  sudo=""
  if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then sudo=sudo; fi
  echo "rust.sh: no cargo found; installing Debian's cargo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends cargo >/dev/null
fi
cfg_dir=$root/bindings/rust/.cargo
registry=${PAGEDKV_CARGO_REGISTRY_DIR:-/usr/share/cargo/registry}

if [ "${PAGEDKV_RUST_REGISTRY:-debian}" = crates-io ]; then
  rm -f "$cfg_dir/config.toml"
  echo "rust.sh: using crates.io"
  exit 0
fi
if [ ! -d "$registry" ] || ! ls -d "$registry"/bindgen-* >/dev/null 2>&1; then
  echo "rust.sh: no packaged crates in $registry; cargo will use crates.io"
  rm -f "$cfg_dir/config.toml"
  exit 0
fi
mkdir -p "$cfg_dir"

# A cargo directory source needs .cargo-checksum.json in every crate. Debian
# ships them, but if some crate lacks one, serve the registry through a
# shadow directory of symlinks that adds an empty checksum (no file hashes:
# the files are the distribution's, verified by dpkg).
source_dir=$registry
missing=0
for d in "$registry"/*/; do
  [ -f "$d/.cargo-checksum.json" ] || missing=$((missing + 1))
done
if [ "$missing" -gt 0 ]; then
  source_dir=$cfg_dir/registry
  rm -rf "$source_dir"
  mkdir -p "$source_dir"
  for d in "$registry"/*/; do
    name=$(basename "$d")
    if [ -f "$d/.cargo-checksum.json" ]; then
      ln -s "${d%/}" "$source_dir/$name"
    else
      mkdir "$source_dir/$name"
      for f in "$d".* "$d"*; do
        case $(basename "$f") in . | .. | '.*' | '*') continue ;; esac
        ln -s "$f" "$source_dir/$name/"
      done
      echo '{"package":null,"files":{}}' >"$source_dir/$name/.cargo-checksum.json"
    fi
  done
  echo "rust.sh: $missing packaged crates lacked .cargo-checksum.json; shadowed in $source_dir"
fi

cat >"$cfg_dir/config.toml.new" <<CFG
# Written by scripts/deps/rust.sh; not committed. Delete it (or rerun with
# PAGEDKV_RUST_REGISTRY=crates-io) to build from crates.io.
[source.crates-io]
replace-with = "debian-packaged"

[source.debian-packaged]
directory = "$source_dir"

[net]
offline = true
CFG
if ! cmp -s "$cfg_dir/config.toml.new" "$cfg_dir/config.toml"; then
  mv "$cfg_dir/config.toml.new" "$cfg_dir/config.toml"
  # A lock file resolved against another registry would not match this one.
  rm -f "$root/bindings/rust/Cargo.lock"
else
  rm -f "$cfg_dir/config.toml.new"
fi
echo "rust.sh: cargo uses Debian's packaged crates ($source_dir), offline"
