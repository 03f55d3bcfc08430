// SPDX-License-Identifier: Apache-2.0

// One full gradient synchronisation of ResNet-50 (161 float32 tensors, 25.6 M values, 102 MB):
// naive (one all-reduce per tensor), flat with cohort's defaults, buckets of several sizes with
// every tensor under the bucket size packed (as PyTorch DDP does), everything in one buffer (as
// ChainerMN's flat did), beside what a trainer without cohort writes, one raw MPI_Allreduce per
// tensor ("vs tensor"), and one raw MPI_Allreduce of the same bytes in one contiguous buffer
// (which Open MPI runs, past a few MiB, through a temporary buffer as large). The methods take
// turns within each repetition; each sample is the slowest rank's time; the median is reported.
// Each method's result is verified before it is timed.
//
//   mpirun -np 4 ./bench_grad_sync [--iters 10]

#include <cohort/cohort.hpp>

#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>
#include <mpi.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "resnet50.hpp"
#include "timing.hpp"

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

struct row {
  std::string name;
  std::string layout; // how the tensors are grouped
  std::function<void()> run;
  std::function<std::size_t()> collectives;
  // Rows whose gradients live elsewhere than the shared model's (in a shared window).
  std::function<void(float)> fill{};
  std::function<std::size_t(float)> count_not_equal{};
};

