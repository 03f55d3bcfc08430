// SPDX-License-Identifier: Apache-2.0
#pragma once

// The main() of a multi-rank GPU test: one GPU per rank of each node, or the whole job is skipped
// (77) alike on every rank, since NCCL does not support two ranks on one device. Each rank then
// drives GPU intra_rank of its node.
//
// With COHORT_TEST_SHARED_DEVICE=1, ranks share the node's GPUs (rank i on GPU i % count): the
// device kit's way to run the strategies that move device memory through MPI (host_staged,
// cuda_aware_flat) at several ranks on a machine with one GPU. Only the cases labelled
// `mpi_on_device` can run so (`--run_test=@mpi_on_device`); NCCL refuses the others.

#include <cohort/cohort.hpp>
#include <cohort/transport/cuda.hpp>

#include <boost/mpi/environment.hpp>
#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <cstdlib>
#include <string_view>

int main(int argc, char* argv[]) {
  boost::mpi::environment env(argc, argv);
  auto topology = cohort::make_communicator<cohort::naive>();
  const char* shared = std::getenv("COHORT_TEST_SHARED_DEVICE");
  const bool sharing = shared != nullptr && std::string_view(shared) == "1";
  const int needed = sharing ? 1 : topology.intra_size();
  const int fewest = topology.allreduce_obj(cohort::cuda::device_count() - needed,
                                            [](int a, int b) { return a < b ? a : b; });
  if (fewest < 0) {
    if (topology.rank() == 0) {
      std::printf(sharing ? "no CUDA device visible: skipped\n"
                          : "fewer CUDA devices than ranks on a node (one each needed): skipped\n");
    }
    return 77;
  }
  cohort::cuda::select_device(topology.intra_rank());
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
