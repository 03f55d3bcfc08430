// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>

#include <chrono>
#include <cstdint>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! What a communicator's gradient reductions did since it was made or last asked with
//! `take_grad_sync_stats()`: per rank, host clocks. `exposed` is what the trainer waited for:
//! a blocking `allreduce_grad` whole (its agreement included); with overlap, the wait at the step
//! (`wait_grad_sync`) alone, the buckets reduced while backward ran being hidden behind it.
//! `reducing` is the time the buckets took (pack, exchange, unpack), wherever they ran. For a GPU
//! strategy, the time to enqueue its work, not the device's.
struct grad_sync_stats {
  std::uint64_t steps = 0;   //!< reductions completed (a step that threw is not one; the
                             //!< collectives and time it spent before are counted below)
  std::uint64_t bytes = 0;   //!< gradient bytes reduced (this rank's, before any cast)
  std::uint64_t buckets = 0; //!< collectives run for them (a device strategy's as it counts them)
  std::uint64_t carried = 0; //!< blocking steps of one small bucket reduced inside the step's
                             //!< agreement: one round trip instead of two (counted in buckets)
  std::uint64_t wire_bytes = 0; //!< bytes this rank handed to the strategy's exchanges: what a
                                //!< compressing reducer saves shows here (its all-reduce
                                //!< algorithm then moves a multiple of it)
  std::chrono::nanoseconds reducing{0};
  std::chrono::nanoseconds exposed{0};
  //! Time a gradient hook (powersgd) spent computing, outside its exchanges (in `reducing`).
  std::chrono::nanoseconds hook{0};

  grad_sync_stats& operator+=(const grad_sync_stats& o) noexcept {
    steps += o.steps;
    bytes += o.bytes;
    buckets += o.buckets;
    carried += o.carried;
    wire_bytes += o.wire_bytes;
    reducing += o.reducing;
    exposed += o.exposed;
    hook += o.hook;
    return *this;
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
