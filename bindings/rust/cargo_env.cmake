# Shared by bindings/rust and examples/rust: how ctest runs cargo against
# this build tree's libpagedkv. Sets PAGEDKV_CARGO_OK, PAGEDKV_CARGO,
# PAGEDKV_CARGO_ENV (test ENVIRONMENT), PAGEDKV_CARGO_FLAGS and
# PAGEDKV_CARGO_WORKSPACE.
if(DEFINED PAGEDKV_CARGO_OK)
  return()
endif()
set(PAGEDKV_CARGO_OK FALSE)
find_program(PAGEDKV_CARGO cargo HINTS $ENV{CARGO_HOME}/bin $ENV{HOME}/.cargo/bin /root/.cargo/bin)
if(NOT PAGEDKV_CARGO)
  message(STATUS "pagedkv: cargo not found; Rust binding tests are not registered")
  return()
endif()
set(PAGEDKV_CARGO_OK TRUE)
set(PAGEDKV_CARGO_WORKSPACE ${PROJECT_SOURCE_DIR}/bindings/rust)
get_filename_component(_pkv_cargo_bin ${PAGEDKV_CARGO} DIRECTORY)
# One target dir per CMake build tree: the bindgen dependency tree compiles
# once and is reused by every later build and test run.
set(PAGEDKV_CARGO_ENV
  "PKG_CONFIG_PATH=${PAGEDKV_PKG_CONFIG_PATH}"
  "CARGO_TARGET_DIR=${PROJECT_BINARY_DIR}/bindings/rust/target"
  "LD_LIBRARY_PATH=$<TARGET_FILE_DIR:pagedkv>"
  "PATH=${_pkv_cargo_bin}:$ENV{PATH}"
  "CARGO_TERM_COLOR=never")
# scripts/deps/rust.sh selects Debian's packaged crates by writing this file;
# nothing can be fetched then.
set(PAGEDKV_CARGO_FLAGS)
if(EXISTS ${PAGEDKV_CARGO_WORKSPACE}/.cargo/config.toml)
  list(APPEND PAGEDKV_CARGO_FLAGS --offline)
endif()
