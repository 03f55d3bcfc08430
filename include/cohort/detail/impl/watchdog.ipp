// SPDX-License-Identifier: Apache-2.0
#pragma once

// What watchdog.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/detail/watchdog.hpp>

#include <array>
#include <unistd.h>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

COHORT_DECL std::string describe_seconds(watch_clock::duration d) {
  const auto tenths = std::chrono::duration_cast<std::chrono::milliseconds>(d).count() / 100;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " s";
}

COHORT_DECL const std::string& host_name() {
  static const std::string name = [] {
    std::array<char, 256> buffer{};
    return gethostname(buffer.data(), buffer.size() - 1) == 0 ? std::string(buffer.data())
                                                              : std::string("unknown host");
  }();
  return name;
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
    // Each slot is read a few times per its timeout and stall warning, at most once per 10 ms.
    auto period = std::chrono::duration_cast<watch_clock::duration>(std::chrono::seconds(1));
    for (const watch_slot* slot : slots_) {
      for (const watch_clock::duration limit : {slot->timeout, slot->stall_warning}) {
        if (limit.count() > 0) {
          period = std::min(period, limit / 4);
        }
      }
    }
    period = std::max(
        period, std::chrono::duration_cast<watch_clock::duration>(std::chrono::milliseconds(10)));
    changed_.wait_for(lock, period);
    const auto now = watch_clock::now().time_since_epoch().count();
    for (watch_slot* slot : slots_) {
      const auto since = slot->since.load(std::memory_order_relaxed);
      if (since == 0) {
        continue;
      }
      const watch_clock::duration waited(now - since);
      if (slot->timeout.count() > 0 && waited > slot->timeout) {
        end_job(describe(*slot, waited));
      }
      // The n-th warning after 2^n stall warnings: a long stall says so a few times, not each
      // period. Counted with an exchange, and only while the same call waits: a call that began
      // meanwhile reset the count, and its own first warning is then due.
      unsigned warned = slot->warnings.load(std::memory_order_relaxed);
      if (slot->stall_warning.count() > 0 && warned < 32 &&
          waited > slot->stall_warning * (std::uint64_t{1} << warned) &&
          slot->warnings.compare_exchange_strong(warned, warned + 1, std::memory_order_relaxed) &&
          slot->since.load(std::memory_order_relaxed) == since) {
        const std::string line = describe_stall(*slot, waited);
        std::fprintf(stderr, "%s\n", line.c_str());
        std::fflush(stderr);
      }
    }
  }
}

COHORT_DECL std::string watchdog::describe(const watch_slot& slot, watch_clock::duration waited) {
  const char* operation = slot.operation.load(std::memory_order_relaxed);
  std::string message = "cohort: timeout on rank " + std::to_string(slot.rank) + " (" +
                        host_name() + "): " + (operation != nullptr ? operation : "an MPI call") +
                        " (#" + std::to_string(slot.sequence.load(std::memory_order_relaxed)) +
                        ", " + std::to_string(slot.bytes.load(std::memory_order_relaxed)) +
                        " bytes) has waited " + describe_seconds(waited) + " (timeout " +
                        describe_seconds(slot.timeout) + "); ";
  message += slot.agreed.load(std::memory_order_relaxed)
                 ? "every rank had arrived at it (they passed its agreement check), so a "
                   "rank stalled or died inside the transfer"
                 : "the ranks had not checked that they all arrived (the agreement check is "
                   "off, or this call has none): a rank may never have called it";
  return message + "; ending the job";
}

COHORT_DECL std::string watchdog::describe_stall(const watch_slot& slot,
                                                 watch_clock::duration waited) {
  const char* operation = slot.operation.load(std::memory_order_relaxed);
  return "cohort: stall on rank " + std::to_string(slot.rank) + " (" + host_name() +
         "): " + (operation != nullptr ? operation : "an MPI call") + " (#" +
         std::to_string(slot.sequence.load(std::memory_order_relaxed)) + ", " +
         std::to_string(slot.bytes.load(std::memory_order_relaxed)) + " bytes) has waited " +
         describe_seconds(waited) + "; " +
         (slot.agreed.load(std::memory_order_relaxed)
              ? "every rank had arrived at it (they passed its agreement check): the transfer "
                "itself is stalled (a rank stopped, or a link down or slow)"
              : "the ranks had not checked that they all arrived (the agreement check is off, "
                "or this call has none): a rank may not have called it yet") +
         "; still waiting" +
         (slot.timeout.count() > 0
              ? " (the timeout, " + describe_seconds(slot.timeout) + ", ends the job)"
              : std::string(" (no timeout)"));
}

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
