// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the NCCL strategies (pure_nccl, single_node) share: tensors in GPU memory go through NCCL
// on cohort's stream, ordered after the user's stream with events; tensors in host memory, and
// objects, through MPI as in every strategy. The NCCL communicator is created at the first
// device collective, on the device current then, so that the trainer can pick its device from
// intra_rank() first (as in ChainerMN).

#if !defined(__CUDACC__)
#error                                                                                             \
    "<cohort/communicator/gpu/nccl_strategy.hpp> launches CUDA kernels: compile this translation unit with nvcc and include <cohort/cuda.hpp>"
#endif

#include <cohort/communicator/agreement.hpp>
#include <cohort/communicator/basic_communicator.hpp>
#include <cohort/communicator/engine/gpu/bucketed_reduction.hpp>
#include <cohort/communicator/engine/gpu/streams.hpp>
#include <cohort/communicator/gpu/options.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/operation.hpp>
#include <cohort/error.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/concepts.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/cuda.hpp>
#include <cohort/transport/nccl.hpp>
#include <cohort/transport/nccl_blocks.hpp>

#include <boost/mpi/communicator.hpp>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

template <class Strategy>
class nccl_strategy : public basic_communicator<Strategy> {
  using base = basic_communicator<Strategy>;

public:
  nccl_strategy(const boost::mpi::communicator& comm, communicator_options options, gpu_options gpu)
      : base(comm, options)
      , gpu_(gpu)
      , fused_(engine::device_bucket_limits(options)) {
    // (A rank whose timeout is zero would never abort the NCCL communicator its peers abort.)
    agree_on_settings(static_cast<base&>(*this),
                      {{"gpu_options::timeout", std::to_string(gpu.timeout.count()) + " ms"}},
                      "communicator creation");
  }

  static constexpr bool reduces_gpu_memory = true;

  //! The stream the trainer queues its work on (the legacy default stream unless set): cohort's
  //! work starts after what is queued there, and what is queued there next starts after it.
  void set_stream(cudaStream_t user) noexcept { streams_.set_user_stream(user); }
  //! Throws for a gradient in the memory of another device than the communicator's (checked before
  //! the ranks agree, so that it is an error on every rank, not a hang).
  void check_gradient_memory(const grad_slot& slot) {
    check_device(slot.grad.data, "parameter '" + std::string(slot.name) + "'");
  }

  //! Buckets (collectives) per step of the last layout reduced (what `bucket_count()` says).
  std::size_t device_bucket_count() const noexcept { return fused_.bucket_count(); }

  //! Blocks until cohort's queued work is done (needed only with gpu_options::timeout zero).
  void synchronize() const { streams_.synchronize(); }
  //! Destroys the NCCL communicator (before the CUDA context goes): once the work queued on it has
  //! been handed to the device, it is finalized within `gpu_options::timeout`, then freed; an
  //! error, or the time limit, aborts it instead and throws (see nccl::communicator::destroy).
  //! Idempotent; a later device collective throws.
  void finalize() {
    finalized_ = true;
    if (nccl_) {
      nccl_->destroy();
    }
  }

  //! Ends the NCCL communicator at once (ncclCommAbort), abandoning its pending work: for a job
  //! that gives up after an error or a timeout. A later device collective throws.
  void abort() noexcept {
    finalized_ = true;
    if (nccl_) {
      nccl_->abort();
    }
  }

  //! Creates the NCCL communicator on the current device (collective). The first device
  //! collective does it otherwise; device send and recv need it done.
  void connect() { (void)nccl_comm(); }

  //! A communicator of the same strategy and options, GPU options included, over the ranks that
  //! pass `color`. Collective.
  Strategy split(int color, int key) const {
    Strategy part = base::split(color, key);
    static_cast<nccl_strategy&>(part).gpu_ = gpu_;
    return part;
  }
  const gpu_options& gpu() const noexcept { return gpu_; }

  // ---- tensor collectives: device memory through NCCL, host memory through MPI ---------------