int run(int argc, char** argv) {
  const boost::mpi::communicator world;
  int iters = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (flag == "--quick") {
      iters = 2;
    } else {
      if (world.rank() == 0) {
        std::fprintf(stderr, "usage: bench_grad_sync [--iters N] [--quick]\n");
      }
      return 2;
    }
  }

  bench::gradient_set model = bench::resnet50_gradients();
  const std::size_t elements = model.elements();
  std::vector<float> contiguous(elements);

  // Every communicator owns its buckets; they are built once here and reused by every sample.
  std::vector<std::unique_ptr<cohort::flat>> flats;
  std::vector<row> rows;
  const MPI_Comm raw_comm = world;
  rows.push_back({"raw MPI_Allreduce", "one contiguous buffer",
                  [&] {
                    cohort::mpi::check(MPI_Allreduce(MPI_IN_PLACE, contiguous.data(),
                                                     static_cast<int>(elements), MPI_FLOAT, MPI_SUM,
                                                     raw_comm),
                                       "MPI_Allreduce (raw)", raw_comm);
                  },
                  [] { return std::size_t{1}; }});
  // The issue-14 baseline: what a trainer without cohort writes, one MPI call per gradient.
  rows.push_back({"raw per tensor", "one MPI_Allreduce per tensor, whole",
                  [&] {
                    for (std::vector<float>& g : model.grads) {
                      cohort::mpi::check(MPI_Allreduce(MPI_IN_PLACE, g.data(),
                                                       static_cast<int>(g.size()), MPI_FLOAT,
                                                       MPI_SUM, raw_comm),
                                         "MPI_Allreduce (raw per tensor)", raw_comm);
                    }
                  },
                  [&] { return model.grads.size(); }});
  auto naive = std::make_unique<cohort::naive>(world);
  rows.push_back({"naive", "one all-reduce per tensor",
                  [&] { naive->allreduce_grad(model.params, cohort::sum{}); },
                  [&] { return naive->bucket_count(); }});
  const auto add_flat = [&](std::string name, std::string layout,
                            cohort::communicator_options options) {
    flats.push_back(std::make_unique<cohort::flat>(world, options));
    cohort::flat* comm = flats.back().get();
    rows.push_back({std::move(name), std::move(layout),
                    [&model, comm] { comm->allreduce_grad(model.params, cohort::sum{}); },
                    [comm] { return comm->bucket_count(); }});
  };
  add_flat("flat (defaults)", "4 MiB buckets, >= 64 KiB in place", {});
  // The trace's cost: the defaults, each rank writing its spans (issue 14: on <= 2%).
  const std::filesystem::path trace_dir = std::filesystem::temp_directory_path() /
                                          ("cohort-bench-trace-" + std::to_string(world.rank()));
  // One communicator, its trace paused for one row and resumed for the next: two communicators
  // doing the same work differ by more than the trace costs on this VM.
  flats.push_back(std::make_unique<cohort::flat>(
      world, cohort::communicator_options{.trace_directory = trace_dir.string()}));
  cohort::flat* traced = flats.back().get();
  rows.push_back({"flat, paused", "the next row's communicator, its trace paused",
                  [&model, traced] {
                    traced->pause_trace();
                    traced->allreduce_grad(model.params, cohort::sum{});
                  },
                  [traced] { return traced->bucket_count(); }});
  rows.push_back({"flat, traced", "the defaults, COHORT_TRACE on",
                  [&model, traced] {
                    traced->resume_trace();
                    traced->allreduce_grad(model.params, cohort::sum{});
                  },
                  [traced] { return traced->bucket_count(); }});
  add_flat("flat, unsegmented", "the same, each MPI call whole", {.segment_bytes = 0});
  add_flat("flat, 256 KiB seg.", "the same, MPI calls of at most 256 KiB",
           {.segment_bytes = 256 * 1024});
  for (const std::size_t bucket : {1 * mib, 4 * mib, 25 * mib}) {
    add_flat("buckets " + std::to_string(bucket / mib) + " MiB", "all packed, first bucket 1 MiB",
             {.bucket_bytes = bucket, .fusion_threshold_bytes = bucket});
  }
  add_flat("one buffer", "all packed in one 98 MiB bucket (ChainerMN)",
           {.bucket_bytes = elements * sizeof(float),
            .first_bucket_bytes = elements * sizeof(float),
            .fusion_threshold_bytes = elements * sizeof(float)});
  // The gradients allocated in the node's shared window (issue 14's ResNet-50 row), reduced
  // there: with flat's buckets (the small tensors packed and reduced through MPI), and with
  // every tensor in place in the window.
  using shared_set = bench::basic_gradient_set<cohort::shared_allocator<float>>;
  std::vector<std::unique_ptr<cohort::shared_memory<>>> shared_comms;
  std::vector<std::unique_ptr<shared_set>> shared_models;
  const auto add_shared = [&](std::string name, std::string layout,
                              cohort::communicator_options options) {
    // Values and gradients both in the window: 2 x 102 MB.
    shared_comms.push_back(std::make_unique<cohort::shared_memory<>>(
        world, options, 2 * elements * sizeof(float) + 2 * mib));
    cohort::shared_memory<>* comm = shared_comms.back().get();
    shared_models.push_back(
        std::make_unique<shared_set>(bench::resnet50_gradients(comm->allocator<float>())));
    shared_set* grads = shared_models.back().get();
    rows.push_back({std::move(name), std::move(layout),
                    [grads, comm] { comm->allreduce_grad(grads->params, cohort::sum{}); },
                    [comm] { return comm->bucket_count(); }, [grads](float x) { grads->fill(x); },
                    [grads](float x) { return grads->count_not_equal(x); }});
  };
  add_shared("shared_memory", "in the window, flat's buckets", {});
  add_shared("shared_memory, all", "in the window, every tensor in place",
             {.fusion_threshold_bytes = 0});

  // Verify: every rank gives rank + 1; the sum is n (n + 1) / 2 everywhere.
  const int n = world.size();
  const float expected = static_cast<float>(n) * static_cast<float>(n + 1) / 2;
  for (const auto& r : rows) {
    r.fill ? r.fill(static_cast<float>(world.rank() + 1))
           : model.fill(static_cast<float>(world.rank() + 1));
    std::fill(contiguous.begin(), contiguous.end(), static_cast<float>(world.rank() + 1));
    r.run();
    unsigned long long wrong =
        r.name == "raw MPI_Allreduce"
            ? static_cast<unsigned long long>(std::count_if(contiguous.begin(), contiguous.end(),
                                                            [&](float x) { return x != expected; }))
        : r.count_not_equal ? r.count_not_equal(expected)
                            : model.count_not_equal(expected);
    cohort::mpi::check(
        MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, raw_comm),
        "MPI_Allreduce (verification)", raw_comm);
    if (wrong != 0) {
      throw std::runtime_error(r.name + ": " + std::to_string(wrong) + " wrong elements");
    }
  }

  std::vector<std::vector<double>> samples(rows.size());
  for (int i = 0; i < iters; ++i) {
    for (std::size_t k = 0; k < rows.size(); ++k) {
      // Written first, as backward writes the gradients before they are reduced.
      rows[k].fill ? rows[k].fill(0.0f) : model.fill(0.0f);
      std::fill(contiguous.begin(), contiguous.end(), 0.0f);
      samples[k].push_back(bench::time_once(raw_comm, rows[k].run));
    }
  }

  if (world.rank() == 0) {
    std::printf("# cohort gradient synchronisation of ResNet-50 (bench/grad_sync.cpp)\n");
    std::printf("# %d ranks; %zu tensors, %zu float32 values (%.1f MB); sum; median of %d runs, "
                "each the slowest rank's time, after one verified run\n",
                n, model.params.size(), elements, static_cast<double>(elements) * 4 / 1e6, iters);
    std::printf("# %-18s %-45s %11s %10s %7s %10s\n", "method", "grouping", "collectives",
                "time(ms)", "vs raw", "vs tensor");
    const double raw = bench::median(samples[0]);
    const double per_tensor = bench::median(samples[1]);
    for (std::size_t k = 0; k < rows.size(); ++k) {
      const double t = bench::median(samples[k]);
      std::printf("  %-18s %-45s %11zu %10.2f %7.2f %10.2f\n", rows[k].name.c_str(),
                  rows[k].layout.c_str(), rows[k].collectives(), t * 1e3, t / raw, t / per_tensor);
    }
  }
  flats.clear(); // (their traces written out)
  shared_models.clear();
  shared_comms.clear();
  std::filesystem::remove_all(trace_dir);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  boost::mpi::environment env(argc, argv);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_grad_sync on rank %d: %s\n", boost::mpi::communicator().rank(),
                 e.what());
    return 1;
  }
}
