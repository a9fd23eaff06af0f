# FlashoptAddKernels.cmake: flashopt_add_kernels(), for projects that use
# libflashopt (find_package(flashopt) includes this file).
#
#   flashopt_add_kernels(<target>
#                        SPECS a.json [b.json ...]
#                        [TARGETS cpu,sm_90]     # default: the spec's "targets"
#                        [CPU x86-64-v3,x86-64]  # CPU flavours (default: flashopt-gen's)
#                        [OUTPUT_DIR dir]        # default: <binary dir>/flashopt-kernels/<target>
#                        [DEPENDS files...]      # extra inputs (e.g. rule files)
#                        [EMBED])
#
# For each spec, flashopt-gen runs at build time (one custom command per spec,
# re-run when the spec or its rule file changes) and writes the bundle
# <OUTPUT_DIR>/<spec name>/ (manifest.json plus kernels); <target> depends on
# the bundles. The spec's "name" is read when CMake configures (and CMake
# re-configures when a spec changes).
#
# Without EMBED, the program loads the bundle directory at run time:
#   flashopt_optimizer_create(ctx, "<OUTPUT_DIR>/<name>", &opt);
# The directory is stored in <target>'s FLASHOPT_KERNELS_DIR property and in
# the variable FLASHOPT_KERNELS_DIR of the caller, e.g. for
#   target_compile_definitions(app PRIVATE KERNELS_DIR="${FLASHOPT_KERNELS_DIR}")
#
# With EMBED, every file of each bundle is compiled into <target> as byte
# arrays (a generated C source, or C++ when the project has no C enabled,
# written by flashopt-embed.cmake at build time; no Python needed), defining
#   const flashopt_embedded_bundle flashopt_bundle_<name>;   // C linkage
# (<name> made a C identifier) and declared in the generated header
#   #include "flashopt_bundle_<name>.h"
# which is on <target>'s include path. Use it with
#   flashopt_optimizer_create_embedded(ctx, &flashopt_bundle_<name>, &opt);
#
# flashopt-gen is FLASHOPT_GEN_EXECUTABLE (set by flashoptConfig.cmake to the
# installed one; may be overridden), or the flashopt-gen target when called
# inside the flashopt build itself. It needs a C compiler driver (`cc`, or
# $CC) to link the CPU kernels, and ptxas (optional) for cubins.
include_guard(GLOBAL)
if(CMAKE_VERSION VERSION_LESS 3.19)
  message(FATAL_ERROR "flashopt_add_kernels needs CMake 3.19 or newer (string(JSON)); "
                      "this is ${CMAKE_VERSION}")
endif()

