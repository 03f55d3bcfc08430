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

// cohort speaks MPI's C API: the deprecated C++ bindings that <mpi.h> would otherwise pull in
// cost every translation unit a fifth of a second (Boost.MPI skips them too).
// Defined as Boost.MPI defines them, so that its definitions repeat cohort's exactly.
#if !defined(OMPI_SKIP_MPICXX)
#define OMPI_SKIP_MPICXX
#endif
#if !defined(MPICH_SKIP_MPICXX)
#define MPICH_SKIP_MPICXX 1
#endif

//! Where the non-template engine (gradient sync, checks, liveness) is compiled. By default in
//! every translation unit that uses it, as `inline` functions: header-only, nothing to build.
//! With COHORT_SEPARATE_COMPILATION defined in every translation unit of the program, once, in
//! the one that includes <cohort/src.hpp> (Boost.Asio's BOOST_ASIO_SEPARATE_COMPILATION): the
//! others only declare it, which makes each of them several times cheaper to compile.
#if defined(COHORT_SEPARATE_COMPILATION)
#define COHORT_DECL
#else
#define COHORT_DECL inline
#endif

//! cohort's versioned inline namespace: two libraries built against different cohort versions
//! never share a symbol.
#define COHORT_ABI_NAMESPACE v0_1

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {}
} // namespace cohort
