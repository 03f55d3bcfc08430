// SPDX-License-Identifier: Apache-2.0
#pragma once

// CUDA LibTorch with cohort's GPU strategies (pure_nccl, single_node, host_staged...): cohort's
// work is queued after LibTorch's current stream of the parameters' device, and LibTorch's later
// work after cohort's, with events (cohort's device_streams), at every reduction and broadcast.
// The current stream is read at each call, so a trainer that runs under a
// `c10::cuda::CUDAStreamGuard` is followed onto its stream.
//
// No `recordStream` is needed: cohort reads and writes the gradients and parameters on its own
// stream only between two events of the current stream, which waits for cohort's work before
// anything queued after the call. Memory the caching allocator frees later is reused on that
// stream, after cohort's work; cohort's own buffers are its own allocations, not the cache's.
//
// For a translation unit compiled by nvcc (the GPU strategies launch cohort's kernels), with a
// LibTorch whose headers nvcc compiles as C++20: 2.x. LibTorch 1.13's do not (ATen's
// `std::vector<IValue>` of an incomplete type, which C++20's constexpr destructors reject).

#include <cohort/adapters/torch/distributed_optimizer.hpp>
#include <cohort/adapters/torch/module.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/transport/cuda.hpp>

#include <cuda_runtime_api.h>

#include <c10/cuda/CUDAStream.h>
#include <sstream>
#include <string>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {

//! The one CUDA device of `params` (a data-parallel rank drives one GPU). Throws
//! `invalid_argument` naming a parameter that is elsewhere: on the CPU or on another device,
//! or on a device other than the current one, where cohort's streams and NCCL communicator are.
inline c10::Device cuda_device_of(const std::vector<parameter>& params, int rank) {
  const int current = cuda::current_device();
  for (const parameter& p : params) {
    const c10::Device device = p.value.device();
    if (!device.is_cuda() || device.index() != current) {
      std::ostringstream where;
      where << device;
      throw invalid_argument("cohort::torch on rank " + std::to_string(rank) + ": parameter " +
                             p.name + " is on " + where.str() +
                             ", not on the current CUDA device cuda:" + std::to_string(current) +
                             " that the GPU strategy reduces on (move the module there: "
                             "module->to(torch::Device(torch::kCUDA, cohort::cuda::select_device("
                             "comm.intra_rank()))))");
    }
  }
  return {c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(current)};
}

//! A GPU strategy follows LibTorch's current stream of the current device.
template <class Communicator>
requires(detail::reduces_device_memory<Communicator>() &&
         requires(Communicator & comm, cudaStream_t stream) {
           comm.set_stream(stream);
         }) struct stream_order<Communicator> {
  static void follow(Communicator& comm, const std::vector<parameter>& params) {
    const c10::Device device = cuda_device_of(params, comm.rank());
    comm.set_stream(c10::cuda::getCurrentCUDAStream(device.index()).stream());
  }
};

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
