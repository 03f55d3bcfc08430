// SPDX-License-Identifier: Apache-2.0
// What stands between ResNet-50's gradient reduction and 0.8x of one MPI call per tensor on one
// node (issue 14): a probe in raw MPI, not a strategy. For ResNet-50's 161 gradient tensors
// (25.6 M float32, 102 MB) on the ranks of one node, in turn within each repetition:
//
//   per tensor   one MPI_Allreduce(MPI_IN_PLACE) per tensor: the baseline;
//   segments     the tensors packed in one buffer and reduced in MPI_Allreduce calls of 1 MiB,
//                as cohort's flat does (without its packing: a bound for it);
//   window       the tensors living in an MPI-3 shared-memory window: each rank sums its 1/n of
//                the elements straight from every rank's memory into its own, then copies the
//                others' sums into its own (2 S read and S written per rank; no MPI transfer);
//   window+copy  the same with the tensors copied into the window and back, as a library must
//                that does not own the tensors' memory.
//
// A sample is the slowest rank's time; the median of the samples is printed, with each method's
// ratio to `per tensor`. Every method's first step is checked against the exact sum.
//
//   mpicxx -O3 -std=c++20 -DOMPI_SKIP_MPICXX -Iinclude bench/shared_window.cpp -o shared_window
//   mpirun -np 2 ./shared_window [--iters 15]
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "resnet50.hpp"

namespace {

double seconds_max(double t, MPI_Comm comm) {
  double slowest = 0;
  MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
  return slowest;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "shared_window: %s\n", what);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int iters = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--iters") {
      iters = std::atoi(argv[i + 1]);
    }
  }
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_size(node, &size);
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  require(world == size, "run it on one node: the window is shared memory");

  const bench::resnet50 model;
  std::size_t total = 0;
  for (const auto& t : model.tensors) {
    total += t.count;
  }
  const float mine = 0.5f * static_cast<float>(rank + 1); // sums of these are exact
  const float sum = 0.5f * static_cast<float>(size * (size + 1) / 2);

  std::vector<std::vector<float>> tensors;
  for (const auto& t : model.tensors) {
    tensors.emplace_back(t.count, mine);
  }
  std::vector<float> packed(total, mine);

  float* base = nullptr;
  MPI_Win window;
  MPI_Win_allocate_shared(static_cast<MPI_Aint>(total * sizeof(float)), sizeof(float),
                          MPI_INFO_NULL, node, &base, &window);
  std::vector<float*> of(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    MPI_Aint bytes = 0;
    int unit = 0;
    MPI_Win_shared_query(window, r, &bytes, &unit, &of[static_cast<std::size_t>(r)]);
  }
  std::fill(base, base + total, mine);
  MPI_Win_lock_all(MPI_MODE_NOCHECK, window);
  const auto fence = [&] {
    MPI_Win_sync(window);
    MPI_Barrier(node);
    MPI_Win_sync(window);
  };
  const std::size_t begin = total * static_cast<std::size_t>(rank) / static_cast<std::size_t>(size);
  const std::size_t end =
      total * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(size);
  // The reduction inside the window: this rank's slice summed from every rank's memory (in
  // chunks that stay in cache), then the others' slices copied from theirs.
  const auto window_step = [&] {
    fence();
    constexpr std::size_t chunk = 4096;
    for (std::size_t at = begin; at < end; at += chunk) {
      const std::size_t n = std::min(chunk, end - at);
      float* out = base + at;
      for (int r = 0; r < size; ++r) {
        if (r == rank) {
          continue;
        }
        const float* in = of[static_cast<std::size_t>(r)] + at;
        for (std::size_t j = 0; j < n; ++j) {
          out[j] += in[j];
        }
      }
    }
    fence();
    for (int r = 0; r < size; ++r) {
      if (r == rank) {
        continue;
      }
      const std::size_t b = total * static_cast<std::size_t>(r) / static_cast<std::size_t>(size);
      const std::size_t e =
          total * static_cast<std::size_t>(r + 1) / static_cast<std::size_t>(size);
      std::memcpy(base + b, of[static_cast<std::size_t>(r)] + b, (e - b) * sizeof(float));
    }
    fence();
  };

  struct method {
    const char* name;
    std::vector<double> times;
  };
  std::vector<method> methods = {
      {"per tensor", {}}, {"segments", {}}, {"window", {}}, {"window+copy", {}}};
  const auto run = [&](std::size_t m) {
    switch (m) {
    case 0:
      for (auto& t : tensors) {
        MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.size()), MPI_FLOAT, MPI_SUM, node);
      }
      break;
    case 1: {
      constexpr std::size_t segment = (std::size_t{1} << 20) / sizeof(float);
      for (std::size_t at = 0; at < total; at += segment) {
        MPI_Allreduce(MPI_IN_PLACE, packed.data() + at,
                      static_cast<int>(std::min(segment, total - at)), MPI_FLOAT, MPI_SUM, node);
      }
      break;
    }
    case 2:
      window_step();
      break;
    default: {
      std::size_t at = 0;
      for (const auto& t : tensors) {
        std::memcpy(base + at, t.data(), t.size() * sizeof(float));
        at += t.size();
      }
      window_step();
      at = 0;
      for (auto& t : tensors) {
        std::memcpy(t.data(), base + at, t.size() * sizeof(float));
        at += t.size();
      }
    }
    }
  };
  // The first step of each, checked; the window's second method starts from the tensors again.
  for (std::size_t m = 0; m < methods.size(); ++m) {
    if (m == 3) {
      std::fill(base, base + total, 0.0f);
      for (auto& t : tensors) {
        std::fill(t.begin(), t.end(), mine);
      }
    }
    run(m);
    const float* result = m == 0 ? nullptr : m == 1 ? packed.data() : base;
    bool right = true;
    if (m == 0 || m == 3) {
      for (const auto& t : tensors) {
        right = right && std::all_of(t.begin(), t.end(), [&](float x) { return x == sum; });
      }
    } else {
      right = std::all_of(result, result + total, [&](float x) { return x == sum; });
    }
    require(right, "a method's first step is not the exact sum");
  }
  for (int i = 0; i < iters; ++i) {
    for (std::size_t k = 0; k < methods.size(); ++k) {
      const std::size_t m = (k + static_cast<std::size_t>(i)) % methods.size();
      // Values that grow by `size` per step stay far from float's range in --iters steps.
      MPI_Barrier(node);
      const double start = MPI_Wtime();
      run(m);
      methods[m].times.push_back(seconds_max(MPI_Wtime() - start, node));
    }
  }
  if (rank == 0) {
    std::printf("ResNet-50 gradients (%zu tensors, %.1f MB), %d ranks on one node, median of %d\n",
                model.tensors.size(), static_cast<double>(total * sizeof(float)) / 1e6, size,
                iters);
    const double baseline = median(methods[0].times);
    for (const method& m : methods) {
      std::printf("%-12s %9.2f ms  %5.2fx per tensor\n", m.name, median(m.times) * 1e3,
                  median(m.times) / baseline);
    }
  }
  MPI_Win_unlock_all(window);
  MPI_Win_free(&window);
  MPI_Comm_free(&node);
  MPI_Finalize();
  return 0;
}
