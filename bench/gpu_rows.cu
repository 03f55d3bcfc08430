// SPDX-License-Identifier: Apache-2.0
// The GPU rows of bench/allreduce: the same gradient set in device memory, reduced by pure_nccl
// and host_staged, next to one raw ncclAllReduce of the same bytes in one buffer. Every call is
// complete on the device when its time is taken (the host waits for it), as in the MPI rows.

#include <cohort/nccl.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "gpu_rows.hpp"

namespace bench {
namespace {

struct device_floats {
  float* data = nullptr;
  std::size_t count = 0;
  explicit device_floats(std::size_t n)
      : count(n) {
    cohort::cuda::check(cudaMalloc(&data, std::max<std::size_t>(1, n) * sizeof(float)),
                        "cudaMalloc");
  }
  device_floats(const device_floats&) = delete;
  device_floats& operator=(const device_floats&) = delete;
  ~device_floats() { (void)cudaFree(data); }

  void fill(float x) {
    const std::vector<float> host(count, x);
    cohort::cuda::check(
        cudaMemcpy(data, host.data(), count * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    // Pageable copies may return early: done before kernels on other streams read the buffer.
    cohort::cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::size_t count_not_equal(float x) const {
    std::vector<float> host(count);
    cohort::cuda::check(
        cudaMemcpy(host.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return static_cast<std::size_t>(
        std::count_if(host.begin(), host.end(), [x](float y) { return y != x; }));
  }
};

class rows final : public gpu_rows {
public:
  explicit rows(const boost::mpi::communicator& world)
      : raw_comm_(world)
      , pure_(world)
      , staged_(world) {}

  std::vector<method> prepare(std::size_t elements, std::size_t per_tensor) override {
    contiguous_ = std::make_unique<device_floats>(elements);
    values_.clear();
    grads_.clear();
    spans_.clear();
    params_.clear();
    for (std::size_t begin = 0; begin < elements; begin += per_tensor) {
      const std::size_t n = std::min(per_tensor, elements - begin);
      values_.push_back(std::make_unique<device_floats>(n));
      grads_.push_back(std::make_unique<device_floats>(n));
    }
    spans_.reserve(2 * grads_.size());
    for (std::size_t i = 0; i < grads_.size(); ++i) {
      spans_.emplace_back(values_[i]->data, values_[i]->count);
      spans_.emplace_back(grads_[i]->data, grads_[i]->count);
      params_.push_back({"layer" + std::to_string(i), &spans_[2 * i], &spans_[2 * i + 1]});
    }
    const auto fill_grads = [this](float x) {
      for (auto& g : grads_) {
        g->fill(x);
      }
    };
    const auto check_grads = [this](float x) {
      std::size_t wrong = 0;
      for (const auto& g : grads_) {
        wrong += g->count_not_equal(x);
      }
      return wrong;
    };
    std::vector<method> methods;
    methods.push_back({"gpu raw nccl",
                       [this] {
                         cohort::nccl::allreduce(raw_comm_, contiguous_->data, contiguous_->data,
                                                 contiguous_->count, cohort::dtype::float32,
                                                 cohort::reduce_op::sum, stream_.get());
                         stream_.synchronize();
                       },
                       [this](float x) { contiguous_->fill(x); },
                       [this](float x) { return contiguous_->count_not_equal(x); }});
    methods.push_back({"gpu pure_nccl", [this] { pure_.allreduce_grad(params_, cohort::sum{}); },
                       fill_grads, check_grads});
    methods.push_back({"gpu host_staged",
                       [this] {
                         staged_.allreduce_grad(params_, cohort::sum{});
                         cohort::cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
                       },
                       fill_grads, check_grads});
    return methods;
  }

private:
  cohort::nccl::communicator raw_comm_;
  cohort::cuda::stream stream_;
  cohort::pure_nccl pure_;
  cohort::host_staged staged_;
  std::unique_ptr<device_floats> contiguous_;
  std::vector<std::unique_ptr<device_floats>> values_, grads_;
  std::vector<cohort::device_span<float>> spans_;
  std::vector<cohort::parameter_ref<cohort::device_span<float>>> params_;
};

} // namespace

std::unique_ptr<gpu_rows> gpu_rows::create(const boost::mpi::communicator& world,
                                           std::string& why_not) {
  auto topology = cohort::make_communicator<cohort::naive>(world);
  const int devices = cohort::cuda::device_count();
  int fewest = devices;
  fewest = topology.allreduce_obj(fewest, [](int a, int b) { return std::min(a, b); });
  const int busiest =
      topology.allreduce_obj(topology.intra_size(), [](int a, int b) { return std::max(a, b); });
  if (fewest < busiest) {
    why_not = fewest == 0 ? "no CUDA device visible"
                          : std::to_string(fewest) + " GPU(s) for " + std::to_string(busiest) +
                                " ranks on a node (one each needed)";
    return nullptr;
  }
  cohort::cuda::select_device(topology.intra_rank());
  return std::make_unique<rows>(world);
}

} // namespace bench
