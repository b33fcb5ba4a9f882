#!/usr/bin/env bash
# The user's install paths, outside the repository (run by scripts/test.sh
# after the main build; needs that build in build/ or $PAGEDKV_BUILD_DIR):
#  - `cmake --install` into a temporary, non-default prefix, then the C, Rust
#    and Go examples copied to a temporary directory and built against that
#    prefix the documented ways: C through pkg-config (shared and
#    pagedkv-static) and find_package (shared and pagedkv::pagedkv_static),
#    Rust as a path dependency (rpath through DEP_PAGEDKV_LIB_DIR, and the
#    `static` feature), Go through a replace directive (default and
#    -tags pagedkv_static). Each program runs without LD_LIBRARY_PATH, and
#    the ELF dynamic section is checked: shared builds need libpagedkv.so.1,
#    static ones must not;
#  - `pip install ./bindings/python` into a fresh venv with build isolation
#    (newest scikit-build-core and swig from PyPI; no CUDA by default), then
#    tests/pip_install_check.py --smoke-only and the numpy example with that
#    venv's interpreter.
# PAGEDKV_INSTALL_TESTS selects stages (default "c rust go python").
# Prints each stage's time; any failure exits non-zero.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${PAGEDKV_BUILD_DIR:-$root/build}" && pwd)
stages=${PAGEDKV_INSTALL_TESTS:-c rust go python}
jobs=$(nproc)
# Kept between runs: the Rust consumer's target dir (bindgen takes a while to
# build). Everything a user would create lives in $work.
cache=$build/install-test-cache
work=$(mktemp -d "${TMPDIR:-/tmp}/pagedkv-install.XXXXXX")
trap '[ -n "${PAGEDKV_KEEP:-}" ] || rm -rf "$work"' EXIT
unset LD_LIBRARY_PATH PYTHONPATH PKG_CONFIG_PATH

prefix=$work/prefix
passed=0
failed=0
failures=()
stage_start=$SECONDS
run_stage() { # name, command...
  local name=$1 t0=$SECONDS
  shift
  echo "== install test: $name"
  # In a background subshell so that set -e holds inside the stage (it is
  # ignored in anything run as an `if` condition).
  ("$@") &
  if wait $!; then
    passed=$((passed + 1))
    echo "== install test: $name: ok, $((SECONDS - t0)) s"
  else
    failed=$((failed + 1))
    failures+=("$name")
    echo "== install test: $name: FAILED, $((SECONDS - t0)) s"
  fi
}

