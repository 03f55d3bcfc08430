// SPDX-License-Identifier: Apache-2.0
#pragma once

// The front door every strategy shares: the topology, the tensor and object collectives, the
// parameter broadcast and allreduce_grad, blocking or overlapped with backward. It checks the
// arguments, reads the user's types into type-erased views, and forwards: to the checks
// (engine/checks.hpp), to the gradient-sync engine (engine/grad_sync.hpp), to the transports.
// A strategy derives from basic_communicator<Strategy> (CRTP: no virtual call) and supplies only
// how one bucket of host gradients is exchanged, `exchange(tensor_view, reduce_op)` over the
// gradient channels (`grad_comm()`, ...), or, for device memory, how all of them are reduced,
// `reduce_gradients(std::span<const grad_slot>, const reduction_table&)`.

#include <cohort/communicator/communicator_base.hpp>
#include <cohort/communicator/engine/bucket_plan.hpp>
#include <cohort/communicator/engine/checks.hpp>
#include <cohort/communicator/engine/grad_sync_queue.hpp>
#include <cohort/communicator/engine/parameter_broadcast.hpp>
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
#include <mutex>
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
class basic_communicator : public communicator_base {
public:
  //! Builds the communicator over a duplicate of `comm` (so that cohort's messages never match
  //! the user's), and works out the topology. Collective over `comm`. Every rank must pass the
  //! same strategy and options: they are compared here, whatever `check_agreement` says, and a
  //! difference throws `mismatch_error` on every rank naming the option and both values.
  explicit basic_communicator(const boost::mpi::communicator& comm,
                              communicator_options options = {})
      : communicator_base(comm, options)
      , syncs_(std::make_unique<engine::grad_sync_queue>(
            strategy_access::bucketing<Strategy>(options))) {
    std::string_view name = "a strategy without a name";
    if constexpr (requires { Strategy::name; }) {
      name = Strategy::name;
    }
    // Same name, other template arguments (hierarchical<Intra, Inter>): the type tells.
    checks().agree_on_options(name, typeid(Strategy).name());
    connect(comm);
  }

  //! A reduction still pending on `other` is abandoned first: cohort's thread reads the
  //! communicator it began on.
  basic_communicator(basic_communicator&& other) noexcept
      : communicator_base(
            (other.abandon_grad_sync("its communicator was moved from"), std::move(other)))
      , syncs_(std::move(other.syncs_)) {}

  //! Abandons a reduction pending on either side, then takes `other`'s place (this rank leaves
  //! the communicator it had: its peers are told, see liveness.hpp).
  basic_communicator& operator=(basic_communicator&& other) noexcept {
    if (this != &other) {
      abandon_grad_sync("its communicator was replaced by move assignment");
      other.abandon_grad_sync("its communicator was moved from");
      syncs_ = std::move(other.syncs_);
      communicator_base::operator=(std::move(other));
    }
    return *this;
  }
  basic_communicator(const basic_communicator&) = delete;
  basic_communicator& operator=(const basic_communicator&) = delete;

