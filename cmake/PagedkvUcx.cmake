# PAGEDKV_UCX: AUTO (default) builds the UCX transfer engine when UCX
# (libucx-dev, pkg-config "ucx") is found; ON requires it; OFF builds the
# stub, whose pkv_transfer_* calls return PKV_E_UNSUPPORTED.
set(PAGEDKV_WITH_UCX OFF)
if(NOT PAGEDKV_UCX STREQUAL "OFF")
  pkg_check_modules(UCX IMPORTED_TARGET ucx)
  if(UCX_FOUND)
    set(PAGEDKV_WITH_UCX ON)
  elseif(PAGEDKV_UCX STREQUAL "ON")
    message(FATAL_ERROR "PAGEDKV_UCX=ON but UCX was not found (install libucx-dev: scripts/deps/ucx.apt)")
  endif()
endif()
message(STATUS "pagedkv: UCX transfers ${PAGEDKV_WITH_UCX}")
