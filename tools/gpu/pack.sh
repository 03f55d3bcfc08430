#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The device kit, packed: cohort's GPU tests, examples/gpu_mlp, the benchmarks' GPU rows and CUDA
# LibTorch's test, built here with nvcc (for sm_90, the H100's and H200's: CMAKE_CUDA_ARCHITECTURES,
# 90 alone on a machine without a GPU, else 75, 80 and 90), and with them the runtime a bare GPU machine lacks: Open MPI's launcher, libraries,
# plugins and help files, PMIx, hwloc, libevent, Boost.MPI, Boost.Serialization, Boost.Test
# (whatever `ldd` resolves outside the C and C++ runtimes), and the CUDA runtime (0.7 MB). NCCL
# (208 MB) and LibTorch (over 1 GB) are not carried: tools/gpu/run.sh loads the device machine's
# own, from its PyTorch wheel, which must be the version the torch test was built against
# (--torch-build). One folder, at most 60 MiB; tools/gpu/run.sh runs it (docs/gpu.md).
#
#   tools/gpu/pack.sh [--build DIR] [--torch-build DIR] [--out DIR] [--no-build]
#
# --build: a configured cohort build with CUDA, tests, examples and benchmarks (default: build/,
#   tools/dev.sh's); its kit targets are built first unless --no-build.
# --torch-build: a build configured against a CUDA LibTorch, whose test_gpu_torch is packed
#   (`tools/torch-wheel.sh WORK ==VERSION --build-only test_gpu_torch` makes WORK/build); without
#   it the kit has no CUDA LibTorch case.
# --out: the kit's folder (default: gpu-kit/, git-ignored); emptied first.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$root/build
torch_build=
out=$root/gpu-kit
do_build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$(realpath "$2"); shift 2 ;;
    --torch-build) torch_build=$(realpath "$2"); shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --no-build) do_build=0; shift ;;
    *) echo "pack.sh: unknown argument $1 (known: --build, --torch-build, --out, --no-build)" >&2
       exit 2 ;;
  esac
done
limit_mib=60

# What the kit runs, by build-tree path. The host cases (kernels' host oracle, the checks made
# before touching a GPU, one collective over the relocated Open MPI) run anywhere and prove the
# kit's runtime; the rest are skipped without a GPU.
targets=(test/gpu/test_gpu_instantiate test/gpu/test_gpu_kernels test/gpu/test_gpu_strategies
         test/gpu/test_gpu_distributed_optimizer test/gpu/test_gpu_without_device
         test/test_kernels_host examples/gpu_mlp bench/bench_allreduce
         bench/bench_gpu_kernels bench/bench_gpu_info)
if [ ! -f "$build/CMakeCache.txt" ]; then
  echo "pack.sh: $build is not a configured cohort build (tools/dev.sh test or gpu-pack makes one)" >&2
  exit 1
fi
if [ "$do_build" = 1 ]; then
  cmake --build "$build" -j "$(nproc)" --target "${targets[@]##*/}"
  if [ -n "$torch_build" ]; then
    cmake --build "$torch_build" -j "$(nproc)" --target test_gpu_torch
  fi
fi

# The architectures nvcc compiled for (from the Makefile or Ninja build files): the H100 needs
# sm_90's code (PTX of an older one would be compiled at load time, and timed so).
architectures=$(cat "$build"/test/gpu/CMakeFiles/test_gpu_kernels.dir/flags.make \
                  "$build"/build.ninja 2>/dev/null | grep -oE 'sm_[0-9]+a?' | sort -u | tr '\n' ' ' || true)
if [[ " $architectures" != *" sm_90 "* ]]; then
  echo "pack.sh: the build has no sm_90 code (architectures: ${architectures:-unknown}); configure with CMAKE_CUDA_ARCHITECTURES including 90" >&2
  exit 1
fi
# (Emptied only if it is a kit already, or nothing; a kit being packed is marked so from the start,
# so that a pack that failed halfway can be packed again.)
if [ -e "$out" ] && [ ! -f "$out/MANIFEST" ]; then
  echo "pack.sh: $out exists and is not a device kit: not emptying it" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out"
echo "cohort device kit, incomplete: its packing did not finish" > "$out/MANIFEST"
mkdir -p "$out/bin" "$out/lib" "$out/openmpi/bin" "$out/openmpi/lib" "$out/openmpi/share" \
  "$out/openmpi/etc" "$out/pmix/lib" "$out/pmix/share"
for t in "${targets[@]}"; do
  if [ ! -x "$build/$t" ]; then
    echo "pack.sh: $build/$t is missing (a build without nvcc or NCCL has no GPU targets)" >&2
    exit 1
  fi
  cp "$build/$t" "$out/bin/"
done
if [ -n "$torch_build" ]; then
  cp "$torch_build/test/gpu/test_gpu_torch" "$out/bin/"
  # The version run.sh must find on the device machine (the wheel's torch/version.py).
  torch_dir=$(sed -n 's/^Torch_DIR[^=]*=//p' "$torch_build/CMakeCache.txt")
  sed -n "s/^__version__ = '\(.*\)'/\1/p" "$torch_dir/../../../version.py" > "$out/torch-version.txt"
  [ -s "$out/torch-version.txt" ] || { echo "pack.sh: no LibTorch version beside $torch_dir" >&2; exit 1; }
fi

