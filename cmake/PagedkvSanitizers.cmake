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
  set(PAGEDKV_BUILD_BINDINGS OFF CACHE BOOL "" FORCE)
  set(PAGEDKV_BUILD_BENCH OFF CACHE BOOL "" FORCE)
endif()
