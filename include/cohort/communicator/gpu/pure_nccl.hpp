// SPDX-License-Identifier: Apache-2.0
#pragma once

#if !defined(__CUDACC__)
#error                                                                                             \
    "<cohort/communicator/gpu/pure_nccl.hpp> launches CUDA kernels: compile this translation unit with nvcc and include <cohort/cuda.hpp>"
#endif

#include <cohort/communicator/gpu/nccl_strategy.hpp>
#include <cohort/communicator/gpu/options.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>

#include <boost/mpi/communicator.hpp>

#include <string_view>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! NCCL everywhere: gradients in GPU memory are packed by one kernel per bucket (in the reducer's
//! wire dtype: `compressed<float16>` halves the bytes), each bucket reduced by one NCCL all-reduce
//! over all ranks on cohort's stream and unpacked by one kernel. ChainerMN's default since v6.
class pure_nccl : public detail::nccl_strategy<pure_nccl> {
public:
  static constexpr std::string_view name = "pure_nccl";

  explicit pure_nccl(const boost::mpi::communicator& comm, communicator_options options = {},
                     gpu_options gpu = {})
      : detail::nccl_strategy<pure_nccl>(comm, options, gpu) {}
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
