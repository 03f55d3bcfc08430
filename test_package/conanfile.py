# SPDX-License-Identifier: Apache-2.0
import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, cmake_layout


class CohortTestConan(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps", "CMakeToolchain"

    def requirements(self):
        # run=True: a header-library's binaries are not in its consumers' run environment
        # otherwise, and the launcher (bin/cohort-run) is one.
        self.requires(self.tested_reference_str, run=True)

    def layout(self):
        cmake_layout(self)

    def build(self):
        cmake = CMake(self)
        options = self.dependencies["cohort"].options
        components = [name for name in ("eigen", "torch", "checkpoint")
                      if options.get_safe(f"with_{name}")]
        cmake.configure(variables={"COHORT_COMPONENTS": ";".join(components)})
        cmake.build()

    def test(self):
        if can_run(self):
            trainer = os.path.join(self.cpp.build.bindir, "test_package")
            # Two ranks, allowed to share a core and to run as root (CI containers).
            mpirun = "mpirun --oversubscribe --allow-run-as-root"
            self.run(f"{mpirun} -np 2 {trainer}", env="conanrun")
            # The launcher is on the run environment's PATH, and starts the trainer too.
            self.run(f"cohort-run --mpirun '{mpirun}' --ranks-per-host 2 --max-restarts 0 -- "
                     f"{trainer}", env="conanrun")
