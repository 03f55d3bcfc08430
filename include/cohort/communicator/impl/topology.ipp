// SPDX-License-Identifier: Apache-2.0
#pragma once

// What topology.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/topology.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

COHORT_DECL node_layout discover_topology(const boost::mpi::communicator& comm,
                                          int simulated_ranks_per_node) {
  const int per_node = detail::ranks_per_node_override(simulated_ranks_per_node);
  const int rank = comm.rank();
  MPI_Comm node = MPI_COMM_NULL;
  if (per_node > 0) {
    mpi::check(MPI_Comm_split(comm, rank / per_node, rank, &node), "MPI_Comm_split (node)", comm);
  } else {
    mpi::check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
               "MPI_Comm_split_type (node)", comm);
  }
  boost::mpi::communicator intra = detail::adopt(node);

  int leader = rank;
  mpi::check(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, intra),
             "MPI_Allreduce (node leader)", comm);
  std::vector<int> leaders(static_cast<std::size_t>(comm.size()));
  mpi::check(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, comm),
             "MPI_Allgather (node leaders)", comm);
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());

  topology topo;
  topo.rank = rank;
  topo.size = comm.size();
  topo.intra_rank = intra.rank();
  topo.intra_size = intra.size();
  topo.inter_rank =
      static_cast<int>(std::lower_bound(leaders.begin(), leaders.end(), leader) - leaders.begin());
  topo.inter_size = static_cast<int>(leaders.size());

  MPI_Comm across = MPI_COMM_NULL;
  mpi::check(MPI_Comm_split(comm, topo.intra_rank, topo.inter_rank, &across),
             "MPI_Comm_split (inter)", comm);
  return {topo, std::move(intra), detail::adopt(across)};
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
