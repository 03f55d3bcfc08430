// SPDX-License-Identifier: Apache-2.0
// allreduce_grad takes a reducer policy: a type whose plan() says how gradients are reduced.
#include <cohort/communicator/flat.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/tensor/std.hpp>

#include <vector>

struct halve {
  double factor = 0.5;
};

void sync(cohort::flat& comm, std::vector<cohort::parameter_ref<std::vector<float>>>& params) {
#ifdef COHORT_COMPILE_FAIL
  comm.allreduce_grad(params, halve{});
#else
  comm.allreduce_grad(params, cohort::mean{});
#endif
}

int main() {}
