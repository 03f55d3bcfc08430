// SPDX-License-Identifier: Apache-2.0
// What the differentiable functions (cohort::torch::allreduce,
// <cohort/adapters/torch/functions.hpp>) cost beside the communication they do: per tensor size,
// the median over runs of the time per call of one MPI_Allreduce, the communicator's checked
// allreduce, cohort::torch::allreduce without autograd (the ranks' agreement on shapes, a copy, the
// all-reduce), and with autograd (the same recorded, then backward: a second all-reduce), against
// two raw all-reduces once LibTorch's own part of that step (the graph without communication:
// "graph") is taken out.
//
//   mpirun -np 2 bench_torch_functions [--runs 7] [--calls 200]

#include <cohort/adapters/torch.hpp>
#include <cohort/cohort.hpp>

#include <boost/mpi/environment.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <torch/torch.h>
#include <vector>

#include "timing.hpp"

int main(int argc, char** argv) {
  boost::mpi::environment env(argc, argv);
  int runs = 7, calls = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--runs") {
      runs = std::atoi(argv[i + 1]);
    } else if (flag == "--calls") {
      calls = std::atoi(argv[i + 1]);
    }
  }
  torch::set_num_threads(1);
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const MPI_Comm raw = comm.mpi_comm();
  if (comm.rank() == 0) {
    std::printf("cohort::torch::allreduce at %d ranks, median of %d runs of %d calls (us a call)\n",
                comm.size(), runs, calls);
    std::printf("%10s %8s %8s %8s %10s %10s %10s %14s\n", "bytes", "MPI", "comm", "torch",
                "torch+bwd", "graph", "torch/MPI", "(+bwd-graph)/2MPI");
  }
  for (const std::int64_t bytes : {256, 4096, 65536, 1048576}) {
    const at::Tensor x = torch::ones({bytes / 4});
    at::Tensor y = x.clone();
    std::vector<double> mpi, checked, plain, both, graph;
    const auto per_call = [&](auto&& f) {
      return 1e6 *
             bench::time_once(raw,
                              [&] {
                                for (int c = 0; c < calls; ++c) {
                                  f();
                                }
                              }) /
             calls;
    };
    for (int run = 0; run < runs; ++run) {
      // Interleaved, sample by sample, so that the machine's drift falls on every row alike.
      mpi.push_back(per_call([&] {
        cohort::mpi::check(MPI_Allreduce(MPI_IN_PLACE, y.data_ptr<float>(),
                                         static_cast<int>(y.numel()), MPI_FLOAT, MPI_SUM, raw),
                           "MPI_Allreduce", raw);
      }));
      checked.push_back(per_call([&] { comm.allreduce(y); }));
      plain.push_back(per_call([&] {
        const torch::NoGradGuard no_grad;
        (void)cohort::torch::allreduce(comm, x);
      }));
      both.push_back(per_call([&] {
        const at::Tensor leaf = x.detach().requires_grad_();
        cohort::torch::allreduce(comm, leaf).sum().backward();
      }));
      graph.push_back(per_call([&] { // LibTorch's own part of that: the graph, no communication
        const at::Tensor leaf = x.detach().requires_grad_();
        leaf.clone().sum().backward();
      }));
    }
    if (comm.rank() == 0) {
      const double m = bench::median(mpi), c = bench::median(checked), p = bench::median(plain),
                   b = bench::median(both), g = bench::median(graph);
      std::printf("%10lld %8.2f %8.2f %8.2f %10.2f %10.2f %10.2f %14.2f\n",
                  static_cast<long long>(bytes), m, c, p, b, g, p / m, (b - g) / (2 * m));
    }
  }
  return 0;
}
