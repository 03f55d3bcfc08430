// SPDX-License-Identifier: Apache-2.0
#pragma once

// The lanes of a communicator's gradient reductions (see grad_sync_queue.hpp): inline in every
// translation unit by default, compiled once in the one that includes <cohort/src.hpp> when
// COHORT_SEPARATE_COMPILATION is defined.

#include <cohort/communicator/engine/grad_sync_queue.hpp>

#include <algorithm>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL grad_sync& grad_sync_queue::lane_for(const checks& c, const void* owner) {
  const std::size_t count = count_.load(std::memory_order_relaxed);
  const auto use = [&](std::size_t i) -> grad_sync& {
    users_[i] = owner;
    last_.store(lanes_[i].get());
    return *lanes_[i];
  };
  for (std::size_t i = 0; i < count; ++i) {
    if (users_[i] == owner) {
      return use(i);
    }
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (users_[i] == given_back() && !lanes_[i]->pending()) {
      lanes_[i]->take_kept(); // (its last owner's)
      return use(i);
    }
  }
  if (count == max_lanes) {
    throw invalid_argument("cohort: rank " + std::to_string(c.rank()) + ": more than " +
                           std::to_string(max_lanes) +
                           " optimizers reduce gradients over one communicator: give some a "
                           "communicator of their own (comm.split)");
  }
  lanes_[count] = std::make_unique<grad_sync>(limits_, mutex_);
  if (!restored_.empty()) {
    lanes_[count]->restore_orders(restored_);
  }
  count_.store(count + 1, std::memory_order_release);
  return use(count);
}

COHORT_DECL grad_sync* grad_sync_queue::pending_lane(const void* owner) const noexcept {
  for (const auto& lane : lanes()) {
    if (lane->pending_for(owner)) {
      return lane.get();
    }
  }
  return nullptr;
}

COHORT_DECL grad_sync* grad_sync_queue::pending_or_only(const void* owner) const noexcept {
  if (grad_sync* mine = pending_lane(owner); mine != nullptr || owner != nullptr) {
    return mine;
  }
  grad_sync* found = nullptr;
  for (const auto& lane : lanes()) {
    if (lane->pending()) {
      if (found != nullptr) {
        return nullptr;
      }
      found = lane.get();
    }
  }
  return found;
}

COHORT_DECL void grad_sync_queue::give_back(const void* owner) noexcept {
  const std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < count_.load(std::memory_order_relaxed); ++i) {
    if (users_[i] == owner && owner != nullptr) {
      users_[i] = given_back();
      lanes_[i]->take_kept();
    }
  }
}

COHORT_DECL void grad_sync_queue::require_overlap_possible(const checks& c, const void* owner) {
  if (pending_for(owner)) {
    throw invalid_argument("cohort: begin_allreduce_grad on rank " + std::to_string(c.rank()) +
                           ": an overlapped allreduce_grad is still pending; wait() on it first");
  }
  if (!threads_checked_) {
    c.require_thread_multiple();
    threads_checked_ = true;
  }
  if (!worker_) {
    worker_ = std::make_unique<grad_sync::worker_type>();
  }
}

COHORT_DECL void grad_sync_queue::begin(grad_sync& lane, const checks& c, const strategy_ref& s,
                                        const reduction_table& table, missing_grad missing,
                                        const void* owner, std::string problem) {
  lane.begin(c, s, table, missing, owner, std::move(problem), *worker_, generation_.load() + 1);
  generation_.fetch_add(1);
}

