// SPDX-License-Identifier: Apache-2.0
// Stage 2's two collectives, alone (issue 36): T tensors, each owned by one rank in turn, reduced
// to their owners and then copied back from them, beside the all-reduce an unsharded optimizer
// runs on the same tensors. Rows:
//   all-reduce, one at a time     cohort::mpi::allreduce (1 MiB segments: what flat runs)
//   reduce, one at a time         MPI_Reduce to each owner after the other
//   reduce, two in flight         MPI_Ireduce, the older completed as the next starts (what the
//                                 engine does: bucketed_reduction::max_in_flight)
//   reduce, all in flight         MPI_Ireduce, every one started, then all completed
//   broadcast, over every rank    MPI_Ibcast from each owner over every rank, all in flight
//   broadcast_each                cohort's: on nodes alike across the nodes, then inside each
// Each row: the median of --reps runs (the slowest rank's time), rows taking turns.
//
//   bench_reduce_to_owners [--mib M] [--tensors T] [--reps R]
#include <cohort/cohort.hpp>

#include <boost/mpi/environment.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "timing.hpp"

namespace {

struct arguments {
  std::size_t mib = 4;
  int tensors = 4;
  int reps = 7;
};

arguments parse(int argc, char** argv) {
  arguments a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = argv[i];
    const long value = std::strtol(argv[i + 1], nullptr, 10);
    if (name == "--mib" && value > 0) {
      a.mib = static_cast<std::size_t>(value);
    } else if (name == "--tensors" && value > 0) {
      a.tensors = static_cast<int>(value);
    } else if (name == "--reps" && value > 0) {
      a.reps = static_cast<int>(value);
    } else {
      std::fprintf(stderr, "usage: %s [--mib M] [--tensors T] [--reps R]\n", argv[0]);
      std::exit(2);
    }
  }
  return a;
}

} // namespace

int main(int argc, char** argv) {
  boost::mpi::environment env(argc, argv);
  const arguments args = parse(argc, argv);
  auto comm = cohort::make_communicator<cohort::flat>();
  const MPI_Comm world = comm.mpi_comm();
  const int n = comm.size();
  const std::size_t count = args.mib * (std::size_t{1} << 20) / sizeof(float);
  std::vector<std::vector<float>> tensors(static_cast<std::size_t>(args.tensors),
                                          std::vector<float>(count, 1.0f));
  std::vector<cohort::tensor_view> views;
  std::vector<int> owners;
  for (int t = 0; t < args.tensors; ++t) {
    views.push_back(cohort::make_view(tensors[static_cast<std::size_t>(t)]));
    owners.push_back(t % n);
  }
  const auto reduce_in_flight = [&](std::size_t window) {
    std::vector<cohort::mpi::request> pending;
    for (std::size_t t = 0; t < views.size(); ++t) {
      pending.push_back(cohort::mpi::ireduce(world, views[t], cohort::reduce_op::sum, owners[t]));
      if (window > 0 && pending.size() >= window) {
        pending[pending.size() - window].wait();
      }
    }
    for (auto& p : pending) {
      p.wait();
    }
  };
  const std::vector<std::pair<const char*, std::function<void()>>> rows = {
      {"all-reduce, one at a time",
       [&] {
         for (const auto& v : views) {
           cohort::mpi::allreduce(world, v, cohort::reduce_op::sum);
         }
       }},
      {"reduce, one at a time",
       [&] {
         for (std::size_t t = 0; t < views.size(); ++t) {
           cohort::mpi::reduce(world, views[t], cohort::reduce_op::sum, owners[t]);
         }
       }},
      {"reduce, two in flight", [&] { reduce_in_flight(2); }},
      {"reduce, all in flight", [&] { reduce_in_flight(0); }},
      {"broadcast, over every rank",
       [&] {
         std::vector<cohort::mpi::request> pending;
         for (std::size_t t = 0; t < views.size(); ++t) {
           pending.push_back(cohort::mpi::ibroadcast(world, views[t], owners[t]));
         }
         for (auto& p : pending) {
           p.wait();
         }
       }},
      {"broadcast_each", [&] { comm.broadcast_each(views, owners); }},
  };
  std::vector<std::vector<double>> samples(rows.size());
  for (int rep = 0; rep < args.reps + 1; ++rep) {
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const double seconds = bench::time_once(world, rows[r].second);
      if (rep > 0) { // (the first round warms the connections up)
        samples[r].push_back(seconds);
      }
    }
  }
  if (comm.rank() == 0) {
    std::printf("# bench_reduce_to_owners: %d ranks (%d nodes of %d), %d tensors of %zu MiB of "
                "float32, owned by ranks 0, 1, ... in turn; median of %d runs, rows taking turns\n",
                n, comm.inter_size(), comm.intra_size(), args.tensors, args.mib, args.reps);
    std::printf("%-32s %12s %12s\n", "row", "ms", "/all-reduce");
    const double base = bench::median(samples[0]);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const double ms = bench::median(samples[r]);
      std::printf("%-32s %12.1f %12.3f\n", rows[r].first, ms * 1e3, ms / base);
    }
  }
  return 0;
}