  template <writable_tensor T>
  void allreduce(T& t, reduce_op op = reduce_op::sum) {
    if constexpr (host_tensor<T>) {
      if (!on_device(t)) {
        return base::allreduce(t, op);
      }
    }
    operation_scope scope("allreduce");
    tensor_view v;
    const std::string problem = this->local_checks([&] { v = device_view(t, "allreduce"); });
    this->agree("allreduce (device memory)", v.count, v.type, static_cast<int>(op), "op", problem);
    enqueue("allreduce", [&](nccl::communicator& c, cudaStream_t s) {
      nccl::allreduce(c, v.data, v.data, v.count, v.type, op, s);
    });
  }

  template <writable_tensor T>
  void broadcast(T& t, int root = 0) {
    if constexpr (host_tensor<T>) {
      if (!on_device(t)) {
        return base::broadcast(t, root);
      }
    }
    operation_scope scope("broadcast");
    tensor_view v;
    const std::string problem = this->local_checks([&] {
      v = device_view(t, "broadcast");
      this->check_root(root, "broadcast");
    });
    this->agree("broadcast (device memory)", v.count, v.type, root, "root", problem);
    enqueue("broadcast", [&](nccl::communicator& c, cudaStream_t s) {
      nccl::broadcast(c, v.data, v.count, v.type, root, s);
    });
  }

  using base::allgather;
  using base::reduce_scatter;

  template <tensor In, writable_tensor Out>
  void allgather(const In& in, Out& out) {
    if constexpr (host_tensor<In> && host_tensor<Out>) {
      if (!on_device(in) && !on_device(out)) {
        return base::allgather(in, out);
      }
    }
    operation_scope scope("allgather");
    const_tensor_view i;
    tensor_view o;
    const std::string problem = this->local_checks([&] {
      i = device_const_view(in, "allgather");
      o = device_view(out, "allgather");
      this->check_blocks(i, o, "allgather");
    });
    this->agree("allgather (device memory)", i.count, i.type, 0, "", problem);
    enqueue("allgather", [&](nccl::communicator& c, cudaStream_t s) {
      nccl::allgather(c, i.data, o.data, i.count, i.type, s);
    });
  }

  template <tensor In, writable_tensor Out>
  void reduce_scatter(const In& in, Out& out, reduce_op op = reduce_op::sum) {
    if constexpr (host_tensor<In> && host_tensor<Out>) {
      if (!on_device(in) && !on_device(out)) {
        return base::reduce_scatter(in, out, op);
      }
    }
    operation_scope scope("reduce_scatter");
    const_tensor_view i;
    tensor_view o;
    const std::string problem = this->local_checks([&] {
      i = device_const_view(in, "reduce_scatter");
      o = device_view(out, "reduce_scatter");
      this->check_blocks(o, i, "reduce_scatter");
    });
    this->agree("reduce_scatter (device memory)", o.count, o.type, static_cast<int>(op), "op",
                problem);
    enqueue("reduce_scatter", [&](nccl::communicator& c, cudaStream_t s) {
      nccl::reduce_scatter(c, i.data, o.data, o.count, o.type, op, s);
    });
  }

  //! `allgather` of blocks of any size (rank r's `in` holds counts[r] elements, 0 too; `out` their
  //! sum, rank r's after the ranks' before it), in device memory: the ranks agree on the counts,
  //! then one broadcast from each rank in one NCCL group (NCCL's all-gather where they are even).
  template <tensor In, writable_tensor Out>
  void allgather(const In& in, Out& out, std::span<const std::size_t> counts) {
    if constexpr (host_tensor<In> && host_tensor<Out>) {
      if (!on_device(in) && !on_device(out)) {
        return base::allgather(in, out, counts);
      }
    }
    operation_scope scope("allgather");
    const_tensor_view i;
    tensor_view o;
    std::vector<std::size_t> offsets;
    const std::string problem = this->local_checks([&] {
      i = device_const_view(in, "allgather");
      o = device_view(out, "allgather");
      offsets = this->check_counted_blocks(i, o, counts, "allgather");
    });
    this->agree_on_counts("allgather (device memory)", counts, i.type, 0, "", problem,
                          o.size_bytes());
    enqueue("allgather", [&](nccl::communicator& c, cudaStream_t s) {
      nccl::allgather_blocks(c, i.data, o.data, counts, offsets, i.type, s);
    });
  }

