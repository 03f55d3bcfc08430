// SPDX-License-Identifier: Apache-2.0
#pragma once

// What ticks.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/trace/ticks.hpp>

#include <fstream>
#include <string>

#if defined(COHORT_TRACE_TSC)
#include <cpuid.h>
#endif

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

COHORT_DECL bool trace_ticks::detect_invariant_counter() noexcept {
#if defined(COHORT_TRACE_TSC)
  // The CPU says the counter is invariant, and (on Linux) the kernel, which checks that the
  // cores' counters agree, keeps it as its own clock: a VM or a machine whose counters drift
  // apart has the kernel fall back to another clocksource, and the trace to steady_clock.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0x80000007u, &eax, &ebx, &ecx, &edx) == 0 || (edx & (1u << 8)) == 0) {
    return false;
  }
#if defined(__linux__)
  try {
    std::ifstream source("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    std::string name;
    return source >> name && name == "tsc";
  } catch (...) {
    return false; // (no memory for a stream: steady_clock)
  }
#else
  return true;
#endif
#else
  return false;
#endif
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
