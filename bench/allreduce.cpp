// SPDX-License-Identifier: Apache-2.0

// Gradient all-reduce bandwidth of cohort's naive and flat strategies against one raw
// MPI_Allreduce of the same bytes, in the layout of nccl-tests' all_reduce_perf, so that the
// numbers read like the ones people already know.
//
// For each size S the ranks build a gradient set of float32 tensors of S bytes in all, each at
// most --tensor-bytes (1 MiB by default: a model has many tensors, so naive pays one all-reduce
// per tensor as it would in training). naive and flat reduce the same gradient set, raw one
// contiguous buffer of the same size, and the methods take turns within each repetition, so that
// a noisy neighbour or a change of CPU clock hits them all alike. A sample is the time of the
// slowest rank (a step waits for it); the median of the samples is reported, because on a shared
// machine the mean follows the outliers.
//
//   mpirun -np 4 ./bench_allreduce [--min-bytes 4K] [--max-bytes 256M] [--iters 20] ...
//
// Before it is timed, each method reduces known values once and the result is checked on every
// rank: a benchmark that measures a wrong answer measures nothing.

#include <cohort/algorithm/ring.hpp>
#include <cohort/cohort.hpp>

#include "gradient_set.hpp"
#include "method.hpp"
#include "timing.hpp"
#if defined(COHORT_BENCH_GPU)
#include "gpu_rows.hpp"
#endif

#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>
#include <mpi.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace {

constexpr std::size_t kib = std::size_t{1} << 10;
constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t gib = std::size_t{1} << 30;

struct settings {
  std::size_t min_bytes = 4 * kib;
  std::size_t max_bytes = 256 * mib;
  std::size_t tensor_bytes = 1 * mib;
  std::size_t bucket_bytes = cohort::communicator_options{}.bucket_bytes;
  std::size_t fusion_threshold = cohort::communicator_options{}.fusion_threshold_bytes;
  // Small sizes are cheap, and on a shared or oversubscribed machine their times are bimodal
  // (a rank descheduled or not), so their median needs more than a handful of samples. From
  // `large_bytes` up one call takes long enough (0.03-0.5 s at 2-4 ranks on 2 cores) for fewer
  // to do, and the full sweep stays near a minute. 0: min(iters, 10).
  int iters = 20;
  std::size_t large_bytes = 64 * mib;
  int large_iters = 0;
  int warmup = 1;
  bool unchecked_rows = true;
  std::vector<std::string> only; // the rows to run (empty: all)
  std::size_t ring_window = 2;
  bool help = false;
};

constexpr const char* usage =
    "usage: bench_allreduce [options]\n"
    "  --min-bytes B     smallest size, in bytes (suffix K, M or G: powers of 1024; default 4K)\n"
    "  --max-bytes B     largest size (default 256M); sizes double from min to max\n"
    "  --tensor-bytes B  largest tensor of the gradient set (default 1M)\n"
    "  --bucket-bytes B  the bucket size of flat, hierarchical, two_dimensional (default 4M)\n"
    "  --fusion-threshold B  flat reduces tensors of B bytes or more in place (default 64K)\n"
    "  --iters N         timed repetitions per size, median reported (default 20)\n"
    "  --large-iters N   timed repetitions from --large-bytes up (default 10, at most --iters)\n"
    "  --large-bytes B   where --large-iters starts (default 64M)\n"
    "  --warmup N        untimed repetitions per size before timing (default 1)\n"
    "  --checked-only    leave out the rows with the agreement check off\n"
    "  --only ROWS       only these rows (comma-separated: raw,flat,hierarchical)\n"
    "  --ring-window N   chunks in flight each way in the row ring/window (default 2)\n"
    "  --quick           4K to 1M, 3 repetitions: a smoke run\n"
    "  --help            this text\n";

