# SPDX-License-Identifier: Apache-2.0
# FindxxHash: xxHash's header, for cohort's checkpoint checksums (XXH3, xxHash 0.8 or later).
# cohort inlines xxHash (XXH_INLINE_ALL), so the header is all it needs. Takes xxHash's own CMake
# package where there is one (vcpkg, Conan), else finds xxhash.h (Debian's libxxhash-dev ships no
# CMake package) in xxHash_ROOT or the system's directories.
#
# Result: xxHash_FOUND, xxHash_VERSION, and the imported target xxHash::xxhash.

find_package(xxHash CONFIG QUIET)
if(TARGET xxHash::xxhash)
  get_target_property(_xxhash_includes xxHash::xxhash INTERFACE_INCLUDE_DIRECTORIES)
  find_path(xxHash_INCLUDE_DIR xxhash.h HINTS ${_xxhash_includes} NO_DEFAULT_PATH)
endif()
find_path(xxHash_INCLUDE_DIR xxhash.h HINTS $ENV{xxHash_ROOT} ${xxHash_ROOT}
          PATH_SUFFIXES include)

if(xxHash_INCLUDE_DIR AND EXISTS "${xxHash_INCLUDE_DIR}/xxhash.h")
  file(STRINGS "${xxHash_INCLUDE_DIR}/xxhash.h" _xxhash_version_lines
       REGEX "^#define XXH_VERSION_(MAJOR|MINOR|RELEASE) +[0-9]+")
  foreach(_part MAJOR MINOR RELEASE)
    string(REGEX REPLACE ".*#define XXH_VERSION_${_part} +([0-9]+).*" "\\1" _xxhash_${_part}
           "${_xxhash_version_lines}")
  endforeach()
  set(xxHash_VERSION "${_xxhash_MAJOR}.${_xxhash_MINOR}.${_xxhash_RELEASE}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(xxHash REQUIRED_VARS xxHash_INCLUDE_DIR
                                  VERSION_VAR xxHash_VERSION)

if(xxHash_FOUND AND NOT TARGET xxHash::xxhash)
  add_library(xxHash::xxhash INTERFACE IMPORTED)
  set_target_properties(xxHash::xxhash PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${xxHash_INCLUDE_DIR}")
endif()
mark_as_advanced(xxHash_INCLUDE_DIR)
