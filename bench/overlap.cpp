// SPDX-License-Identifier: Apache-2.0

// A training step of ResNet-50's gradients with a configurable backward time, and the real
// reduction (flat, default buckets): how close overlap brings the step to max(compute,
// reduction) rather than their sum.
//
// Backward is simulated: the 161 gradients are written in reverse registration order (as
// backward produces them), each followed by an equal share of --compute-ms spent asleep, as a CPU
// thread is while its GPU computes. Rows, for each compute time:
//   compute only      backward, no reduction
//   reduction only    one blocking allreduce_grad of the written gradients
//   sequential        backward, then the blocking allreduce_grad (a step without overlap)
//   overlap           backward calling distributed_optimizer::grad_ready(i) after each
//                     gradient, then step(), which waits for what is left
//   double buffering  backward, then step() with double_buffering (reduces this step's
//                     gradients while the next step computes; updates one step stale)
// Each sample is the slowest rank's time; the median of --iters is reported, after one untimed
// round. The overlapped
// result is verified before timing.
//
//   mpirun -np 2 ./bench_overlap [--compute-ms 20,50,100] [--iters 7]

#include <cohort/cohort.hpp>

#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "resnet50.hpp"
#include "timing.hpp"

namespace {

// The inner optimizer: the step's update itself is not what is measured.
struct no_update {
  void step() {}
};

std::vector<double> parse_list(std::string_view text) {
  std::vector<double> values;
  std::stringstream stream{std::string(text)};
  for (std::string item; std::getline(stream, item, ',');) {
    values.push_back(std::stod(item));
  }
  return values;
}

int run(int argc, char** argv) {
  const boost::mpi::communicator world;
  std::vector<double> compute_ms = {20, 50, 100};
  int iters = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--compute-ms" && i + 1 < argc) {
      compute_ms = parse_list(argv[++i]);
    } else if (flag == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (flag == "--quick") {
      compute_ms = {10};
      iters = 2;
    } else {
      if (world.rank() == 0) {
        std::fprintf(stderr, "usage: bench_overlap [--compute-ms A,B,...] [--iters N] [--quick]\n");
      }
      return 2;
    }
  }

  bench::gradient_set model = bench::resnet50_gradients();
  const std::size_t tensors = model.params.size();
  cohort::flat comm(world);
  cohort::distributed_optimizer<no_update, cohort::flat, cohort::sum> overlapped{no_update{}, comm,
                                                                                 model.params};
  cohort::flat buffered_comm(world);
  cohort::distributed_optimizer<no_update, cohort::flat, cohort::sum> buffered{
      no_update{}, buffered_comm, model.params, {.double_buffering = true}};
  const MPI_Comm timing = world;

  const auto backward = [&](double ms, auto&& hook) {
    const auto share = std::chrono::duration<double, std::milli>(ms / static_cast<double>(tensors));
    for (std::size_t i = tensors; i-- > 0;) {
      std::fill(model.grads[i].begin(), model.grads[i].end(), 1.0f);
      std::this_thread::sleep_for(share);
      hook(i);
    }
  };
  const auto no_hook = [](std::size_t) {};

  // Verify the overlapped step: every rank writes rank + 1, the sum is n (n + 1) / 2.
  {
    const int n = world.size();
    for (std::size_t i = tensors; i-- > 0;) {
      std::fill(model.grads[i].begin(), model.grads[i].end(), static_cast<float>(world.rank() + 1));
      overlapped.grad_ready(i);
    }
    overlapped.step();
    unsigned long long wrong =
        model.count_not_equal(static_cast<float>(n) * static_cast<float>(n + 1) / 2);
    cohort::mpi::check(
        MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, timing),
        "MPI_Allreduce (verification)", timing);
    if (wrong != 0) {
      throw std::runtime_error("overlap: " + std::to_string(wrong) + " wrong elements");
    }
  }

  if (world.rank() == 0) {
    std::printf("# cohort overlap of ResNet-50's gradient reduction with backward "
                "(bench/overlap.cpp)\n");
    std::printf("# %d ranks; flat, default buckets; %zu tensors, %.1f MB; backward simulated: "
                "gradients written in reverse order, each followed by an equal share of the "
                "compute time asleep\n",
                world.size(), tensors, static_cast<double>(model.elements()) * 4 / 1e6);
    std::printf("# median of %d runs, each the slowest rank's time; ideal = max(compute, "
                "reduction), sum = compute + reduction\n",
                iters);
    std::printf("# %10s %-18s %10s %9s %9s\n", "compute", "method", "time(ms)", "vs ideal",
                "vs sum");
  }
  for (const double ms : compute_ms) {
    const char* names[] = {"compute only", "reduction only", "sequential", "overlap",
                           "double buffering"};
    std::vector<std::vector<double>> samples(5);
    // One untimed round first: each method's first step touches its buffers for the first time.
    for (int i = -1; i < iters; ++i) {
      samples[0].push_back(bench::time_once(timing, [&] { backward(ms, no_hook); }));
      samples[1].push_back(
          bench::time_once(timing, [&] { comm.allreduce_grad(model.params, cohort::sum{}); }));
      samples[2].push_back(bench::time_once(timing, [&] {
        backward(ms, no_hook);
        comm.allreduce_grad(model.params, cohort::sum{});
      }));
      samples[3].push_back(bench::time_once(timing, [&] {
        backward(ms, [&](std::size_t t) { overlapped.grad_ready(t); });
        overlapped.step();
      }));
    }
    // Double buffering leaves a reduction in flight from step to step, which would slow whatever
    // ran next: its steps run on their own, back to back as in training, and the last reduction
    // is applied before the next compute time.
    for (int i = -1; i < iters; ++i) {
      samples[4].push_back(bench::time_once(timing, [&] {
        backward(ms, no_hook);
        buffered.step();
      }));
    }
    buffered.finish();
    for (auto& s : samples) {
      s.erase(s.begin());
    }
    if (world.rank() == 0) {
      const double compute = bench::median(samples[0]);
      const double reduction = bench::median(samples[1]);
      const double ideal = std::max(compute, reduction);
      for (std::size_t k = 0; k < samples.size(); ++k) {
        const double t = bench::median(samples[k]);
        std::printf("  %8.0fms %-18s %10.2f %9.2f %9.2f\n", ms, names[k], t * 1e3, t / ideal,
                    t / (compute + reduction));
      }
    }
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  boost::mpi::environment env(argc, argv, boost::mpi::threading::multiple);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_overlap on rank %d: %s\n", boost::mpi::communicator().rank(),
                 e.what());
    return 1;
  }
}
