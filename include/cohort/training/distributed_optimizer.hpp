// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/concepts.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/training/detail/gradient_copies.hpp>
#include <cohort/training/distributed_optimizer_options.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

namespace detail {
struct optimizer_sharding; // sharded_optimizer's way in: see sharded_optimizer.hpp
} // namespace detail

//! Wraps an optimizer so that training is data-parallel: on construction every rank's
//! parameters are overwritten with `root`'s (so the replicas start identical, and no step is
//! lost to it as in ChainerMN, whose first update() only broadcast); each `step()` reduces the
//! gradients across ranks with `Reducer` (the mean, by default) and then steps the inner
//! optimizer, so that the replicas stay identical.
//!
//! To overlap the reduction with backward, call `grad_ready(i)` as parameter i's gradient
//! becomes final (from a hook, from any thread): the first call of a step begins the reduction,
//! full buckets leave at once, and `step()` waits for the rest. Inside `no_sync()`, gradients
//! accumulate locally and nothing is reduced: the step after it reduces their sum once (gradient
//! accumulation). `synchronize()` reduces without stepping (to clip the reduced gradients); the
//! `step()` after it does not reduce again. Whatever the mix, a step's gradients are reduced
//! exactly once.
//!
//! Several optimizers may share one communicator (a GAN's generator and discriminator): each
//! reduces only its own parameters' gradients, and their overlapped reductions may be pending at
//! once, reduced in the order they began. A step ends the reductions begun before its own
//! first, keeping their gradients reduced (the discriminator's, which the generator's backward
//! reached): the step of their optimizer then does not reduce them again.
//!
//! The parameter set and the communicator are held by reference: both must outlive the wrapper,
//! and neither may be moved while it is in use. A strategy chosen at compile time costs nothing
//! per step beyond its own work: the parameter set's type is erased once, into the
//! communicator's own `parameter_source` (a table of functions per set type, read once per step
//! and once per `grad_ready`).
//!
//! `Communicator` may be spelled as a reference (`decltype(comm)` of a reference parameter);
//! class template argument deduction also works: `distributed_optimizer opt{sgd{}, comm, params}`.
template <optimizer Optimizer, class Communicator, reducer Reducer = mean>
requires communicator<std::remove_cvref_t<Communicator>>
class distributed_optimizer {
public:
  using communicator_type = std::remove_cvref_t<Communicator>;

  //! Broadcasts `params` from `options.root` (collective). Throws `mismatch_error` if the ranks'
  //! parameter layouts differ.
  template <parameter_set Params>
  distributed_optimizer(Optimizer inner, communicator_type& comm, Params& params,
                        distributed_optimizer_options options = {}, Reducer reducer = {})
      : inner_(std::move(inner))
      , comm_(&comm)
      , reducer_(std::move(reducer))
      , options_(options)
      , params_(params) {
    if constexpr (!overlapping_communicator<communicator_type>) {
      if (options.double_buffering) {
        throw invalid_argument("cohort: distributed_optimizer: double_buffering needs a strategy "
                               "that reduces on cohort's thread (a host strategy: flat, ...)");
      }
    }
    comm.broadcast_parameters(params, options.root);
  }

  distributed_optimizer(const distributed_optimizer&) = delete;
  distributed_optimizer& operator=(const distributed_optimizer&) = delete;

  //! Abandons this optimizer's reduction still in flight: a step that was never taken (an
  //! exception in backward, say) must not send gradients backward never produced. The other
  //! ranks get an error naming this rank at that reduction's next bucket (see
  //! `abandon_grad_sync`). With double buffering, call `finish()` before to apply the last step.
  ~distributed_optimizer() {
    if constexpr (overlapping_communicator<communicator_type>) {
      if (comm_->grad_sync_pending_for(this)) {
        comm_->abandon_grad_sync_for(
            this, std::uncaught_exceptions() > 0
                      ? "its distributed_optimizer was destroyed during the unwinding of an "
                        "exception, in the middle of a step"
                      : "its distributed_optimizer was destroyed in the middle of a step");
      }
      comm_->forget_grad_sync_owner(this);
    }
  }