// "4096", "4K", "4KiB", "256M", "1G": binary multiples, as sizes of buffers are.
std::size_t parse_bytes(std::string_view flag, std::string_view text) {
  std::size_t value = 0;
  const auto [rest, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  std::string_view suffix(rest, static_cast<std::size_t>(text.data() + text.size() - rest));
  std::size_t unit = 1;
  if (!suffix.empty()) {
    switch (suffix.front()) {
    case 'K':
    case 'k':
      unit = kib;
      break;
    case 'M':
    case 'm':
      unit = mib;
      break;
    case 'G':
    case 'g':
      unit = gib;
      break;
    default:
      unit = 0;
      break;
    }
    suffix.remove_prefix(1);
    if (suffix == "iB" || suffix == "B") {
      suffix = {};
    }
  }
  if (error != std::errc{} || unit == 0 || !suffix.empty() || value > SIZE_MAX / unit) {
    throw std::invalid_argument(std::string(flag) + ": '" + std::string(text) +
                                "' is not a size in bytes");
  }
  return value * unit;
}

int parse_count(std::string_view flag, std::string_view text, int minimum) {
  int value = 0;
  const auto [rest, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || rest != text.data() + text.size() || value < minimum) {
    throw std::invalid_argument(std::string(flag) + ": '" + std::string(text) +
                                "' is not a whole number >= " + std::to_string(minimum));
  }
  return value;
}

// Every rank parses the same command line, so every rank reaches the same verdict.
settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    const auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) {
        throw std::invalid_argument(std::string(flag) + " needs a value");
      }
      return argv[++i];
    };
    if (flag == "--min-bytes") {
      s.min_bytes = parse_bytes(flag, value());
    } else if (flag == "--max-bytes") {
      s.max_bytes = parse_bytes(flag, value());
    } else if (flag == "--tensor-bytes") {
      s.tensor_bytes = parse_bytes(flag, value());
    } else if (flag == "--bucket-bytes") {
      s.bucket_bytes = parse_bytes(flag, value());
    } else if (flag == "--fusion-threshold") {
      s.fusion_threshold = parse_bytes(flag, value());
    } else if (flag == "--iters") {
      s.iters = parse_count(flag, value(), 1);
    } else if (flag == "--large-iters") {
      s.large_iters = parse_count(flag, value(), 1);
    } else if (flag == "--large-bytes") {
      s.large_bytes = parse_bytes(flag, value());
    } else if (flag == "--warmup") {
      s.warmup = parse_count(flag, value(), 0);
    } else if (flag == "--ring-window") {
      s.ring_window = static_cast<std::size_t>(parse_count(flag, value(), 0));
    } else if (flag == "--checked-only") {
      s.unchecked_rows = false;
    } else if (flag == "--only") {
      // (comma-separated row names: a run with another MPI setting needs only its raw row)
      const std::string_view list = value();
      for (std::size_t start = 0; start <= list.size();) {
        const std::size_t comma = std::min(list.find(',', start), list.size());
        s.only.emplace_back(list.substr(start, comma - start));
        start = comma + 1;
      }
    } else if (flag == "--quick") {
      s.min_bytes = 4 * kib;
      s.max_bytes = 1 * mib;
      s.iters = 3;
    } else if (flag == "--help" || flag == "-h") {
      s.help = true;
    } else {
      throw std::invalid_argument("unknown option '" + std::string(flag) + "'");
    }
  }
  if (s.min_bytes < sizeof(float) || s.tensor_bytes < sizeof(float)) {
    throw std::invalid_argument("--min-bytes and --tensor-bytes must be at least 4 (one float)");
  }
  if (s.max_bytes < s.min_bytes) {
    throw std::invalid_argument("--max-bytes is smaller than --min-bytes");
  }
  // The raw row is one MPI call, whose count is an int.
  if (s.max_bytes / sizeof(float) > static_cast<std::size_t>(INT_MAX)) {
    throw std::invalid_argument("--max-bytes is above what one MPI_Allreduce of floats can take");
  }
  if (s.large_iters == 0) {
    s.large_iters = std::min(s.iters, 10);
  }
  return s;
}

using bench::gradient_set;
using bench::method;

using bench::median;

// Reduces rank + 1 from every rank once and checks for 1 + 2 + ... + n everywhere (exact in
// float for any rank count this runs at). Then zeroes the buffers for timing, so that repeated
// sums neither grow to infinity nor change what is being timed.
void verify(MPI_Comm comm, const method& m, int rank, int ranks, std::size_t bytes) {
  m.fill(static_cast<float>(rank + 1));
  m.run();
  const float expected = static_cast<float>(ranks) * static_cast<float>(ranks + 1) / 2;
  unsigned long long wrong = m.count_not_equal(expected);
  cohort::mpi::check(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm),
                     "MPI_Allreduce (verification)", comm);
  if (wrong != 0) {
    throw std::runtime_error(std::string(m.name) + " at " + std::to_string(bytes) +
                             " bytes: " + std::to_string(wrong) +
                             " elements over all ranks are not " + std::to_string(expected));
  }
  m.fill(0.0f);
}

std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string line(text, static_cast<std::size_t>(length));
  return line.substr(0, line.find_first_of(",\n"));
}

