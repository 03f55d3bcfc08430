// SPDX-License-Identifier: Apache-2.0
#pragma once

// The front door every strategy shares: the topology, the tensor and object collectives, the
// parameter broadcast and allreduce_grad, blocking or overlapped with backward. It checks the
// arguments, reads the user's types into type-erased views, and forwards: to the checks
// (engine/checks.hpp), to the transports, and, the strategy, the reducer and the parameter set
// erased (strategy_ref, reduction_table, parameter_source or a gradient_reader), to
// grad_sync_base.hpp, which is compiled once for every strategy and alone sees the gradient-sync
// engine (engine/grad_sync.hpp).
// A strategy derives from basic_communicator<Strategy> (CRTP: no virtual call) and supplies only
// how one bucket of host gradients is exchanged, `exchange(tensor_view, reduce_op)` over the
// gradient channels (`grad_comm()`, ...), or, for device memory, how all of them are reduced,
// `reduce_gradients(std::span<const grad_slot>, const reduction_table&)`.

#include <cohort/communicator/communicator_base.hpp>
#include <cohort/communicator/engine/bucket_plan.hpp>
#include <cohort/communicator/engine/checks.hpp>
#include <cohort/communicator/engine/parameter_broadcast.hpp>
#include <cohort/communicator/grad_sync_base.hpp>
#include <cohort/communicator/grad_sync_request.hpp>
#include <cohort/communicator/grad_sync_stats.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/communicator/strategy_access.hpp>
#include <cohort/communicator/topology.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/operation.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/concepts.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/mpi/communicator.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The front door of every strategy: `Strategy` derives from basic_communicator<Strategy>
//! (CRTP: no virtual call) and supplies how gradients are exchanged (see the top of this file).
template <class Strategy>
class basic_communicator : public grad_sync_base {
public:
  //! Builds the communicator over a duplicate of `comm` (so that cohort's messages never match
  //! the user's), and works out the topology. Collective over `comm`. Every rank must pass the
  //! same strategy and options: they are compared here, whatever `check_agreement` says, and a
  //! difference throws `mismatch_error` on every rank naming the option and both values.
  explicit basic_communicator(const boost::mpi::communicator& comm,
                              communicator_options options = {})
      : grad_sync_base(comm, options, strategy_access::bucketing<Strategy>(options)) {
    std::string_view name = "a strategy without a name";
    if constexpr (requires { Strategy::name; }) {
      name = Strategy::name;
    }
    // Same name, other template arguments (hierarchical<Intra, Inter>): the type tells.
    checks().agree_on_options(name, typeid(Strategy).name());
    connect(comm);
  }

  basic_communicator(basic_communicator&&) noexcept = default;
  basic_communicator& operator=(basic_communicator&&) noexcept = default;
  basic_communicator(const basic_communicator&) = delete;
  basic_communicator& operator=(const basic_communicator&) = delete;

  //! A communicator of the same strategy over the ranks that pass the same `color` (>= 0),
  //! ordered by `key`. Collective. The options are kept (ChainerMN's split lost them).
  Strategy split(int color, int key) const {
    return Strategy(detail::adopt(split_comm(color, key)), options());
  }

  //! Copies every parameter's value from `root` to every rank. The ranks first agree on the
  //! layout (names, sizes, dtypes) if the agreement check is on. Small values travel packed in
  //! a bucket's worth of bytes at a time, large ones in place, so no copy of the model is made.
  template <parameter_set Params>
  void broadcast_parameters(Params&& params, int root = 0) {
    detail::operation_scope scope("broadcast_parameters");
    const engine::parameter_layout layout = engine::agreed_parameters(
        checks(), params, root,
        [&](auto& value, const std::string& what) { return host_view(value, what); });
    engine::broadcast_host_values(checks(), mpi_comm(), layout.values, root);
  }

  //! Reduces every parameter's gradient over all ranks as `reducer` says (for `mean`: the
  //! average), in place. Before anything is reduced, the ranks agree on the layout and on the
  //! reducer's plan for each dtype (if the check is on); a parameter without a gradient is
  //! reported or zero-filled as `options` says. A failure inside the exchange, after the ranks
  //! agreed to run it, ends the job with a message naming the rank and the cause.
  template <parameter_set Params, reducer Reducer>
  void allreduce_grad(Params&& params, const Reducer& reducer, grad_sync_options options = {}) {
    using set = std::remove_reference_t<Params>;
    reduce_now(
        [](const void* p, missing_grad missing, std::vector<grad_slot>& slots,
           std::vector<std::string>& names) {
          collect_gradients(*static_cast<set*>(const_cast<void*>(p)), missing, slots, names);
        },
        std::addressof(params), reducer, options);
  }
  //! The same, for a set whose type is erased (see parameter_source).
  template <reducer Reducer>
  void allreduce_grad(const parameter_source& params, const Reducer& reducer,
                      grad_sync_options options = {}) {
    reduce_now(
        [](const void* p, missing_grad missing, std::vector<grad_slot>& slots,
           std::vector<std::string>& names) {
          static_cast<const parameter_source*>(p)->collect(missing, slots, names);
        },
        &params, reducer, options);
  }

