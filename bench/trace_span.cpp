// SPDX-License-Identifier: Apache-2.0

// What one span of the trace costs the thread that records it, between pieces of real work (a
// dependent chain of about 1.3 µs, as a step's own code leaves the pipeline): the loop without a
// span, with a span into a recorder, and with two steady_clock reads or two counter reads in its
// place, interleaved, median of several runs. The recorder's own thread formats and writes.
//
//   ./bench_trace_span [--runs 7] [--spans 200000]

#include <cohort/trace/recorder.hpp>
#include <cohort/trace/ticks.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <vector>

namespace {

volatile double sink = 1.0;

void work() {
  double x = sink;
  for (int i = 0; i < 400; ++i) {
    x = x * 1.0000001 + 0.1;
  }
  sink = x;
}

template <class F>
double per_iteration_ns(int n, F&& f) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    work();
    f(i);
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
             .count() /
         n;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv); // (the recorder's end-of-job hook belongs to an MPI program)
  int runs = 7;
  int spans = 200000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--runs") {
      runs = std::max(1, std::atoi(argv[i + 1]));
    } else if (flag == "--spans") {
      spans = std::max(1000, std::atoi(argv[i + 1]));
    }
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "cohort-bench-trace-span";
  std::vector<double> plain, span, clocks, ticks;
  {
    cohort::trace_recorder recorder(dir, 0, "flat");
    for (int r = 0; r < runs; ++r) {
      plain.push_back(per_iteration_ns(spans, [](int) {}));
      span.push_back(per_iteration_ns(spans, [&](int i) {
        const cohort::trace_span s(&recorder, "agreement", cohort::trace_thread::trainer, 4096, i,
                                   "allreduce_grad");
      }));
      clocks.push_back(per_iteration_ns(spans, [](int) {
        sink =
            sink + static_cast<double>(std::chrono::steady_clock::now().time_since_epoch().count() -
                                       std::chrono::steady_clock::now().time_since_epoch().count());
      }));
      ticks.push_back(per_iteration_ns(spans, [](int) {
        sink = sink + static_cast<double>(cohort::trace_ticks::now() - cohort::trace_ticks::now());
      }));
    }
  }
  std::filesystem::remove_all(dir);
  const double base = median(plain);
  std::printf("# bench/trace_span: the cost of one span to the recording thread, between %.0f ns "
              "of work; median of %d runs of %d\n",
              base, runs, spans);
  std::printf("# %-34s %12s\n", "per iteration, over the work alone", "ns");
  std::printf("  %-34s %12.1f\n", "a span into a recorder", median(span) - base);
  std::printf("  %-34s %12.1f\n", "two steady_clock reads", median(clocks) - base);
  std::printf("  %-34s %12.1f\n", "two trace_ticks reads", median(ticks) - base);
  MPI_Finalize();
  return 0;
}
