// SPDX-License-Identifier: Apache-2.0
#pragma once

// What grad_sync_base.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/engine/grad_sync.hpp>
#include <cohort/communicator/engine/grad_sync_queue.hpp>
#include <cohort/communicator/engine/slots.hpp>
#include <cohort/communicator/grad_sync_base.hpp>
#include <cohort/detail/operation.hpp>
#include <cohort/error.hpp>

#include <exception>
#include <mutex>
#include <string>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

COHORT_DECL grad_sync_base::grad_sync_base(const boost::mpi::communicator& comm,
                                           const communicator_options& options,
                                           engine::bucket_limits limits)
    : communicator_base(comm, options)
    , syncs_(std::make_unique<engine::grad_sync_queue>(limits)) {}

COHORT_DECL grad_sync_base::grad_sync_base(grad_sync_base&& other) noexcept
    : communicator_base(
          (other.abandon_grad_sync("its communicator was moved from"), std::move(other)))
    , syncs_(std::move(other.syncs_)) {}

COHORT_DECL grad_sync_base& grad_sync_base::operator=(grad_sync_base&& other) noexcept {
  if (this != &other) {
    abandon_grad_sync("its communicator was replaced by move assignment");
    other.abandon_grad_sync("its communicator was moved from");
    syncs_ = std::move(other.syncs_);
    communicator_base::operator=(std::move(other));
  }
  return *this;
}

COHORT_DECL grad_sync_base::~grad_sync_base() {
  abandon_grad_sync(std::uncaught_exceptions() > 0
                        ? "its communicator was destroyed during the unwinding of an exception"
                        : "its communicator was destroyed");
}

COHORT_DECL void grad_sync_base::grad_ready(std::size_t index, const void* owner) {
  const std::lock_guard lock(syncs_->mutex());
  pending_lane("grad_ready", owner).mark(index);
}

COHORT_DECL void grad_sync_base::mark_all_ready(const void* owner) {
  const std::lock_guard lock(syncs_->mutex());
  pending_lane("grad_ready", owner).mark_rest_ready();
}

COHORT_DECL void grad_sync_base::wait_grad_sync(step_end end, std::span<const grad_slot> now,
                                                const void* owner) {
  const void* whose = owner;
  {
    const std::lock_guard lock(syncs_->mutex());
    whose = pending_lane("wait", owner).owner();
  }
  syncs_->finish(checks(), whose, end, now);
}

COHORT_DECL bool grad_sync_base::wait_grad_sync_transfers(const void* owner) {
  return syncs_->wait_transfers(owner);
}

COHORT_DECL bool grad_sync_base::take_kept_grad_sync(const void* owner) noexcept {
  return syncs_->take_kept(owner);
}

COHORT_DECL void grad_sync_base::forget_grad_sync_owner(const void* owner) noexcept {
  if (syncs_) {
    syncs_->give_back(owner);
  }
}

COHORT_DECL void grad_sync_base::abandon_grad_sync(std::string_view why) noexcept {
  if (syncs_) {
    syncs_->abandon_all(why);
  }
}

COHORT_DECL void grad_sync_base::abandon_grad_sync_for(const void* owner,
                                                       std::string_view why) noexcept {
  if (syncs_) {
    syncs_->abandon(owner, why);
  }
}

COHORT_DECL bool grad_sync_base::grad_sync_pending() const noexcept {
  return syncs_ != nullptr && syncs_->pending();
}

COHORT_DECL bool grad_sync_base::grad_sync_complete(const void* owner) const {
  return syncs_ == nullptr || syncs_->complete(owner);
}

COHORT_DECL bool grad_sync_base::grad_sync_pending_for(const void* owner) const noexcept {
  return syncs_ != nullptr && syncs_->pending_for(owner);
}

COHORT_DECL std::uint64_t grad_sync_base::grad_sync_generation() const noexcept {
  return syncs_ ? syncs_->generation() : 0;
}

COHORT_DECL bool grad_sync_base::grad_sync_pending_at(std::uint64_t generation) const noexcept {
  return syncs_ != nullptr && syncs_->pending_at(generation);
}

COHORT_DECL std::size_t grad_sync_base::bucket_buffer_bytes() const noexcept {
  return syncs_ ? syncs_->bucket_buffer_bytes() : 0;
}

COHORT_DECL std::size_t grad_sync_base::host_bucket_count() const noexcept {
  return syncs_ ? syncs_->bucket_count() : 0;
}

COHORT_DECL grad_sync_stats grad_sync_base::take_grad_sync_stats() {
  detail::operation_scope scope("take_grad_sync_stats");
  // Under the lock a backward hook takes to begin a step: none begins between the check and the
  // read.
  const std::lock_guard lock(syncs_->mutex());
  syncs_->require_no_pending(checks(), "take_grad_sync_stats", nullptr);
  return syncs_->take_stats();
}

COHORT_DECL std::vector<bucket_order> grad_sync_base::learned_bucket_orders() const {
  return syncs_ != nullptr ? syncs_->learned_orders() : std::vector<bucket_order>{};
}

COHORT_DECL void grad_sync_base::restore_bucket_orders(std::vector<bucket_order> orders) {
  detail::operation_scope scope("restore_bucket_orders");
  const std::lock_guard lock(syncs_->mutex());
  syncs_->require_no_pending(checks(), "restore_bucket_orders", nullptr);
  syncs_->restore_orders(std::move(orders));
}

