// SPDX-License-Identifier: Apache-2.0
#pragma once

// The line the examples print after each epoch: what the gradient reductions of this rank did
// in it (cohort::grad_sync_stats), so that a user sees what the communication costs and how
// much of it the trainer waited for.

#include <cohort/communicator/grad_sync_stats.hpp>

#include <chrono>
#include <cstdio>

inline void print_grad_sync(const cohort::grad_sync_stats& s) {
  const auto ms = [](std::chrono::nanoseconds t) {
    return std::chrono::duration<double, std::milli>(t).count();
  };
  std::printf("  gradients (rank 0): %.1f MB in %llu steps, %llu collectives, %.1f ms reducing, "
              "%.1f ms waited for\n",
              static_cast<double>(s.bytes) / 1e6, static_cast<unsigned long long>(s.steps),
              static_cast<unsigned long long>(s.buckets), ms(s.reducing), ms(s.exposed));
}