  //! Abandons an overlapped reduction still pending (the other ranks get an error; nothing this
  //! rank did not mark ready is sent), so that cohort's thread never outlives what it reads.
  //! Then tells the other ranks that this rank leaves the communicator.
  ~basic_communicator() {
    abandon_grad_sync(std::uncaught_exceptions() > 0
                          ? "its communicator was destroyed during the unwinding of an exception"
                          : "its communicator was destroyed");
  }

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
    reduce_blocking(reducer, options, [&](auto& slots, auto& names) {
      collect_gradients(params, options.missing, slots, names);
    });
  }
  //! The same, for a set whose type is erased (see parameter_source).
  template <reducer Reducer>
  void allreduce_grad(const parameter_source& params, const Reducer& reducer,
                      grad_sync_options options = {}) {
    reduce_blocking(reducer, options, [&](auto& slots, auto& names) {
      params.collect(options.missing, slots, names);
    });
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
    const std::lock_guard lock(syncs_->mutex());
    start_locked(parameter_source(params), reducer, options, owner);
  }

  //! Starts an overlapped reduction of gradients given as views (which the caller keeps alive and
  //! does not touch until `wait_grad_sync`): for a wrapper that reduces a copy of the gradients.
  template <reducer Reducer>
  void start_grad_sync(std::span<const grad_slot> slots, const Reducer& reducer,
                       const void* owner = nullptr) {
    detail::operation_scope scope("allreduce_grad");
    const std::lock_guard lock(syncs_->mutex());
    require_overlap_possible(owner);
    engine::grad_sync& lane = syncs_->lane_for(checks(), owner);
    lane.slots().assign(slots.begin(), slots.end());
    syncs_->begin(lane, checks(), strategy(), reduction_table(reducer, size()),
                  missing_grad::report, owner, local_problem(lane));
  }

  //! Parameter `index` of `params` (the set the reduction began with) has its final gradient: it
  //! is read again, and its bucket reduced if that completes it. Safe from any thread.
  template <parameter_set Params>
  void grad_ready(Params& params, std::size_t index) {
    const std::lock_guard lock(syncs_->mutex());
    reread_and_mark(pending_lane("grad_ready", nullptr), parameter_source(params), index);
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
    const std::lock_guard lock(syncs_->mutex());
    engine::grad_sync* lane = syncs_->pending_lane(owner);
    if (lane == nullptr) {
      lane = &start_locked(params, reducer, options, owner);
    }
    reread_and_mark(*lane, params, index);
  }

  //! Gradient `index` of the views given to `start_grad_sync` (by `owner`) is final.
  void grad_ready(std::size_t index, const void* owner = nullptr) {
    const std::lock_guard lock(syncs_->mutex());
    pending_lane("grad_ready", owner).mark(index);
  }

  //! Marks every gradient of `owner`'s reduction not yet ready as ready (in index order). This
  //! order is never learned: it says nothing of when backward produces the gradients.
  void mark_all_ready(const void* owner = nullptr) {
    const std::lock_guard lock(syncs_->mutex());
    pending_lane("grad_ready", owner).mark_rest_ready();
  }

  //! Marks the rest of `owner`'s reduction ready, and waits until every bucket is reduced (for
  //! no owner: a request's reduction, or the only one pending).
  //! Collective (the ranks agree on `end` too). Rethrows the first error on every rank. `now`,
  //! if given, is the gradients as they are: one that moved since the reduction read it is an
  //! error naming it, on every rank. Reductions of other owners begun before this one end
  //! first, their gradients kept (see `take_kept_grad_sync`).
  void wait_grad_sync(step_end end = step_end::update, std::span<const grad_slot> now = {},
                      const void* owner = nullptr) {
    const void* whose = owner;
    {
      const std::lock_guard lock(syncs_->mutex());
      whose = pending_lane("wait", owner).owner();
    }
    syncs_->finish(checks(), whose, end, now);
  }

  //! Waits until every bucket of `owner`'s pending overlapped reduction is reduced, so that its
  //! gradients hold their reduced values, without ending the step (no collective: the step's end
  //! is still agreed at `wait_grad_sync`, where a failure on the way is thrown). What LibTorch's
  //! adapter does at the end of backward, as DDP does. Returns false, waiting for nothing, where
  //! that cannot be now (none pending, gradients not all marked ready, or a reduction begun
  //! before still waiting for its own).
  bool wait_grad_sync_transfers(const void* owner) { return syncs_->wait_transfers(owner); }

  //! Whether `owner`'s last overlapped reduction was ended, its gradients kept reduced, by the
  //! wait of a reduction begun after it (another optimizer's step); forgets it. Its gradients
  //! are reduced already: the step that follows does not reduce them again.
  bool take_kept_grad_sync(const void* owner) noexcept { return syncs_->take_kept(owner); }

  //! `owner` (an optimizer being destroyed) will not reduce again: its lane may serve another.
  void forget_grad_sync_owner(const void* owner) noexcept {
    if (syncs_) {
      syncs_->give_back(owner);
    }
  }

  //! Ends every pending overlapped reduction without sending what was not marked ready: a rank
  //! must never send a gradient its backward did not produce. The buckets already on their way
  //! are finished; at the next bucket (or at the end) every rank gets an error naming this rank
  //! and `why`. With the agreement check off, this rank skips the rest and its peers wait for
  //! it until the timeout ends the job. Does nothing if no reduction is pending.
  void abandon_grad_sync(std::string_view why) noexcept {
    if (syncs_) {
      syncs_->abandon_all(why);
    }
  }

  //! The same for `owner`'s reduction only (and any begun before it that would hold its
  //! buckets back: those still waiting for gradients).
  void abandon_grad_sync_for(const void* owner, std::string_view why) noexcept {
    if (syncs_) {
      syncs_->abandon(owner, why);
    }
  }

  //! Checks gradients about to be reduced from copies (collective, as `allreduce_grad` checks its
  //! own): a wrapper that must refuse a step before it touches anything calls this first.
  template <reducer Reducer>
  void validate_grad_sync(std::span<const grad_slot> slots, const Reducer& reducer,
                          missing_grad missing) {
    detail::operation_scope scope("allreduce_grad");
    engine::grad_sync* lane = nullptr;
    {
      const std::lock_guard lock(syncs_->mutex());
      lane = &syncs_->lane_for(checks(), nullptr);
    }
    lane->validate_copies(checks(), slots, reduction_table(reducer, size()), missing);
  }

  //! Whether an overlapped reduction has begun and not been waited on (any owner's).
  bool grad_sync_pending() const noexcept { return syncs_ != nullptr && syncs_->pending(); }

  //! Whether every bucket of `owner`'s pending overlapped reduction (for no owner: a request's,
  //! or the only one pending) is reduced (or none is pending): `wait_grad_sync` would then only
  //! agree on the end of the step. Does not wait for transfers.
  bool grad_sync_complete(const void* owner = nullptr) const {
    return syncs_ == nullptr || syncs_->complete(owner);
  }

  //! Whether `owner` has an overlapped reduction pending.
  bool grad_sync_pending_for(const void* owner) const noexcept {
    return syncs_ != nullptr && syncs_->pending_for(owner);
  }

  //! Counts the overlapped reductions begun so far (what tells a request its own one).
  std::uint64_t grad_sync_generation() const noexcept { return syncs_ ? syncs_->generation() : 0; }
  //! Whether the reduction begun as the `generation`th is still pending.
  bool grad_sync_pending_at(std::uint64_t generation) const noexcept {
    return syncs_ != nullptr && syncs_->pending_at(generation);
  }

  //! Bytes held by the gradient buckets (each optimizer's, of the last layout it reduced; 0 for
  //! device strategies).
  std::size_t bucket_buffer_bytes() const noexcept {
    return syncs_ ? syncs_->bucket_buffer_bytes() : 0;
  }

  //! Buckets (collectives) per step of the last layout reduced (a device strategy counts its own,
  //! with `device_bucket_count()`).
  std::size_t bucket_count() const noexcept {
    if (const auto device =
            strategy_access::device_bucket_count(static_cast<const Strategy&>(*this))) {
      return *device;
    }
    return syncs_ != nullptr ? syncs_->bucket_count() : 0;
  }

  //! What this communicator's gradient reductions did since it was made or last asked (bytes,
  //! steps, collectives, time reducing and time the trainer waited: see grad_sync_stats), and a
  //! fresh count from now: an epoch's figures, say. Between steps: throws `invalid_argument`
  //! while an overlapped reduction is pending.
  grad_sync_stats take_grad_sync_stats() {
    detail::operation_scope scope("take_grad_sync_stats");
    // Under the lock a backward hook takes to begin a step: none begins between the check and
    // the read.
    const std::lock_guard lock(syncs_->mutex());
    syncs_->require_no_pending(checks(), "take_grad_sync_stats", nullptr);
    return syncs_->take_stats();
  }

  //! The orders this communicator learned to build gradient buckets in (with overlap), by
  //! layout: a checkpoint keeps them (`cohort::bucket_orders`, cohort/checkpoint.hpp).
  std::vector<bucket_order> learned_bucket_orders() const {
    return syncs_ != nullptr ? syncs_->learned_orders() : std::vector<bucket_order>{};
  }

  //! Adopts orders a checkpoint kept, each when its layout is next reduced (as the run that
  //! saved them did), so that a resumed run reduces bit for bit as that run would have. Call it
  //! on every rank alike, between steps.
  void restore_bucket_orders(std::vector<bucket_order> orders) {
    detail::operation_scope scope("restore_bucket_orders");
    const std::lock_guard lock(syncs_->mutex());
    syncs_->require_no_pending(checks(), "restore_bucket_orders", nullptr);
    syncs_->restore_orders(std::move(orders));
  }

