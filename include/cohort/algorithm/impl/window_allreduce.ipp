// SPDX-License-Identifier: Apache-2.0
#pragma once

// What window_allreduce.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/algorithm/window_allreduce.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace algorithm {

COHORT_DECL void window_allreduce::wait_for(std::uint64_t& flag, std::uint64_t value) noexcept {
  const std::atomic_ref<std::uint64_t> f(flag);
  for (unsigned spins = 0; f.load(std::memory_order_acquire) < value; ++spins) {
    if (spins < 64) {
      continue;
    }
    if (spins < 65536) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

COHORT_DECL std::string window_allreduce::disagreement(int r, std::uint64_t k) const {
  const auto where = [&](int rank) {
    const std::uint64_t* b = flags(rank).buffer[k % 2];
    return "a buffer of " + std::to_string(b[1]) + " " +
           std::string(to_string(static_cast<dtype>(b[2]))) + " elements (" +
           std::string(to_string(static_cast<reduce_op>(b[3]))) + ") " +
           (b[0] == 0 ? std::string("outside the window")
                      : "at offset " + std::to_string(b[0] - 1) + " of the window") +
           " on rank " + std::to_string(rank);
  };
  const int me = window_->rank();
  return "cohort: shared_memory exchange #" + std::to_string(k) + " (rank " + std::to_string(me) +
         " of the node): " + where(me) + ", " + where(r) +
         ": every rank must allocate its gradients from the communicator's shared_allocator in "
         "the same order and sizes";
}

} // namespace algorithm
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
