// SPDX-License-Identifier: Apache-2.0
// An Eigen matrix of a scalar cohort has no dtype for is refused with a message naming the
// scalars it takes.
#include <cohort/adapters/eigen.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <Eigen/Core>
#include <complex>

int main() {
#ifdef COHORT_COMPILE_FAIL
  Eigen::Matrix<std::complex<float>, 2, 2> m;
#else
  Eigen::Matrix<float, 2, 2> m;
#endif
  return static_cast<int>(cohort::make_view(m).count);
}
