// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>

#include <atomic>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

// The name of the collective this process is inside, for a hang watchdog to report: a stuck
// collective then fails with the operation's name instead of a silent timeout. Two atomic
// exchanges per call, nothing else.
inline std::atomic<const char*>& current_operation() noexcept {
  static std::atomic<const char*> name{nullptr};
  return name;
}

class operation_scope {
public:
  explicit operation_scope(const char* name) noexcept
      : previous_(current_operation().exchange(name)) {}
  ~operation_scope() { current_operation().store(previous_); }
  operation_scope(const operation_scope&) = delete;
  operation_scope& operator=(const operation_scope&) = delete;

private:
  const char* previous_;
};

} // namespace detail

//! The name of the cohort operation the calling process is currently inside (the outermost
//! collective, e.g. "allreduce_grad"), or nullptr. Meant for watchdogs and diagnostics.
inline const char* current_operation() noexcept {
  return detail::current_operation().load(std::memory_order_relaxed);
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