  //! Reduces the gradients across ranks (or waits for the overlapped reduction), then steps the
  //! inner optimizer. With double buffering: starts reducing these gradients and steps with the
  //! previous step's. Collective.
  void step() {
    require_syncing("step");
    if (options_.double_buffering) {
      if (swap_and_start()) {
        inner_.step();
      }
      return;
    }
    if (!synchronized_.load(std::memory_order_relaxed)) {
      // After a start that failed (on every rank alike), a blocking reduction checks again.
      clear_failed_start();
      reduce();
    }
    synchronized_.store(false, std::memory_order_relaxed);
    inner_.step();
  }

  //! Ends this step without stepping the inner optimizer: after `synchronize()` when the update
  //! is skipped (non-finite gradients under a loss scaler, say), so that the next step starts
  //! afresh. A reduction this optimizer's hooks began is finished first (collective; the ranks
  //! agree that its gradients are dropped: a rank that steps with them while another skips is an
  //! error on every rank). Horovod's `skip_synchronize` for the case where the step is not taken.
  void skip_step() {
    if constexpr (overlapping_communicator<communicator_type>) {
      if (comm_->grad_sync_pending_for(this)) {
        end_pending(step_end::discard);
      }
      comm_->take_kept_grad_sync(this);
    }
    synchronized_.store(false, std::memory_order_relaxed);
    clear_failed_start();
  }

  //! Reduces the gradients across ranks without stepping: for gradient clipping or inspection
  //! between the reduction and the update; the next `step()` uses them as they are. Collective.
  //! Throws `invalid_argument` if called twice before a step (the gradients are reduced already).
  void synchronize() {
    require_syncing("synchronize");
    if (options_.double_buffering) {
      throw invalid_argument("cohort: synchronize() with double_buffering: the gradients are "
                             "reduced one step late; finish() applies the last reduction");
    }
    if (synchronized_.load(std::memory_order_relaxed)) {
      throw invalid_argument("cohort: synchronize() on rank " + std::to_string(comm_->rank()) +
                             " twice before a step: this step's gradients are reduced already "
                             "(reducing them again would scale them once more); call step()");
    }
    reduce();
    synchronized_.store(true, std::memory_order_relaxed);
  }

  //! Parameter `index`'s gradient is final (call it from backward, from any thread): begins the
  //! step's overlapped reduction on the first call, and sends every bucket this completes.
  //! Ignored inside `no_sync()` and with double buffering (which reduces at `step()`). After
  //! `synchronize()` (or `keep_reduced()`), a new backward accumulates onto the reduced
  //! gradients and its reduction reduces the sum: right for a reducer that averages (the mean of
  //! reduced + local is reduced + the mean of local), an error naming no_sync() for others.
  //!
  //! From the first call until the step's end (`step()`, `skip_step()`), every gradient must
  //! stay where it is: cohort's thread reads it and writes the reduced value back into the
  //! memory it had when the reduction began (or when it was marked ready). A gradient that moved
  //! by then (its tensor replaced or reallocated) is an error naming it on every rank at the
  //! step; memory freed meanwhile is the caller's bug (LibTorch's adapter holds every tensor for
  //! its caller).
  void grad_ready(std::size_t index) requires overlapping_communicator<communicator_type> {
    // A gradient changes: reduced gradients another optimizer's step kept for this one are
    // this one's no longer (inside no_sync() too: the step after must reduce them).
    comm_->take_kept_grad_sync(this);
    if (no_sync_depth_.load(std::memory_order_relaxed) != 0 || options_.double_buffering) {
      return;
    }
    if (synchronized_.load(std::memory_order_relaxed)) {
      require_averaging("grad_ready(" + std::to_string(index) + ") after synchronize()");
      synchronized_.store(false, std::memory_order_relaxed);
    }
    if (start_failed_.load(std::memory_order_relaxed) && !failed_backward_over(index)) {
      // Every rank's start failed alike; retrying it from each later hook of that backward would
      // make each rank issue as many collectives as its autograd engine has hooks left.
      throw invalid_argument("cohort: grad_ready(" + std::to_string(index) + ") on rank " +
                             std::to_string(comm_->rank()) +
                             ": this step's overlapped reduction failed to start (see the first "
                             "error); step() reduces it blocking, or skip_step() drops it");
    }
    try {
      comm_->grad_ready_for(this, params_, reducer_, sync_options(), index);
    } catch (...) {
      if (!comm_->grad_sync_pending_for(this)) {
        const std::lock_guard lock(failed_mutex_);
        failed_marks_.clear();
        failed_marks_.resize(index + 1, 0);
        failed_marks_[index] = 1;
        start_failed_.store(true, std::memory_order_relaxed);
      }
      throw;
    }
  }

