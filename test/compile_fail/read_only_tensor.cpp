// SPDX-License-Identifier: Apache-2.0
// A span of const elements can be read (sent), not written (reduced into).
#include <cohort/tensor/std.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <span>
#include <vector>

int main() {
  std::vector<float> storage(4);
#ifdef COHORT_COMPILE_FAIL
  std::span<const float> t(storage);
#else
  std::span<float> t(storage);
#endif
  return static_cast<int>(cohort::make_view(t).count);
}
