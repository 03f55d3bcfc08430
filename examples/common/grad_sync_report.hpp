// SPDX-License-Identifier: Apache-2.0
#pragma once

// The line the examples print after each epoch: what the gradient reductions did in it
// (cohort::grad_sync_stats), so that a user sees what the communication costs and how much of
// it the trainer waited for: rank 0's figures, and the slowest rank's times beside them (one
// rank that waits much longer than the others is the one the job waits for).

#include <cohort/communicator/grad_sync_stats.hpp>
#include <cohort/reduce_op.hpp>

#include <chrono>
#include <cstdio>
#include <vector>

//! Collective: every rank calls it; rank 0 prints (when `report`). Resets the statistics.
template <class Communicator>
void report_grad_sync(Communicator& comm, bool report) {
  const cohort::grad_sync_stats s = comm.take_grad_sync_stats();
  const auto ms = [](std::chrono::nanoseconds t) {
    return std::chrono::duration<double, std::milli>(t).count();
  };
  std::vector<double> slowest{ms(s.reducing), ms(s.exposed)};
  comm.allreduce(slowest, cohort::reduce_op::max);
  if (report) {
    // MB sent: what the reducer handed the exchanges (less than the gradients' MB where it
    // compresses); a gradient hook's own compute (powersgd's) is part of the time reducing.
    char hook[48] = "";
    if (s.hook.count() > 0) {
      std::snprintf(hook, sizeof hook, ", %.1f ms of it compressing", ms(s.hook));
    }
    std::printf("  gradients (rank 0): %.1f MB in %llu steps, %.2f MB sent, %llu buckets, %.1f ms "
                "reducing (slowest rank %.1f%s), %.1f ms waited for (slowest rank %.1f)\n",
                static_cast<double>(s.bytes) / 1e6, static_cast<unsigned long long>(s.steps),
                static_cast<double>(s.wire_bytes) / 1e6, static_cast<unsigned long long>(s.buckets),
                ms(s.reducing), slowest[0], hook, ms(s.exposed), slowest[1]);
    std::fflush(stdout);
  }
}
