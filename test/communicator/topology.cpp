// SPDX-License-Identifier: Apache-2.0
// Node membership from MPI, and the override that simulates several nodes on one machine.
// Run plainly (every rank on this one node) and as "2 nodes x 2 ranks" with
// COHORT_RANKS_PER_NODE=2 (then COHORT_EXPECT_RANKS_PER_NODE tells the test what to expect).
#define BOOST_TEST_MODULE communicator.topology
#include <cohort/cohort.hpp>

#include <cstdlib>

#include "support/expect.hpp"
#include "support/mpi_test_main.hpp"

using cohort::test::message_has;

namespace {
void check_layout(const cohort::flat& comm, int per_node) {
  const int n = comm.size();
  const int r = comm.rank();
  BOOST_TEST(comm.intra_rank() == r % per_node);
  BOOST_TEST(comm.intra_size() == std::min(per_node, n - (r / per_node) * per_node));
  BOOST_TEST(comm.inter_rank() == r / per_node);
  BOOST_TEST(comm.inter_size() == (n + per_node - 1) / per_node);
  BOOST_TEST(comm.intra_comm().size() == comm.intra_size());
  BOOST_TEST(comm.intra_comm().rank() == comm.intra_rank());
  BOOST_TEST(comm.inter_comm().rank() == comm.inter_rank());
  // The inter communicator links the ranks with the same intra_rank across nodes.
  const int peers = comm.inter_comm().size();
  int expected_peers = 0;
  for (int other = 0; other < n; ++other) {
    expected_peers += other % per_node == comm.intra_rank() ? 1 : 0;
  }
  BOOST_TEST(peers == expected_peers);
}
} // namespace

BOOST_AUTO_TEST_CASE(real_or_environment_topology) {
  const auto comm = cohort::make_communicator<cohort::flat>();
  const char* expected = std::getenv("COHORT_EXPECT_RANKS_PER_NODE");
  // Without an override, mpirun on one machine puts every rank on one node.
  check_layout(comm, expected != nullptr ? std::atoi(expected) : comm.size());
  BOOST_TEST(comm.topology().rank == comm.rank());
}

BOOST_AUTO_TEST_CASE(simulated_nodes_of_every_size) {
  const int n = boost::mpi::communicator().size();
  for (int per_node = 1; per_node <= n; ++per_node) {
    const auto comm =
        cohort::make_communicator<cohort::flat>({.simulated_ranks_per_node = per_node});
    check_layout(comm, per_node);
  }
}

BOOST_AUTO_TEST_CASE(negative_override_is_an_error) {
  BOOST_CHECK_EXCEPTION(cohort::make_communicator<cohort::naive>({.simulated_ranks_per_node = -2}),
                        cohort::invalid_argument, message_has({"simulated_ranks_per_node", "-2"}));
}
