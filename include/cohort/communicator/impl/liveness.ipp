// SPDX-License-Identifier: Apache-2.0
#pragma once

// What liveness.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/liveness.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

COHORT_DECL void liveness::check_departures(watch_clock::time_point now, const char* operation,
                                            std::uint64_t sequence) {
  const std::string departure = control_.departure(now, leave_grace());
  if (departure.empty()) {
    return;
  }
  end_job("cohort: rank " + std::to_string(rank_) + ": " + departure +
          "; this rank waited for it in " + operation + " (#" + std::to_string(sequence) +
          "), which it can never join; ending the job");
}

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
