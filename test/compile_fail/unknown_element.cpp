// SPDX-License-Identifier: Apache-2.0
// A container of an element type cohort has no dtype for is not a tensor.
#include <cohort/tensor/std.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <cstdint>
#include <vector>

int main() {
#ifdef COHORT_COMPILE_FAIL
  std::vector<char> t(3);
#else
  std::vector<std::uint8_t> t(3);
#endif
  return static_cast<int>(cohort::make_view(t).count);
}
