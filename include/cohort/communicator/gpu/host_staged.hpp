// SPDX-License-Identifier: Apache-2.0
#pragma once

// For MPI builds that are not CUDA-aware (ChainerMN's non_cuda_aware): tensors in GPU memory are
// copied to pinned host memory, reduced by MPI on the host, and copied back. Gradients are packed
// on the device first (one kernel), so each step moves one buffer per bucket each way.

#if !defined(__CUDACC__)
#error                                                                                             \
    "<cohort/communicator/gpu/host_staged.hpp> launches CUDA kernels: compile this translation unit with nvcc and include <cohort/cuda.hpp>"
#endif

#include <cohort/communicator/basic_communicator.hpp>
#include <cohort/communicator/engine/gpu/bucketed_reduction.hpp>
#include <cohort/communicator/engine/gpu/streams.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/operation.hpp>
#include <cohort/error.hpp>
#include <cohort/tensor/concepts.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/cuda.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/mpi/communicator.hpp>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

//! One pinned host buffer that device memory is staged through, on cohort's stream (host_staged's
//! and the GPU two-level strategies'). Pinned, because cudaMemcpyAsync between device and pinned
//! memory is asynchronous and ordered on its stream, where one with pageable memory may
//! synchronize with the host ("API synchronization behavior", CUDA runtime API). The buffer grows
//! only once the copies queued from it are done, and the host writes it only after waiting for
//! them: every copy from it is on the one stream it is used with.
class pinned_staging {
public:
  //! At least `bytes` of pinned memory; if it must grow, `stream`'s copies from the old buffer
  //! are waited for first.
  void* reserve(std::size_t bytes, cudaStream_t stream) {
    if (buffer_.size() < bytes) {
      cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
    return buffer_.reserve(bytes);
  }

  //! `device` (queued on `stream`) through the buffer: copied in (if `copy_in`), `wait()`ed for,
  //! handed to `f` as a host view, and copied back on `stream`.
  template <class Wait, class F>
  void round_trip(tensor_view device, bool copy_in, cudaStream_t stream, Wait&& wait, F&& f) {
    void* const host = reserve(device.size_bytes(), stream);
    if (copy_in) {
      cuda::check(
          cudaMemcpyAsync(host, device.data, device.size_bytes(), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (device to host)");
    }
    wait();
    f(tensor_view{host, device.count, device.type, memory_location::host});
    cuda::check(
        cudaMemcpyAsync(device.data, host, device.size_bytes(), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (host to device)");
  }

  //! `broadcast` with MPI on `comm` (where this process is `rank`) from `root`: the parameter
  //! broadcast of the strategies that stage through the host.
  void broadcast_over_mpi(MPI_Comm comm, int rank, int root, std::span<const tensor_view> values,
                          std::size_t capacity, cudaStream_t stream) {
    broadcast(values, rank == root, capacity, stream, [&](void* host, std::size_t bytes) {
      mpi::broadcast(comm, {host, bytes, dtype::uint8, memory_location::host}, root);
    });
  }

  //! Broadcasts `values` (device memory) from the root through the buffer, `capacity` bytes at a
  //! time: the root copies a bucket's worth into it on `stream`, `send(void* host, std::size_t
  //! bytes)` broadcasts the bucket on the host once the copies are done, and the other ranks copy
  //! it back on `stream` (the caller then orders the user's stream after those copies). A value
  //! larger than a bucket travels in pieces: the pinned memory is one bucket, not a copy of the
  //! model. A `capacity` of 0 gives each value a bucket of its own, whole (as `bucket_bytes` 0
  //! does for gradients).
  template <class Send>
  void broadcast(std::span<const tensor_view> values, bool root, std::size_t capacity,
                 cudaStream_t stream, Send&& send) {
    const bool one_each = capacity == 0;
    if (one_each) {
      for (const tensor_view& v : values) {
        capacity = std::max(capacity, v.size_bytes());
      }
    }
    capacity = std::max<std::size_t>(1, capacity);
    auto* const host = static_cast<std::byte*>(reserve(capacity, stream));
    pieces_.clear();
    std::size_t filled = 0;
    const auto flush = [&] {
      if (filled == 0) {
        return;
      }
      // On the root, the copies into the bucket are done; elsewhere, the copies out of the last
      // bucket, before MPI overwrites it.
      cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      send(static_cast<void*>(host), filled);
      if (!root) {
        for (const piece& p : pieces_) {
          cuda::check(
              cudaMemcpyAsync(p.device, host + p.offset, p.bytes, cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync (host to device)");
        }
      }
      pieces_.clear();
      filled = 0;
    };
    for (const tensor_view& v : values) {
      const std::size_t bytes = v.size_bytes();
      for (std::size_t done = 0; done < bytes;) {
        if (filled == capacity) {
          flush();
        }
        const std::size_t n = std::min(capacity - filled, bytes - done);
        void* const device = static_cast<std::byte*>(v.data) + done;
        if (root) {
          cuda::check(cudaMemcpyAsync(host + filled, device, n, cudaMemcpyDeviceToHost, stream),
                      "cudaMemcpyAsync (device to host)");
        }
        pieces_.push_back({device, filled, n});
        filled += n;
        done += n;
      }
      if (one_each) {
        flush();
      }
    }
    flush();
  }

private:
  struct piece {
    void* device;
    std::size_t offset;
    std::size_t bytes;
  };

  cuda::pinned_buffer buffer_;
  std::vector<piece> pieces_;
};

} // namespace detail

class host_staged : public basic_communicator<host_staged> {
  using base = basic_communicator<host_staged>;

public:
  static constexpr std::string_view name = "host_staged";

  explicit host_staged(const boost::mpi::communicator& comm, communicator_options options = {})
      : base(comm, options)
      , fused_(engine::device_bucket_limits(options)) {}

  static constexpr bool reduces_gpu_memory = true;

  //! Buckets (collectives) per step of the last layout reduced (what `bucket_count()` says).
  std::size_t device_bucket_count() const noexcept { return fused_.bucket_count(); }

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
    agree("allreduce (device memory)", v.count, v.type, static_cast<int>(op), "op", problem);
    const auto watch = watch_transfer("allreduce", v.size_bytes());
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
    agree("broadcast (device memory)", v.count, v.type, root, "root", problem);
    const auto watch = watch_transfer("broadcast", v.size_bytes());
    staged(v, rank() == root, [&](tensor_view host) { mpi::broadcast(mpi_comm(), host, root); });
  }

  //! Copies every parameter's value from `root`. Values in device memory are staged through
  //! pinned host memory a bucket (`bucket_bytes`) at a time, on cohort's stream, after the work
  //! queued on the user's stream and before what is queued there next, as the gradients are. The
  //! ranks first agree on every name, size and dtype (a `mismatch_error` on every rank if they
  //! differ). Parameters in host memory go through MPI, as in every strategy.
  template <parameter_set Params>
  void broadcast_parameters(Params&& params, int root = 0) {
    broadcast_device_parameters(params, root, [&](std::span<const tensor_view> values) {
      streams_.run([&](cudaStream_t s) {
        staging_.broadcast_over_mpi(mpi_comm(), rank(), root, values, options().bucket_bytes, s);
      });
    });
  }

private:
  friend strategy_access;

  void prepare_gradients(std::span<const grad_slot> slots, const reduction_table& reduction) {
    fused_.prepare(slots, reduction);
  }

  // The plan prepare_gradients made from the reducer's table, before the ranks agreed.
  void reduce_gradients(std::span<const grad_slot> slots, const reduction_table&) {
    streams_.run([&](cudaStream_t s) {
      fused_.run(slots, s, [&](tensor_view packed, reduce_op op) {
        // The host must wait for the pack before MPI reads the copy: one synchronisation per
        // bucket.
        staging_.round_trip(
            packed, true, s, [&] { synchronize(s); },
            [&](tensor_view host) { mpi::allreduce(mpi_comm(), host, op); });
      });
    });
  }

  // Copies `device` to pinned memory (if `copy_in`), runs `f` on the host copy, copies it back.
  template <class F>
  void staged(tensor_view device, bool copy_in, F&& f) {
    streams_.run([&](cudaStream_t s) {
      staging_.round_trip(
          device, copy_in, s, [&] { synchronize(s); }, f);
    });
  }

  static void synchronize(cudaStream_t s) {
    cuda::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }

  engine::device_streams streams_;
  engine::device_fused_reduction fused_;
  detail::pinned_staging staging_;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
