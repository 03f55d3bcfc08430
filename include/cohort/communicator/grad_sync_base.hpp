// SPDX-License-Identifier: Apache-2.0
#pragma once

// What every communicator does with gradient reductions that does not depend on its strategy:
// the overlapped reductions pending (one lane per optimizer), marking their gradients ready,
// waiting for them, abandoning them, and what they counted and learned. Not a template: compiled
// once (impl/grad_sync_base.ipp) for every strategy. basic_communicator<Strategy> adds what needs
// the strategy's, the reducer's or the parameter set's type, and erases them (strategy_ref,
// reduction_table, parameter_source or a gradient_reader) before it calls in here: the lanes, and
// the engine under them, are declared, not defined, in a trainer's translation unit built with
// COHORT_SEPARATE_COMPILATION (header-only, impl/grad_sync_base.ipp brings them).

#include <cohort/communicator/bucket_order.hpp>
#include <cohort/communicator/communicator_base.hpp>
#include <cohort/communicator/engine/bucket_plan.hpp>
#include <cohort/communicator/engine/strategy_ref.hpp>
#include <cohort/communicator/grad_sync_stats.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>
#include <cohort/reducer/concepts.hpp>

#include <boost/mpi/communicator.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {
class grad_sync;
class grad_sync_queue;
} // namespace engine

//! The strategy-independent half of every communicator's gradient reductions (see the top of this
//! file); a strategy derives from basic_communicator<Strategy>, which derives from this.
class grad_sync_base : public communicator_base {
public:
  //! Gradient `index` of the views given to `start_grad_sync` (by `owner`) is final.
  void grad_ready(std::size_t index, const void* owner = nullptr);

  //! Marks every gradient of `owner`'s reduction not yet ready as ready (in index order). This
  //! order is never learned: it says nothing of when backward produces the gradients.
  void mark_all_ready(const void* owner = nullptr);

  //! Marks the rest of `owner`'s reduction ready, and waits until every bucket is reduced (for
  //! no owner: a request's reduction, or the only one pending).
  //! Collective (the ranks agree on `end` too). Rethrows the first error on every rank. `now`,
  //! if given, is the gradients as they are: one that moved since the reduction read it is an
  //! error naming it, on every rank. Reductions of other owners begun before this one end
  //! first, their gradients kept (see `take_kept_grad_sync`).
  void wait_grad_sync(step_end end = step_end::update, std::span<const grad_slot> now = {},
                      const void* owner = nullptr);

  //! Waits until every bucket of `owner`'s pending overlapped reduction is reduced, so that its
  //! gradients hold their reduced values, without ending the step (no collective: the step's end
  //! is still agreed at `wait_grad_sync`, where a failure on the way is thrown). What LibTorch's
  //! adapter does at the end of backward, as DDP does. Returns false, waiting for nothing, where
  //! that cannot be now (none pending, gradients not all marked ready, or a reduction begun
  //! before still waiting for its own).
  bool wait_grad_sync_transfers(const void* owner);

  //! Whether `owner`'s last overlapped reduction was ended, its gradients kept reduced, by the
  //! wait of a reduction begun after it (another optimizer's step); forgets it. Its gradients
  //! are reduced already: the step that follows does not reduce them again.
  bool take_kept_grad_sync(const void* owner) noexcept;

  //! `owner` (an optimizer being destroyed) will not reduce again: its lane may serve another.
  void forget_grad_sync_owner(const void* owner) noexcept;

  //! Ends every pending overlapped reduction without sending what was not marked ready: a rank
  //! must never send a gradient its backward did not produce. The buckets already on their way
  //! are finished; at the next bucket (or at the end) every rank gets an error naming this rank
  //! and `why`. With the agreement check off, this rank skips the rest and its peers wait for
  //! it until the timeout ends the job. Does nothing if no reduction is pending.
  void abandon_grad_sync(std::string_view why) noexcept;

  //! The same for `owner`'s reduction only (and any begun before it that would hold its
  //! buckets back: those still waiting for gradients).
  void abandon_grad_sync_for(const void* owner, std::string_view why) noexcept;

  //! Whether an overlapped reduction has begun and not been waited on (any owner's).
  bool grad_sync_pending() const noexcept;

  //! Whether every bucket of `owner`'s pending overlapped reduction (for no owner: a request's,
  //! or the only one pending) is reduced (or none is pending): `wait_grad_sync` would then only
  //! agree on the end of the step. Does not wait for transfers.
  bool grad_sync_complete(const void* owner = nullptr) const;

  //! Whether `owner` has an overlapped reduction pending.
  bool grad_sync_pending_for(const void* owner) const noexcept;

  //! Counts the overlapped reductions begun so far (what tells a request its own one).
  std::uint64_t grad_sync_generation() const noexcept;
  //! Whether the reduction begun as the `generation`th is still pending.
  bool grad_sync_pending_at(std::uint64_t generation) const noexcept;

  //! Bytes held by the gradient buckets (each optimizer's, of the last layout it reduced; 0 for
  //! device strategies).
  std::size_t bucket_buffer_bytes() const noexcept;

