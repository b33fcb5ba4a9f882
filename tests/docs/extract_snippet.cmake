# cmake -DMD=<markdown> -DHEADING=<line> -DHEADERS=<dir> -DOUT_INCLUDES=<file>
#       -DOUT_BODY=<file> -DOUT_SHIMS=<file> -P extract_snippet.cmake
# Writes the first ```c block after the line HEADING of MD: its #include
# lines to OUT_INCLUDES, the rest to OUT_BODY (compiled inside a function),
# and to OUT_SHIMS, for every pkv_* function the block calls that returns a
# pkv_status in HEADERS/pagedkv/*.h, a macro of that name that passes the
# status to pkv_doc_check (the function's own name is not expanded again
# inside its macro, so the macro calls the library).
file(READ "${MD}" text)
string(FIND "${text}" "\n${HEADING}\n" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${MD}: no line '${HEADING}'")
endif()
string(SUBSTRING "${text}" ${at} -1 text)
string(FIND "${text}" "\n```c\n" begin)
if(begin EQUAL -1)
  message(FATAL_ERROR "${MD}: no ```c block after '${HEADING}'")
endif()
math(EXPR begin "${begin} + 6")
string(SUBSTRING "${text}" ${begin} -1 text)
string(FIND "${text}" "\n```" end)
math(EXPR end "${end} + 1")
string(SUBSTRING "${text}" 0 ${end} block)

set(includes "")
set(body "#line 1 \"${MD} (${HEADING})\"\n")
string(REPLACE ";" "\\;" block "${block}")
string(REPLACE "\n" ";" lines "${block}")
foreach(line IN LISTS lines)
  if(line MATCHES "^#include")
    string(APPEND includes "${line}\n")
  else()
    string(APPEND body "${line}\n")
  endif()
endforeach()

file(GLOB headers "${HEADERS}/pagedkv/*.h")
set(decls "")
foreach(h ${headers})
  file(READ ${h} t)
  string(APPEND decls "${t}")
endforeach()
string(REGEX MATCHALL "pkv_[a-z0-9_]+\\(" calls "${block}")
list(REMOVE_DUPLICATES calls)
set(shims "")
foreach(c ${calls})
  string(REPLACE "(" "" name "${c}")
  if(decls MATCHES "PKV_API pkv_status ${name}\\(")
    string(APPEND shims "#define ${name}(...) pkv_doc_check(${name}(__VA_ARGS__), \"${name}\")\n")
  endif()
endforeach()

# Written only when changed, so an unrelated README edit rebuilds nothing.
foreach(pair "OUT_INCLUDES;includes" "OUT_BODY;body" "OUT_SHIMS;shims")
  list(GET pair 0 var)
  list(GET pair 1 content)
  file(WRITE "${${var}}.tmp" "${${content}}")
  file(COPY_FILE "${${var}}.tmp" "${${var}}" ONLY_IF_DIFFERENT)
  file(REMOVE "${${var}}.tmp")
endforeach()