void print_header(const settings& s, int ranks, int nodes, const std::string& gpu_line) {
  std::printf("# cohort %d.%d.%d all-reduce benchmark (bench/allreduce.cpp); %s\n",
              COHORT_VERSION_MAJOR, COHORT_VERSION_MINOR, COHORT_VERSION_PATCH,
              mpi_library().c_str());
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__OPTIMIZE__)
  std::printf("# WARNING: built without optimization: the packing in flat is timed at -O0\n");
#endif
  std::printf("# ranks: %d on %d node(s); float32, sum, in place\n", ranks, nodes);
  std::printf("# sizes: %zu to %zu bytes; each point the median of %d timed runs", s.min_bytes,
              s.max_bytes, s.iters);
  if (s.large_iters != s.iters && s.large_bytes <= s.max_bytes) {
    std::printf(" (%d from %zu bytes up)", s.large_iters, s.large_bytes);
  }
  std::printf(", after %d warmup run(s) and one verified run\n", s.warmup);
  std::printf("# time: of the slowest rank, all ranks starting after a barrier\n");
  std::printf("# naive, flat: allreduce_grad(params, cohort::sum{}) over float32 tensors of at "
              "most %zu bytes each\n",
              s.tensor_bytes);
  std::printf(
      "#   (naive: one MPI_Allreduce per tensor; flat: tensors under %zu bytes packed into "
      "buckets of %zu bytes, one MPI_Allreduce per bucket, unpacked; larger ones reduced in "
      "place)\n",
      s.fusion_threshold, s.bucket_bytes);
  std::printf("# hierarchical, two_dimensional: the same buckets, reduced in two levels over the "
              "nodes above (set COHORT_RANKS_PER_NODE to simulate several nodes on one machine)\n");
  std::printf("# raw: one MPI_Allreduce(MPI_IN_PLACE) over one contiguous buffer of the same "
              "bytes; ring: cohort's ring all-reduce (algorithm/ring.hpp, 1 MiB chunks, all of "
              "a step posted at once) on it, ring/window: the same with %zu chunks in flight; "
              "tensor: flat.allreduce(buffer), in segments of %zu bytes\n",
              s.ring_window, cohort::communicator_options{}.segment_bytes);
  std::printf("# agreement check: on for naive, flat and tensor%s\n",
              s.unchecked_rows ? "; off for naive/nocheck, flat/nocheck and tensor/nocheck" : "");
  std::printf("# timeout: 10 min (the default: watched by the watchdog) everywhere but "
              "flat/notimeout (0: nothing watched)\n");
  std::printf("# trace: off everywhere but flat/traced (COHORT_TRACE: each rank writes its "
              "spans to a file) and flat/paused (the same communicator, its trace paused: what "
              "flat/traced costs is flat/traced over flat/paused)\n");
  std::printf("%s\n", gpu_line.c_str());
  std::printf("# algbw = bytes / time; busbw = algbw * 2(n-1)/n (0 at one rank), as in "
              "nccl-tests; GB = 1e9 bytes; vs raw = time / raw time (gpu rows: / gpu raw nccl)\n");
  std::printf("#\n");
  std::printf("# %11s %11s %8s %15s %12s %12s %12s %7s\n", "bytes", "elements", "tensors", "method",
              "time(us)", "algbw(GB/s)", "busbw(GB/s)", "vs raw");
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  const boost::mpi::communicator world;
  const int rank = world.rank();
  const int ranks = world.size();

  settings s;
  try {
    s = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    if (rank == 0) {
      std::fprintf(stderr, "bench_allreduce: %s\n%s", e.what(), usage);
    }
    return 2;
  }
  if (s.help) {
    if (rank == 0) {
      std::fputs(usage, stdout);
    }
    return 0;
  }

  const cohort::communicator_options checked{.bucket_bytes = s.bucket_bytes,
                                             .fusion_threshold_bytes = s.fusion_threshold};
  const cohort::communicator_options unchecked{.check_agreement = false,
                                               .bucket_bytes = s.bucket_bytes,
                                               .fusion_threshold_bytes = s.fusion_threshold};
  cohort::naive naive(world, checked);
  cohort::flat flat(world, checked);
  cohort::hierarchical<> hierarchical(world, checked);
  // two_dimensional needs nodes of one size; where they differ, its row is left out.
  std::optional<cohort::two_dimensional<>> two_dimensional;
  try {
    two_dimensional.emplace(world, checked);
  } catch (const cohort::invalid_argument&) {
  }
  cohort::naive naive_unchecked(world, unchecked);
  cohort::flat flat_unchecked(world, unchecked);
  // The price of the timeout (docs/failure.md): the same as flat with nothing watched.
  cohort::communicator_options untimed = checked;
  untimed.timeout = std::chrono::milliseconds(0);
  untimed.stall_warning = std::chrono::milliseconds(0); // nothing watched at all
  cohort::flat flat_untimed(world, untimed);
  // The price of the trace (COHORT_TRACE): the same as flat, each rank writing its spans.
  cohort::communicator_options traced = checked;
  const std::filesystem::path trace_dir =
      std::filesystem::temp_directory_path() /
      ("cohort-bench-allreduce-trace-" + std::to_string(world.rank()));
  traced.trace_directory = trace_dir.string();
  std::optional<cohort::flat> flat_traced(std::in_place, world, traced);
  // The raw calls go to a communicator of the same kind as cohort's (a duplicate of world), so
  // that MPI picks its algorithm under the same conditions; the bookkeeping stays on world.
  const MPI_Comm raw_comm = naive.mpi_comm();
  const MPI_Comm ring_comm = flat.mpi_comm();
  cohort::algorithm::ring_workspace ring_workspace;
  const MPI_Comm bookkeeping = world;

  // GPU rows where this binary was built with them and every rank has a GPU of its own.
  std::string gpu_line = "# gpu rows: none (built without CUDA and NCCL)";
