// SPDX-License-Identifier: Apache-2.0

// What compression buys where the link is the bottleneck (issue 35): one gradient reduction of
// ResNet-50's gradients (161 float32 tensors, 25.6 M values; each weight seen as out channels x
// the rest, as DDP's hooks see it) with the mean, with float16 on the wire, and with PowerSGD at
// ranks 1, 2 and 4 (with cohort's default 4 MiB buckets, and with DDP's 25 MiB), every row over
// flat; then the same reducers over `dummy` (no transfer at all): the compression's own compute.
// Per row: the collectives, the bytes this rank handed its exchanges per step (what the link
// carries is a multiple of it, the same for every row), how many times fewer than the mean's,
// the time (median over the runs, each the slowest rank's) and, of it, PowerSGD's own compute
// (grad_sync_stats::hook: the orthogonalization and the matrix products; of it, the time in
// Gram-Schmidt, powersgd_stats::orthogonalizing). Rows take turns
// within each run; the gradients are the same random values before each.
//
//   mpirun -np 4 ./bench_powersgd [--iters 5] [--only TEXT]   # TEXT: the rows whose
//                                                               "reducer, strategy" holds it

#include <cohort/cohort.hpp>

#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "resnet50.hpp"
#include "timing.hpp"

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

struct row {
  std::string name;
  std::string reducer;
  std::function<void()> run;
  std::function<cohort::grad_sync_stats()> stats;
  std::function<std::size_t()> collectives;
  std::vector<double> samples{};
  double wire_bytes = 0;   // per step
  double hook_seconds = 0; // per step
  // PowerSGD's time orthogonalizing so far (rows of other reducers: none).
  std::function<std::chrono::nanoseconds()> orthogonalizing{};
  std::chrono::nanoseconds orthogonalizing_before{0};
  double orthogonalize_seconds = 0; // per step
};

