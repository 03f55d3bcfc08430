// SPDX-License-Identifier: Apache-2.0
// What the device kit (tools/gpu/run.sh) reports first: the GPUs this process sees, the CUDA
// driver and runtime, the NCCL library that was loaded (the device machine's own) and whether
// the MPI library is CUDA-aware. One `key: value` line each; never fails for want of a GPU.

#include <cohort/kernels/scale.cuh>
#include <cohort/transport/cuda_aware_mpi.hpp>

#include <boost/mpi/environment.hpp>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>

namespace {
void print_version(const char* what, int v) {
  std::printf("%s: %d.%d\n", what, v / 1000, v % 1000 / 10);
}
} // namespace

int main(int argc, char** argv) {
  boost::mpi::environment env(argc, argv);
  int driver = 0, runtime = 0, nccl = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  print_version("cuda driver", driver);
  print_version("cuda runtime", runtime);
  if (ncclGetVersion(&nccl) == ncclSuccess) {
    std::printf("nccl: %d.%d.%d\n", nccl / 10000, nccl / 100 % 100, nccl % 100);
  }
  std::printf("mpi cuda-aware: %s\n", cohort::mpi_is_cuda_aware() ? "yes" : "no");
  // Why no device is seen, when none is: the kit's run fails a machine that has a GPU whose
  // CUDA sees none (a driver older than this runtime, no access to /dev/nvidia*).
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    std::printf("gpu: none (cudaGetDeviceCount: %s)\n", cudaGetErrorString(e));
    count = 0;
  } else if (count == 0) {
    std::printf("gpu: none\n");
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
      std::printf("gpu: %d %s (sm_%d%d, %zu MiB)\n", i, prop.name, prop.major, prop.minor,
                  prop.totalGlobalMem >> 20);
    }
  }
  // Which of the fat binary's images this device runs: its own architecture's machine code, or
  // PTX compiled at load time (an architecture the build did not name).
  if (count > 0) {
    cudaFuncAttributes kernel{};
    if (cudaFuncGetAttributes(&kernel, cohort::kernels::device::scale_kernel<float>) ==
        cudaSuccess) {
      std::printf("kernel image: sm_%d (PTX %d)\n", kernel.binaryVersion, kernel.ptxVersion);
    }
  }
  return 0;
}
