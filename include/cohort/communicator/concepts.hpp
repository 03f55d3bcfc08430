// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/std.hpp>

#include <boost/mpi/communicator.hpp>

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

namespace detail {
// Stand-ins with which the concept below checks the templated members.
struct reducer_archetype {
  grad_reduction plan(dtype type, int) const { return {type}; }
};
using parameters_archetype = std::vector<parameter_ref<std::vector<float>>>;

// A strategy that takes the trainer's stream (`set_stream`: the GPU ones).
template <class Strategy, class Stream>
concept takes_stream = requires(Strategy& s, Stream stream) {
  s.set_stream(stream);
};
// A strategy that owns an NCCL communicator, which it can create early, finalize and abort.
template <class Strategy>
concept owns_nccl_communicator = requires(Strategy& s) {
  s.connect();
  s.finalize();
  s.abort();
};
} // namespace detail

//! A gradient-synchronisation strategy: topology, tensor and object collectives, and the
//! multi-tensor `allreduce_grad`, over an MPI communicator that the training layer may use for
//! its own small exchanges. `naive`, `flat` and `dummy` model it.
template <class C>
concept communicator = std::move_constructible<C> &&
    requires(C& c, const C& cc, std::vector<float>& t, int i, detail::parameters_archetype& params,
             const parameter_source& source) {
  { cc.rank() } -> std::same_as<int>;
  { cc.size() } -> std::same_as<int>;
  { cc.intra_rank() } -> std::same_as<int>;
  { cc.intra_size() } -> std::same_as<int>;
  { cc.inter_rank() } -> std::same_as<int>;
  { cc.inter_size() } -> std::same_as<int>;
  c.allreduce(t, reduce_op::sum);
  c.broadcast(t, i);
  c.allgather(t, t);
  c.reduce_scatter(t, t, reduce_op::sum);
  c.send(t, i, i);
  c.recv(t, i, i);
  { c.bcast_obj(i, i) } -> std::same_as<int>;
  { c.gather_obj(i, i) } -> std::same_as<std::vector<int>>;
  { c.allreduce_obj(i) } -> std::same_as<int>;
  c.send_obj(i, i, i);
  { c.template recv_obj<int>(i, i) } -> std::same_as<int>;
  { cc.split(i, i) } -> std::same_as<C>;
  c.broadcast_parameters(params, i);
  c.allreduce_grad(params, detail::reducer_archetype{}, grad_sync_options{});
  c.allreduce_grad(source, detail::reducer_archetype{}, grad_sync_options{});
};

//! A communicator that can reduce gradients while backward runs (the host strategies).
template <class C>
concept overlapping_communicator = communicator<C> && !requires {
  requires C::reduces_gpu_memory;
}
&&requires(C& c, const C& cc, detail::parameters_archetype& params, std::size_t i,
           const void* owner, std::span<const grad_slot> slots, const parameter_source& source) {
  c.start_grad_sync(params, detail::reducer_archetype{}, grad_sync_options{});
  c.start_grad_sync(slots, detail::reducer_archetype{}, owner);
  c.grad_ready(params, i);
  c.grad_ready(i, owner);
  c.grad_ready(i);
  c.grad_ready_for(owner, params, detail::reducer_archetype{}, grad_sync_options{}, i);
  c.grad_ready_for(owner, source, detail::reducer_archetype{}, grad_sync_options{}, i);
  c.mark_all_ready(owner);
  c.wait_grad_sync();
  c.wait_grad_sync(step_end::update, slots, owner);
  c.abandon_grad_sync("why");
  c.abandon_grad_sync_for(owner, "why");
  { c.take_kept_grad_sync(owner) } -> std::same_as<bool>;
  { c.wait_grad_sync_transfers(owner) } -> std::same_as<bool>;
  c.forget_grad_sync_owner(owner);
  c.validate_grad_sync(slots, detail::reducer_archetype{}, missing_grad::report);
  { cc.grad_sync_pending() } -> std::same_as<bool>;
  { cc.grad_sync_pending_for(owner) } -> std::same_as<bool>;
  { cc.grad_sync_pending_at(std::uint64_t{}) } -> std::same_as<bool>;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
