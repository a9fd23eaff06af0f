# The Python wheel (pyproject.toml, scikit-build-core): libflashopt and the
# bundles of every shipped spec go inside the package, as flashopt/lib/
# libflashopt.so and flashopt/kernels/<spec>/, where bindings/python/flashopt
# finds them with no environment variables. Everything here is installed in
# the component "python", the only one the wheel takes.
#
# Two ways:
#  - from source (the default of `pip install .`): the project is configured
#    as usual (LLVM/MLIR 22 needed), flashopt-gen generates the bundles, and
#    flashopt_wheel_install() installs what the build made;
#  - from a build that exists (-C cmake.define.FLASHOPT_WHEEL_PREBUILT=<build
#    dir>, what the wheel test does): nothing is compiled, the library and
#    the bundles of <build dir> are packaged (flashopt_wheel_install_prebuilt).

set(FLASHOPT_WHEEL_COMPONENT python)

# Installs the library (as a plain file named libflashopt.so: ctypes loads it
# by path) and a kernels directory.
function(_flashopt_wheel_files lib kernels)
  install(FILES ${lib} DESTINATION flashopt/lib RENAME libflashopt.so
          COMPONENT ${FLASHOPT_WHEEL_COMPONENT})
  install(DIRECTORY ${kernels}/ DESTINATION flashopt/kernels
          COMPONENT ${FLASHOPT_WHEEL_COMPONENT})
endfunction()

# From source: after every target is defined.
function(flashopt_wheel_install)
  _flashopt_wheel_files($<TARGET_FILE:flashopt> ${CMAKE_BINARY_DIR}/kernels)
endfunction()

# From the build directory `dir` of an earlier build.
function(flashopt_wheel_install_prebuilt dir)
  get_filename_component(dir ${dir} ABSOLUTE)
  file(REAL_PATH ${dir}/lib/libflashopt.so lib)
  foreach(need ${lib} ${dir}/kernels/adamw_bf16_m24/manifest.json)
    if(NOT EXISTS ${need})
      message(FATAL_ERROR "FLASHOPT_WHEEL_PREBUILT=${dir}: ${need} is missing "
                          "(build the project there first: scripts/build.sh)")
    endif()
  endforeach()
  message(STATUS "flashopt wheel: packaging ${lib} and ${dir}/kernels")
  _flashopt_wheel_files(${lib} ${dir}/kernels)
  # The targets pyproject.toml builds, with nothing to do here.
  add_custom_target(flashopt)
  add_custom_target(flashopt-kernels)
endfunction()
