// SPDX-License-Identifier: Apache-2.0
// single_node refuses to start across nodes, on every rank, before it touches a GPU: run with
// COHORT_RANKS_PER_NODE=1 (every rank its own simulated node), it needs no device.
#define BOOST_TEST_MODULE gpu.single_node_across_nodes
#include <cohort/nccl.hpp>

#include "support/mpi_test_main.hpp"

BOOST_AUTO_TEST_CASE(across_nodes_is_an_error_naming_the_node_count) {
  const boost::mpi::communicator world;
  if (world.size() < 2) {
    return;
  }
  BOOST_CHECK_EXCEPTION((void)cohort::single_node{world}, cohort::invalid_argument,
                        [&](const cohort::invalid_argument& e) {
                          return std::string(e.what()).find(
                                     "are on " + std::to_string(world.size()) + " nodes") !=
                                 std::string::npos;
                        });
}
