// SPDX-License-Identifier: Apache-2.0
#pragma once

#if !defined(__CUDACC__)
#error                                                                                             \
    "<cohort/communicator/gpu/single_node.hpp> launches CUDA kernels: compile this translation unit with nvcc and include <cohort/cuda.hpp>"
#endif

#include <cohort/communicator/gpu/nccl_strategy.hpp>
#include <cohort/communicator/gpu/options.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <boost/mpi/communicator.hpp>

#include <string>
#include <string_view>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! NCCL inside one node (all GPUs of one machine), as `pure_nccl` does it, for jobs that never
//! span machines. Constructing it across nodes is an error on every rank, naming the node count.
class single_node : public detail::nccl_strategy<single_node> {
public:
  static constexpr std::string_view name = "single_node";

  explicit single_node(const boost::mpi::communicator& comm, communicator_options options = {},
                       gpu_options gpu = {})
      : detail::nccl_strategy<single_node>(comm, options, gpu) {
    if (inter_size() != 1) {
      throw invalid_argument("cohort: single_node on rank " + std::to_string(rank()) + ": the " +
                             std::to_string(size()) + " ranks are on " +
                             std::to_string(inter_size()) +
                             " nodes; single_node runs inside one node (use pure_nccl)");
    }
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
