// SPDX-License-Identifier: Apache-2.0
#pragma once

#if !defined(__CUDACC__)
#error                                                                                             \
    "cohort/kernels/scale.cuh is CUDA: compile this translation unit with nvcc (host code scales with <cohort/kernels/host.hpp>)"
#endif

#include <cohort/config.hpp>
#include <cohort/kernels/batch.hpp>
#include <cohort/kernels/functors.hpp>
#include <cohort/kernels/launch.cuh>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <cstdint>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace kernels::device {

template <class T>
COHORT_KERNEL void scale_kernel(T* data, std::uint64_t count, batch_factor factor) {
  using op = scale_cast<T, T>;
  const op f{factor.get<typename op::compute>()};
  for (std::uint64_t i = first_index(); i < count; i += grid_stride()) {
    data[i] = f(data[i]);
  }
}

//! Multiplies every element of `data` by `factor` in place, on `stream`. A factor of one costs
//! nothing (no launch).
inline void scale(tensor_view data, double factor, cudaStream_t stream) {
  if (factor == 1.0 || data.count == 0) {
    return;
  }
  visit(data.type, [&]<class T>(std::type_identity<T>) {
    scale_kernel<T><<<grid_size(data.count), block_size, 0, stream>>>(
        static_cast<T*>(data.data), data.count, batch_factor{static_cast<float>(factor), factor});
  });
  check_launch("scale_kernel");
}

} // namespace kernels::device
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