COHORT_DECL void grad_sync_queue::finish(const checks& c, const void* owner, step_end end,
                                         std::span<const grad_slot> now) {
  std::array<grad_sync*, max_lanes> before{}; // the lanes begun before, oldest first
  std::size_t n = 0;
  grad_sync* mine = nullptr;
  {
    const std::lock_guard lock(mutex_);
    mine = pending_or_only(owner);
    if (mine == nullptr) {
      return;
    }
    for (const auto& lane : lanes()) {
      if (lane->pending() && lane->generation() < mine->generation()) {
        // (inserted in order: a handful at most)
        std::size_t at = n++;
        for (; at > 0 && before[at - 1]->generation() > lane->generation(); --at) {
          before[at] = before[at - 1];
        }
        before[at] = lane.get();
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (!before[i]->all_marked()) {
        throw invalid_argument(
            "cohort: rank " + std::to_string(c.rank()) +
            ": this optimizer's reduction waits behind another's, begun before it, whose "
            "gradients are not all marked ready yet (reductions run in the order they began): "
            "mark them (or step that optimizer) first");
      }
    }
    if (!now.empty()) {
      mine->verify_unmoved(now);
    }
    mine->mark_rest_ready();
  }
  for (std::size_t i = 0; i < n; ++i) {
    before[i]->finish(step_end::keep);
  }
  mine->finish(end);
}

COHORT_DECL bool grad_sync_queue::wait_transfers(const void* owner) {
  grad_sync* mine = nullptr;
  {
    const std::lock_guard lock(mutex_);
    mine = pending_lane(owner);
    if (mine == nullptr || !mine->all_marked()) {
      return false;
    }
    for (const auto& lane : lanes()) {
      if (lane->pending() && lane->generation() < mine->generation() && !lane->all_marked()) {
        return false;
      }
    }
  }
  mine->wait_transfers();
  return true;
}

COHORT_DECL void grad_sync_queue::abandon(const void* owner, std::string_view why) noexcept {
  grad_sync* mine = pending_lane(owner);
  if (mine == nullptr) {
    return;
  }
  // A lane begun before that still waits for gradients would hold this one's buckets forever.
  for (const auto& lane : lanes()) {
    if (lane->pending() && lane->generation() < mine->generation() && !lane->all_marked()) {
      lane->abandon("a reduction begun after it was abandoned (" + std::string(why) + ")");
    }
  }
  mine->abandon(why);
}

COHORT_DECL void grad_sync_queue::abandon_all(std::string_view why) noexcept {
  for (;;) {
    grad_sync* oldest = nullptr;
    for (const auto& lane : lanes()) {
      if (lane->pending() && (oldest == nullptr || lane->generation() < oldest->generation())) {
        oldest = lane.get();
      }
    }
    if (oldest == nullptr) {
      return;
    }
    oldest->abandon(why);
  }
}

COHORT_DECL bool grad_sync_queue::take_kept(const void* owner) noexcept {
  for (const auto& lane : lanes()) {
    if (lane->owner() == owner && lane->take_kept()) {
      return true;
    }
  }
  return false;
}

COHORT_DECL bool grad_sync_queue::pending() const noexcept {
  return std::ranges::any_of(lanes(), [](const auto& lane) { return lane->pending(); });
}

COHORT_DECL bool grad_sync_queue::pending_at(std::uint64_t generation) const noexcept {
  return std::ranges::any_of(lanes(), [&](const auto& lane) {
    return lane->pending() && lane->generation() == generation;
  });
}

COHORT_DECL bool grad_sync_queue::complete(const void* owner) {
  grad_sync* mine = pending_or_only(owner);
  return mine == nullptr || mine->complete();
}

COHORT_DECL void grad_sync_queue::require_no_pending(const checks& c, std::string_view operation,
                                                     const void* owner) const {
  for (const auto& lane : lanes()) {
    if (lane->pending()) {
      throw invalid_argument(
          "cohort: " + std::string(operation) + " on rank " + std::to_string(c.rank()) + ": " +
          (lane->owner() != owner && lane->owner() != nullptr
               ? "another optimizer's overlapped reduction is pending on this communicator (it "
                 "marked gradients ready and has not stepped); step it first, or give each "
                 "optimizer a communicator of its own"
               : "an overlapped allreduce_grad is still pending; wait() on it first"));
    }
  }
}

COHORT_DECL grad_sync_stats grad_sync_queue::take_stats() noexcept {
  grad_sync_stats total;
  for (const auto& lane : lanes()) {
    total += lane->take_stats();
  }
  return total;
}

COHORT_DECL std::vector<bucket_order> grad_sync_queue::learned_orders() const {
  std::vector<bucket_order> all;
  for (const auto& lane : lanes()) {
    for (bucket_order& order : lane->learned_orders()) {
      // (a restored order is in every lane: kept once)
      if (std::ranges::none_of(all,
                               [&](const bucket_order& o) { return o.layout == order.layout; })) {
        all.push_back(std::move(order));
      }
    }
  }
  return all;
}

COHORT_DECL void grad_sync_queue::restore_orders(std::vector<bucket_order> orders) {
  for (const auto& lane : lanes()) {
    lane->restore_orders(orders);
  }
  restored_ = std::move(orders);
}

COHORT_DECL std::size_t grad_sync_queue::bucket_buffer_bytes() const noexcept {
  std::size_t bytes = 0;
  for (const auto& lane : lanes()) {
    bytes += lane->bucket_buffer_bytes();
  }
  return bytes;
}

COHORT_DECL std::size_t grad_sync_queue::bucket_count() const noexcept {
  const grad_sync* last = last_.load();
  return last != nullptr ? last->bucket_count() : 0;
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
