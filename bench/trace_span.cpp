// SPDX-License-Identifier: Apache-2.0

// What one event of the trace costs, between pieces of real work (a dependent chain of about
// 0.6 µs, as a step's own code leaves the pipeline): to the thread that records it (the loop
// without an event, with a span, with a carried step's event, and with two steady_clock reads or
// two counter reads in its place, interleaved, median of several runs), and to the recorder's own
// thread, which formats and writes them (its CPU time per event: the process's CPU time less the
// recording thread's, less the same difference over the loop without events, which is what the
// MPI library's own threads take meanwhile). On a machine whose cores are all busy with ranks,
// as this VM's two are at 2 ranks, the writer's time is taken from a rank: both count.
//
//   ./bench_trace_span [--runs 7] [--spans 200000]

#include <cohort/trace/span.hpp>
#include <cohort/trace/ticks.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string_view>
#include <utility>
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

double cpu_ns(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

struct timing {
  double wall_ns;       // per iteration, on the recording thread
  double others_cpu_ns; // per iteration, CPU of the process's other threads
};

// Runs `f` n times between pieces of work, then `after` (a recorder's destruction: its writer
// formats and writes what is left), and times both.
template <class F, class After>
timing per_iteration(int n, F&& f, After&& after) {
  const double process0 = cpu_ns(CLOCK_PROCESS_CPUTIME_ID);
  const double thread0 = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    work();
    f(i);
  }
  const double wall =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  const double thread_loop = cpu_ns(CLOCK_THREAD_CPUTIME_ID) - thread0;
  after();
  const double others = (cpu_ns(CLOCK_PROCESS_CPUTIME_ID) - process0) - thread_loop;
  return {wall / n, others / n};
}

template <class F>
timing per_iteration(int n, F&& f) {
  return per_iteration(n, std::forward<F>(f), [] {});
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
  std::vector<double> plain, span, carried, clocks, ticks, plain_others, span_others,
      carried_others;
  for (int r = 0; r < runs; ++r) {
    const timing none = per_iteration(spans, [](int) {});
    plain.push_back(none.wall_ns);
    plain_others.push_back(none.others_cpu_ns);
    {
      std::optional<cohort::trace_recorder> recorder(std::in_place, dir, 0, "flat");
      const timing t = per_iteration(
          spans,
          [&](int i) {
            const cohort::trace_span s(&*recorder, "agreement", cohort::trace_thread::trainer, 4096,
                                       i, "allreduce_grad");
          },
          [&] { recorder.reset(); });
      span.push_back(t.wall_ns);
      span_others.push_back(t.others_cpu_ns);
    }
    {
      std::optional<cohort::trace_recorder> recorder(std::in_place, dir, 0, "flat");
      const timing t = per_iteration(
          spans,
          [&](int) {
            // As grad_sync records a blocking step carried in its agreement: five counter reads.
            const std::uint64_t start = cohort::trace_ticks::now();
            const std::uint64_t packed = cohort::trace_ticks::now();
            const std::uint64_t reduced = cohort::trace_ticks::now();
            recorder->carried_step(start, {start, packed, reduced}, cohort::trace_ticks::now(),
                                   16384);
          },
          [&] { recorder.reset(); });
      carried.push_back(t.wall_ns);
      carried_others.push_back(t.others_cpu_ns);
    }
    clocks.push_back(per_iteration(spans, [](int) {
                       sink =
                           sink + static_cast<double>(
                                      std::chrono::steady_clock::now().time_since_epoch().count() -
                                      std::chrono::steady_clock::now().time_since_epoch().count());
                     }).wall_ns);
    ticks.push_back(per_iteration(spans, [](int) {
                      sink = sink + static_cast<double>(cohort::trace_ticks::now() -
                                                        cohort::trace_ticks::now());
                    }).wall_ns);
  }
  std::filesystem::remove_all(dir);
  const double base = median(plain);
  const double others_base = median(plain_others);
  std::printf("# bench/trace_span: what one event of the trace costs, between %.0f ns of work; "
              "median of %d runs of %d\n",
              base, runs, spans);
  std::printf("# %-38s %16s %16s %10s\n", "per event", "recording (ns)", "writer CPU (ns)",
              "sum (ns)");
  const auto row = [&](const char* name, double wall, double others) {
    std::printf("  %-38s %16.1f %16.1f %10.1f\n", name, wall - base, others - others_base,
                wall - base + others - others_base);
  };
  row("a span (trace_span)", median(span), median(span_others));
  row("a carried step (grad_sync's one event)", median(carried), median(carried_others));
  std::printf("  %-38s %16.1f\n", "two steady_clock reads", median(clocks) - base);
  std::printf("  %-38s %16.1f\n", "two trace_ticks reads", median(ticks) - base);
  MPI_Finalize();
  return 0;
}
