// SPDX-License-Identifier: Apache-2.0
// allreduce_grad takes a range of parameters (value and gradient), not a range of tensors.
#include <cohort/communicator/flat.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/tensor/std.hpp>

#include <vector>

void sync(cohort::flat& comm, std::vector<std::vector<float>>& grads,
          std::vector<cohort::parameter_ref<std::vector<float>>>& params) {
#ifdef COHORT_COMPILE_FAIL
  comm.allreduce_grad(grads, cohort::mean{});
  (void)params;
#else
  comm.allreduce_grad(params, cohort::mean{});
  (void)grads;
#endif
}

int main() {}
