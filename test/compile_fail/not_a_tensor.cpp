// SPDX-License-Identifier: Apache-2.0
// A type without tensor_traits is not a tensor.
#include <cohort/tensor/std.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <vector>

struct not_adapted {
  std::vector<float> values;
};

int main() {
#ifdef COHORT_COMPILE_FAIL
  not_adapted t;
#else
  std::vector<float> t;
#endif
  return static_cast<int>(cohort::make_view(t).count);
}