COHORT_DECL void grad_sync_base::finish_overlap() noexcept {
  abandon_grad_sync("its communicator was destroyed");
}

COHORT_DECL void grad_sync_base::reduce_set_now(gradient_reader read, const void* set,
                                                const engine::strategy_ref& strategy,
                                                const reduction_table& table,
                                                grad_sync_options options) {
  detail::operation_scope scope("allreduce_grad");
  engine::grad_sync* lane = nullptr;
  {
    const std::lock_guard lock(syncs_->mutex());
    syncs_->require_no_pending(checks(), "allreduce_grad", nullptr);
    lane = &syncs_->lane_for(checks(), nullptr);
  }
  read(set, options.missing, lane->slots(), lane->names());
  lane->reduce_blocking(checks(), strategy, table.scattered_to(options.owners, rank()),
                        options.missing, local_problem(*lane, strategy, options.owners));
}

COHORT_DECL void grad_sync_base::start_set(const parameter_source& params,
                                           const engine::strategy_ref& strategy,
                                           const reduction_table& table, grad_sync_options options,
                                           const void* owner) {
  const std::lock_guard lock(syncs_->mutex());
  start_locked(params, strategy, table, options, owner);
}

COHORT_DECL void grad_sync_base::start_views(std::span<const grad_slot> slots,
                                             const engine::strategy_ref& strategy,
                                             const reduction_table& table, const void* owner) {
  detail::operation_scope scope("allreduce_grad");
  const std::lock_guard lock(syncs_->mutex());
  require_overlap_possible(owner);
  engine::grad_sync& lane = syncs_->lane_for(checks(), owner);
  lane.slots().assign(slots.begin(), slots.end());
  syncs_->begin(lane, checks(), strategy, table, missing_grad::report, owner,
                local_problem(lane, strategy));
}

COHORT_DECL void grad_sync_base::mark_ready_in(const parameter_source& params, std::size_t index) {
  const std::lock_guard lock(syncs_->mutex());
  reread_and_mark(pending_lane("grad_ready", nullptr), params, index);
}

COHORT_DECL bool grad_sync_base::mark_ready_if_pending(const void* owner,
                                                       const parameter_source& params,
                                                       std::size_t index) {
  const std::lock_guard lock(syncs_->mutex());
  engine::grad_sync* lane = syncs_->pending_lane(owner);
  if (lane == nullptr) {
    return false;
  }
  reread_and_mark(*lane, params, index);
  return true;
}

COHORT_DECL void grad_sync_base::mark_ready_for(const void* owner, const parameter_source& params,
                                                const engine::strategy_ref& strategy,
                                                const reduction_table& table,
                                                grad_sync_options options, std::size_t index) {
  const std::lock_guard lock(syncs_->mutex());
  engine::grad_sync* lane = syncs_->pending_lane(owner);
  if (lane == nullptr) {
    lane = &start_locked(params, strategy, table, options, owner);
  }
  reread_and_mark(*lane, params, index);
}

COHORT_DECL void grad_sync_base::validate_views(std::span<const grad_slot> slots,
                                                const reduction_table& table,
                                                missing_grad missing) {
  detail::operation_scope scope("allreduce_grad");
  engine::grad_sync* lane = nullptr;
  {
    const std::lock_guard lock(syncs_->mutex());
    lane = &syncs_->lane_for(checks(), nullptr);
  }
  lane->validate_copies(checks(), slots, table, missing);
}

COHORT_DECL engine::grad_sync& grad_sync_base::start_locked(const parameter_source& params,
                                                            const engine::strategy_ref& strategy,
                                                            const reduction_table& table,
                                                            grad_sync_options options,
                                                            const void* owner) {
  detail::operation_scope scope("allreduce_grad");
  require_overlap_possible(owner);
  engine::grad_sync& lane = syncs_->lane_for(checks(), owner);
  params.collect(options.missing, lane.slots(), lane.names());
  params.remember(lane.elements());
  lane.elements_of() = params.address();
  syncs_->begin(lane, checks(), strategy, table.scattered_to(options.owners, rank()),
                options.missing, owner, local_problem(lane, strategy, options.owners));
  return lane;
}

COHORT_DECL void grad_sync_base::require_overlap_possible(const void* owner) {
  syncs_->require_overlap_possible(checks(), owner);
}

COHORT_DECL std::string grad_sync_base::local_problem(const engine::grad_sync& lane,
                                                      const engine::strategy_ref& strategy,
                                                      std::span<const int> owners) const {
  return engine::local_checks([&] {
    if (!owners.empty()) {
      engine::check_owners(owners, lane.slots(), rank(), size(), strategy.device());
    }
    for (const grad_slot& slot : lane.slots()) {
      if (slot.state != slot_state::ok || slot.grad.count == 0) {
        continue;
      }
      checks().require_location(slot.grad.location, strategy.device(), "allreduce_grad");
      if (strategy.check_gradient_memory != nullptr) {
        strategy.check_gradient_memory(strategy.self, slot);
      }
    }
  });
}

COHORT_DECL engine::grad_sync& grad_sync_base::pending_lane(std::string_view operation,
                                                            const void* owner) {
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

COHORT_DECL void grad_sync_base::reread_and_mark(engine::grad_sync& lane,
                                                 const parameter_source& params,
                                                 std::size_t index) {
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

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
