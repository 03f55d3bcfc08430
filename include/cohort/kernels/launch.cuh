// SPDX-License-Identifier: Apache-2.0
#pragma once

#if !defined(__CUDACC__)
#error                                                                                             \
    "cohort/kernels/launch.cuh is CUDA: compile this translation unit with nvcc (host code uses <cohort/kernels/host.hpp>)"
#endif

#include <cohort/config.hpp>
#include <cohort/transport/cuda.hpp>

#include <algorithm>
#include <cstdint>

//! Declares a cohort kernel: hidden visibility, so that two libraries that instantiate the same
//! kernel (each in its own translation units, inside cohort's versioned namespace) never resolve
//! to each other's copy.
#define COHORT_KERNEL __global__ __attribute__((visibility("hidden")))

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace kernels::device {

inline constexpr unsigned block_size = 256;

//! Blocks for a grid-stride loop over `n` elements: enough to fill any current GPU, never more
//! than the elements need.
inline unsigned grid_size(std::uint64_t n) {
  const std::uint64_t wanted = (n + block_size - 1) / block_size;
  return static_cast<unsigned>(std::max<std::uint64_t>(1, std::min<std::uint64_t>(wanted, 65536)));
}

//! The first index of this thread and the stride of a grid-stride loop, in 64 bits.
__device__ inline std::uint64_t first_index() {
  return static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::uint64_t grid_stride() {
  return static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
}

//! Checks the launch that was just made (configuration errors show up here, not at the launch).
inline void check_launch(const char* kernel) {
  cuda::check(cudaGetLastError(), kernel);
}

} // namespace kernels::device
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
