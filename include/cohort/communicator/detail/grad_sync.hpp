// SPDX-License-Identifier: Apache-2.0
#pragma once

// The gradient-sync engine: blocking and overlapped reductions (and, through the optimizer's
// copies, double-buffered ones) of type-erased gradient slots, host and device alike. Not a
// template: it is compiled once whatever the strategy, the parameter set and the reducer, which
// reach it as a `strategy_ref` (two function pointers), slots and a `reduction_table`. The
// templated front door (basic_communicator.hpp) only reads the user's types into slots.

#include <cohort/communicator/bucket_plan.hpp>
#include <cohort/communicator/bucketed_reduction.hpp>
#include <cohort/communicator/detail/checks.hpp>
#include <cohort/communicator/detail/readiness.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/liveness.hpp>
#include <cohort/communicator/overlap_worker.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/operation.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

//! What the engine needs of a strategy, type-erased: for a host strategy, how one packed bucket
//! is exchanged (and, optionally, what its exchange allocates before the ranks agree); for a
//! device strategy, how all the gradients are reduced in one call. One indirect call per bucket,
//! beside a collective of up to `bucket_bytes`.
struct strategy_ref {
  void* self = nullptr;
  void (*exchange)(void*, tensor_view, reduce_op) = nullptr;
  void (*prepare)(void*, const bucket&) = nullptr;
  void (*reduce_all)(void*, std::span<const grad_slot>, const reduction_table&) = nullptr;

  bool device() const noexcept { return reduce_all != nullptr; }
};

//! One communicator's gradient reductions. Blocking calls run on the caller's thread; an
//! overlapped one reduces each bucket on cohort's own thread as soon as its gradients are marked
//! ready and the buckets before it are on their way. `mutex()` guards the overlapped state (hooks
//! may call from several threads at once: LibTorch's autograd does); the front door holds it
//! around every call that reads or marks slots.
class grad_sync {
public:
  explicit grad_sync(bucket_limits limits)
      : reduction_(limits) {}

  grad_sync(const grad_sync&) = delete;
  grad_sync& operator=(const grad_sync&) = delete;

  std::mutex& mutex() noexcept { return mutex_; }

  //! The slots of the reduction being prepared, filled by the front door (collect_gradients).
  std::vector<grad_slot>& slots() noexcept { return slots_; }
  std::vector<std::string>& names() noexcept { return names_; }
  //! Where each parameter of a set that is not random-access lives, so that `grad_ready` reads
  //! one again in O(1) instead of walking the set.
  std::vector<void*>& elements() noexcept { return elements_; }

  // ---- blocking ------------------------------------------------------------------------------

  //! Reduces `slots()` on this thread (none pending: the front door checked before it read
  //! them). `problem` is what this rank's own checks found.
  void reduce_blocking(const checks& c, const strategy_ref& s, const reduction_table& table,
                       missing_grad missing, std::string problem) {
    validate(c, s, table, missing, "blocking", std::move(problem));
    const auto watch = c.watch_transfer("allreduce_grad", c.live().bytes(waiter::caller));
    c.fatal_on_failure("allreduce_grad", [&] {
      const std::span<const grad_slot> slots(slots_);
      if (s.device()) {
        s.reduce_all(s.self, slots, table);
        return;
      }
      const std::size_t buckets = reduction_.plan().buckets().size();
      for (std::size_t b = 0; b < buckets; ++b) {
        reduction_.reduce_bucket(
            b, slots, [&](tensor_view packed, reduce_op op) { s.exchange(s.self, packed, op); });
      }
    });
  }

  //! Checks gradients about to be reduced from copies (collective), for a wrapper that must
  //! refuse a step before it touches anything.
  void validate_copies(const checks& c, std::span<const grad_slot> slots,
                       const reduction_table& table, missing_grad missing) const {
    validate_gradients(c.live(), waiter::caller, "allreduce_grad",
                       c.live().next_sequence(waiter::caller), slots, c.options().check_agreement,
                       missing, std::string(), "double-buffered", table);
  }

  // ---- overlapped (under mutex()) --------------------------------------------------------------

  //! Throws unless an overlapped reduction may begin now: none pending, MPI threads enough, and
  //! cohort's thread made (before the ranks agree: a thread that cannot start fails here alone).
  void require_overlap_possible(const checks& c, const void* owner) {
    require_no_pending(c, "begin_allreduce_grad", owner);
    if (!threads_checked_) {
      c.require_thread_multiple();
      threads_checked_ = true;
    }
    if (!worker_) {
      worker_ = std::make_unique<overlap_worker<grad_sync>>();
    }
  }

