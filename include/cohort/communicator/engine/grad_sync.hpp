// SPDX-License-Identifier: Apache-2.0
#pragma once

// The gradient-sync engine: blocking and overlapped reductions (and, through the optimizer's
// copies, double-buffered ones) of type-erased gradient slots, host and device alike. Not a
// template: it is compiled once whatever the strategy, the parameter set and the reducer, which
// reach it as a `strategy_ref` (two function pointers), slots and a `reduction_table`. The
// templated front door (basic_communicator.hpp) only reads the user's types into slots.

#include <cohort/communicator/engine/bucket_plan.hpp>
#include <cohort/communicator/engine/bucketed_reduction.hpp>
#include <cohort/communicator/engine/checks.hpp>
#include <cohort/communicator/engine/gradient_agreement.hpp>
#include <cohort/communicator/engine/liveness.hpp>
#include <cohort/communicator/engine/overlap_worker.hpp>
#include <cohort/communicator/engine/readiness.hpp>
#include <cohort/communicator/engine/step_observer.hpp>
#include <cohort/communicator/engine/strategy_ref.hpp>
#include <cohort/communicator/grad_sync_stats.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/operation.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/reducer/hook.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/trace/span.hpp>
#include <cohort/transport/mpi.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! One lane of a communicator's gradient reductions (see grad_sync_queue: one per optimizer
//! with a reduction pending). Blocking calls run on the caller's thread; an overlapped one
//! reduces each bucket on cohort's own thread (the queue's, shared by the lanes) as soon as its
//! gradients are marked ready and the buckets before it are on their way. `mutex()`, the
//! queue's, guards the overlapped state (hooks may call from several threads at once:
//! LibTorch's autograd does); the front door holds it around every call that reads or marks
//! slots.
class grad_sync {
public:
  using worker_type = overlap_worker<grad_sync>;

  grad_sync(bucket_limits limits, std::mutex& mutex)
      : reduction_(limits)
      , mutex_(mutex) {}

  grad_sync(const grad_sync&) = delete;
  grad_sync& operator=(const grad_sync&) = delete;

  std::mutex& mutex() noexcept { return mutex_; }

  //! The slots of the reduction being prepared, filled by the front door (collect_gradients).
  std::vector<grad_slot>& slots() noexcept { return slots_; }
  const std::vector<grad_slot>& slots() const noexcept { return slots_; }
  std::vector<std::string>& names() noexcept { return names_; }
  //! Where each parameter of a set that is not random-access lives, so that `grad_ready` reads
  //! one again in O(1) instead of walking the set.
  std::vector<void*>& elements() noexcept { return elements_; }
  //! The set `elements()` are of: `grad_ready` must be given that one.
  const void*& elements_of() noexcept { return elements_of_; }

  // ---- blocking ------------------------------------------------------------------------------

  //! Reduces `slots()` on this thread (none pending: the front door checked before it read
  //! them). `problem` is what this rank's own checks found.
  void reduce_blocking(const checks& c, const strategy_ref& s, const reduction_table& table,
                       missing_grad missing, std::string problem);

  //! Checks gradients about to be reduced from copies (collective), for a wrapper that must
  //! refuse a step before it touches anything.
  void validate_copies(const checks& c, std::span<const grad_slot> slots,
                       const reduction_table& table, missing_grad missing) const;

  // ---- overlapped (under mutex()) --------------------------------------------------------------

  //! Begins an overlapped reduction of `slots()` for `owner` (collective: the ranks agree on it
  //! now), its buckets reduced by `worker` after those of every reduction begun before.
  //! `generation` counts the communicator's overlapped reductions.
  void begin(const checks& c, const strategy_ref& s, const reduction_table& table,
             missing_grad missing, const void* owner, std::string problem, worker_type& worker,
             std::uint64_t generation);

  void require_pending(const checks& c, std::string_view operation) const;

  //! Whether gradient `index` must be read again before it is marked (not yet marked: a marked
  //! one may be in flight on cohort's thread, and its view is never touched again).
  bool needs_reread(std::size_t index) const noexcept {
    return index < slots_.size() && !readiness_.is_ready(index);
  }
  missing_grad missing() const noexcept { return missing_; }

