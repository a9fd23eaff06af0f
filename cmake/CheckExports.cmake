# CheckExports.cmake: the dynamic symbols libflashopt defines are exactly
# the C ABI's functions (ctest runtime/exports).
#   cmake -DLIBRARY=<libflashopt.so> -DHEADERS=<runtime/include/flashopt>
#         [-DNM=<nm>] -P CheckExports.cmake
# Every FLASHOPT_API function of flashopt.h, flashopt_dist.h and
# flashopt_state.h must be exported, and nothing but flashopt_* functions
# may be (no C++ symbol: the internals are hidden, runtime/CMakeLists.txt;
# the one private flashopt_ function, flashopt_internal_set_last_error, is
# for libflashopt_nccl: capi/Errors.h).
foreach(v LIBRARY HEADERS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "CheckExports.cmake: -D${v}=... is required")
  endif()
endforeach()
if(NOT NM)
  set(NM nm)
endif()
execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY}
  OUTPUT_VARIABLE _out RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIBRARY} failed (${_rc})")
endif()
string(REPLACE "\n" ";" _lines "${_out}")
set(_exported)
set(_foreign)
foreach(_l ${_lines})
  if(_l MATCHES "^[0-9a-fA-F]* *[A-Za-z] ([^ ]+)$")
    set(_name ${CMAKE_MATCH_1})
    list(APPEND _exported ${_name})
    if(NOT _name MATCHES "^flashopt_")
      list(APPEND _foreign ${_name})
    endif()
  endif()
endforeach()
set(_missing)
set(_declared)
foreach(_h flashopt.h flashopt_dist.h flashopt_state.h)
  file(READ ${HEADERS}/${_h} _text)
  # Declarations start a line (not "#define FLASHOPT_API ...").
  string(REGEX MATCHALL "\n[ \t]*FLASHOPT_API[^;(#]*\\(" _decls "${_text}")
  foreach(_d ${_decls})
    if(_d MATCHES "([A-Za-z_][A-Za-z_0-9]*)[ \t\n]*\\($")
      list(APPEND _declared ${CMAKE_MATCH_1})
      list(FIND _exported ${CMAKE_MATCH_1} _at)
      if(_at EQUAL -1)
        list(APPEND _missing ${CMAKE_MATCH_1})
      endif()
    endif()
  endforeach()
endforeach()
list(LENGTH _exported _n)
if(_foreign OR _missing)
  list(JOIN _foreign "\n  " _f)
  list(JOIN _missing "\n  " _m)
  message(FATAL_ERROR "${LIBRARY}: ${_n} exported symbols\n"
    "not the C ABI's:\n  ${_f}\nC ABI functions not exported:\n  ${_m}")
endif()
list(LENGTH _declared _nd)
set(_private ${_exported})
list(REMOVE_ITEM _private ${_declared})
message(STATUS "${LIBRARY}: ${_n} exported symbols: the ${_nd} FLASHOPT_API "
  "functions of its public headers, and ${_private}")
