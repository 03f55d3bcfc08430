// SPDX-License-Identifier: Apache-2.0
#pragma once

// What host.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/kernels/host.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace kernels {
namespace host {
namespace detail {

COHORT_DECL void scale_cast_n(const void* src, dtype from, void* dst, dtype to, std::size_t count,
                              double factor) {
  if (count == 0) {
    return;
  }
  if (from == to && factor == 1.0) {
    if (src != dst) {
      std::memmove(dst, src, count * size_of(from));
    }
    return;
  }
  visit(from, [&]<class From>(std::type_identity<From>) {
    visit(to, [&]<class To>(std::type_identity<To>) {
      const scale_cast<From, To> f{static_cast<typename scale_cast<From, To>::compute>(factor)};
      const auto* in = static_cast<const From*>(src);
      auto* out = static_cast<To*>(dst);
      for (std::size_t i = 0; i < count; ++i) {
        out[i] = f(in[i]);
      }
    });
  });
}

} // namespace detail
} // namespace host
} // namespace kernels
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