  // ---- gradients reduced while backward runs ------------------------------------------------

  //! Begins a reduction of `params`' gradients that overlaps with backward: call `ready(i)` on
  //! the request as parameter i's gradient becomes final (from a hook, from any thread), and
  //! `wait()` before the optimizer step. A bucket is reduced, on cohort's own thread, as soon as
  //! its gradients are ready and the buckets before it are on their way; the order gradients
  //! become ready in the first step is learned (rank 0's) and the buckets rebuilt for it.
  //! Collective: the ranks agree on the layout now, so every gradient tensor must exist, with its
  //! final size, already. Needs MPI started with `MPI_THREAD_MULTIPLE` (throws `cohort::error`
  //! otherwise).
  template <parameter_set Params, reducer Reducer>
  grad_sync_request<Strategy, Params> begin_allreduce_grad(Params& params, const Reducer& reducer,
                                                           grad_sync_options options = {}) {
    start_grad_sync(params, reducer, options);
    return {self(), params};
  }

  //! Non-blocking `allreduce_grad`: every gradient is ready now; the buckets are reduced on
  //! cohort's thread while the caller goes on. `wait()` on the request before touching them.
  template <parameter_set Params, reducer Reducer>
  grad_sync_request<Strategy, Params> iallreduce_grad(Params& params, const Reducer& reducer,
                                                      grad_sync_options options = {}) {
    start_grad_sync(params, reducer, options);
    mark_all_ready();
    return {self(), params};
  }

  //! The parts of `begin_allreduce_grad` for callers that keep no request (the optimizer
  //! wrapper): start, say which gradient is ready, wait. `owner` names who started it (an
  //! optimizer: several may share a communicator, each with a reduction pending at once, and
  //! each reduces only its own gradients; their buckets are reduced in the order the
  //! reductions began).
  template <parameter_set Params, reducer Reducer>
  void start_grad_sync(Params& params, const Reducer& reducer, grad_sync_options options = {},
                       const void* owner = nullptr) {
    refuse_overlap_on_device();
    start_set(parameter_source(params), strategy(), reduction_table(reducer, size()), options,
              owner);
  }

  //! Starts an overlapped reduction of gradients given as views (which the caller keeps alive and
  //! does not touch until `wait_grad_sync`): for a wrapper that reduces a copy of the gradients.
  template <reducer Reducer>
  void start_grad_sync(std::span<const grad_slot> slots, const Reducer& reducer,
                       const void* owner = nullptr) {
    refuse_overlap_on_device();
    start_views(slots, strategy(), reduction_table(reducer, size()), owner);
  }

  // grad_ready(index, owner), for views given to start_grad_sync, is grad_sync_base's: the
  // overload below would hide it.
  using grad_sync_base::grad_ready;

  //! Parameter `index` of `params` (the set the reduction began with) has its final gradient: it
  //! is read again, and its bucket reduced if that completes it. Safe from any thread.
  template <parameter_set Params>
  void grad_ready(Params& params, std::size_t index) {
    mark_ready_in(parameter_source(params), index);
  }

  //! What an optimizer's backward hook calls, from any thread: the first call of a step begins
  //! the reduction for `owner` (collective, as `start_grad_sync`), and every call marks parameter
  //! `index` ready.
  template <parameter_set Params, reducer Reducer>
  void grad_ready_for(const void* owner, Params& params, const Reducer& reducer,
                      grad_sync_options options, std::size_t index) {
    grad_ready_for(owner, parameter_source(params), reducer, options, index);
  }
  //! The same, for a set whose type is erased (see parameter_source).
  template <reducer Reducer>
  void grad_ready_for(const void* owner, const parameter_source& params, const Reducer& reducer,
                      grad_sync_options options, std::size_t index) {
    refuse_overlap_on_device();
    // (Once a step's reduction began, as for every gradient but its first, nothing of the
    // strategy or the reducer is needed.)
    if (!mark_ready_if_pending(owner, params, index)) {
      mark_ready_for(owner, params, strategy(), reduction_table(reducer, size()), options, index);
    }
  }

