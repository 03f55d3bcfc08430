// SPDX-License-Identifier: Apache-2.0
// cohort::torch::distributed_optimizer over a GPU strategy needs <cohort/adapters/torch/cuda.hpp>
// (cohort's work must follow LibTorch's CUDA stream), and cannot take a run-time mix of host and
// GPU strategies: both are refused at compile time, never left unordered. (Stand-ins for the
// strategies, which need nvcc: what stream_order reads of them is all that matters here.)
#include <cohort/adapters/torch/distributed_optimizer.hpp>

#include <vector>

struct host_strategy {};
struct gpu_strategy {
  static constexpr bool reduces_gpu_memory = true;
};
struct mixed_choice {
  static constexpr bool reduces_gpu_memory = false;
  static constexpr bool may_reduce_gpu_memory = true;
};

int main() {
  std::vector<cohort::torch::parameter> params;
  host_strategy host;
  cohort::torch::stream_order<host_strategy>::follow(host, params);
#ifdef COHORT_COMPILE_FAIL
#ifdef COHORT_MIXED
  mixed_choice mixed;
  cohort::torch::stream_order<mixed_choice>::follow(mixed, params);
#else
  gpu_strategy gpu;
  cohort::torch::stream_order<gpu_strategy>::follow(gpu, params);
#endif
#endif
}
