// SPDX-License-Identifier: Apache-2.0
#pragma once

// The pause between two polls of something that finishes on its own (a device's work, a
// non-blocking communicator's state): yields while the wait is short, sleeps once it is long. A
// sleep on Linux lasts 60-110 us whatever it asks for (timer slack): a wait that slept from its
// first poll made every short device operation last that long, twice a step for the NCCL
// strategies (the user's work, then cohort's). Yielding leaves the core to ranks that
// oversubscribe it; sleeping once the wait is long (a peer still computing, backward still
// queued) stops the spinning, and a sleep's latency is small beside such a wait.

#include <cohort/config.hpp>

#include <chrono>
#include <thread>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

class poll_backoff {
public:
  explicit poll_backoff(std::chrono::microseconds sleep = std::chrono::microseconds(50),
                        std::chrono::microseconds yield_for = std::chrono::milliseconds(2))
      : sleep_(sleep)
      , yield_until_(std::chrono::steady_clock::now() + yield_for) {}

  void pause() const {
    if (std::chrono::steady_clock::now() < yield_until_) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep_);
    }
  }

private:
  std::chrono::microseconds sleep_;
  std::chrono::steady_clock::time_point yield_until_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