  //! Marks gradient `index` ready, with `now` its view read again just before: a gradient whose
  //! size, dtype or memory changed since the reduction began is a problem every rank hears of.
  void mark_reread(std::size_t index, const grad_slot& now);

  //! Marks gradient `index` ready as it is.
  void mark(std::size_t index) {
    caller_marked_ = true;
    mark_ready(index);
  }

  //! Marks every gradient not yet ready as ready (in index order, an order never learned).
  void mark_rest_ready();

  //! Compares the gradients as they are `now` with the views the pending reduction reads and
  //! writes (each as it was when the reduction began, or when it was marked ready): one that
  //! moved (its tensor replaced, resized or freed) would never receive its reduced value, and is
  //! a problem every rank hears of at the end of the step. Under `mutex()`.
  void verify_unmoved(std::span<const grad_slot> now);

  //! Waits for cohort's thread, then ends the step with an agreement on what every rank found
  //! and on `end` (collective, on the caller's channel: cohort's thread may be reducing another
  //! lane's buckets meanwhile). Call after `mark_rest_ready`, without holding `mutex()`.
  void finish(step_end end = step_end::update);

  //! Whether every gradient is marked ready (cohort's thread needs nothing more from the caller).
  bool all_marked() const noexcept { return readiness_.all_launched(); }

  //! Waits until every launched bucket is reduced (the gradients hold their reduced values),
  //! without ending the step: no collective, and a failure is kept for `finish`. Call it once
  //! every gradient is marked and no lane begun before waits for gradients, without holding
  //! `mutex()`.
  void wait_transfers() { worker_->wait(*this, /*rethrow=*/false); }

  //! Ends a pending overlapped reduction without sending what was not marked ready (see
  //! basic_communicator::abandon_grad_sync). Does nothing if none is pending.
  void abandon(std::string_view why) noexcept;

  bool pending() const noexcept { return pending_; }
  bool pending_for(const void* owner) const noexcept { return pending_ && owner_ == owner; }
  //! Who began the pending reduction, or the last one.
  const void* owner() const noexcept { return owner_; }
  std::uint64_t generation() const noexcept { return generation_; }
  //! Whether the last reduction ended with its reduced gradients kept (step_end::keep) and no
  //! one had taken them since; forgets them. From any thread.
  bool take_kept() noexcept { return kept_.exchange(false); }

  //! Whether every bucket of the pending reduction is reduced (or none is pending).
  bool complete();

  std::size_t bucket_buffer_bytes() const noexcept { return reduction_.buffer_bytes(); }
  std::size_t bucket_count() const noexcept { return reduction_.bucket_count(); }
  std::vector<bucket_order> learned_orders() const { return reduction_.learned_orders(); }
  //! What the reductions did since the last call (see grad_sync_stats); resets the count.
  grad_sync_stats take_stats() noexcept { return observer_.take_stats(); }
  void restore_orders(std::vector<bucket_order> orders) {
    reduction_.restore_orders(std::move(orders));
  }

  //! On cohort's thread (overlap_worker): one bucket, after the ranks agree that none found a
  //! problem so far. A failure before the exchange (the agreement) is the same on every rank: the
  //! worker skips the rest of the step everywhere alike. A failure inside the exchange ends the
  //! job.
  void reduce_bucket(std::size_t b);

private:
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

  // Checks `slots_` (collective): for host strategies, the bucket plan is prepared and every
  // buffer the exchange needs is allocated first, so that nothing fails on one rank alone once
  // the ranks have agreed; then the ranks agree on the layout, the reducer's plan, this rank's
  // problems and `mode`, so that a problem on one rank is an error on every rank. A blocking step
  // of one small packed bucket travels in that agreement and is reduced there: returns whether
  // it was (its bucket is then packed and reduced in the shared buffer, still to be unpacked).
  bool validate(const checks& c, const strategy_ref& s, const reduction_table& table,
                missing_grad missing, reduction_mode mode, std::string problem);