  //! What this communicator's gradient reductions did since it was made or last asked (bytes,
  //! steps, collectives, time reducing and time the trainer waited: see grad_sync_stats), and a
  //! fresh count from now: an epoch's figures, say. Between steps: throws `invalid_argument`
  //! while an overlapped reduction is pending.
  grad_sync_stats take_grad_sync_stats();

  //! The orders this communicator learned to build gradient buckets in (with overlap), by
  //! layout: a checkpoint keeps them (`cohort::bucket_orders`, cohort/checkpoint.hpp).
  std::vector<bucket_order> learned_bucket_orders() const;

  //! Adopts orders a checkpoint kept, each when its layout is next reduced (as the run that
  //! saved them did), so that a resumed run reduces bit for bit as that run would have. Call it
  //! on every rank alike, between steps.
  void restore_bucket_orders(std::vector<bucket_order> orders);

protected:
  //! Collective over `comm` (see communicator_base); `limits`: the strategy's buckets.
  grad_sync_base(const boost::mpi::communicator& comm, const communicator_options& options,
                 engine::bucket_limits limits);

  //! A reduction still pending on `other` is abandoned first: cohort's thread reads the
  //! communicator it began on.
  grad_sync_base(grad_sync_base&& other) noexcept;

  //! Abandons a reduction pending on either side, then takes `other`'s place (this rank leaves
  //! the communicator it had: its peers are told, see liveness.hpp).
  grad_sync_base& operator=(grad_sync_base&& other) noexcept;

  //! Abandons an overlapped reduction still pending (the other ranks get an error; nothing this
  //! rank did not mark ready is sent), so that cohort's thread never outlives what it reads.
  //! Then tells the other ranks that this rank leaves the communicator.
  ~grad_sync_base();

  //! For a strategy whose `exchange` uses members of its own: abandons a pending reduction
  //! before they go (from its destructor).
  void finish_overlap() noexcept;

private:
  // What basic_communicator<Strategy>'s templates call, the strategy, the reducer and the set
  // erased; no strategy reaches the lanes, and none gets past the front door's compile-time
  // refusals (a device strategy's overlap, a gradient hook on device memory).
  template <class Strategy>
  friend class basic_communicator;

  //! How allreduce_grad reads a parameter set's gradients and names into a lane, the set's type
  //! erased (`collect_gradients`, or a parameter_source's `collect`).
  using gradient_reader = void (*)(const void* set, missing_grad missing,
                                   std::vector<grad_slot>& slots, std::vector<std::string>& names);

  //! allreduce_grad: reads `set` with `read` and reduces its gradients on this thread, as `table`
  //! says (scattered to `options.owners`, if any).
  void reduce_set_now(gradient_reader read, const void* set, const engine::strategy_ref& strategy,
                      const reduction_table& table, grad_sync_options options);
  //! start_grad_sync: begins `owner`'s overlapped reduction of `params` (collective).
  void start_set(const parameter_source& params, const engine::strategy_ref& strategy,
                 const reduction_table& table, grad_sync_options options, const void* owner);
  //! start_grad_sync of views the caller keeps (missing gradients reported).
  void start_views(std::span<const grad_slot> slots, const engine::strategy_ref& strategy,
                   const reduction_table& table, const void* owner);
  //! grad_ready(params, index) of the pending reduction with no owner.
  void mark_ready_in(const parameter_source& params, std::size_t index);
  //! grad_ready_for, once a reduction is pending for `owner`: marks parameter `index` ready and
  //! returns true; false, marking nothing, when none is pending yet.
  bool mark_ready_if_pending(const void* owner, const parameter_source& params, std::size_t index);
  //! grad_ready_for's first call of a step: begins `owner`'s reduction (as start_set does) unless
  //! another thread just did, and marks parameter `index` ready.
  void mark_ready_for(const void* owner, const parameter_source& params,
                      const engine::strategy_ref& strategy, const reduction_table& table,
                      grad_sync_options options, std::size_t index);
  //! validate_grad_sync.
  void validate_views(std::span<const grad_slot> slots, const reduction_table& table,
                      missing_grad missing);

  // Buckets per step of the last layout reduced on the host (0 once moved from).
  std::size_t host_bucket_count() const noexcept;

  // Under the queue's mutex.
  engine::grad_sync& start_locked(const parameter_source& params,
                                  const engine::strategy_ref& strategy,
                                  const reduction_table& table, grad_sync_options options,
                                  const void* owner);
  // (A device strategy cannot overlap: basic_communicator refuses it at compile time.)
  void require_overlap_possible(const void* owner);

  // What this rank's own checks find in the lane's slots: memory the strategy cannot reduce, or
  // owners that do not fit. Agreed on with the layout, so that it is an error on every rank.
  std::string local_problem(const engine::grad_sync& lane, const engine::strategy_ref& strategy,
                            std::span<const int> owners = {}) const;

  // `owner`'s pending lane (for no owner: the request's, else the one pending, if only one is),
  // or an error naming `operation`. Under the queue's mutex.
  engine::grad_sync& pending_lane(std::string_view operation, const void* owner);

  // Under the queue's mutex: reads parameter `index` again and marks it ready.
  void reread_and_mark(engine::grad_sync& lane, const parameter_source& params, std::size_t index);

  std::unique_ptr<engine::grad_sync_queue> syncs_; // null once moved from
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/impl/grad_sync_base.ipp>
#endif
