// SPDX-License-Identifier: Apache-2.0
#pragma once

#if !defined(__CUDACC__)
#error                                                                                             \
    "cohort/kernels/cast.cuh is CUDA: compile this translation unit with nvcc (host code casts with <cohort/kernels/host.hpp>)"
#endif

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/kernels/functors.hpp>
#include <cohort/kernels/launch.cuh>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <cstdint>
#include <string>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace kernels::device {

template <class From, class To>
COHORT_KERNEL void cast_kernel(const From* source, To* target, std::uint64_t count) {
  for (std::uint64_t i = first_index(); i < count; i += grid_stride()) {
    target[i] = convert<To>(source[i]);
  }
}

//! Converts `source` into `target` elementwise (same count, any dtypes; fp32 to fp16 and bf16
//! rounds to nearest even), on `stream`.
inline void cast(const_tensor_view source, tensor_view target, cudaStream_t stream) {
  if (source.count != target.count) {
    throw invalid_argument("cohort: cast from " + std::to_string(source.count) + " elements to " +
                           std::to_string(target.count));
  }
  if (source.count == 0) {
    return;
  }
  visit(source.type, [&]<class From>(std::type_identity<From>) {
    visit(target.type, [&]<class To>(std::type_identity<To>) {
      cast_kernel<From, To><<<grid_size(source.count), block_size, 0, stream>>>(
          static_cast<const From*>(source.data), static_cast<To*>(target.data), source.count);
    });
  });
  check_launch("cast_kernel");
}

} // namespace kernels::device
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