  //! A hook's owner that knows where backward passes begin (LibTorch's adapter) says so: a start
  //! that failed on every rank in the last one is over (see grad_ready: without this call, a
  //! backward is known to be new when it marks a gradient the failed one marked).
  void backward_began() noexcept { clear_failed_start(); }

  //! Waits until this optimizer's pending reduction has reduced every bucket (its gradients hold
  //! the reduced values) without ending the step, as DDP does at the end of backward: from then
  //! on the gradients may change (clipping, a zero_grad of LibTorch's own) with no harm, and the
  //! step's end compares nothing of them. Does nothing where it cannot wait now (see
  //! wait_grad_sync_transfers).
  void wait_reduced() requires overlapping_communicator<communicator_type> {
    if (!options_.double_buffering && comm_->wait_grad_sync_transfers(this)) {
      reduced_.store(true, std::memory_order_relaxed);
    }
  }

  //! Whether the pending reduction has reduced every bucket (see wait_reduced).
  bool reduced() const noexcept { return reduced_.load(std::memory_order_relaxed); }

  //! Ends this optimizer's pending reduction, its gradients kept reduced, before a second
  //! backward of the same step accumulates onto them (what LibTorch's adapter does as that
  //! backward reaches its first gradient, as DDP reduces at the end of every backward): the next
  //! reduction reduces reduced + local, which is right for a reducer that averages; for others,
  //! an error that names no_sync(). Collective. Does nothing if none is pending.
  void keep_reduced() requires overlapping_communicator<communicator_type> {
    if (!comm_->grad_sync_pending_for(this) || options_.double_buffering) {
      return;
    }
    require_averaging("a second backward before step()");
    end_pending(step_end::keep);
  }

  //! With double buffering, waits for the last reduction and steps with it, so that no step's
  //! gradients are lost at the end of training. Otherwise does nothing. Collective.
  void finish() {
    if constexpr (overlapping_communicator<communicator_type>) {
      if (options_.double_buffering && comm_->grad_sync_pending_for(this)) {
        // The gradients are read again: they may have moved since the last step.
        params_.collect(options_.missing, slots_, names_);
        copies_.require_same_layout(slots_, comm_->rank(), "finish");
        comm_->wait_grad_sync(step_end::update, {}, this);
        copies_.swap_with(slots_);
        inner_.step();
      }
    }
  }

  //! While the returned guard lives, gradients are not reduced: the backward passes of several
  //! micro-batches accumulate into them (the caller does not zero them), and the first `step()`
  //! after the guard reduces their sum once. `step()` inside the guard throws.
  class no_sync_guard {
  public:
    explicit no_sync_guard(distributed_optimizer& owner) noexcept
        : owner_(&owner) {
      owner_->no_sync_depth_.fetch_add(1, std::memory_order_relaxed);
    }
    no_sync_guard(no_sync_guard&& other) noexcept
        : owner_(std::exchange(other.owner_, nullptr)) {}
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;
    no_sync_guard& operator=(no_sync_guard&&) = delete;
    ~no_sync_guard() {
      if (owner_ != nullptr) {
        owner_->no_sync_depth_.fetch_sub(1, std::memory_order_relaxed);
      }
    }

