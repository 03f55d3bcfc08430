// SPDX-License-Identifier: Apache-2.0
#pragma once

// The main() of a multi-rank GPU test: one GPU per rank of each node, or the whole job is skipped
// (77) alike on every rank, since NCCL does not support two ranks on one device. Each rank then
// drives GPU intra_rank of its node.

#include <cohort/cohort.hpp>
#include <cohort/transport/cuda.hpp>

#include <boost/mpi/environment.hpp>
#include <boost/test/unit_test.hpp>

#include <cstdio>

int main(int argc, char* argv[]) {
  boost::mpi::environment env(argc, argv);
  auto topology = cohort::make_communicator<cohort::naive>();
  const int fewest = topology.allreduce_obj(cohort::cuda::device_count() - topology.intra_size(),
                                            [](int a, int b) { return a < b ? a : b; });
  if (fewest < 0) {
    if (topology.rank() == 0) {
      std::printf("fewer CUDA devices than ranks on a node (one each needed): skipped\n");
    }
    return 77;
  }
  cohort::cuda::select_device(topology.intra_rank());
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
