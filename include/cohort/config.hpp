// SPDX-License-Identifier: Apache-2.0
#pragma once

// No configure-generated header: everything here is detected from the compiler itself, so the
// installed headers are the same for every consumer.

#include <cohort/version.hpp>

//! Marks code that runs on the host and, when compiled by nvcc, on the device too. The per-element
//! logic of every kernel is written this way so that host tests exercise the same code.
#if defined(__CUDACC__)
#define COHORT_HOST_DEVICE __host__ __device__
#else
#define COHORT_HOST_DEVICE
#endif

//! cohort's versioned inline namespace: two libraries built against different cohort versions
//! never share a symbol.
#define COHORT_ABI_NAMESPACE v0_1

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {}
} // namespace cohort