  private:
    distributed_optimizer* owner_;
  };

  [[nodiscard]] no_sync_guard no_sync() {
    if constexpr (overlapping_communicator<communicator_type>) {
      if (comm_->grad_sync_pending_for(this) && !options_.double_buffering) {
        throw invalid_argument("cohort: no_sync() while this step's gradients are already being "
                               "reduced (grad_ready was called): enter no_sync before backward");
      }
    }
    return no_sync_guard(*this);
  }

  //! Whether the reducer averages (maps equal gradients to themselves: `mean`, `compressed`):
  //! only then is reducing gradients reduced already, plus new ones, right (R(R(a) + b) =
  //! R(a + b)), as a backward that accumulates onto reduced gradients does.
  bool averages() const {
    if constexpr (gradient_hook<Reducer>) {
      return false; // (a compression of reduced gradients plus new ones is not theirs together)
    }
    const int ranks = comm_->size();
    const grad_reduction plan = reducer_.plan(dtype::float32, ranks);
    const double gain = plan.pre_scale * plan.post_scale * ranks;
    return plan.op == reduce_op::sum && gain > 1.0 - 1e-9 && gain < 1.0 + 1e-9;
  }

  //! Whether gradients are reduced now (false inside `no_sync()`).
  bool syncing() const noexcept { return no_sync_depth_.load(std::memory_order_relaxed) == 0; }

  Optimizer& inner() noexcept { return inner_; }
  const Optimizer& inner() const noexcept { return inner_; }
  communicator_type& comm() const noexcept { return *comm_; }
  const Reducer& reducer() const noexcept { return reducer_; }

private:
  friend struct detail::optimizer_sharding;

  // This step's reduction: the one this optimizer's hooks began, or a blocking one (which the
  // communicator refuses, naming it, while another optimizer's reduction is pending).
  void reduce() {
    if constexpr (overlapping_communicator<communicator_type>) {
      if (comm_->grad_sync_pending_for(this)) {
        end_pending(step_end::update);
        return;
      }
      if (comm_->take_kept_grad_sync(this)) {
        return; // a later optimizer's step ended this one's reduction, its gradients kept
      }
    }
    comm_->allreduce_grad(params_, reducer_, sync_options());
  }

  // Waits for this optimizer's overlapped reduction, its gradients as they are now compared with
  // the memory it reads and writes (a gradient replaced since is an error on every rank).
  // (Double buffering reduces its own copies; dropped gradients may have moved harmlessly.)
  void end_pending(step_end end) requires overlapping_communicator<communicator_type> {
    // (reset first: what follows may throw, and the reduction is over either way)
    const bool reduced = reduced_.exchange(false, std::memory_order_relaxed);
    if (options_.double_buffering || end == step_end::discard || reduced) {
      comm_->wait_grad_sync(end, {}, this);
      return;
    }
    params_.collect(options_.missing, slots_, names_);
    comm_->wait_grad_sync(end, std::span<const grad_slot>(slots_), this);
  }

  // Whether grad_ready(index) after a failed start belongs to a new backward, the failed one
  // being over: its gradient was marked since the failure already (each backward marks each
  // gradient once). The step that failed on every rank is then over, with no call between.
  bool failed_backward_over(std::size_t index) {
    const std::lock_guard lock(failed_mutex_);
    if (index >= failed_marks_.size()) {
      failed_marks_.resize(index + 1, 0);
    }
    if (failed_marks_[index] == 0) {
      failed_marks_[index] = 1;
      return false;
    }
    start_failed_.store(false, std::memory_order_relaxed);
    return true;
  }

  void clear_failed_start() noexcept { start_failed_.store(false, std::memory_order_relaxed); }

  grad_sync_options sync_options() const noexcept { return {options_.missing, owners_}; }

