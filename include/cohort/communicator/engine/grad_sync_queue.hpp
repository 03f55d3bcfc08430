// SPDX-License-Identifier: Apache-2.0
#pragma once

// A communicator's gradient reductions, one lane (a grad_sync) per optimizer: several optimizers
// may share a communicator with overlapped reductions pending at once (a GAN's discriminator,
// whose hooks fire during the generator's backward, and the generator), each reducing exactly
// its own gradients. One thread of cohort's reduces every lane's buckets, the lanes in the order
// their reductions began, so that every rank issues the same collectives in the same order.

#include <cohort/communicator/engine/checks.hpp>
#include <cohort/communicator/engine/grad_sync.hpp>
#include <cohort/communicator/engine/overlap_worker.hpp>
#include <cohort/communicator/grad_sync_stats.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

class grad_sync_queue {
public:
  //! How many optimizers may keep a lane on one communicator (a lane holds its own buckets).
  static constexpr std::size_t max_lanes = 8;

  explicit grad_sync_queue(bucket_limits limits)
      : limits_(limits) {}

  grad_sync_queue(const grad_sync_queue&) = delete;
  grad_sync_queue& operator=(const grad_sync_queue&) = delete;

  //! Guards every lane's overlapped state; the front door holds it around every call that reads
  //! or marks slots.
  std::mutex& mutex() noexcept { return mutex_; }

  //! `owner`'s lane: the one it used last, else one an owner gave back, else a new one. Under
  //! `mutex()`. Throws past `max_lanes`.
  grad_sync& lane_for(const checks& c, const void* owner);

  //! `owner`'s lane if its reduction is pending, else null. Never blocks.
  grad_sync* pending_lane(const void* owner) const noexcept;

  //! `owner`'s pending lane; for no owner, a request's, else the one pending if only one is.
  grad_sync* pending_or_only(const void* owner) const noexcept;

  //! `owner` will not reduce again (its optimizer is gone): another may take its lane.
  void give_back(const void* owner) noexcept;

  //! Throws unless an overlapped reduction may begin for `owner` now: none of its own pending,
  //! MPI threads enough, and cohort's thread made (before the ranks agree: a thread that cannot
  //! start fails here alone). Under `mutex()`.
  void require_overlap_possible(const checks& c, const void* owner);

  //! Begins `lane`'s overlapped reduction (see grad_sync::begin), after every one pending.
  void begin(grad_sync& lane, const checks& c, const strategy_ref& s, const reduction_table& table,
             missing_grad missing, const void* owner, std::string problem);

  //! Ends `owner`'s pending reduction with `end` (see grad_sync::finish), after ending every
  //! reduction begun before it with its gradients kept (step_end::keep): a reduction does not
  //! outlive the step of one begun after it, so that no gradient is still being written when
  //! its optimizer's step, or a module's zero_grad, comes (as DDP ends each at the end of its
  //! backward). `now`, if given, is `owner`'s gradients as they are (see verify_unmoved).
  //! Collective. Throws, ending nothing, if a reduction begun before still waits for gradients.
  void finish(const checks& c, const void* owner, step_end end, std::span<const grad_slot> now);

  //! Abandons `owner`'s pending reduction (see grad_sync::abandon), and first every one begun
  //! before it that still waits for gradients (its buckets would wait for them). Does nothing
  //! if none is pending.
  void abandon(const void* owner, std::string_view why) noexcept;

  //! Abandons every pending reduction, in the order they began.
  void abandon_all(std::string_view why) noexcept;

  //! Waits until every bucket of `owner`'s pending reduction is reduced, without ending it (see
  //! grad_sync::wait_transfers). Returns false, waiting for nothing, where that cannot be now:
  //! none pending, a gradient not marked, a lane begun before still waiting for gradients.
  bool wait_transfers(const void* owner);

  //! Whether `owner`'s last reduction was ended with its gradients kept by a later one's step
  //! (and forgets it): they are reduced already.
  bool take_kept(const void* owner) noexcept;

  bool pending() const noexcept;
  bool pending_for(const void* owner) const noexcept { return pending_lane(owner) != nullptr; }
  //! Whether the reduction that began as the `generation`th is pending.
  bool pending_at(std::uint64_t generation) const noexcept;
  //! Counts the overlapped reductions begun so far.
  std::uint64_t generation() const noexcept { return generation_.load(); }

  //! Whether every bucket of `owner`'s pending reduction is reduced (or none is pending).
  bool complete(const void* owner);

  //! Throws if any overlapped reduction is pending, naming whose (`owner`'s, or another's).
  void require_no_pending(const checks& c, std::string_view operation, const void* owner) const;

  //! Every lane's statistics since the last call, summed (see grad_sync::take_stats).
  grad_sync_stats take_stats() noexcept;
  std::vector<bucket_order> learned_orders() const;
  //! Every lane, and every lane made later, adopts `orders` (each a layout's).
  void restore_orders(std::vector<bucket_order> orders);
  //! Every lane's (each holds its own buckets).
  std::size_t bucket_buffer_bytes() const noexcept;
  //! Of the lane used last.
  std::size_t bucket_count() const noexcept;

private:
  std::span<const std::unique_ptr<grad_sync>> lanes() const noexcept {
    return {lanes_.data(), count_.load(std::memory_order_acquire)};
  }

  // A lane's slot is given back (its owner gone): a later owner may take it.
  static const void* given_back() noexcept { return &lanes_given_back; }
  static inline const char lanes_given_back = 0;

  bucket_limits limits_;
  std::mutex mutex_;
  // Made once and never removed (an owner's lane is found again without a lock); `count_`
  // published after the lane is made.
  std::array<std::unique_ptr<grad_sync>, max_lanes> lanes_;
  std::array<const void*, max_lanes> users_{}; // whose each lane is (given_back(): no one's)
  std::atomic<std::size_t> count_{0};
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<grad_sync*> last_{nullptr};
  std::vector<bucket_order> restored_;
  bool threads_checked_ = false;
  std::unique_ptr<grad_sync::worker_type> worker_; // last: its thread stops before the lanes go
};

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/engine/impl/grad_sync_queue.ipp>
#endif