  //! `reduce_scatter` of blocks of any size (`in` holds the sum of `counts`; rank r gets the
  //! reduction of its block, counts[r] elements, 0 too, in `out`), in device memory: one reduce to
  //! each rank in one NCCL group (NCCL's reduce-scatter where the counts are even).
  template <tensor In, writable_tensor Out>
  void reduce_scatter(const In& in, Out& out, std::span<const std::size_t> counts,
                      reduce_op op = reduce_op::sum) {
    if constexpr (host_tensor<In> && host_tensor<Out>) {
      if (!on_device(in) && !on_device(out)) {
        return base::reduce_scatter(in, out, counts, op);
      }
    }
    operation_scope scope("reduce_scatter");
    const_tensor_view i;
    tensor_view o;
    std::vector<std::size_t> offsets;
    const std::string problem = this->local_checks([&] {
      i = device_const_view(in, "reduce_scatter");
      o = device_view(out, "reduce_scatter");
      offsets = this->check_counted_blocks(o, i, counts, "reduce_scatter");
    });
    this->agree_on_counts("reduce_scatter (device memory)", counts, o.type, static_cast<int>(op),
                          "op", problem, i.size_bytes());
    enqueue("reduce_scatter", [&](nccl::communicator& c, cudaStream_t s) {
      nccl::reduce_scatter_blocks(c, i.data, o.data, counts, offsets, o.type, op, s);
    });
  }

  //! Device memory: NCCL has no probe, so the receiver's size is not checked against the sender's.
  template <tensor T>
  void send(const T& t, int dest, int tag = 0) {
    if constexpr (host_tensor<T>) {
      if (!on_device(t)) {
        return base::send(t, dest, tag);
      }
    }
    operation_scope scope("send");
    this->check_peer(dest, "send");
    require_connected("send");
    const const_tensor_view v = device_const_view(t, "send");
    enqueue("send", [&](nccl::communicator& c, cudaStream_t s) {
      nccl::send(c, v.data, v.count, v.type, dest, s);
    });
  }

  template <writable_tensor T>
  void recv(T& t, int source, int tag = 0) {
    if constexpr (host_tensor<T>) {
      if (!on_device(t)) {
        return base::recv(t, source, tag);
      }
    }
    operation_scope scope("recv");
    this->check_peer(source, "recv");
    require_connected("recv");
    const tensor_view v = device_view(t, "recv");
    enqueue("recv", [&](nccl::communicator& c, cudaStream_t s) {
      nccl::recv(c, v.data, v.count, v.type, source, s);
    });
  }

  //! Copies every parameter's value from `root`. Values in GPU memory go through NCCL on cohort's
  //! stream, after the work queued on the user's stream and before what is queued there next: a
  //! value of at least `fusion_threshold_bytes` in place, smaller ones packed on the device a
  //! bucket (`bucket_bytes`) at a time. The ranks first agree on every name, size and dtype (a
  //! `mismatch_error` on every rank if they differ). Parameters in host memory go through MPI, as
  //! in every strategy.
  template <parameter_set Params>
  void broadcast_parameters(Params&& params, int root = 0) {
    this->broadcast_device_parameters(
        params, root,
        [&](const tensor_view& v, const std::string& what) { check_device(v.data, what); },
        [&](std::span<const tensor_view> values) {
          enqueue("broadcast_parameters", [&](nccl::communicator& c, cudaStream_t s) {
            broadcast_.run(values, this->rank() == root, this->options().bucket_bytes,
                           this->options().fusion_threshold_bytes, s,
                           [&](void* data, std::size_t bytes) {
                             nccl::broadcast(c, data, bytes, dtype::uint8, root, s);
                           });
          });
        });
  }

protected:
  friend strategy_access;

  // Before the ranks agree (see device_fused_reduction::prepare), on the device the work runs on.
  void prepare_gradients(std::span<const grad_slot> slots, const reduction_table& reduction) {
    const cuda::device_guard on(nccl_ ? nccl_->device() : cuda::current_device());
    fused_.prepare(slots, reduction);
  }