int run(int argc, char** argv) {
  const boost::mpi::communicator world;
  int iters = 5;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (flag == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (flag == "--quick") {
      iters = 1;
    } else {
      if (world.rank() == 0) {
        std::fprintf(stderr, "usage: bench_powersgd [--iters N] [--quick] [--only TEXT]\n");
      }
      return 2;
    }
  }

  bench::gradient_set model = bench::resnet50_gradients();
  // Each rank's own gradients, restored before every sample (a reducer writes over them).
  std::vector<std::vector<float>> original(model.grads.size());
  std::mt19937 engine(static_cast<unsigned>(world.rank() + 1));
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (std::size_t t = 0; t < model.grads.size(); ++t) {
    original[t].resize(model.grads[t].size());
    for (float& x : original[t]) {
      x = normal(engine);
    }
  }
  const auto restore = [&] {
    for (std::size_t t = 0; t < model.grads.size(); ++t) {
      std::copy(original[t].begin(), original[t].end(), model.grads[t].begin());
    }
  };

  std::vector<std::shared_ptr<void>> communicators; // (each row's own: its plans, its state)
  std::vector<row> rows;
  const auto add = [&]<class Communicator>(std::type_identity<Communicator>, std::string name,
                                           std::string strategy, auto reducer,
                                           cohort::communicator_options options) {
    auto comm = std::make_shared<Communicator>(world, options);
    communicators.push_back(comm);
    Communicator* c = comm.get();
    rows.push_back({std::move(name), std::move(strategy),
                    [&model, c, reducer] { c->allreduce_grad(model.params, reducer); },
                    [c] { return c->take_grad_sync_stats(); }, [c] { return c->bucket_count(); }});
    if constexpr (std::is_same_v<decltype(reducer), cohort::powersgd>) {
      rows.back().orthogonalizing = [reducer] { return reducer.stats().orthogonalizing; };
    }
  };
  constexpr std::type_identity<cohort::flat> flat;
  constexpr std::type_identity<cohort::dummy> dummy;
  const cohort::communicator_options ddp_buckets{.bucket_bytes = 25 * mib,
                                                 .fusion_threshold_bytes = 25 * mib};
  const auto psgd = [](int rank) { return cohort::powersgd({.rank = rank, .start_step = 0}); };
  add(flat, "mean", "flat, 4 MiB buckets", cohort::mean{}, {});
  add(flat, "float16 on the wire", "flat, 4 MiB buckets", cohort::compressed<cohort::float16>{},
      {});
  for (const int r : {1, 2, 4}) {
    add(flat, "powersgd rank " + std::to_string(r), "flat, 4 MiB buckets", psgd(r), {});
  }
  add(flat, "powersgd rank 4", "flat, 25 MiB buckets (DDP's)", psgd(4), ddp_buckets);
  add(dummy, "mean", "dummy: no transfer", cohort::mean{}, {});
  add(dummy, "powersgd rank 4", "dummy: compute alone", psgd(4), {});

  std::erase_if(rows, [&](const row& r) {
    return (r.name + ", " + r.reducer).find(only) == std::string::npos;
  });
  if (rows.empty()) {
    throw std::runtime_error("--only " + only + ": no row");
  }

  // One run of each first (PowerSGD's state sized, the plans built), its result checked: finite,
  // and the same bits on every rank (the replicas must not part).
  for (row& r : rows) {
    restore();
    r.run();
    double sum = 0;
    for (const auto& g : model.grads) {
      for (const float x : g) {
        sum += static_cast<double>(x) * x;
      }
    }
    double range[2] = {sum, -sum};
    cohort::mpi::check(MPI_Allreduce(MPI_IN_PLACE, range, 2, MPI_DOUBLE, MPI_MAX, world),
                       "MPI_Allreduce (verification)", world);
    if (!std::isfinite(sum) || (r.reducer.rfind("dummy", 0) != 0 && range[0] != -range[1])) {
      throw std::runtime_error(r.name + " (" + r.reducer +
                               "): the reduced gradients differ across ranks, or are not finite");
    }
    (void)r.stats();
  }
  for (row& r : rows) {
    r.orthogonalizing_before = r.orthogonalizing ? r.orthogonalizing() : r.orthogonalizing_before;
  }
  for (int i = 0; i < iters; ++i) {
    for (row& r : rows) {
      restore();
      r.samples.push_back(bench::time_once(world, r.run));
    }
  }
  for (row& r : rows) {
    const cohort::grad_sync_stats s = r.stats();
    const auto steps = static_cast<double>(std::max<std::uint64_t>(1, s.steps));
    r.wire_bytes = static_cast<double>(s.wire_bytes) / steps;
    r.hook_seconds = std::chrono::duration<double>(s.hook).count() / steps;
    if (r.orthogonalizing) {
      r.orthogonalize_seconds =
          std::chrono::duration<double>(r.orthogonalizing() - r.orthogonalizing_before).count() /
          steps;
    }
  }

  if (world.rank() == 0) {
    const double elements = static_cast<double>(model.elements());
    std::printf("# cohort: ResNet-50's gradients reduced with compression (bench/powersgd.cpp)\n");
    std::printf("# %d ranks; %zu tensors, %.0f float32 values (%.1f MB); median of %d runs, each "
                "the slowest rank's time; hook: PowerSGD's own compute, orth.: of it, Gram-Schmidt "
                "(rank 0's)\n",
                world.size(), model.params.size(), elements, elements * 4 / 1e6, iters);
    std::printf("# %-20s %-29s %11s %13s %8s %10s %9s %9s %8s\n", "reducer", "strategy, buckets",
                "collectives", "MB sent/step", "fewer", "time(ms)", "hook(ms)", "orth.(ms)",
                "vs mean");
    const double mean_bytes = rows[0].wire_bytes;
    const double mean_time = bench::median(rows[0].samples);
    for (row& r : rows) {
      const double t = bench::median(r.samples);
      const bool dummy = r.reducer.rfind("dummy", 0) == 0;
      std::printf(
          "  %-20s %-29s %11zu %13.3f %8s %10.2f %9.2f %9.2f %8.2f\n", r.name.c_str(),
          r.reducer.c_str(), r.collectives(), r.wire_bytes / 1e6,
          dummy ? "-"
                : (std::to_string(static_cast<int>(mean_bytes / r.wire_bytes + 0.5)) + "x").c_str(),
          t * 1e3, r.hook_seconds * 1e3, r.orthogonalize_seconds * 1e3,
          dummy ? 0.0 : t / mean_time);
    }
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  boost::mpi::environment env(argc, argv);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_powersgd: %s\n", e.what());
    return 1;
  }
}