#if defined(COHORT_BENCH_GPU)
  std::string no_gpu_rows;
  const auto gpu = bench::gpu_rows::create(world, no_gpu_rows);
  gpu_line = gpu ? "# gpu: pure_nccl and host_staged allreduce_grad over the same tensors in "
                   "device memory; gpu raw nccl: one ncclAllReduce of one buffer; each waited for"
                 : "# gpu rows: none (" + no_gpu_rows + ")";
#endif
  if (rank == 0) {
    print_header(s, ranks, naive.inter_size(), gpu_line);
  }
  const double busbw_factor = 2.0 * (ranks - 1) / ranks;
  const auto wall_start = std::chrono::steady_clock::now();

  for (std::size_t bytes = s.min_bytes; bytes <= s.max_bytes;
       bytes = bytes > s.max_bytes / 2 ? s.max_bytes + 1 : bytes * 2) {
    const std::size_t elements = bytes / sizeof(float);
    std::vector<float> contiguous(elements, 0.0f);
    auto grads =
        gradient_set::uniform(elements, std::max<std::size_t>(1, s.tensor_bytes / sizeof(float)));

    const auto fill_raw = [&](float x) { std::fill(contiguous.begin(), contiguous.end(), x); };
    const auto check_raw = [&](float x) {
      return static_cast<std::size_t>(
          std::count_if(contiguous.begin(), contiguous.end(), [x](float y) { return y != x; }));
    };
    const auto fill_grads = [&](float x) { grads.fill(x); };
    const auto check_grads = [&](float x) { return grads.count_not_equal(x); };
    const int count = static_cast<int>(elements);

    std::vector<method> methods;
    methods.push_back({"raw",
                       [&] {
                         cohort::mpi::check(MPI_Allreduce(MPI_IN_PLACE, contiguous.data(), count,
                                                          MPI_FLOAT, MPI_SUM, raw_comm),
                                            "MPI_Allreduce (raw)", raw_comm);
                       },
                       fill_raw, check_raw});
    // The ring of algorithm/ring.hpp on the same contiguous buffer, on a communicator of its own:
    // with its defaults (every chunk of a step posted at once), and with a bounded window.
    for (const auto& row : {std::pair<const char*, std::size_t>{"ring", 0},
                            std::pair<const char*, std::size_t>{"ring/window", s.ring_window}}) {
      const std::size_t window = row.second;
      methods.push_back({row.first,
                         [&, window] {
                           cohort::algorithm::ring_allreduce(
                               ring_comm,
                               {contiguous.data(), elements, cohort::dtype::float32,
                                cohort::memory_location::host},
                               cohort::reduce_op::sum, {.window = window}, ring_workspace);
                         },
                         fill_raw, check_raw});
    }
    // The same contiguous buffer through the communicator's tensor all-reduce (checked, in
    // segments of communicator_options::segment_bytes).
    methods.push_back({"tensor", [&] { flat.allreduce(contiguous); }, fill_raw, check_raw});
    if (s.unchecked_rows) {
      methods.push_back(
          {"tensor/nocheck", [&] { flat_unchecked.allreduce(contiguous); }, fill_raw, check_raw});
    }
    methods.push_back({"naive", [&] { naive.allreduce_grad(grads.params, cohort::sum{}); },
                       fill_grads, check_grads});
    if (s.unchecked_rows) {
      methods.push_back({"naive/nocheck",
                         [&] { naive_unchecked.allreduce_grad(grads.params, cohort::sum{}); },
                         fill_grads, check_grads});
    }
    methods.push_back({"flat", [&] { flat.allreduce_grad(grads.params, cohort::sum{}); },
                       fill_grads, check_grads});
    if (s.unchecked_rows) {
      methods.push_back({"flat/nocheck",
                         [&] { flat_unchecked.allreduce_grad(grads.params, cohort::sum{}); },
                         fill_grads, check_grads});
    }
    methods.push_back({"flat/paused",
                       [&] {
                         flat_traced->pause_trace();
                         flat_traced->allreduce_grad(grads.params, cohort::sum{});
                       },
                       fill_grads, check_grads});
    methods.push_back({"flat/traced",
                       [&] {
                         flat_traced->resume_trace();
                         flat_traced->allreduce_grad(grads.params, cohort::sum{});
                       },
                       fill_grads, check_grads});
    methods.push_back({"flat/notimeout",
                       [&] { flat_untimed.allreduce_grad(grads.params, cohort::sum{}); },
                       fill_grads, check_grads});
    methods.push_back({"hierarchical",
                       [&] { hierarchical.allreduce_grad(grads.params, cohort::sum{}); },
                       fill_grads, check_grads});
    if (two_dimensional) {
      methods.push_back({"two_dimensional",
                         [&] { two_dimensional->allreduce_grad(grads.params, cohort::sum{}); },
                         fill_grads, check_grads});
    }

    if (!s.only.empty()) {
      std::erase_if(methods, [&](const method& m) {
        return std::find(s.only.begin(), s.only.end(), m.name) == s.only.end();
      });
    }
#if defined(COHORT_BENCH_GPU)
    if (gpu) {
      for (auto& m :
           gpu->prepare(elements, std::max<std::size_t>(1, s.tensor_bytes / sizeof(float)))) {
        methods.push_back(std::move(m));
      }
    }
#endif
    for (const auto& m : methods) {
      verify(bookkeeping, m, rank, ranks, bytes);
    }
    for (int w = 0; w < s.warmup; ++w) {
      for (const auto& m : methods) {
        m.run();
      }
    }
    const int iters = bytes >= s.large_bytes ? s.large_iters : s.iters;
    std::vector<std::vector<double>> samples(methods.size());
    for (int i = 0; i < iters; ++i) {
      for (std::size_t k = 0; k < methods.size(); ++k) {
        // Write the buffers first, as a backward pass writes the gradients before they are
        // reduced: otherwise the methods sharing the gradient set find it in cache, left there by
        // the one before, and raw, alone on its buffer, does not.
        methods[k].fill(0.0f);
        samples[k].push_back(bench::time_once(bookkeeping, methods[k].run));
      }
    }

    if (rank == 0) {
      // Host rows compare with the raw MPI_Allreduce, GPU rows with the raw ncclAllReduce.
      const double raw_time = median(samples.front());
      double gpu_raw_time = raw_time;
      for (std::size_t k = 0; k < methods.size(); ++k) {
        if (methods[k].name == "gpu raw nccl") {
          gpu_raw_time = median(samples[k]);
        }
      }
      for (std::size_t k = 0; k < methods.size(); ++k) {
        const double time = median(samples[k]);
        const double algbw = static_cast<double>(bytes) / time / 1e9;
        const std::string& name = methods[k].name;
        std::printf("  %11zu %11zu %8zu %15.*s %12.2f %12.3f %12.3f %7.2f\n", bytes, elements,
                    grads.params.size(), static_cast<int>(name.size()), name.data(), time * 1e6,
                    algbw, algbw * busbw_factor,
                    time / (name.starts_with("gpu") ? gpu_raw_time : raw_time));
      }
      std::fflush(stdout);
    }
  }

  if (rank == 0) {
    const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - wall_start;
    std::printf("# all results verified; wall time %.2f s\n", wall.count());
  }
  flat_traced.reset(); // (its trace written out)
  std::filesystem::remove_all(trace_dir);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  const boost::mpi::environment env(argc, argv);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    // Other ranks may be waiting in a collective this rank will never join: end them all.
    std::fprintf(stderr, "bench_allreduce on rank %d: %s\n", boost::mpi::communicator().rank(),
                 e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
