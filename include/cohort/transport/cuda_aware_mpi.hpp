// SPDX-License-Identifier: Apache-2.0
#pragma once

// Whether the MPI library can read and write GPU memory itself (what cuda_aware_flat needs).

#include <cohort/config.hpp>

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h> // Open MPI's MPIX_Query_cuda_support
#endif

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Whether the MPI library says it can read and write GPU memory: true or false where it can
//! tell (Open MPI), true where it cannot (the user's choice of this strategy is then trusted).
inline bool mpi_is_cuda_aware() noexcept {
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  return MPIX_Query_cuda_support() == 1;
#else
  return true;
#endif
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
