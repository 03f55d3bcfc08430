// SPDX-License-Identifier: Apache-2.0
#pragma once

#if !defined(__CUDACC__)
#error                                                                                             \
    "cohort/kernels/reduce.cuh is CUDA: compile this translation unit with nvcc (host code reduces with <cohort/kernels/host.hpp>)"
#endif

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/kernels/functors.hpp>
#include <cohort/kernels/launch.cuh>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <cstdint>
#include <string>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace kernels::device {

template <class T>
COHORT_KERNEL void reduce_kernel(T* inout, const T* in, std::uint64_t count, reduce_op op) {
  const combine<T> f{op};
  for (std::uint64_t i = first_index(); i < count; i += grid_stride()) {
    inout[i] = f(inout[i], in[i]);
  }
}

//! `inout[i] = op(inout[i], in[i])` elementwise (same count and dtype), on `stream`.
inline void reduce(tensor_view inout, const_tensor_view in, reduce_op op, cudaStream_t stream) {
  if (inout.count != in.count || inout.type != in.type) {
    throw invalid_argument("cohort: reduce of " + std::to_string(in.count) + " " +
                           std::string(to_string(in.type)) + " elements into " +
                           std::to_string(inout.count) + " " + std::string(to_string(inout.type)) +
                           " elements");
  }
  if (in.count == 0) {
    return;
  }
  visit(inout.type, [&]<class T>(std::type_identity<T>) {
    reduce_kernel<T><<<grid_size(in.count), block_size, 0, stream>>>(
        static_cast<T*>(inout.data), static_cast<const T*>(in.data), in.count, op);
  });
  check_launch("reduce_kernel");
}

} // namespace kernels::device
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
