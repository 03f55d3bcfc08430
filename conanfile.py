# SPDX-License-Identifier: Apache-2.0
import os

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout
from conan.tools.files import copy

required_conan_version = ">=2.0"


class CohortConan(ConanFile):
    name = "cohort"
    version = "0.1.0"
    description = "Header-only C++20 data-parallel training over MPI and NCCL"
    license = "Apache-2.0"
    topics = ("mpi", "nccl", "cuda", "distributed-training", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    # The components a consumer may ask for. The headers and the CMake package are the same
    # either way (CUDA and NCCL are found on the consumer's machine, as CMake's components do):
    # these options only say which components the package declares.
    # with_eigen requires Eigen and with_checkpoint xxHash (ConanCenter's, or the system's through
    # [platform_requires]);
    # with_torch declares cohort::torch over the LibTorch that cohort's CMake package finds on the
    # consumer's machine (Torch_DIR): LibTorch is not on ConanCenter.
    options = {"with_cuda": [True, False], "with_nccl": [True, False],
               "with_eigen": [True, False], "with_torch": [True, False],
               "with_checkpoint": [True, False]}
    default_options = {"with_cuda": False, "with_nccl": False, "with_eigen": False,
                       "with_torch": False, "with_checkpoint": False}
    exports_sources = "CMakeLists.txt", "LICENSE", "cmake/*", "include/*", "tools/cohort-run"

    def config_options(self):
        pass

    def configure(self):
        if self.options.with_nccl:
            self.options.with_cuda = True

    def layout(self):
        cmake_layout(self)

    def requirements(self):
        # Public headers include both, so both are transitive. ConanCenter's Boost builds without
        # MPI by default: take both from the system with [platform_requires] (docs/packaging.md).
        self.requires("boost/[>=1.74]", transitive_headers=True)
        self.requires("openmpi/[>=4.1]", transitive_headers=True)
        if self.options.with_eigen:
            self.requires("eigen/[>=3.4]", transitive_headers=True)
        if self.options.with_checkpoint:
            self.requires("xxhash/[>=0.8]", transitive_headers=True)

    def package_id(self):
        self.info.clear()

    def validate(self):
        check_min_cppstd(self, 20)

    def generate(self):
        toolchain = CMakeToolchain(self)
        toolchain.cache_variables["COHORT_BUILD_TESTS"] = False
        toolchain.cache_variables["COHORT_BUILD_EXAMPLES"] = False
        toolchain.cache_variables["COHORT_BUILD_BENCHMARKS"] = False
        toolchain.cache_variables["COHORT_WITH_CUDA"] = bool(self.options.with_cuda)
        toolchain.cache_variables["COHORT_WITH_EIGEN"] = bool(self.options.with_eigen)
        toolchain.cache_variables["COHORT_WITH_TORCH"] = bool(self.options.with_torch)
        toolchain.cache_variables["COHORT_WITH_CHECKPOINT"] = bool(self.options.with_checkpoint)
        toolchain.cache_variables["CMAKE_INSTALL_DATADIR"] = "share"
        toolchain.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        CMake(self).install()

    def package_info(self):
        # Consumers use cohort's own CMake package (share/cmake/cohort), which finds MPI, Boost
        # and, per component, CUDA and NCCL: the same targets as without Conan.
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.builddirs = ["."]
        self.cpp_info.set_property("pkg_config_name", "cohort")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        base = self.cpp_info.components["cohort"]
        base.set_property("cmake_target_name", "cohort::cohort")
        base.requires = ["boost::boost", "openmpi::openmpi"]
        # With components, Conan reads the build directories of the components: the package
        # root goes on CMAKE_PREFIX_PATH, where share/cmake/cohort is found.
        base.builddirs = ["."]
        # bin/cohort-run, the launcher: on the PATH of the run environment of a consumer that
        # requires cohort with run=True (a header-library is not "run" by default).
        base.bindirs = ["bin"]
        base.libdirs = []
        # The GPU components: name, wanted, what it builds on, the system library it links.
        for name, wanted, builds_on, library in (
            ("cuda", self.options.with_cuda, "cohort", "cudart"),
            ("nccl", self.options.with_nccl, "cuda", "nccl"),
        ):
            if not wanted:
                continue
            component = self.cpp_info.components[name]
            component.set_property("cmake_target_name", f"cohort::{name}")
            component.requires = [builds_on]
            component.system_libs = [library]
            component.bindirs = []
            component.libdirs = []
        # The adapters: Eigen from its package, LibTorch found by cohort's CMake package.
        if self.options.with_eigen:
            eigen = self.cpp_info.components["eigen"]
            eigen.set_property("cmake_target_name", "cohort::eigen")
            eigen.requires = ["cohort", "eigen::eigen"]
            eigen.bindirs = []
            eigen.libdirs = []
        if self.options.with_checkpoint:
            checkpoint = self.cpp_info.components["checkpoint"]
            checkpoint.set_property("cmake_target_name", "cohort::checkpoint")
            checkpoint.requires = ["cohort", "xxhash::xxhash"]
            checkpoint.bindirs = []
            checkpoint.libdirs = []
        if self.options.with_torch:
            torch = self.cpp_info.components["torch"]
            torch.set_property("cmake_target_name", "cohort::torch")
            torch.requires = ["cohort"]
            torch.bindirs = []
            torch.libdirs = []
