# SPDX-License-Identifier: Apache-2.0
# The package: headers, the cohort-run launcher, one export set per component (cohort, and cuda and nccl where they were
# found), the config and version files, FindNCCL (NCCL ships no CMake package) and a pkg-config
# file. The same files are written to the build tree, so that a consumer can use it directly.

include(CMakePackageConfigHelpers)
set(COHORT_CMAKE_DIR ${CMAKE_INSTALL_DATADIR}/cmake/cohort)

install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The launcher that restarts a job on the hosts left (docs/launcher.md): a Python 3 script.
install(PROGRAMS tools/cohort-run DESTINATION ${CMAKE_INSTALL_BINDIR})

set(COHORT_COMPONENTS_BUILT)
foreach(component IN ITEMS cohort cuda nccl eigen torch checkpoint)
  if(component STREQUAL "cohort")
    set(target cohort)
    set(set_name cohort-targets)
  else()
    set(target cohort_${component})
    set(set_name cohort-${component}-targets)
  endif()
  if(NOT TARGET ${target})
    continue()
  endif()
  list(APPEND COHORT_COMPONENTS_BUILT ${component})
  install(TARGETS ${target} EXPORT ${set_name})
  install(EXPORT ${set_name} NAMESPACE cohort:: DESTINATION ${COHORT_CMAKE_DIR})
  export(EXPORT ${set_name} NAMESPACE cohort:: FILE ${PROJECT_BINARY_DIR}/${set_name}.cmake)
endforeach()

configure_package_config_file(cmake/cohort-config.cmake.in
  ${PROJECT_BINARY_DIR}/cohort-config.cmake INSTALL_DESTINATION ${COHORT_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cohort-config-version.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
configure_file(cmake/FindNCCL.cmake ${PROJECT_BINARY_DIR}/FindNCCL.cmake COPYONLY)
configure_file(cmake/FindxxHash.cmake ${PROJECT_BINARY_DIR}/FindxxHash.cmake COPYONLY)
install(FILES ${PROJECT_BINARY_DIR}/cohort-config.cmake
              ${PROJECT_BINARY_DIR}/cohort-config-version.cmake
              cmake/FindNCCL.cmake cmake/FindxxHash.cmake
        DESTINATION ${COHORT_CMAKE_DIR})

# pkg-config, for build systems that are not CMake: the compile and link flags of MPI and
# Boost.MPI as this configuration found them.
set(COHORT_PC_CFLAGS "-std=c++20")
foreach(dir IN LISTS MPI_CXX_INCLUDE_DIRS)
  string(APPEND COHORT_PC_CFLAGS " -I${dir}")
endforeach()
foreach(option IN LISTS MPI_CXX_COMPILE_OPTIONS)
  string(APPEND COHORT_PC_CFLAGS " ${option}")
endforeach()
set(COHORT_PC_LIBS "-lboost_mpi -lboost_serialization")
foreach(library IN LISTS MPI_CXX_LIBRARIES)
  string(APPEND COHORT_PC_LIBS " ${library}")
endforeach()
if(Boost_LIBRARY_DIRS)
  list(GET Boost_LIBRARY_DIRS 0 boost_library_dir)
  string(PREPEND COHORT_PC_LIBS "-L${boost_library_dir} ")
endif()
configure_file(cmake/cohort.pc.in ${PROJECT_BINARY_DIR}/cohort.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cohort.pc DESTINATION ${CMAKE_INSTALL_DATADIR}/pkgconfig)
