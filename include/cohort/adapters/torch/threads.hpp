// SPDX-License-Identifier: Apache-2.0
#pragma once

// How many intra-op threads a rank's LibTorch should run: the ranks of a node share its cores,
// and each LibTorch process defaults to one thread per core, so N ranks on a node would run N
// times as many compute threads as there are cores and slow each other down. With overlap,
// cohort's own thread (which drives MPI while backward runs) needs a core too: it is busy for
// as long as a bucket is on its way, and MPI polls while it waits.

#include <cohort/config.hpp>

#include <algorithm>
#include <sched.h>
#include <thread>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {

//! The cores this process may run on (its CPU affinity: what mpirun's binding and a container's
//! limits leave it), or the machine's if that cannot be read.
inline int available_cores() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    return std::max(1, CPU_COUNT(&set));
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

//! Intra-op threads for one of `ranks_on_node` ranks sharing `cores` cores: an equal share, one
//! fewer when cohort's thread overlaps the reduction with backward (where the share allows it),
//! and at least one. For `torch::set_num_threads(intra_op_threads(comm.intra_size(), ...))`.
inline int intra_op_threads(int ranks_on_node, bool overlap, int cores = available_cores()) {
  const int share = std::max(1, cores / std::max(1, ranks_on_node));
  return overlap && share > 1 ? share - 1 : share;
}

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
