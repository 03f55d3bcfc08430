// SPDX-License-Identifier: Apache-2.0
// A gradient hook (powersgd) computes on host memory: with a strategy that reduces device memory
// (pure_nccl's kind, here a user's own) it does not compile, naming the host strategies.
#include <cohort/communicator/basic_communicator.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/reducer/powersgd.hpp>
#include <cohort/tensor/std.hpp>

#include <span>
#include <vector>

class device_strategy : public cohort::basic_communicator<device_strategy> {
public:
  static constexpr bool reduces_gpu_memory = true;
  using cohort::basic_communicator<device_strategy>::basic_communicator;

private:
  friend cohort::strategy_access;
  void reduce_gradients(std::span<const cohort::grad_slot>, const cohort::reduction_table&) {}
};

void reduce(device_strategy& comm, std::vector<cohort::parameter_ref<std::vector<float>>>& params) {
#ifdef COHORT_COMPILE_FAIL
  comm.allreduce_grad(params, cohort::powersgd());
#else
  comm.allreduce_grad(params, cohort::mean{});
#endif
}