# needs_libpagedkv BINARY yes|no: checks the binary's DT_NEEDED entries and,
# for a shared link, that the loader resolves libpagedkv inside the test
# prefix (not some other installed copy) with no LD_LIBRARY_PATH.
needs_libpagedkv() {
  local has=no
  if readelf -d "$1" | grep -q 'NEEDED.*libpagedkv\.so'; then has=yes; fi
  if [ "$has" != "$2" ]; then
    echo "$1: expected NEEDED libpagedkv.so: $2, found: $has" >&2
    readelf -d "$1" | grep -E 'NEEDED|RPATH|RUNPATH' >&2
    return 1
  fi
  if [ "$has" = yes ]; then
    local resolved
    resolved=$(ldd "$1" | sed -n 's/.*libpagedkv\.so[.0-9]* => \([^ ]*\).*/\1/p')
    case $(realpath -m "$resolved") in
      "$(realpath "$prefix")"/*) ;;
      *)
        echo "$1: libpagedkv resolves to '$resolved', not under $prefix" >&2
        return 1
        ;;
    esac
  fi
}

# ------------------------------------------------------------------ install
if [ ! -f "$build/CMakeCache.txt" ]; then
  echo "test-install: no build in $build (run scripts/build.sh first)" >&2
  exit 1
fi
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:[A-Z]*=//p' "$build/CMakeCache.txt")
libdir=${libdir:-lib}
pcdir=$prefix/$libdir/pkgconfig
echo "installed into $prefix ($(find "$prefix" -type f | wc -l) files)"
# Moving the tree must not matter (pagedkv.pc uses ${pcfiledir}, the CMake
# package its own location): consumers use it from here.
mv "$prefix" "$work/moved"
prefix=$work/moved
pcdir=$prefix/$libdir/pkgconfig

# ---------------------------------------------------------------------- C
c_pkg_config() {
  local d=$work/c-pc
  mkdir -p "$d" && cp "$root/examples/c/quickstart.c" "$d/"
  (
    cd "$d"
    export PKG_CONFIG_PATH=$pcdir
    [ "$(pkg-config --variable=includedir pagedkv)" -ef "$prefix/include" ]
    # shellcheck disable=SC2046
    cc -Wall -o quickstart quickstart.c $(pkg-config --cflags --libs pagedkv) -lm
    needs_libpagedkv quickstart yes
    ./quickstart >/dev/null
    # shellcheck disable=SC2046
    cc -Wall -o quickstart-static quickstart.c $(pkg-config --cflags --libs pagedkv-static) -lm
    needs_libpagedkv quickstart-static no
    ./quickstart-static >/dev/null
  )
}

c_find_package() {
  local d=$work/c-cmake
  mkdir -p "$d" && cp "$root/examples/c/quickstart.c" "$d/"
  cat >"$d/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.22)
project(consumer LANGUAGES C)
find_package(pagedkv 0.1 REQUIRED)
add_executable(quickstart quickstart.c)
target_link_libraries(quickstart PRIVATE pagedkv::pagedkv m)
add_executable(quickstart-static quickstart.c)
target_link_libraries(quickstart-static PRIVATE pagedkv::pagedkv_static m)
EOF
  (
    cd "$d"
    cmake -S . -B b -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >cmake.log || { cat cmake.log; exit 1; }
    cmake --build b
    needs_libpagedkv b/quickstart yes
    b/quickstart >/dev/null
    needs_libpagedkv b/quickstart-static no
    b/quickstart-static >/dev/null
  )
}

# ------------------------------------------------------------------- Rust
rust_consumer() {
  local d=$work/rust
  mkdir -p "$d/src" "$d/.cargo"
  cp "$root/examples/rust/src/main.rs" "$d/src/"
  # A user's crate: the safe crate, plus pagedkv-sys for the links metadata
  # (DEP_PAGEDKV_LIB_DIR) its build script turns into an rpath.
  cat >"$d/Cargo.toml" <<EOF
[package]
name = "consumer"
version = "0.1.0"
edition = "2021"

[features]
static = ["pagedkv/static"]

[dependencies]
pagedkv = { path = "$root/bindings/rust/pagedkv" }
pagedkv-sys = { path = "$root/bindings/rust/pagedkv-sys" }
EOF
  cat >"$d/build.rs" <<'EOF'
fn main() {
    if let Ok(dir) = std::env::var("DEP_PAGEDKV_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
EOF
  # The registry scripts/deps/rust.sh selected for this checkout, if any.
  if [ -f "$root/bindings/rust/.cargo/config.toml" ]; then
    cp "$root/bindings/rust/.cargo/config.toml" "$d/.cargo/config.toml"
  fi
  (
    cd "$d"
    export PKG_CONFIG_PATH=$pcdir CARGO_TARGET_DIR=$cache/cargo-target
    cargo build -q --release
    needs_libpagedkv "$CARGO_TARGET_DIR/release/consumer" yes
    "$CARGO_TARGET_DIR/release/consumer" >/dev/null
    cargo build -q --release --features static
    needs_libpagedkv "$CARGO_TARGET_DIR/release/consumer" no
    "$CARGO_TARGET_DIR/release/consumer" >/dev/null
  )
}

# --------------------------------------------------------------------- Go
go_consumer() {
  local d=$work/go
  mkdir -p "$d"
  cp "$root/examples/go/decode/main.go" "$d/"
  cat >"$d/go.mod" <<EOF
module example.com/consumer

go 1.19

require github.com/pagedkv/pagedkv-go v0.0.0

replace github.com/pagedkv/pagedkv-go => $root/bindings/go
EOF
  (
    cd "$d"
    export PKG_CONFIG_PATH=$pcdir GOCACHE=$work/go-cache GOPATH=$work/go-path GOFLAGS=-mod=mod \
      GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local CGO_ENABLED=1
    go build -o consumer .
    needs_libpagedkv consumer yes
    ./consumer >/dev/null
    go build -x -tags pagedkv_static -o consumer-static . 2>go-static.log || { cat go-static.log; exit 1; }
    needs_libpagedkv consumer-static no
    ./consumer-static >/dev/null
  )
}

# ----------------------------------------------------------------- Python
python_venv() {
  local d=$work/venv
  python3 -m venv "$d"
  # Build isolation (pip's default): scikit-build-core and swig come from
  # PyPI, newest within pyproject.toml's ranges; no CUDA unless asked for.
  CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$d/bin/python" -m pip install -q --disable-pip-version-check \
    --no-cache-dir "$root/bindings/python"
  (
    cd "$work"
    # Where the package and its libpagedkv landed, py.typed, no CUDA, one step.
    "$d/bin/python" "$root/bindings/python/tests/pip_install_check.py" --smoke-only
    "$d/bin/python" "$root/examples/python/decode_numpy.py" --steps 8 >/dev/null
  )
}

for s in $stages; do
  case $s in
    c)
      run_stage "C via pkg-config (shared, pagedkv-static)" c_pkg_config
      run_stage "C via find_package (pagedkv::pagedkv, pagedkv::pagedkv_static)" c_find_package
      ;;
    rust)
      # ctest skips the Rust tests without cargo (bindings/rust/cargo_env.cmake); so does this.
      PATH=$PATH:${CARGO_HOME:-$HOME/.cargo}/bin
      if command -v cargo >/dev/null; then
        run_stage "Rust crate (rpath, --features static)" rust_consumer
      else
        echo "== install test: Rust crate: skipped, no cargo"
      fi
      ;;
    go) run_stage "Go module (default, -tags pagedkv_static)" go_consumer ;;
    python) run_stage "pip install into a fresh venv (build isolation)" python_venv ;;
    *) echo "test-install: unknown stage $s" >&2 && exit 2 ;;
  esac
done
echo "== install tests: $passed passed, $failed failed, $((SECONDS - stage_start)) s"
if [ "$failed" -gt 0 ]; then
  printf '   failed: %s\n' "${failures[@]}"
  exit 1
fi
