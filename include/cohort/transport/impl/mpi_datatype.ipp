// SPDX-License-Identifier: Apache-2.0
#pragma once

// What mpi_datatype.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/transport/mpi_datatype.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace mpi {
namespace detail {

COHORT_DECL const half_handles& halves() {
  static const half_handles handles;
  return handles;
}

} // namespace detail
} // namespace mpi
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
