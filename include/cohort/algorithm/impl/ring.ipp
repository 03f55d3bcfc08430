// SPDX-License-Identifier: Apache-2.0
#pragma once

// What ring.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/algorithm/ring.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace algorithm {

COHORT_DECL void ring_reduce_scatter(MPI_Comm comm, tensor_view data, reduce_op op,
                                     const ring_options& options, ring_workspace& workspace) {
  const detail::ring_position ring(comm);
  if (ring.ranks == 1) {
    return;
  }
  const auto ranks = static_cast<std::size_t>(ring.ranks);
  std::byte* staging = workspace.reserve((data.count + ranks - 1) / ranks * size_of(data.type));
  // Step s sends block rank-1-s and reduces the arriving block rank-2-s into its own copy: after
  // ranks-1 steps, the last block reduced is block rank, holding every rank's contribution.
  for (int s = 0; s < ring.ranks - 1; ++s) {
    const auto recv_block = ring.before(data.count, 2 + s);
    const tensor_view target = detail::part(data, recv_block);
    detail::ring_step(
        comm, ring, detail::part(data, ring.before(data.count, 1 + s)),
        {staging, recv_block.count, data.type, memory_location::host}, options, workspace,
        [&](const_tensor_view chunk, std::size_t offset) {
          kernels::host::reduce(detail::part(target, {offset, chunk.count}), chunk, op);
        });
  }
}

COHORT_DECL void ring_allgather(MPI_Comm comm, tensor_view data, const ring_options& options,
                                ring_workspace& workspace) {
  const detail::ring_position ring(comm);
  // Step s forwards block rank-s and receives block rank-1-s straight into place.
  for (int s = 0; s < ring.ranks - 1; ++s) {
    detail::ring_step(comm, ring, detail::part(data, ring.before(data.count, s)),
                      detail::part(data, ring.before(data.count, 1 + s)), options, workspace,
                      [](const_tensor_view, std::size_t) {});
  }
}

} // namespace algorithm
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
