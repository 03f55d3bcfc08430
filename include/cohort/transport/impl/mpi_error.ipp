// SPDX-License-Identifier: Apache-2.0
#pragma once

// What mpi_error.hpp declares and does not define inline: in every translation unit by default,
// compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/transport/mpi_error.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace mpi {

COHORT_DECL void check(int code, std::string_view operation, MPI_Comm comm) {
  if (code == MPI_SUCCESS) {
    return;
  }
  char message[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, message, &length) != MPI_SUCCESS) {
    length = 0;
  }
  throw engine_error("MPI", std::string(operation), rank_of(comm), code,
                     std::string(message, static_cast<std::size_t>(length)));
}

} // namespace mpi
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
