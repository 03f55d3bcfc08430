# SPDX-License-Identifier: Apache-2.0
# An overlay port: vcpkg install cohort --overlay-ports=<cohort>/packaging/vcpkg
# Header-only: configured once (release), installed, its CMake package moved where vcpkg wants it.
set(VCPKG_BUILD_TYPE release)

# The sources are this repository (two levels up from the port); a registry port would use
# vcpkg_from_github instead.
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
  FEATURES
    cuda COHORT_WITH_CUDA
    eigen COHORT_WITH_EIGEN
    torch COHORT_WITH_TORCH
    checkpoint COHORT_WITH_CHECKPOINT
)

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    -DCOHORT_BUILD_TESTS=OFF
    -DCOHORT_BUILD_EXAMPLES=OFF
    -DCOHORT_BUILD_BENCHMARKS=OFF
    -DCMAKE_INSTALL_DATADIR=share
    ${FEATURE_OPTIONS}
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/cohort)
vcpkg_fixup_pkgconfig()

file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug")
# vcpkg keeps a port's programs in tools/<port>, not bin/: the launcher cohort-run (a script).
file(INSTALL "${CURRENT_PACKAGES_DIR}/bin/cohort-run" DESTINATION "${CURRENT_PACKAGES_DIR}/tools/${PORT}"
     FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ
                      WORLD_EXECUTE)
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/bin")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
