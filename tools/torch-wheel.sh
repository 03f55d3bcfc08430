#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# cohort's LibTorch adapter against the LibTorch of PyTorch's wheel on PyPI (2.x, CUDA-enabled),
# beside Debian's 1.13 that the test suite uses: downloads the wheel (no dependencies: it ships
# LibTorch's headers, libraries and CMake package), configures cohort with it, builds the
# adapter's tests and the torch_mnist example, and runs them on the CPU at 1 to 3 ranks; builds
# CUDA LibTorch's test over the GPU strategies with nvcc (adapters/torch/cuda.hpp), which runs
# where each rank has a GPU and is skipped elsewhere. The
# wheel's LibTorch links its CUDA libraries into every binary: those /usr/local/cuda lacks come
# from their own wheels. Not part of CI (the wheels are 0.9 GB); see docs/libtorch.md for the last
# result.
#
#   tools/torch-wheel.sh [WORK_DIR] [VERSION_SPEC] [--build-only TARGET...]
#     (defaults: /tmp/cohort-torch-wheel, ">=2.1,<3"; --build-only builds those targets and runs
#     nothing: the device kit's CUDA LibTorch test, tools/gpu/pack.sh --torch-build WORK_DIR/build)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${1:-/tmp/cohort-torch-wheel}
spec=${2:->=2.1,<3}
shift $(($# < 2 ? $# : 2))
build_only=()
if [ "${1:-}" = --build-only ]; then
  shift
  build_only=("$@")
fi
mkdir -p "$work"

if [ ! -d "$work/wheel/torch" ]; then
  python3 -m pip download --quiet --no-deps --dest "$work" "torch$spec"
  wheel=$(ls "$work"/torch-*.whl | head -n 1)
  mkdir -p "$work/wheel"
  python3 -m zipfile -e "$wheel" "$work/wheel"
fi
torch=$work/wheel/torch
# The CUDA libraries libtorch_cuda needs (LibTorch links it into every binary to register its
# operators) that a CUDA toolkit does not ship: cuSPARSELt, NVSHMEM and cuFile, from their own
# wheels, at the versions the torch wheel asks for.
if [ ! -d "$work/cudalibs/nvidia" ]; then
  metadata=$(python3 - "$(ls "$work"/torch-*.whl | head -n 1)" <<'PY'
import sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
print(wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode())
PY
)
  pins=$(sed -n 's/^Requires-Dist: \(nvidia-\(cusparselt\|nvshmem\)[^;]*\);.*/\1/p' <<<"$metadata" |
         tr -d ' ')
  mkdir -p "$work/cudalibs"
  python3 -m pip download --quiet --no-deps --dest "$work/cudalibs" $pins nvidia-cufile
  for w in "$work"/cudalibs/*.whl; do python3 -m zipfile -e "$w" "$work/cudalibs"; done
fi
extra_libs=$(find "$work/cudalibs/nvidia" -type d -name lib | paste -sd: -)
version=$(sed -n 's/^__version__ = .\([^"]*\)./\1/p' "$torch/version.py" 2>/dev/null || true)
echo "torch-wheel: LibTorch ${version:-?} from $torch"

# The wheel's package first: Debian's, if installed, sits on the default search path.
cuda_libs=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64:$extra_libs
cmake -S "$root" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DCOHORT_BUILD_TESTS=ON \
  -DCOHORT_BUILD_EXAMPLES=ON -DCOHORT_BUILD_BENCHMARKS=OFF -DCOHORT_WITH_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$torch" -DCaffe2_DIR="$torch/share/cmake/Caffe2" \
  -DTorch_DIR="$torch/share/cmake/Torch" \
  `# LibTorch's package adds nvcc flags for its own list, which without a GPU to ask starts at` \
  `# sm_50, which CUDA 13 dropped: cohort's architectures instead.` \
  -DTORCH_CUDA_ARCH_LIST="7.5;8.0;9.0" \
  "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed -Wl,--allow-shlib-undefined -Wl,-rpath-link,$cuda_libs"
if [ ${#build_only[@]} -gt 0 ]; then
  cmake --build "$work/build" -j "$(nproc)" --target "${build_only[@]}"
  exit 0
fi
cmake --build "$work/build" -j "$(nproc)" --target test_adapters_torch torch_mnist \
  test_headers_torch_cuda test_gpu_torch
export LD_LIBRARY_PATH=$torch/lib:$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
(cd "$work/build" && ctest --output-on-failure -R '^(adapters\.torch|examples\.torch_mnist|gpu\.torch)')
