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
  // Every rank's node leader and intra_rank.
  const std::array<int, 2> mine{leader, intra.rank()};
  std::vector<std::array<int, 2>> placement(static_cast<std::size_t>(comm.size()));
  mpi::check(MPI_Allgather(mine.data(), 2, MPI_INT, placement.data(), 2, MPI_INT, comm),
             "MPI_Allgather (node leaders)", comm);
  std::vector<int> leaders;
  for (const auto& where : placement) {
    leaders.push_back(where[0]);
  }
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
  const auto node_of = [&](int its_leader) {
    return static_cast<int>(std::lower_bound(leaders.begin(), leaders.end(), its_leader) -
                            leaders.begin());
  };
  std::vector<int> on_node(leaders.size());
  for (auto& where : placement) { // (leader, intra_rank) -> (intra_rank, inter_rank)
    where = {where[1], node_of(where[0])};
    ++on_node[static_cast<std::size_t>(where[1])];
  }

  topology topo;
  topo.rank = rank;
  topo.size = comm.size();
  topo.intra_rank = intra.rank();
  topo.intra_size = intra.size();
  topo.inter_rank = node_of(leader);
  topo.inter_size = static_cast<int>(leaders.size());

  MPI_Comm across = MPI_COMM_NULL;
  mpi::check(MPI_Comm_split(comm, topo.intra_rank, topo.inter_rank, &across),
             "MPI_Comm_split (inter)", comm);
  const bool alike =
      std::all_of(on_node.begin(), on_node.end(), [&](int n) { return n == on_node.front(); });
  return {topo, std::move(intra), detail::adopt(across), std::move(placement), alike};
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
