// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/mpi/communicator.hpp>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Where a rank sits: globally, inside its node, and among the nodes. Nodes are numbered by
//! their lowest global rank, and a rank's intra_rank is its order among its node's ranks (as in
//! ChainerMN, but node membership comes from MPI's shared-memory split, not from host names,
//! so two containers that share a host name are still two nodes).
struct topology {
  int rank = 0;
  int size = 1;
  int intra_rank = 0; //!< index among the ranks of this node: the GPU to use
  int intra_size = 1; //!< ranks on this node
  int inter_rank = 0; //!< index of this node
  int inter_size = 1; //!< number of nodes
};

//! A topology with the communicators that go with it: the ranks of this node, and the ranks
//! with the same intra_rank on every node.
struct node_layout {
  topology topo;
  boost::mpi::communicator intra;
  boost::mpi::communicator inter;
  //! Every rank's {intra_rank, inter_rank}, by rank: where a root sits.
  std::vector<std::array<int, 2>> placement;
  //! Whether every node holds as many ranks (then each rank has a peer of its intra_rank on every
  //! node, in `inter` at the peer's inter_rank).
  bool nodes_alike = true;
};

namespace detail {
inline int ranks_per_node_override(int requested) {
  if (requested < 0) {
    throw invalid_argument(
        "cohort: simulated_ranks_per_node must be 0 (ask MPI) or positive, not " +
        std::to_string(requested));
  }
  if (requested > 0) {
    return requested;
  }
  const char* text = std::getenv("COHORT_RANKS_PER_NODE");
  if (text == nullptr || *text == '\0') {
    return 0;
  }
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value <= 0 || value > 1 << 20) {
    throw invalid_argument("cohort: COHORT_RANKS_PER_NODE must be a positive integer, not '" +
                           std::string(text) + "'");
  }
  return static_cast<int>(value);
}

inline boost::mpi::communicator adopt(MPI_Comm comm) {
  mpi::return_errors(comm);
  return boost::mpi::communicator(comm, boost::mpi::comm_take_ownership);
}
} // namespace detail

//! Works out the topology of `comm` (collective over `comm`). `simulated_ranks_per_node` > 0
//! groups consecutive ranks into nodes of that size instead of asking MPI.
COHORT_DECL node_layout discover_topology(const boost::mpi::communicator& comm,
                                          int simulated_ranks_per_node = 0);

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/impl/topology.ipp>
#endif