protected:
  //! For a strategy whose `exchange` uses members of its own: abandons a pending reduction
  //! before they go (from its destructor).
  void finish_overlap() noexcept { abandon_grad_sync("its communicator was destroyed"); }

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

  // allreduce_grad, `collect` reading the set (a typed one directly: none of parameter_source).
  template <reducer Reducer, class Collect>
  void reduce_blocking(const Reducer& reducer, grad_sync_options options, Collect&& collect) {
    static_assert(!(gradient_hook<Reducer> && device_strategy()),
                  "cohort: gradient hooks (powersgd) reduce host gradients over host strategies "
                  "(flat, hierarchical, two_dimensional, ...)");
    detail::operation_scope scope("allreduce_grad");
    engine::grad_sync* lane = nullptr;
    {
      const std::lock_guard lock(syncs_->mutex());
      syncs_->require_no_pending(checks(), "allreduce_grad", nullptr);
      lane = &syncs_->lane_for(checks(), nullptr);
    }
    collect(lane->slots(), lane->names());
    lane->reduce_blocking(checks(), strategy(),
                          reduction_table(reducer, size()).scattered_to(options.owners, rank()),
                          options.missing, local_problem(*lane, options.owners));
  }

  // What this rank's own checks find in the slots read: memory the strategy cannot reduce.
  // Agreed on with the layout, so that it is an error on every rank.
  std::string local_problem(const engine::grad_sync& lane, std::span<const int> owners = {}) {
    return engine::local_checks([&] {
      if (!owners.empty()) {
        engine::check_owners(owners, lane.slots(), rank(), size(), device_strategy());
      }
      for (const grad_slot& slot : lane.slots()) {
        if (slot.state != slot_state::ok || slot.grad.count == 0) {
          continue;
        }
        checks().require_location(slot.grad.location, device_strategy(), "allreduce_grad");
        strategy_access::check_gradient_memory(self(), slot);
      }
    });
  }

  void require_overlap_possible(const void* owner) {
    static_assert(!device_strategy(), "cohort: overlap needs a host strategy (flat, ...)");
    syncs_->require_overlap_possible(checks(), owner);
  }

  // `owner`'s pending lane (for no owner: the request's, else the one pending, if only one is),
  // or an error naming `operation`. Under the queue's mutex.
  engine::grad_sync& pending_lane(std::string_view operation, const void* owner) {
    engine::grad_sync* lane = syncs_->pending_or_only(owner);
    if (lane == nullptr) {
      throw invalid_argument(
          "cohort: " + std::string(operation) + " on rank " + std::to_string(rank()) + ": " +
          (owner == nullptr && syncs_->pending()
               ? "several optimizers' overlapped reductions are pending: name the owner"
               : "no overlapped allreduce_grad is pending (begin_allreduce_grad starts one)"));
    }
    return *lane;
  }

  // Under the queue's mutex.
  template <reducer Reducer>
  engine::grad_sync& start_locked(const parameter_source& params, const Reducer& reducer,
                                  grad_sync_options options, const void* owner) {
    detail::operation_scope scope("allreduce_grad");
    require_overlap_possible(owner);
    engine::grad_sync& lane = syncs_->lane_for(checks(), owner);
    params.collect(options.missing, lane.slots(), lane.names());
    params.remember(lane.elements());
    lane.elements_of() = params.address();
    syncs_->begin(lane, checks(), strategy(),
                  reduction_table(reducer, size()).scattered_to(options.owners, rank()),
                  options.missing, owner, local_problem(lane, options.owners));
    return lane;
  }

  // Under the queue's mutex: reads parameter `index` again and marks it ready.
  void reread_and_mark(engine::grad_sync& lane, const parameter_source& params, std::size_t index) {
    if (params.remembers_elements() && lane.elements_of() != params.address()) {
      // Its elements are read where the set began's live: another set would be read as this one.
      throw invalid_argument("cohort: grad_ready(" + std::to_string(index) + ") on rank " +
                             std::to_string(rank()) +
                             ": this parameter set is not the one the "
                             "reduction began with; give grad_ready that same set");
    }
    if (!lane.needs_reread(index)) {
      lane.mark(index);
      return;
    }
    lane.mark_reread(index, params.reread(index, lane.elements(), lane.missing()));
  }

  std::unique_ptr<engine::grad_sync_queue> syncs_;
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
