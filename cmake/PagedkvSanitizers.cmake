# PAGEDKV_SANITIZE=address builds everything with ASan+UBSan (leak checks
# included); =thread with TSan. Bindings are skipped in sanitizer builds:
# their host runtimes (python, go, cargo) cannot load an instrumented library.
if(PAGEDKV_SANITIZE STREQUAL "address")
  set(_pkv_san -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
elseif(PAGEDKV_SANITIZE STREQUAL "thread")
  set(_pkv_san -fsanitize=thread -fno-omit-frame-pointer)
elseif(NOT PAGEDKV_SANITIZE STREQUAL "")
  message(FATAL_ERROR "PAGEDKV_SANITIZE must be '', 'address' or 'thread'")
endif()
if(_pkv_san)
  # Quoted: an unquoted list would split the generator expression apart.
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_pkv_san}>")
  add_link_options(${_pkv_san})
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    # C programs linking the C++ library need UBSan's C++ runtime too (and
    # the C++ library that runtime uses).
    add_link_options("$<$<LINK_LANGUAGE:C>:-fsanitize-link-c++-runtime;-lstdc++>")
  endif()
  set(PAGEDKV_BUILD_BINDINGS OFF CACHE BOOL "" FORCE)
  set(PAGEDKV_BUILD_BENCH OFF CACHE BOOL "" FORCE)
endif()

# PAGEDKV_FUZZER=ON (clang) builds the libFuzzer targets of tests/fuzz and
# gives the library coverage instrumentation, so libFuzzer steers by what
# happens inside pagedkv. Tests and the CPU kernel files are left
# uninstrumented: coverage counters in their float loops made the ASan test
# run 1.7x as long, and the harnesses reach the kernels through validation
# code that is instrumented.
option(PAGEDKV_FUZZER "Build the libFuzzer targets (clang) with a coverage-instrumented library" OFF)
if(PAGEDKV_FUZZER AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  set(PAGEDKV_FUZZ_COVERAGE "$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>")
elseif(PAGEDKV_FUZZER)
  message(WARNING "PAGEDKV_FUZZER=ON needs clang; ${CMAKE_CXX_COMPILER_ID} builds no coverage "
                  "instrumentation (and tests/fuzz builds no libFuzzer targets)")
endif()