  //! Begins an overlapped reduction of `slots()` (collective: the ranks agree on it now). The
  //! order the gradients become ready in is learned over `world` (cohort's gradient channel).
  void begin(const checks& c, const strategy_ref& s, MPI_Comm world, const reduction_table& table,
             missing_grad missing, const void* owner, std::string problem) {
    validate(c, s, table, missing, "overlapped", std::move(problem));
    checks_ = &c;
    world_ = world;
    strategy_ = s;
    owner_ = owner;
    missing_ = missing;
    readiness_.begin(reduction_.plan(), slots_.size());
    ++generation_;
    abandoned_from_.store(none);
    caller_marked_ = false;
    problem_.clear();
    problem_flag_.store(false);
    worker_->start(*this);
    pending_ = true;
  }

  //! Throws unless the pending reduction is `owner`'s (a hook of another optimizer).
  void require_owner(const checks& c, const void* owner, std::size_t index) const {
    if (owner_ != owner) {
      throw invalid_argument(
          "cohort: grad_ready(" + std::to_string(index) + ") on rank " + std::to_string(c.rank()) +
          ": another optimizer's overlapped reduction is pending on this communicator (its hooks "
          "marked gradients ready and it has not stepped): step it before this backward, keep "
          "its hooks quiet during this backward with its no_sync() (a GAN's discriminator during "
          "the generator's backward), or give each optimizer a communicator of its own");
    }
  }

  void require_pending(const checks& c, std::string_view operation) const {
    if (!pending_) {
      throw invalid_argument("cohort: " + std::string(operation) + " on rank " +
                             std::to_string(c.rank()) +
                             ": no overlapped allreduce_grad is pending (begin_allreduce_grad "
                             "starts one)");
    }
  }

  //! Whether gradient `index` must be read again before it is marked (not yet marked: a marked
  //! one may be in flight on cohort's thread, and its view is never touched again).
  bool needs_reread(std::size_t index) const noexcept {
    return index < slots_.size() && !readiness_.is_ready(index);
  }
  missing_grad missing() const noexcept { return missing_; }

  //! Marks gradient `index` ready, with `now` its view read again just before: a gradient whose
  //! size, dtype or memory changed since the reduction began is a problem every rank hears of.
  void mark_reread(std::size_t index, const grad_slot& now) {
    grad_slot& then = slots_[index];
    if (now.state != slot_state::ok || now.grad.count != then.grad.count ||
        now.grad.type != then.grad.type || now.grad.location != then.grad.location) {
      grad_slot changed = now;
      changed.name = then.name;
      report("cohort: grad_ready on rank " + std::to_string(checks_->rank()) + ": " +
             slot_label(then) + " had " + slot_description(then) +
             " when the reduction began, and now has " + slot_description(changed));
      return;
    }
    then.grad = now.grad;
    mark(index);
  }

  //! Marks gradient `index` ready as it is.
  void mark(std::size_t index) {
    caller_marked_ = true;
    mark_ready(index);
  }

