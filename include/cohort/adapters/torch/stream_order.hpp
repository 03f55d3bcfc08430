// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/adapters/torch/detail/stepper.hpp>
#include <cohort/adapters/torch/module.hpp>
#include <cohort/config.hpp>

#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {

//! How cohort's work is ordered with LibTorch's. A host strategy needs nothing: the gradients are
//! CPU tensors, complete when backward returns, and reduced when cohort's call returns. A GPU
//! strategy queues its work after LibTorch's current CUDA stream and LibTorch's after it: that
//! is the specialization of <cohort/adapters/torch/cuda.hpp>, which a translation unit (nvcc's)
//! that uses a GPU strategy includes.
template <class Communicator>
struct stream_order {
  static_assert(!detail::may_reduce_device_memory<Communicator>(),
                "cohort::torch::distributed_optimizer over a GPU strategy: #include "
                "<cohort/adapters/torch/cuda.hpp> (cohort's work follows LibTorch's current "
                "CUDA stream); a run-time choice that mixes host and GPU strategies has no "
                "stream to follow: choose among GPU strategies only (any_gpu_communicator)");
  static void follow(Communicator&, const std::vector<parameter>&) noexcept {}
};

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
