# PAGEDKV_EVENTS: the KV event publisher (impl/events) needs libzmq and
# msgpack-c's C++ headers (scripts/deps/events.apt). AUTO builds it when
# both are found; without it pkv_event_publisher_create returns
# PKV_E_UNSUPPORTED.
set(PAGEDKV_WITH_EVENTS OFF)
if(NOT PAGEDKV_EVENTS STREQUAL "OFF")
  pkg_check_modules(ZMQ QUIET IMPORTED_TARGET libzmq)
  find_path(PAGEDKV_MSGPACK_INCLUDE msgpack.hpp)
  if(ZMQ_FOUND AND PAGEDKV_MSGPACK_INCLUDE)
    set(PAGEDKV_WITH_EVENTS ON)
    add_library(pagedkv_events_deps INTERFACE)
    target_link_libraries(pagedkv_events_deps INTERFACE PkgConfig::ZMQ)
    target_include_directories(pagedkv_events_deps INTERFACE ${PAGEDKV_MSGPACK_INCLUDE})
    # msgpack-c's C++ API without Boost (header-only).
    target_compile_definitions(pagedkv_events_deps INTERFACE MSGPACK_NO_BOOST=1)
  elseif(PAGEDKV_EVENTS STREQUAL "ON")
    message(FATAL_ERROR "PAGEDKV_EVENTS=ON but libzmq (pkg-config libzmq) or msgpack.hpp was "
                        "not found: run scripts/setup.sh (scripts/deps/events.apt)")
  endif()
endif()
message(STATUS "pagedkv: KV event publisher (PAGEDKV_EVENTS): ${PAGEDKV_WITH_EVENTS}")
