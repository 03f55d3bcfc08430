// SPDX-License-Identifier: Apache-2.0
#pragma once

// What watchdog.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/detail/watchdog.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

COHORT_DECL std::string describe_seconds(watch_clock::duration d) {
  const auto tenths = std::chrono::duration_cast<std::chrono::milliseconds>(d).count() / 100;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " s";
}

COHORT_DECL void watchdog::add(watch_slot* slot) {
  {
    const std::lock_guard lock(mutex_);
    slots_.push_back(slot);
    if (!thread_.joinable()) {
      thread_ = std::thread([this] { loop(); });
    }
  }
  changed_.notify_one();
}

COHORT_DECL void watchdog::remove(watch_slot* slot) noexcept {
  const std::lock_guard lock(mutex_);
  slots_.erase(std::remove(slots_.begin(), slots_.end(), slot), slots_.end());
}

COHORT_DECL void watchdog::loop() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (slots_.empty()) {
      changed_.wait(lock, [&] { return stop_ || !slots_.empty(); });
      continue;
    }
    // Each slot is read a few times per its timeout, at most once per 10 ms.
    auto period = std::chrono::duration_cast<watch_clock::duration>(std::chrono::seconds(1));
    for (const watch_slot* slot : slots_) {
      period = std::min(period, slot->timeout / 4);
    }
    period = std::max(
        period, std::chrono::duration_cast<watch_clock::duration>(std::chrono::milliseconds(10)));
    changed_.wait_for(lock, period);
    const auto now = watch_clock::now().time_since_epoch().count();
    for (const watch_slot* slot : slots_) {
      const auto since = slot->since.load(std::memory_order_relaxed);
      if (since != 0 && now - since > slot->timeout.count()) {
        end_job(describe(*slot, watch_clock::duration(now - since)));
      }
    }
  }
}

COHORT_DECL std::string watchdog::describe(const watch_slot& slot, watch_clock::duration waited) {
  const char* operation = slot.operation.load(std::memory_order_relaxed);
  std::string message = "cohort: timeout on rank " + std::to_string(slot.rank) + ": " +
                        (operation != nullptr ? operation : "an MPI call") + " (#" +
                        std::to_string(slot.sequence.load(std::memory_order_relaxed)) + ", " +
                        std::to_string(slot.bytes.load(std::memory_order_relaxed)) +
                        " bytes) has waited " + describe_seconds(waited) + " (timeout " +
                        describe_seconds(slot.timeout) + "); ";
  message += slot.agreed.load(std::memory_order_relaxed)
                 ? "every rank had arrived at it (they passed its agreement check), so a "
                   "rank stalled or died inside the transfer"
                 : "the ranks had not checked that they all arrived (the agreement check is "
                   "off, or this call has none): a rank may never have called it";
  return message + "; ending the job";
}

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
