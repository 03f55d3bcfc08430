// SPDX-License-Identifier: Apache-2.0
#pragma once

// What a thread publishes while it waits in a blocking MPI call, for the watchdog to read
// (watchdog.hpp): a few relaxed stores per call. Apart from the watchdog, so that a front door
// that watches its calls does not include the watchdog's thread.

#include <cohort/config.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

using watch_clock = std::chrono::steady_clock;

//! What one thread is waiting for in a blocking MPI call: written by that thread, read by the
//! watchdog. All relaxed atomics: the watchdog only needs a recent view, never a consistent one.
struct watch_slot {
  std::atomic<watch_clock::rep> since{0}; //!< when the call began; 0 while not waiting
  std::atomic<const char*> operation{nullptr};
  std::atomic<std::uint64_t> sequence{0};
  std::atomic<std::size_t> bytes{0};
  //! Whether every rank had passed the agreement check of this call: then all had arrived, and
  //! the stall is inside the transfer.
  std::atomic<bool> agreed{false};
  //! Stall warnings printed in this call so far (the watchdog's: reset when a call begins).
  std::atomic<unsigned> warnings{0};
  watch_clock::duration timeout{};
  watch_clock::duration stall_warning{};
  int rank = -1;

  bool watched() const noexcept { return timeout.count() > 0 || stall_warning.count() > 0; }
};

//! Marks `slot` as waiting for the duration of one blocking call. Without a timeout (a slot not
//! watched) it does nothing.
class watch_scope {
public:
  watch_scope(watch_slot& slot, const char* operation, std::uint64_t sequence, std::size_t bytes,
              bool agreed) noexcept
      : slot_(slot.watched() ? &slot : nullptr) {
    if (slot_ != nullptr) {
      slot_->warnings.store(0, std::memory_order_relaxed);
      slot_->operation.store(operation, std::memory_order_relaxed);
      slot_->sequence.store(sequence, std::memory_order_relaxed);
      slot_->bytes.store(bytes, std::memory_order_relaxed);
      slot_->agreed.store(agreed, std::memory_order_relaxed);
      slot_->since.store(watch_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    }
  }
  ~watch_scope() {
    if (slot_ != nullptr) {
      slot_->since.store(0, std::memory_order_relaxed);
    }
  }
  watch_scope(const watch_scope&) = delete;
  watch_scope& operator=(const watch_scope&) = delete;

private:
  watch_slot* slot_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
