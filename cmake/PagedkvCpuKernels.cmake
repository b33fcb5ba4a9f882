# PAGEDKV_CPU_KERNELS leaves x86 kernel sets out of the build (the scalar set
# is always in): a library built without one runs the next set down where the
# CPU has it. For builds that only run on a known CPU; CI's sanitizer and fuzz
# builds compile the sets their CPU can run, since no test could run the others.
# Sets PAGEDKV_CPU_KERNEL_OMITS: the definitions (PKV_OMIT_<SET>) for every
# target that compiles impl/cpu's kernel files.
set(PAGEDKV_CPU_KERNELS "avx2;avx512;avx512bf16" CACHE STRING
  "x86 CPU kernel sets to compile, a subset of avx2;avx512;avx512bf16 (each needs the one before it)")
set(PAGEDKV_CPU_KERNEL_OMITS "")
set(_pkv_prev_isa_in ON)
foreach(isa avx2 avx512 avx512bf16)
  if(isa IN_LIST PAGEDKV_CPU_KERNELS)
    if(NOT _pkv_prev_isa_in)
      message(FATAL_ERROR "PAGEDKV_CPU_KERNELS: ${isa} needs the set before it (avx2 < avx512 < avx512bf16)")
    endif()
  else()
    string(TOUPPER ${isa} _pkv_isa_upper)
    list(APPEND PAGEDKV_CPU_KERNEL_OMITS PKV_OMIT_${_pkv_isa_upper})
    set(_pkv_prev_isa_in OFF)
  endif()
endforeach()
foreach(isa ${PAGEDKV_CPU_KERNELS})
  if(NOT isa MATCHES "^(avx2|avx512|avx512bf16)$")
    message(FATAL_ERROR "PAGEDKV_CPU_KERNELS: unknown kernel set '${isa}'")
  endif()
endforeach()