# Libraries the device machine has (the C and C++ runtimes of any Linux since glibc 2.36) or
# brings itself (NCCL, LibTorch and the CUDA libraries LibTorch loads, from its PyTorch wheel).
is_provided() {
  case "$(basename "$1")" in
    linux-vdso.so.* | ld-linux-*.so.* | libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | \
      librt.so.* | libutil.so.* | libresolv.so.* | libstdc++.so.* | libgcc_s.so.* | libz.so.*) return 0 ;;
    libnccl.so.* | libtorch*.so* | libc10*.so* | libcuda.so.* | libcublas*.so.* | libcudnn*.so.* | \
      libcufft*.so.* | libcurand*.so.* | libcusolver*.so.* | libcusparse*.so.* | libnvrtc*.so.* | \
      libnvJitLink*.so.* | libnvToolsExt*.so.* | libcupti*.so.* | libnvshmem*.so.* | \
      libcufile*.so.* | libgomp*.so.* | libshm.so | libcaffe2*.so) return 0 ;;
  esac
  return 1
}
# Copies every library `file` needs that the device machine lacks into lib/ (under its soname,
# the name the loader asks for); fails on one that is not found here.
carry_libraries() {
  local file=$1 name path
  while read -r name path; do
    is_provided "$name" && continue
    if [ "$path" = "not" ] || [ -z "$path" ]; then
      echo "pack.sh: $file needs $name, which is not found here" >&2
      return 1
    fi
    [ -e "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
  done < <(ldd "$file" | awk '/=>/ { print $1, $3 } !/=>/ { print $1, "" }' | grep -v '^/')
}
for f in "$out"/bin/*; do
  carry_libraries "$f"
done

# Open MPI, relocated (run.sh sets OPAL_PREFIX and its directories): the launcher, the plugins
# whose libraries the kit has (not the InfiniBand, UCX, PSM or libfabric transports: a single
# machine's shared memory and TCP are what run), their help texts and default parameters.
ompi_plugins=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n 's/^path:pkglibdir://p')
ompi_data=$(ompi_info --path pkgdatadir --parsable 2>/dev/null | sed -n 's/^path:pkgdatadir://p')
ompi_sysconf=$(ompi_info --path sysconfdir --parsable 2>/dev/null | sed -n 's/^path:sysconfdir://p')
[ -d "$ompi_plugins" ] || { echo "pack.sh: Open MPI's plugin folder not found (ompi_info)" >&2; exit 1; }
cp -L "$(command -v orterun || command -v mpirun)" "$out/openmpi/bin/mpirun"
carry_libraries "$out/openmpi/bin/mpirun"
mkdir -p "$out/openmpi/lib/plugins"
allowed='^(libmpi|libopen-rte|libopen-pal|libpmix|libhwloc|libudev|libevent_core|libevent_pthreads|libmca_common_sm|libmca_common_monitoring|libmca_common_ompio|libmunge)[-.]'
kept=0 left=()
for plugin in "$ompi_plugins"/*.so; do
  ok=1
  while read -r name; do
    is_provided "$name" && continue
    [[ "$name" =~ $allowed ]] || { ok=0; break; }
  done < <(ldd "$plugin" | awk '{ print $1 }')
  if [ "$ok" = 1 ]; then
    cp "$plugin" "$out/openmpi/lib/plugins/"
    carry_libraries "$plugin"
    kept=$((kept + 1))
  else
    left+=("$(basename "$plugin" .so)")
  fi
done
cp -r "$ompi_data" "$out/openmpi/share/openmpi"
cp "$ompi_sysconf"/openmpi-mca-params.conf "$out/openmpi/etc/" 2>/dev/null || true
# PMIx, Open MPI's process-management library, relocated too (PMIX_PREFIX and friends).
pmix_lib=$(for p in "$out"/openmpi/lib/plugins/mca_pmix_*.so; do [ -e "$p" ] && ldd "$p"; done |
           awk '$1 ~ /^libpmix/ && !seen++ { print $3 }' || true)
pmix_root=$(dirname "$(dirname "$(readlink -f "${pmix_lib:-/nonexistent}")")")
if [ -d "$pmix_root/lib/pmix" ]; then
  cp -r "$pmix_root/lib/pmix" "$out/pmix/lib/pmix"
  for plugin in "$out"/pmix/lib/pmix/*.so; do carry_libraries "$plugin"; done
  [ -d "$pmix_root/share/pmix" ] && cp -r "$pmix_root/share/pmix" "$out/pmix/share/pmix"
  [ -f "$pmix_root/share/pmix-mca-params.conf" ] && cp "$pmix_root/share/pmix-mca-params.conf" "$out/pmix/share/"
fi

mib=$(( $(du -sk "$out" | cut -f1) / 1024 ))
{
  echo "cohort device kit, packed $(date -u +%Y-%m-%dT%H:%MZ) from $(git -C "$root" describe --always --dirty 2>/dev/null || echo "?")"
  echo "cuda architectures: $architectures"
  echo "uncommitted changes: $(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | wc -l) files ($(git -C "$root" diff HEAD 2>/dev/null | sha256sum | cut -c1-12))"
  echo "nvcc: $(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")/\1/p' "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake | head -n 1)"
  echo "open mpi: $(ompi_info --version 2>/dev/null | head -n 1), $kept plugins (left out: ${left[*]})"
  echo "carried libraries: $(ls "$out/lib" | tr '\n' ' ')"
  echo "size: $mib MiB (limit $limit_mib)"
} > "$out/MANIFEST"
cat "$out/MANIFEST"
if [ "$mib" -gt "$limit_mib" ]; then
  echo "pack.sh: the kit is $mib MiB, over its limit of $limit_mib MiB" >&2
  exit 1
fi
