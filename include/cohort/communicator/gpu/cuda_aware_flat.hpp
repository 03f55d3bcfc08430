// SPDX-License-Identifier: Apache-2.0
#pragma once

// flat for gradients in GPU memory over an MPI that is CUDA-aware (ChainerMN's flat): packed on
// the device by one kernel, reduced by MPI directly on the device buffer, unpacked by one kernel.
// Where MPI is not CUDA-aware, constructing it is an error that says to use host_staged.

#if !defined(__CUDACC__)
#error                                                                                             \
    "<cohort/communicator/gpu/cuda_aware_flat.hpp> launches CUDA kernels: compile this translation unit with nvcc and include <cohort/cuda.hpp>"
#endif

#include <cohort/communicator/basic_communicator.hpp>
#include <cohort/communicator/engine/gpu/bucketed_reduction.hpp>
#include <cohort/communicator/engine/gpu/streams.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/operation.hpp>
#include <cohort/error.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/cuda.hpp>
#include <cohort/transport/cuda_aware_mpi.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/mpi/communicator.hpp>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

class cuda_aware_flat : public basic_communicator<cuda_aware_flat> {
  using base = basic_communicator<cuda_aware_flat>;

public:
  static constexpr std::string_view name = "cuda_aware_flat";

  explicit cuda_aware_flat(const boost::mpi::communicator& comm, communicator_options options = {})
      : base(comm, options)
      , fused_(engine::device_bucket_limits(options)) {
    // Every rank runs the same MPI library: every rank throws alike.
    if (!mpi_is_cuda_aware()) {
      throw invalid_argument("cohort: cuda_aware_flat on rank " + std::to_string(rank()) +
                             ": this MPI library is not CUDA-aware (MPIX_Query_cuda_support); "
                             "use host_staged, or pure_nccl");
    }
  }

  static constexpr bool reduces_gpu_memory = true;

  //! Buckets (collectives) per step of the last layout reduced (what `bucket_count()` says).
  std::size_t device_bucket_count() const noexcept { return fused_.bucket_count(); }

  //! The stream the trainer queues its work on (see nccl_strategy::set_stream).
  void set_stream(cudaStream_t user) noexcept { streams_.set_user_stream(user); }

  //! Copies every parameter's value from `root`. Values in device memory go through MPI on the
  //! device pointers (this strategy's premise): a value of at least `fusion_threshold_bytes` in
  //! place, smaller ones packed on the device a bucket (`bucket_bytes`) at a time, after the work
  //! queued on the user's stream and before what is queued there next. The ranks first agree on
  //! every name, size and dtype (a `mismatch_error` on every rank if they differ). Parameters in
  //! host memory go through MPI, as in every strategy.
  template <parameter_set Params>
  void broadcast_parameters(Params&& params, int root = 0) {
    broadcast_device_parameters(params, root, [&](std::span<const tensor_view> values) {
      streams_.run([&](cudaStream_t s) {
        broadcast_.run(values, rank() == root, options().bucket_bytes,
                       options().fusion_threshold_bytes, s, [&](void* data, std::size_t bytes) {
                         // MPI does not order itself on CUDA streams: on the root the pack (and
                         // the user's work before it) must be done before MPI reads; elsewhere
                         // the unpack of the last bucket, before MPI overwrites the buffer.
                         cuda::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
                         mpi::broadcast(mpi_comm(),
                                        {data, bytes, dtype::uint8, memory_location::device}, root);
                       });
      });
    });
  }

private:
  friend strategy_access;

  // Before the ranks agree: the buffers, and a refusal of 16-bit wires. The MPI ops of fp16 and
  // bf16 are host functions: on device memory only an MPI that stages through the host could run
  // them. Every rank has the same plan, so every rank refuses alike, and nothing is reduced.
  void prepare_gradients(std::span<const grad_slot> slots, const reduction_table& reduction) {
    for (const engine::bucket& k : fused_.prepare(slots, reduction).buckets()) {
      if (k.plan.wire == dtype::float16 || k.plan.wire == dtype::bfloat16) {
        throw invalid_argument("cohort: cuda_aware_flat on rank " + std::to_string(rank()) +
                               ": a " + std::string(to_string(k.plan.wire)) +
                               " wire needs MPI's user-defined ops on device memory; use "
                               "pure_nccl or host_staged for 16-bit gradients or compression");
      }
    }
  }

  // The plan prepare_gradients made from the reducer's table, before the ranks agreed.
  void reduce_gradients(std::span<const grad_slot> slots, const reduction_table&) {
    streams_.run([&](cudaStream_t s) {
      fused_.run(slots, s, [&](tensor_view packed, reduce_op op) {
        // MPI does not order itself on CUDA streams: the pack must be done before it reads.
        cuda::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        mpi::allreduce(mpi_comm(), packed, op);
      });
    });
  }

  engine::device_streams streams_;
  engine::device_fused_reduction fused_;
  engine::device_fused_broadcast broadcast_;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
