#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `conan create` of cohort's recipe with no Conan remote: Conan itself comes from PyPI (into a
# virtual environment under the build directory), and Boost and MPI from the system, declared in
# the profile's [platform_requires]. Runs test_package at 2 ranks. Usage:
#   tools/conan-create.sh <scratch directory>
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${1:?usage: tools/conan-create.sh <scratch directory>}
mkdir -p "$work"

if [ ! -x "$work/venv/bin/conan" ]; then
  python3 -m venv "$work/venv"
  "$work/venv/bin/pip" install --quiet --disable-pip-version-check "conan>=2,<3"
fi
export CONAN_HOME="$work/conan-home"
conan="$work/venv/bin/conan"
"$conan" profile detect --force > /dev/null

boost_version=$(sed -n 's/^#define BOOST_LIB_VERSION "\([0-9_]*\)"/\1/p' /usr/include/boost/version.hpp |
                tr _ .)
mpi_version=$(mpirun --version | sed -n 's/.*Open MPI[^0-9]*\([0-9][0-9.]*\).*/\1/p' | head -n 1)
eigen_version=$(pkg-config --modversion eigen3)
xxhash_version=$(pkg-config --modversion libxxhash)
# A three-part version, as Conan's ranges compare them.
[ "$(echo "$boost_version" | tr -cd . | wc -c)" -ge 2 ] || boost_version="$boost_version.0"
cat > "$work/system-profile" <<PROFILE
include(default)
[settings]
compiler.cppstd=20
[platform_requires]
boost/$boost_version
openmpi/$mpi_version
eigen/$eigen_version
xxhash/$xxhash_version
PROFILE

# With the Eigen adapter and checkpoints (Debian's Eigen and xxHash, declared above), so that
# test_package builds against cohort::eigen and cohort::checkpoint too.
"$conan" create "$root" --profile:all "$work/system-profile" --build=missing --no-remote \
  -o "cohort/*:with_eigen=True" -o "cohort/*:with_checkpoint=True"