  //! Checks gradients about to be reduced from copies (collective, as `allreduce_grad` checks its
  //! own): a wrapper that must refuse a step before it touches anything calls this first.
  template <reducer Reducer>
  void validate_grad_sync(std::span<const grad_slot> slots, const Reducer& reducer,
                          missing_grad missing) {
    validate_views(slots, reduction_table(reducer, size()), missing);
  }

  //! Buckets (collectives) per step of the last layout reduced (a device strategy counts its own,
  //! with `device_bucket_count()`).
  std::size_t bucket_count() const noexcept {
    if (const auto device =
            strategy_access::device_bucket_count(static_cast<const Strategy&>(*this))) {
      return *device;
    }
    return host_bucket_count();
  }

protected:
  //! `broadcast_parameters` for a strategy that moves device memory itself: parameters in host
  //! memory take the host path; otherwise the ranks agree on the layout (every value in device
  //! memory, and `check(view, what)` for what else the strategy asks of it), and then, watched,
  //! `move(values)` copies every value from `root`.
  template <parameter_set Params, class Check, class Move>
  void broadcast_device_parameters(Params& params, int root, Check&& check, Move&& move) {
    if (!engine::any_parameter_on_device(params)) {
      return basic_communicator::broadcast_parameters(params, root);
    }
    detail::operation_scope scope("broadcast_parameters");
    const engine::parameter_layout layout = engine::agreed_parameters(
        checks(), params, root, [&](auto& value, const std::string& what) {
          const tensor_view v = engine::device_value_view(rank(), value, what);
          check(v, what);
          return v;
        });
    // After the ranks agreed: the transfers are watched (a rank stalled in them ends the job).
    const auto watch = watch_transfer("broadcast_parameters", 0);
    move(std::span<const tensor_view>(layout.values));
  }

  //! The same, for a strategy that asks nothing more of a device value than to be one.
  template <parameter_set Params, class Move>
  void broadcast_device_parameters(Params& params, int root, Move&& move) {
    broadcast_device_parameters(
        params, root, [](const tensor_view&, const std::string&) {}, move);
  }

  //! Whether the strategy reduces device memory (see strategy_access.hpp).
  static constexpr bool device_strategy() { return detail::is_device_strategy<Strategy>(); }

private:
  friend strategy_access;

  // A bucket of a scattered reduction (grad_sync_options::owners), reduce-scattered in place over
  // every rank on the gradient channel (MPI's own algorithm, whatever the strategy's
  // topology): what a host strategy does unless it says otherwise (`exchange_scatter`). A
  // bucket of one rank's gradients (a large one alone, in place) is reduced to that rank, which
  // leaves the others' as they were.
  void reduce_scatter_bucket(tensor_view bucket, std::span<const int> blocks, reduce_op op) {
    if (const int owner = engine::single_owner(blocks); owner >= 0) {
      mpi::reduce(grad_comm(), bucket, op, owner);
      return;
    }
    mpi::reduce_scatter_in_place(grad_comm(), bucket, blocks, op);
  }

  // The same for a bucket of `root`'s gradients alone, started and not waited for (the engine
  // keeps a few in flight: strategy_ref::start_reduce).
  mpi::request start_reduce_to(tensor_view bucket, int root, reduce_op op) {
    return mpi::ireduce(grad_comm(), bucket, op, root);
  }

  Strategy& self() noexcept { return static_cast<Strategy&>(*this); }

  engine::strategy_ref strategy() noexcept { return strategy_access::ref(self()); }

  // allreduce_grad, `read` reading the set (a typed one directly: the rest of what
  // parameter_source would instantiate is not needed here).
  template <reducer Reducer>
  void reduce_now(gradient_reader read, const void* set, const Reducer& reducer,
                  grad_sync_options options) {
    static_assert(!(gradient_hook<Reducer> && device_strategy()),
                  "cohort: gradient hooks (powersgd) reduce host gradients over host strategies "
                  "(flat, hierarchical, two_dimensional, ...)");
    reduce_set_now(read, set, strategy(), reduction_table(reducer, size()), options);
  }

  static constexpr void refuse_overlap_on_device() {
    static_assert(!device_strategy(), "cohort: overlap needs a host strategy (flat, ...)");
  }
};

//! A communicator of strategy `Strategy` over all the processes (`MPI_COMM_WORLD`). Collective.
template <class Strategy>
Strategy make_communicator(communicator_options options = {}) {
  return Strategy(boost::mpi::communicator(), options);
}

//! A communicator of strategy `Strategy` over the processes of `comm`. Collective over `comm`.
template <class Strategy>
Strategy make_communicator(const boost::mpi::communicator& comm,
                           communicator_options options = {}) {
  return Strategy(comm, options);
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
