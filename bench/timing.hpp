// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/transport/mpi.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

namespace bench {

//! One sample: all ranks start together after a barrier, each times its own call, and the slowest
//! one counts (a training step waits for it).
template <class Run>
double time_once(MPI_Comm comm, Run&& run) {
  cohort::mpi::check(MPI_Barrier(comm), "MPI_Barrier", comm);
  const auto start = std::chrono::steady_clock::now();
  run();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  double slowest = elapsed.count();
  cohort::mpi::check(MPI_Allreduce(MPI_IN_PLACE, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm),
                     "MPI_Allreduce (timing)", comm);
  return slowest;
}

//! The median: on a shared machine the mean follows the outliers.
inline double median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  const std::size_t mid = samples.size() / 2;
  return samples.size() % 2 == 1 ? samples[mid] : (samples[mid - 1] + samples[mid]) / 2;
}

} // namespace bench