  //! Marks every gradient not yet ready as ready (in index order, an order never learned).
  void mark_rest_ready() {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (!readiness_.is_ready(i)) {
        mark_ready(i);
      }
    }
    // Buckets whose members are all empty gradients have nothing to wait for.
    if (!readiness_.all_launched()) {
      worker_->launch(readiness_.launch_all());
    }
  }

  //! Waits for cohort's thread, then ends the step with an agreement on what every rank found
  //! (collective). Call after `mark_rest_ready`, without holding `mutex()`.
  void finish() {
    operation_scope scope("allreduce_grad");
    struct done_on_exit {
      grad_sync& g;
      ~done_on_exit() {
        // Whatever threw, cohort's thread is done with this step before the next may start.
        try {
          g.worker_->wait();
        } catch (...) {
        }
        const std::lock_guard lock(g.mutex_);
        g.pending_ = false;
      }
    } done{*this};
    const checks& c = *checks_;
    // A bucket's agreement that failed failed on every rank alike: rethrown here everywhere.
    worker_->wait();
    // A problem found after the last bucket left (a gradient marked twice, say): an error on
    // every rank, the failing rank's own.
    const std::string problem = problem_flag_.load() ? problem_ : std::string();
    if (c.options().check_agreement) {
      c.settle_on(waiter::reducer, "allreduce_grad (end of the step)", 0, problem);
    } else if (!problem.empty()) {
      throw invalid_argument(problem);
    }
    if (reduction_.learning() && abandoned_from_.load() == none) {
      learn_order(c);
    }
  }

  //! Ends a pending overlapped reduction without sending what was not marked ready (see
  //! basic_communicator::abandon_grad_sync). Does nothing if none is pending.
  void abandon(std::string_view why) noexcept {
    if (!pending_) {
      return;
    }
    try {
      {
        const std::lock_guard lock(mutex_);
        if (!pending_) {
          return;
        }
        abandoned_from_.store(readiness_.launched());
        report("cohort: rank " + std::to_string(checks_->rank()) +
               " abandoned its overlapped gradient reduction (" + std::string(why) +
               "): the gradients it had not marked ready were never sent");
        worker_->launch(readiness_.launch_all());
      }
      finish();
    } catch (...) {
      // Every rank is told through the agreement; this rank has nothing more to say.
    }
  }

  bool pending() const noexcept { return pending_; }
  bool pending_for(const void* owner) const noexcept { return pending_ && owner_ == owner; }
  std::uint64_t generation() const noexcept { return generation_; }

  //! Whether every bucket of the pending reduction is reduced (or none is pending).
  bool complete() {
    if (!pending_) {
      return true;
    }
    const std::lock_guard lock(mutex_);
    return readiness_.all_launched() && worker_->idle();
  }

  //! Throws if an overlapped reduction is pending (naming another owner's, if it is one).
  void require_no_pending(const checks& c, std::string_view operation, const void* owner) const {
    if (pending_) {
      throw invalid_argument(
          "cohort: " + std::string(operation) + " on rank " + std::to_string(c.rank()) + ": " +
          (owner_ != owner && owner_ != nullptr
               ? "another optimizer's overlapped reduction is pending on this communicator (it "
                 "marked gradients ready and has not stepped); step it first, or give each "
                 "optimizer a communicator of its own"
               : "an overlapped allreduce_grad is still pending; wait() on it first"));
    }
  }

  std::size_t bucket_buffer_bytes() const noexcept { return reduction_.buffer_bytes(); }
  std::size_t bucket_count() const noexcept { return reduction_.bucket_count(); }

  //! On cohort's thread (overlap_worker): one bucket, after the ranks agree that none found a
  //! problem so far. A failure before the exchange (the agreement) is the same on every rank: the
  //! worker skips the rest of the step everywhere alike. A failure inside the exchange ends the
  //! job.
  void reduce_bucket(std::size_t b) {
    const checks& c = *checks_;
    const bucket& k = reduction_.plan().buckets()[b];
    if (c.options().check_agreement) {
      std::string problem =
          problem_flag_.load(std::memory_order_acquire) ? problem_ : std::string();
      fingerprint f;
      f.add(b).add(k.count).add(static_cast<std::uint64_t>(k.plan.wire));
      c.settle_on(
          waiter::reducer, "allreduce_grad (a bucket)", f.value(), problem,
          [&] { return reduction_.describe_bucket(b, slots_); }, k.count * size_of(k.plan.wire));
    }
    if (b >= abandoned_from_.load()) {
      return;
    }
    const auto watch = c.watch_transfer("allreduce_grad (a bucket)", k.count * size_of(k.plan.wire),
                                        waiter::reducer);
    c.fatal_on_failure("allreduce_grad (a bucket on cohort's thread)", [&] {
      reduction_.reduce_bucket(
          b, std::span<const grad_slot>(slots_),
          [&](tensor_view packed, reduce_op op) { strategy_.exchange(strategy_.self, packed, op); },
          /*own_buffer=*/true);
    });
  }

