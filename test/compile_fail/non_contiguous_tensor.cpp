// SPDX-License-Identifier: Apache-2.0
// A tensor type whose traits say it is never contiguous is rejected at compile time.
#include <cohort/tensor/location.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/tensor/traits.hpp>

#include <cstddef>

struct strided {
  float values[8];
};

template <>
struct cohort::tensor_traits<strided> {
#ifdef COHORT_COMPILE_FAIL
  static constexpr bool contiguous = false;
#else
  static constexpr bool contiguous = true;
#endif
  static constexpr memory_location location = memory_location::host;
  static float* data(strided& s) {
    return s.values;
  }
  static const float* data(const strided& s) {
    return s.values;
  }
  static std::size_t size(const strided&) {
    return 4;
  }
};

int main() {
  strided t{};
  return static_cast<int>(cohort::make_view(t).count);
}
