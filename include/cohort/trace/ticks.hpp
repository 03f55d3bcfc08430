// SPDX-License-Identifier: Apache-2.0
#pragma once

// The trace's timestamps. A span reads the time twice; on a step of a few microseconds that is
// most of what tracing costs: here a clock_gettime after real work costs about 75 ns (it waits for
// the instructions before it to retire), the x86 time-stamp counter next to nothing. So spans read
// the counter where it is invariant (the same rate on every core, whatever the power state:
// CPUID's "invariant TSC"), else steady_clock; the trace's writer turns counts into steady_clock
// time between anchors (a count and a steady_clock time read together) that it takes as it goes.

#include <cohort/config.hpp>

#include <chrono>
#include <cstdint>

// The counter is read with the compiler's builtin: <x86intrin.h> would cost every translation
// unit that includes cohort a few tenths of a second to parse, for one instruction.
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define COHORT_TRACE_TSC 1
#endif

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

class trace_ticks {
public:
  using clock = std::chrono::steady_clock;

  //! Now, in the trace's counts.
  static std::uint64_t now() noexcept {
#if defined(COHORT_TRACE_TSC)
    if (counter_is_invariant()) {
      return __builtin_ia32_rdtsc();
    }
#endif
    return static_cast<std::uint64_t>(clock::now().time_since_epoch().count());
  }

  //! A count and the steady_clock time read together.
  struct anchor {
    std::uint64_t ticks;
    clock::time_point time;
    static anchor take() noexcept { return {now(), clock::now()}; }
  };

  //! Counts to time from anchor `from` on, at the rate measured from `first` to `to` (a count a
  //! little before `from` or after `to` is extrapolated): exact for steady_clock's own counts,
  //! within the reads' skew for the counter. The rate is computed once, for the writer's batch of
  //! events, and over the longest baseline there is (`first`: the recorder's first anchor), so that
  //! a short batch, or a thread preempted between an anchor's two reads, does not skew it.
  class converter {
  public:
    converter(const anchor& first, const anchor& from, const anchor& to) noexcept
        : from_(from) {
      const auto span = static_cast<double>(to.ticks - first.ticks);
      per_tick_ = span > 0 ? static_cast<double>((to.time - first.time).count()) / span : 1.0;
    }
    clock::time_point operator()(std::uint64_t ticks) const noexcept {
      const double offset =
          static_cast<double>(static_cast<std::int64_t>(ticks - from_.ticks)) * per_tick_;
      return from_.time + clock::duration(static_cast<clock::rep>(offset));
    }

  private:
    anchor from_;
    double per_tick_;
  };

private:
  static bool counter_is_invariant() noexcept {
    static const bool invariant = detect_invariant_counter();
    return invariant;
  }

  // Asked once per process (impl/ticks.ipp).
  static bool detect_invariant_counter() noexcept;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/trace/impl/ticks.ipp>
#endif