  // The step's size, then, if its gradients are usable, its buckets and buffers (or the device
  // strategy's): returns `problem`, or what failed on the way.
  std::string prepare(const checks& c, const strategy_ref& s, const reduction_table& table,
                      reduction_mode mode, std::string problem);

  // A blocking step's one small bucket, packed to travel in the agreement; empty where the step
  // is not one (several buckets, too large, in place, an exchange that is not an all-reduce).
  carried_bucket pack_carried(const checks& c, const strategy_ref& s);

  // The plan of the current layout (rebuilt in the order learned at an earlier step, if any),
  // its buffers, and whatever the strategy's exchange will need.
  void prepare_buckets(const strategy_ref& s, const reduction_table& table, bool overlapped);

  // Every rank adopts rank 0's order, so the buckets stay the same everywhere; and only an order
  // the caller gave (not the index order of mark_rest_ready) is worth learning. The plan is
  // rebuilt at the next step, before its agreement (a rebuild allocates).
  void learn_order(const checks& c);

  // A problem found on this rank during the step: every rank hears of it at the next agreement.
  void report(std::string problem);

  // The reducer's gradient hook, if any, for this step: kept alive until the step ends, and
  // prepared for the plan's buckets (before the agreement, on the caller's thread).
  void prepare_hook(const checks& c, const reduction_table& table);

  // Bucket `b` of the current plan: through the hook if it is the hook's, as the plan says
  // otherwise. One helper for the caller's thread and cohort's.
  void reduce_one(std::size_t b, trace_thread thread, bool own_buffer);

  // The reduces to single owners that buckets left in flight, completed (bucketed_reduction).
  // `_watched`: after a failed agreement, or for an abandoned step, outside a bucket's watch.
  void complete_in_flight(trace_thread thread);
  void complete_in_flight_watched(const checks& c);

  // The step's reduction completed on every rank: the hook counts it; the step's hook is let go.
  void hook_step_ended() noexcept;

  void mark_ready(std::size_t index);

  bucketed_reduction reduction_;
  // Watches the steps: their statistics and their trace (the trace of the step in flight is
  // read once as it begins, so that a step is traced whole or not at all whatever pause_trace /
  // resume_trace do meanwhile). Told by the caller's thread, and by cohort's in reduce_bucket
  // while a step is in flight (the caller reads the statistics only after finish has waited for
  // that thread).
  step_observer observer_;
  profiler_range step_range_;    // an overlapped step's, from begin to finish (or abandon)
  std::uint64_t step_bytes_ = 0; // of the step in flight
  std::vector<grad_slot> slots_;
  std::vector<std::string> names_; // the slots' names: a parameter's name may be a temporary
  std::vector<void*> elements_;
  const void* elements_of_ = nullptr;

  // The overlapped step in flight. `mutex_` guards every field; cohort's thread reads the plan
  // and the slots of buckets launched to it, and `problem_` once `problem_flag_` is raised.
  std::mutex& mutex_;
  const checks* checks_ = nullptr; // the communicator of the step in flight
  strategy_ref strategy_;
  // Written under `mutex_`; read without it by the pending queries (atomics, for that).
  std::atomic<const void*> owner_{nullptr}; // who began it (an optimizer), for its own hooks only
  std::atomic<bool> pending_{false};
  std::atomic<bool> kept_{false}; // (taken by hooks on any thread)
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
  worker_type* worker_ = nullptr; // the queue's (it outlives every lane)

  // The step's gradient hook (empty: none), what keeps its state alive until the step ends, the
  // layout it was prepared for, and the gradients as it sees them, bucket after bucket.
  hook_ref hook_;
  std::shared_ptr<void> hook_alive_;
  std::uint64_t hook_key_ = 0;
  std::vector<hook_tensor> hook_tensors_;
  std::vector<std::size_t> hook_offsets_;
  bool hook_prepared_ = false; // for this step: its end is the hook's to count
};

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/engine/impl/grad_sync_step.ipp>
#endif
