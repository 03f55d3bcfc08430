// SPDX-License-Identifier: Apache-2.0
#pragma once

#if !defined(__CUDACC__)
#error                                                                                             \
    "<cohort/communicator/gpu/any_communicator.hpp> launches CUDA kernels: compile this translation unit with nvcc and include <cohort/nccl.hpp>"
#endif

#include <cohort/communicator/any_communicator.hpp>
#include <cohort/communicator/gpu/cuda_aware_flat.hpp>
#include <cohort/communicator/gpu/host_staged.hpp>
#include <cohort/communicator/gpu/pure_nccl.hpp>
#include <cohort/communicator/gpu/single_node.hpp>
#include <cohort/communicator/gpu/two_level.hpp>
#include <cohort/communicator/links.hpp>
#include <cohort/config.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The GPU strategies by name: "pure_nccl", "single_node", "hierarchical" and "two_dimensional"
//! (NCCL inside the node), "host_staged" (ChainerMN's non_cuda_aware) and "cuda_aware_flat".
//! Their gradients are reduced in one call per step, so this one does not overlap with backward.
using any_gpu_communicator =
    basic_any_communicator<pure_nccl, single_node, hierarchical<nccl_links>,
                           two_dimensional<nccl_links>, host_staged, cuda_aware_flat>;

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
