// SPDX-License-Identifier: Apache-2.0
// What the GPU strategies check before they touch a GPU, so that it runs on any machine:
// single_node refuses to span nodes (run with COHORT_RANKS_PER_NODE=1, every rank its own
// simulated node), and cuda_aware_flat refuses an MPI that is not CUDA-aware.
#define BOOST_TEST_MODULE gpu.without_device
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

BOOST_AUTO_TEST_CASE(cuda_aware_flat_needs_a_cuda_aware_mpi) {
  if (cohort::mpi_is_cuda_aware()) {
    return; // an MPI that can read GPU memory: the GPU tests exercise it
  }
  BOOST_CHECK_EXCEPTION((void)cohort::cuda_aware_flat{boost::mpi::communicator()},
                        cohort::invalid_argument, [](const cohort::invalid_argument& e) {
                          return std::string(e.what()).find("not CUDA-aware") !=
                                     std::string::npos &&
                                 std::string(e.what()).find("host_staged") != std::string::npos;
                        });
}
