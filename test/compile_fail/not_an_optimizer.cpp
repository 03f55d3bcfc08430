// SPDX-License-Identifier: Apache-2.0
// distributed_optimizer wraps anything with step(), and nothing else.
#include <cohort/communicator/flat.hpp>
#include <cohort/training/distributed_optimizer.hpp>

struct sgd {
#ifdef COHORT_COMPILE_FAIL
  void update() {}
#else
  void step() {}
#endif
};

using wrapped = cohort::distributed_optimizer<sgd, cohort::flat>;

int main() {
  return sizeof(wrapped) == 0;
}