set(_FLASHOPT_EMBED_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/flashopt-embed.cmake")

function(flashopt_add_kernels target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "EMBED" "OUTPUT_DIR;CPU"
                        "SPECS;TARGETS;DEPENDS")
  set(_fn "flashopt_add_kernels(${target})")
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "${_fn}: unknown arguments: ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT TARGET ${target})
    message(FATAL_ERROR "${_fn}: '${target}' is not a target")
  endif()
  if(NOT ARG_SPECS)
    message(FATAL_ERROR "${_fn}: no SPECS given")
  endif()

  # The generator.
  set(_gen_depends)
  if(FLASHOPT_GEN_EXECUTABLE)
    set(_gen "${FLASHOPT_GEN_EXECUTABLE}")
    list(APPEND _gen_depends "${FLASHOPT_GEN_EXECUTABLE}")
  elseif(TARGET flashopt-gen)
    set(_gen "$<TARGET_FILE:flashopt-gen>")
    list(APPEND _gen_depends flashopt-gen)
  else()
    message(FATAL_ERROR
      "${_fn}: flashopt-gen was not found. It is installed with a full "
      "(non FLASHOPT_RUNTIME_ONLY) flashopt build into <prefix>/bin; or set "
      "FLASHOPT_GEN_EXECUTABLE to its path.")
  endif()

  if(ARG_OUTPUT_DIR)
    get_filename_component(_out "${ARG_OUTPUT_DIR}" ABSOLUTE
                           BASE_DIR "${CMAKE_CURRENT_BINARY_DIR}")
  else()
    set(_out "${CMAKE_CURRENT_BINARY_DIR}/flashopt-kernels/${target}")
  endif()
  set(_flags)
  if(ARG_TARGETS)
    string(REPLACE ";" "," _t "${ARG_TARGETS}")
    list(APPEND _flags "--target=${_t}")
  endif()
  if(ARG_CPU)
    string(REPLACE ";" "," _c "${ARG_CPU}")
    list(APPEND _flags "--cpu=${_c}")
  endif()
  set(_extra_depends)
  foreach(d IN LISTS ARG_DEPENDS)
    get_filename_component(d "${d}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    list(APPEND _extra_depends "${d}")
  endforeach()

  if(ARG_EMBED)
    get_property(_langs GLOBAL PROPERTY ENABLED_LANGUAGES)
    if("C" IN_LIST _langs)
      set(_ext c)
    elseif("CXX" IN_LIST _langs)
      set(_ext cpp)
    else()
      message(FATAL_ERROR "${_fn}: EMBED needs the C or CXX language enabled")
    endif()
    set(_embed_dir "${CMAKE_CURRENT_BINARY_DIR}/flashopt-embed/${target}")
    target_include_directories(${target} PRIVATE "${_embed_dir}/include")
    if(TARGET flashopt::flashopt)
      set(_lib flashopt::flashopt)
    elseif(TARGET flashopt)
      set(_lib flashopt)
    else()
      message(FATAL_ERROR "${_fn}: EMBED needs the flashopt::flashopt target "
                          "(find_package(flashopt))")
    endif()
  endif()

  set(_manifests)
  foreach(spec IN LISTS ARG_SPECS)
    get_filename_component(spec "${spec}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    if(NOT EXISTS "${spec}")
      message(FATAL_ERROR "${_fn}: spec file ${spec} does not exist")
    endif()
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${spec}")
    file(READ "${spec}" _json)
    string(JSON _name ERROR_VARIABLE _err GET "${_json}" name)
    if(_err OR NOT _name MATCHES "^[A-Za-z0-9_.-]+$")
      message(FATAL_ERROR "${_fn}: ${spec}: no valid \"name\" (${_err}); run "
                          "flashopt-gen on it for a located error")
    endif()
    # A user rule file ("rule": {"file": "x.mlir"}, relative to the spec).
    set(_deps "${spec}")
    string(JSON _rtype ERROR_VARIABLE _err TYPE "${_json}" rule)
    if(_rtype STREQUAL "OBJECT")
      string(JSON _rfile ERROR_VARIABLE _err GET "${_json}" rule file)
      if(NOT _err AND _rfile)
        get_filename_component(_sdir "${spec}" DIRECTORY)
        get_filename_component(_rfile "${_rfile}" ABSOLUTE BASE_DIR "${_sdir}")
        list(APPEND _deps "${_rfile}")
      endif()
    endif()

    set(_bundle "${_out}/${_name}")
    set(_manifest "${_bundle}/manifest.json")
    get_property(_owner GLOBAL PROPERTY "_FLASHOPT_BUNDLE:${_manifest}")
    if(_owner)
      message(FATAL_ERROR "${_fn}: bundle ${_bundle} is already generated for "
                          "${_owner}; use another OUTPUT_DIR or spec name")
    endif()
    set_property(GLOBAL PROPERTY "_FLASHOPT_BUNDLE:${_manifest}" "${target} (${spec})")
    # A fresh directory each time, so no stale kernel (another target list)
    # is left in the bundle or embedded.
    add_custom_command(OUTPUT "${_manifest}"
      COMMAND "${CMAKE_COMMAND}" -E rm -rf "${_bundle}"
      COMMAND "${_gen}" "${spec}" -o "${_out}" ${_flags}
      DEPENDS ${_deps} ${_extra_depends} ${_gen_depends}
      COMMENT "flashopt-gen ${_name} (for ${target})"
      VERBATIM)
    list(APPEND _manifests "${_manifest}")

    if(ARG_EMBED)
      string(MAKE_C_IDENTIFIER "${_name}" _cid)
      set(_symbol "flashopt_bundle_${_cid}")
      set(_src "${_embed_dir}/flashopt_bundle_${_cid}.${_ext}")
      file(CONFIGURE OUTPUT "${_embed_dir}/include/flashopt_bundle_${_cid}.h"
        CONTENT "/* Generated by flashopt_add_kernels(${target} ... EMBED). */
#ifndef FLASHOPT_BUNDLE_${_cid}_H
#define FLASHOPT_BUNDLE_${_cid}_H
#include <flashopt/flashopt.h>
#ifdef __cplusplus
extern \"C\" {
#endif
/** The flashopt bundle '${_name}' (from ${spec}), compiled into ${target}:
 *  flashopt_optimizer_create_embedded(ctx, &${_symbol}, &opt). */
extern const flashopt_embedded_bundle ${_symbol};
#ifdef __cplusplus
}
#endif
#endif
")
      add_custom_command(OUTPUT "${_src}"
        COMMAND "${CMAKE_COMMAND}" "-DBUNDLE_DIR=${_bundle}" "-DNAME=${_name}"
                "-DSYMBOL=${_symbol}" "-DOUT=${_src}" -P "${_FLASHOPT_EMBED_SCRIPT}"
        DEPENDS "${_manifest}" "${_FLASHOPT_EMBED_SCRIPT}"
        COMMENT "Embedding flashopt bundle ${_name} into ${target}"
        VERBATIM)
      target_sources(${target} PRIVATE "${_src}")
      set_source_files_properties("${_src}" PROPERTIES
        INCLUDE_DIRECTORIES "$<TARGET_PROPERTY:${_lib},INTERFACE_INCLUDE_DIRECTORIES>")
    endif()
  endforeach()

  get_property(_n GLOBAL PROPERTY _FLASHOPT_KERNEL_TARGETS)
  if(NOT _n)
    set(_n 0)
  endif()
  math(EXPR _n "${_n} + 1")
  set_property(GLOBAL PROPERTY _FLASHOPT_KERNEL_TARGETS ${_n})
  add_custom_target(${target}-flashopt-kernels-${_n} DEPENDS ${_manifests})
  add_dependencies(${target} ${target}-flashopt-kernels-${_n})
  set_property(TARGET ${target} PROPERTY FLASHOPT_KERNELS_DIR "${_out}")
  set(FLASHOPT_KERNELS_DIR "${_out}" PARENT_SCOPE)
endfunction()
