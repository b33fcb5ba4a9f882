# Shared by bindings/go and examples/go: finds the Go toolchain and sets
# PAGEDKV_GO_ENV, the environment every go command of the test suite runs
# in. Caches and GOPATH live in the build tree (nothing depends on $HOME),
# the module proxy is off (standard library only), and pkg-config finds the
# uninstalled pagedkv.pc of this build tree.
find_program(PAGEDKV_GO_EXECUTABLE go)
find_program(PAGEDKV_GOFMT_EXECUTABLE gofmt)
set(PAGEDKV_GO_OK TRUE)
if(NOT PAGEDKV_GO_EXECUTABLE)
  message(STATUS "pagedkv: go not found; Go binding tests skipped")
  set(PAGEDKV_GO_OK FALSE)
elseif(PAGEDKV_SANITIZE)
  # A sanitized libpagedkv cannot be loaded into a Go test binary.
  message(STATUS "pagedkv: sanitizer build; Go binding tests skipped")
  set(PAGEDKV_GO_OK FALSE)
endif()
set(_pkv_go_home ${PROJECT_BINARY_DIR}/go-home)
set(PAGEDKV_GO_ENV
  PKG_CONFIG_PATH=${PAGEDKV_PKG_CONFIG_PATH}
  GOCACHE=${_pkv_go_home}/cache
  GOPATH=${_pkv_go_home}/path
  GOMODCACHE=${_pkv_go_home}/path/pkg/mod
  GOENV=off
  GOFLAGS=-mod=mod
  GOPROXY=off
  GOSUMDB=off
  GO111MODULE=on
  GOTOOLCHAIN=local
  CGO_ENABLED=1)
