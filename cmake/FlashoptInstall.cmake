# FlashoptInstall.cmake (included at the end of runtime/CMakeLists.txt):
# installs libflashopt, its public headers and the CMake package
#   <prefix>/include/flashopt/flashopt.h, flashopt_state.h, flashopt_dist.h, flashopt.hpp
#       (not host/: internal)
#   <prefix>/lib/libflashopt.so*
#   <prefix>/lib/cmake/flashopt/flashoptConfig.cmake, flashoptConfigVersion.cmake,
#       flashoptTargets.cmake, FlashoptAddKernels.cmake, flashopt-embed.cmake
# (bin/flashopt-gen comes from tools/flashopt-gen), and writes the same
# package for the build tree into <build>/lib/cmake/flashopt, so
# -DCMAKE_PREFIX_PATH=<build> works without installing.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

add_library(flashopt::flashopt ALIAS flashopt)
set(FLASHOPT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/flashopt"
    CACHE STRING "Where the flashopt CMake package is installed (relative to the prefix)")
mark_as_advanced(FLASHOPT_INSTALL_CMAKEDIR)

install(TARGETS flashopt EXPORT flashoptTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The public headers only (a pattern, so flashopt.hpp is picked up as soon as
# it exists); include/flashopt/host/ is the internal C++ layer.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/runtime/include/flashopt
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "flashopt.h" PATTERN "flashopt_dist.h" PATTERN "flashopt_state.h"
  PATTERN "flashopt.hpp"
  PATTERN "host" EXCLUDE)
install(EXPORT flashoptTargets NAMESPACE flashopt::
  FILE flashoptTargets.cmake DESTINATION ${FLASHOPT_INSTALL_CMAKEDIR})
if(TARGET flashopt_mpi)
  set_target_properties(flashopt_mpi PROPERTIES EXPORT_NAME mpi)
  install(TARGETS flashopt_mpi EXPORT flashoptMpiTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(FILES ${PROJECT_SOURCE_DIR}/runtime/include/flashopt/flashopt_mpi.h
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flashopt)
  install(EXPORT flashoptMpiTargets NAMESPACE flashopt::
    FILE flashoptMpiTargets.cmake DESTINATION ${FLASHOPT_INSTALL_CMAKEDIR})
endif()
if(TARGET flashopt_nccl)
  set_target_properties(flashopt_nccl PROPERTIES EXPORT_NAME nccl)
  install(TARGETS flashopt_nccl EXPORT flashoptNcclTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(FILES ${PROJECT_SOURCE_DIR}/runtime/include/flashopt/flashopt_nccl.h
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flashopt)
  install(EXPORT flashoptNcclTargets NAMESPACE flashopt::
    FILE flashoptNcclTargets.cmake DESTINATION ${FLASHOPT_INSTALL_CMAKEDIR})
endif()

set(_fo_pkg ${CMAKE_CURRENT_BINARY_DIR}/flashopt-package)
set(FLASHOPT_CONFIG_BINDIR ${CMAKE_INSTALL_BINDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/flashoptConfig.cmake.in
  ${_fo_pkg}/flashoptConfig.cmake
  INSTALL_DESTINATION ${FLASHOPT_INSTALL_CMAKEDIR}
  PATH_VARS FLASHOPT_CONFIG_BINDIR)
# 0.x: only the same minor version is compatible (FLASHOPT_ABI_VERSION may change).
write_basic_package_version_file(${_fo_pkg}/flashoptConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${_fo_pkg}/flashoptConfig.cmake ${_fo_pkg}/flashoptConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FlashoptAddKernels.cmake
  ${PROJECT_SOURCE_DIR}/cmake/flashopt-embed.cmake
  DESTINATION ${FLASHOPT_INSTALL_CMAKEDIR})

# The build tree as a package: <build>/lib/cmake/flashopt (the library's
# include directory there is runtime/include, internal headers included).
set(_fo_build_pkg ${PROJECT_BINARY_DIR}/lib/cmake/flashopt)
export(EXPORT flashoptTargets NAMESPACE flashopt::
  FILE ${_fo_build_pkg}/flashoptTargets.cmake)
if(TARGET flashopt_mpi)
  export(EXPORT flashoptMpiTargets NAMESPACE flashopt::
    FILE ${_fo_build_pkg}/flashoptMpiTargets.cmake)
endif()
if(TARGET flashopt_nccl)
  export(EXPORT flashoptNcclTargets NAMESPACE flashopt::
    FILE ${_fo_build_pkg}/flashoptNcclTargets.cmake)
endif()
set(FLASHOPT_CONFIG_BINDIR ${PROJECT_BINARY_DIR}/bin)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/flashoptConfig.cmake.in
  ${_fo_build_pkg}/flashoptConfig.cmake
  INSTALL_DESTINATION lib/cmake/flashopt INSTALL_PREFIX ${PROJECT_BINARY_DIR}
  PATH_VARS FLASHOPT_CONFIG_BINDIR)
configure_file(${_fo_pkg}/flashoptConfigVersion.cmake
  ${_fo_build_pkg}/flashoptConfigVersion.cmake COPYONLY)
foreach(_f FlashoptAddKernels.cmake flashopt-embed.cmake)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${_f} ${_fo_build_pkg}/${_f} COPYONLY)
endforeach()
