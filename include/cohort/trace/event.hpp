// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the trace records of one span, as the recording thread leaves it: cohort's own string
// literals and a few numbers, copied under a lock; turned into text later by the recorder's thread
// (json_format.hpp).

#include <cohort/config.hpp>

#include <array>
#include <cstdint>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The threads a trace shows for each rank.
enum class trace_thread : int { trainer = 0, reducer = 1 };

//! The calling thread's row in the trace: cohort's reduction thread sets its own once; every
//! other thread is the trainer's.
inline trace_thread& this_trace_thread() noexcept {
  thread_local trace_thread role = trace_thread::trainer;
  return role;
}

//! One span, its times in trace_ticks.
struct trace_event {
  const char* name;
  const char* operation; // the call it is part of, or null
  std::uint64_t start;
  std::uint64_t end;
  std::uint64_t bytes;
  std::int64_t bucket; // its index in its plan, or -1
  trace_thread thread;
  bool carried = false; // a blocking step carried in its agreement: its phases end at `phases`
  std::array<std::uint64_t, 3> phases{}; // pack from [0] to [1], agreement and reduce to [2]
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
