# SPDX-License-Identifier: Apache-2.0
# What can be checked of the vcpkg overlay port without the vcpkg tool (which cannot be fetched
# here): the manifest parses and names the right dependencies and features, and every option the
# portfile passes exists in cohort's CMake. (The package.vcpkg_staging test runs the same
# configure and install into a staging prefix and builds a consumer against it.)
#   cmake -DSOURCE=<cohort source> -P check_vcpkg_port.cmake
cmake_minimum_required(VERSION 3.25) # policies of today in this script, IN_LIST among them
set(port ${SOURCE}/packaging/vcpkg/cohort)
file(READ ${port}/vcpkg.json manifest)

string(JSON name GET "${manifest}" name)
string(JSON version GET "${manifest}" version)
if(NOT name STREQUAL "cohort")
  message(FATAL_ERROR "vcpkg.json: name is '${name}', not 'cohort'")
endif()
file(STRINGS ${SOURCE}/CMakeLists.txt project_line REGEX "^project\\(cohort VERSION")
string(REGEX MATCH "VERSION ([0-9.]+)" _ "${project_line}")
if(NOT version STREQUAL CMAKE_MATCH_1)
  message(FATAL_ERROR "vcpkg.json: version ${version}, but CMakeLists.txt says ${CMAKE_MATCH_1}")
endif()

function(dependencies json out)
  set(names)
  string(JSON count LENGTH "${json}")
  if(count GREATER 0)
    math(EXPR last "${count} - 1")
    foreach(i RANGE ${last})
      string(JSON type TYPE "${json}" ${i})
      if(type STREQUAL "STRING")
        string(JSON item GET "${json}" ${i})
      else()
        string(JSON item GET "${json}" ${i} name)
      endif()
      list(APPEND names ${item})
    endforeach()
  endif()
  set(${out} ${names} PARENT_SCOPE)
endfunction()

string(JSON top GET "${manifest}" dependencies)
dependencies("${top}" top_names)
foreach(required IN ITEMS boost-mpi boost-serialization mpi vcpkg-cmake vcpkg-cmake-config)
  if(NOT required IN_LIST top_names)
    message(FATAL_ERROR "vcpkg.json: '${required}' missing from the dependencies (${top_names})")
  endif()
endforeach()
string(JSON cuda_deps GET "${manifest}" features cuda dependencies)
dependencies("${cuda_deps}" cuda_names)
string(JSON nccl_deps GET "${manifest}" features nccl dependencies)
dependencies("${nccl_deps}" nccl_names)
if(NOT "cuda" IN_LIST cuda_names OR NOT "nccl" IN_LIST nccl_names OR
   NOT "cohort" IN_LIST nccl_names)
  message(FATAL_ERROR "vcpkg.json: feature cuda needs the port cuda (${cuda_names}); "
                      "feature nccl needs nccl and cohort[cuda] (${nccl_names})")
endif()

# The adapters' features name the vcpkg ports of their libraries.
foreach(feature IN ITEMS eigen:eigen3 torch:libtorch checkpoint:xxhash)
  string(REPLACE ":" ";" pair ${feature})
  list(GET pair 0 feature_name)
  list(GET pair 1 port_name)
  string(JSON feature_deps GET "${manifest}" features ${feature_name} dependencies)
  dependencies("${feature_deps}" feature_names)
  if(NOT port_name IN_LIST feature_names)
    message(FATAL_ERROR "vcpkg.json: feature ${feature_name} needs the port ${port_name} "
                        "(${feature_names})")
  endif()
endforeach()

# Every -DCOHORT_* the portfile passes, and every feature option, is an option of cohort's CMake.
file(READ ${port}/portfile.cmake portfile)
string(REGEX MATCHALL "COHORT_[A-Z_]+" used "${portfile}")
list(REMOVE_DUPLICATES used)
file(READ ${SOURCE}/CMakeLists.txt cmake)
foreach(option IN LISTS used)
  if(NOT cmake MATCHES "option\\(${option} ")
    message(FATAL_ERROR "portfile.cmake passes ${option}, which CMakeLists.txt does not define")
  endif()
endforeach()
message(STATUS "vcpkg port: manifest and options agree (${used})")