  void require_averaging(const std::string& what) const {
    if (!owners_.empty()) {
      // Reduce-scattered, only the owner's copy of a gradient is reduced: the others' sum with a
      // new backward would no longer add up to the mean.
      throw invalid_argument("cohort: " + what + " on rank " + std::to_string(comm_->rank()) +
                             ": with gradients sharded (stage 2), a gradient is reduced on its "
                             "owner alone, and a backward onto reduced gradients cannot be "
                             "reduced again: wrap every backward but the step's last in "
                             "no_sync()");
    }
    if (!averages()) {
      throw invalid_argument("cohort: " + what + " on rank " + std::to_string(comm_->rank()) +
                             ": this step's gradients are reduced already, and reducing them "
                             "again with this reducer (not a mean) would scale them twice: wrap "
                             "every backward but the step's last in no_sync()");
    }
  }

  void require_syncing(std::string_view operation) const {
    if (no_sync_depth_.load(std::memory_order_relaxed) != 0) {
      throw invalid_argument("cohort: " + std::string(operation) +
                             "() inside no_sync(): the gradients are being accumulated; leave "
                             "the no_sync scope before the backward pass that ends the "
                             "accumulation, then step");
    }
  }

  // Double buffering: waits for the previous reduction, swaps the reduced copy with the fresh
  // gradients, and starts reducing the fresh ones. Returns whether a reduced gradient was swapped
  // in (not on the first step).
  bool swap_and_start() {
    if constexpr (overlapping_communicator<communicator_type>) {
      const bool had_previous = comm_->grad_sync_pending_for(this);
      // Checked before the previous reduction is waited for, so that a refused step loses
      // nothing: that reduction stays pending, for the next step or finish().
      params_.collect(options_.missing, slots_, names_);
      comm_->validate_grad_sync(std::span<const grad_slot>(slots_), reducer_, options_.missing);
      if (had_previous) {
        copies_.require_same_layout(slots_, comm_->rank(), "step");
        comm_->wait_grad_sync(step_end::update, {}, this);
      } else {
        copies_.make(slots_);
      }
      copies_.swap_with(slots_);
      comm_->start_grad_sync(copies_.slots(), reducer_, this);
      comm_->mark_all_ready(this);
      return had_previous;
    } else {
      return false;
    }
  }

  Optimizer inner_;
  communicator_type* comm_;
  Reducer reducer_;
  distributed_optimizer_options options_;
  parameter_source params_;     // the one erasure of the parameter set, the communicator's own
  std::span<const int> owners_; // reduce-scattered to these (sharded_optimizer's stage 2)
  // Read by hooks on other threads (LibTorch's autograd engine), hence atomic.
  std::atomic<int> no_sync_depth_{0};
  std::atomic<bool> synchronized_{false};
  std::atomic<bool> start_failed_{false};
  std::atomic<bool> reduced_{false}; // the pending reduction's buckets all reduced (wait_reduced)
  // After a failed start: the gradients marked since (see failed_backward_over).
  std::mutex failed_mutex_;
  std::vector<char> failed_marks_;
  // Double buffering: the gradients' views this step, and the copies being reduced.
  std::vector<grad_slot> slots_;
  std::vector<std::string> names_;
  detail::gradient_copies copies_;
};

template <class Optimizer, class Communicator, class Params>
distributed_optimizer(Optimizer, Communicator&, Params&)
    -> distributed_optimizer<Optimizer, Communicator, mean>;
template <class Optimizer, class Communicator, class Params>
distributed_optimizer(Optimizer, Communicator&, Params&, distributed_optimizer_options)
    -> distributed_optimizer<Optimizer, Communicator, mean>;
template <class Optimizer, class Communicator, class Params, class Reducer>
distributed_optimizer(Optimizer, Communicator&, Params&, distributed_optimizer_options, Reducer)
    -> distributed_optimizer<Optimizer, Communicator, Reducer>;

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