private:
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

  // Checks `slots_` (collective): for host strategies, the bucket plan is prepared and every
  // buffer the exchange needs is allocated first, so that nothing fails on one rank alone once
  // the ranks have agreed; then the ranks agree on the layout, the reducer's plan, this rank's
  // problems and `mode`, so that a problem on one rank is an error on every rank.
  void validate(const checks& c, const strategy_ref& s, const reduction_table& table,
                missing_grad missing, std::string_view mode, std::string problem) {
    if (!s.device()) {
      const bool usable = std::ranges::all_of(
          slots_, [](const grad_slot& slot) { return slot.state == slot_state::ok; });
      if (problem.empty() && usable) {
        try {
          prepare_buckets(s, table, mode != "blocking");
        } catch (const std::exception& e) {
          problem = "cohort: allreduce_grad on rank " + std::to_string(c.rank()) +
                    ": preparing the reduction's buffers failed: " + e.what();
        }
      }
    }
    std::size_t bytes = 0;
    for (const auto& slot : slots_) {
      bytes += slot.grad.size_bytes();
    }
    const std::uint64_t sequence = c.live().next_sequence(waiter::caller, bytes);
    validate_gradients(c.live(), waiter::caller, "allreduce_grad", sequence, slots_,
                       c.options().check_agreement, missing, problem, mode, table);
  }

  // The plan of the current layout (rebuilt in the order learned at an earlier step, if any),
  // its buffers, and whatever the strategy's exchange will need.
  void prepare_buckets(const strategy_ref& s, const reduction_table& table, bool overlapped) {
    const std::span<const grad_slot> slots(slots_);
    reduction_.prepare(slots, table);
    if (overlapped) {
      reduction_.own_buffers();
    }
    if (s.prepare != nullptr) {
      for (const bucket& b : reduction_.plan().buckets()) {
        s.prepare(s.self, b);
      }
    }
  }

  // Every rank adopts rank 0's order, so the buckets stay the same everywhere; and only an order
  // the caller gave (not the index order of mark_rest_ready) is worth learning. The plan is
  // rebuilt at the next step, before its agreement (a rebuild allocates).
  void learn_order(const checks& c) {
    std::vector<std::int64_t>& order = order_message_; // reused: no allocation per step
    const std::span<const std::size_t> seen = readiness_.seen();
    order.assign(seen.size() + 1, caller_marked_ ? 1 : 0);
    std::copy(seen.begin(), seen.end(), order.begin() + 1);
    {
      const auto watch =
          c.watch_transfer("allreduce_grad (learning the order)", 0, waiter::reducer);
      mpi::broadcast(
          world_, tensor_view{order.data(), order.size(), dtype::int64, memory_location::host}, 0);
    }
    if (order[0] == 1) {
      reduction_.remember_order(std::span<const std::int64_t>(order).subspan(1));
    }
  }

  // A problem found on this rank during the step: every rank hears of it at the next agreement.
  void report(std::string problem) {
    if (!checks_->options().check_agreement) {
      if (abandoned_from_.load() != none) {
        return; // abandoning: nothing to tell without the agreement
      }
      throw invalid_argument(problem);
    }
    if (!problem_flag_.load()) {
      problem_ = std::move(problem);
      problem_flag_.store(true, std::memory_order_release);
    }
  }

  void mark_ready(std::size_t index) {
    std::string problem;
    const auto launch = readiness_.mark(reduction_.plan(), index, problem);
    if (launch) {
      worker_->launch(*launch);
    } else if (!problem.empty()) {
      report("cohort: grad_ready on rank " + std::to_string(checks_->rank()) + ": " +
             (index < slots_.size()
                  ? slot_label(slots_[index]) + " (#" + std::to_string(index) + ") "
                  : std::string()) +
             problem);
    }
  }

  bucketed_reduction reduction_;
  std::vector<grad_slot> slots_;
  std::vector<std::string> names_; // the slots' names: a parameter's name may be a temporary
  std::vector<void*> elements_;

  // The overlapped step in flight. `mutex_` guards every field; cohort's thread reads the plan
  // and the slots of buckets launched to it, and `problem_` once `problem_flag_` is raised.
  std::mutex mutex_;
  const checks* checks_ = nullptr; // the communicator of the step in flight
  MPI_Comm world_ = MPI_COMM_NULL;
  strategy_ref strategy_;
  // Written under `mutex_`; read without it by the pending queries (atomics, for that).
  std::atomic<const void*> owner_{nullptr}; // who began it (an optimizer), for its own hooks only
  std::atomic<bool> pending_{false};
  bool threads_checked_ = false;
  missing_grad missing_ = missing_grad::report;
  readiness readiness_;
  std::vector<std::int64_t> order_message_; // rank 0's order, broadcast while learning
  // Buckets from here on were launched by `abandon`: their gradients were never marked ready,
  // so they are never sent.
  std::atomic<std::size_t> abandoned_from_{none};
  bool caller_marked_ = false; // grad_ready was called, not only mark_rest_ready
  std::uint64_t generation_ = 0;
  std::string problem_; // the first local problem; written before problem_flag_ is raised
  std::atomic<bool> problem_flag_{false};
  std::unique_ptr<overlap_worker<grad_sync>> worker_; // last: its thread stops first
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
