// SPDX-License-Identifier: Apache-2.0
#pragma once

// For MPI builds that are not CUDA-aware (ChainerMN's non_cuda_aware): tensors in GPU memory are
// copied to pinned host memory, reduced by MPI on the host, and copied back. Gradients are packed
// on the device first (one kernel), so each step moves one buffer per dtype each way.

#if !defined(__CUDACC__)
#error                                                                                             \
    "<cohort/communicator/host_staged.hpp> launches CUDA kernels: compile this translation unit with nvcc and include <cohort/cuda.hpp>"
#endif

#include <cohort/communicator/device_fused_reduction.hpp>
#include <cohort/communicator/device_streams.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/mpi_communicator.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/operation.hpp>
#include <cohort/error.hpp>
#include <cohort/tensor/concepts.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/cuda.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/mpi/communicator.hpp>
#include <cuda_runtime_api.h>

#include <span>
#include <string>
#include <string_view>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

class host_staged : public mpi_communicator<host_staged> {
  using base = mpi_communicator<host_staged>;

public:
  static constexpr std::string_view name = "host_staged";

  explicit host_staged(const boost::mpi::communicator& comm, communicator_options options = {})
      : base(comm, options) {}

  static constexpr bool reduces_gpu_memory = true;

  //! The stream the trainer queues its work on (see nccl_strategy::set_stream).
  void set_stream(cudaStream_t user) noexcept { streams_.set_user_stream(user); }

  //! In place over all ranks; device memory is staged through pinned host memory.
  template <writable_tensor T>
  void allreduce(T& t, reduce_op op = reduce_op::sum) {
    if constexpr (host_tensor<T>) {
      if (!detail::on_device(t)) {
        return base::allreduce(t, op);
      }
    }
    detail::operation_scope scope("allreduce");
    tensor_view v;
    const std::string problem = local_checks([&] { v = make_view(t, "allreduce"); });
    agree("allreduce", v.count, v.type, static_cast<int>(op), "op", problem);
    staged(v, true, [&](tensor_view host) { mpi::allreduce(mpi_comm(), host, op); });
  }

  //! From `root` to every rank; device memory is staged through pinned host memory.
  template <writable_tensor T>
  void broadcast(T& t, int root = 0) {
    if constexpr (host_tensor<T>) {
      if (!detail::on_device(t)) {
        return base::broadcast(t, root);
      }
    }
    detail::operation_scope scope("broadcast");
    tensor_view v;
    const std::string problem = local_checks([&] {
      v = make_view(t, "broadcast");
      check_root(root, "broadcast");
    });
    agree("broadcast", v.count, v.type, root, "root", problem);
    staged(v, rank() == root, [&](tensor_view host) { mpi::broadcast(mpi_comm(), host, root); });
  }

private:
  friend base;

  template <reducer Reducer>
  void reduce_gradients(std::span<const detail::grad_slot> slots, const Reducer& reducer) {
    const cudaStream_t s = streams_.begin();
    fused_.run(slots, reducer, size(), s, [&](tensor_view packed, reduce_op op) {
      // The host must wait for the pack before MPI reads the copy: one synchronisation per dtype.
      void* host = grow_pinned(packed.size_bytes(), s);
      cuda::check(
          cudaMemcpyAsync(host, packed.data, packed.size_bytes(), cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync (device to host)");
      cuda::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      mpi::allreduce(mpi_comm(), {host, packed.count, packed.type, memory_location::host}, op);
      cuda::check(
          cudaMemcpyAsync(packed.data, host, packed.size_bytes(), cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync (host to device)");
    });
    streams_.end();
  }

  // Copies `device` to pinned memory (if `copy_in`), runs `f` on the host copy, copies it back.
  template <class F>
  void staged(tensor_view device, bool copy_in, F&& f) {
    const cudaStream_t s = streams_.begin();
    void* host = grow_pinned(device.size_bytes(), s);
    if (copy_in) {
      cuda::check(
          cudaMemcpyAsync(host, device.data, device.size_bytes(), cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync (device to host)");
    }
    cuda::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    f(tensor_view{host, device.count, device.type, memory_location::host});
    cuda::check(cudaMemcpyAsync(device.data, host, device.size_bytes(), cudaMemcpyHostToDevice, s),
                "cudaMemcpyAsync (host to device)");
    streams_.end();
  }

  // The pinned buffer, grown only once the copies queued from it are done.
  void* grow_pinned(std::size_t bytes, cudaStream_t s) {
    if (pinned_.size() < bytes) {
      cuda::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    }
    return pinned_.reserve(bytes);
  }

  detail::device_streams streams_;
  detail::device_fused_reduction fused_;
  cuda::pinned_buffer pinned_;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