  // The plan prepare_gradients made from the reducer's table, before the ranks agreed.
  void reduce_gradients(std::span<const grad_slot> slots, const reduction_table&) {
    Strategy& self = static_cast<Strategy&>(*this);
    enqueue_on(self.bucket_comm(), "allreduce_grad", [&](nccl::communicator& c, cudaStream_t s) {
      fused_.run(slots, s,
                 [&](tensor_view packed, reduce_op op) { self.exchange_bucket(c, packed, op, s); });
    });
  }

  //! The NCCL communicator the gradient buckets travel on (all ranks'), and how one packed buffer
  //! of gradients is reduced over all ranks on it, on stream `s`: one NCCL all-reduce. The
  //! two-level strategies hide both with their own (the node's communicator), so that they never
  //! create a communicator over all ranks for gradients (ChainerMN's did, and failed to start
  //! above a few hundred ranks).
  nccl::communicator& bucket_comm() { return world_comm(); }
  void exchange_bucket(nccl::communicator& c, tensor_view packed, reduce_op op, cudaStream_t s) {
    nccl::allreduce(c, packed.data, packed.data, packed.count, packed.type, op, s);
  }

  //! Marks the end of the user's work queued before the current operation: where its time limit
  //! starts.
  const cuda::event& work_started() const { return streams_.started(); }

  //! cohort's stream and its events, for a strategy's own work beside the user's.
  engine::device_streams& streams() noexcept { return streams_; }

  //! The NCCL communicator over all ranks, created at the first call on the current device.
  nccl::communicator& nccl_comm() { return world_comm(); }

  nccl::communicator& world_comm() {
    if (finalized_) {
      throw error("cohort: device collective on rank " + std::to_string(this->rank()) +
                  " after finalize()");
    }
    if (!nccl_) {
      nccl_.emplace(this->mpi_comm(), gpu_.timeout, *this->options().timeout);
    }
    return *nccl_;
  }

private:
  // Queues `work` on cohort's stream between the user's stream events, then waits for it with the
  // time limit (aborting NCCL on timeout or asynchronous error), unless the limit is zero.
  template <class Work>
  void enqueue(std::string_view operation, Work&& work) {
    enqueue_on(world_comm(), operation, std::forward<Work>(work));
  }

  // The same on a given communicator, which the time limit aborts.
  template <class Work>
  void enqueue_on(nccl::communicator& c, std::string_view operation, Work&& work) {
    const cuda::device_guard on(c.device());
    const cudaStream_t s = streams_.begin();
    work(c, s);
    const cuda::event& done = streams_.end();
    if (gpu_.timeout.count() > 0) {
      c.wait(streams_.started(), done, gpu_.timeout, operation);
    }
  }

  // Point to point cannot create the communicator: that is collective over every rank.
  void require_connected(std::string_view operation) const {
    if (!nccl_ || !nccl_->valid()) {
      throw error("cohort: device " + std::string(operation) + " on rank " +
                  std::to_string(this->rank()) +
                  ": the NCCL communicator does not exist yet; call connect() (or any device "
                  "collective) on every rank first");
    }
  }

  // The device a tensor's memory belongs to must be the NCCL communicator's (or, before it exists,
  // the current one, where it will be created). Never creates it: that is collective, and this
  // runs among a front door's local checks.
  void check_device(const void* data, std::string_view what) {
    const int expected = nccl_ ? nccl_->device() : cuda::current_device();
    const int actual = data == nullptr ? expected : cuda::device_of(data);
    if (actual != expected) {
      throw invalid_argument("cohort: " + std::string(what) + " on rank " +
                             std::to_string(this->rank()) + " is in the memory of device " +
                             std::to_string(actual) + " but this communicator runs on device " +
                             std::to_string(expected));
    }
  }

  template <class T>
  tensor_view device_view(T& t, std::string_view what) {
    const tensor_view v = make_view(t, what);
    check_device(v.data, what);
    return v;
  }
  template <class T>
  const_tensor_view device_const_view(const T& t, std::string_view what) {
    const const_tensor_view v = make_const_view(t, what);
    check_device(v.data, what);
    return v;
  }

  gpu_options gpu_;
  bool finalized_ = false;
  engine::device_streams streams_;
  engine::device_fused_reduction fused_;
  engine::device_fused_broadcast broadcast_;
  // Declared last, destroyed first: the communicator's work ends before its buffers are freed.
  std::optional<nccl::communicator> nccl_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
