// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The customization point through which cohort sees a tensor type. The primary template is
//! declared and not defined: a type is a tensor only where a specialization says so, and
//! users adapt their own types by specializing it in namespace `cohort`, never by editing cohort.
//!
//! A specialization `tensor_traits<T>` provides:
//! - `static E* data(T&)` and `static const E* data(const T&)`: the first element, where `E` is
//!   an `element` (float, double, float16, bfloat16, int32_t, int64_t, uint8_t); the dtype then
//!   follows at compile time. A type whose element type is only known at run time returns
//!   `void*` / `const void*` and also provides `static cohort::dtype dtype_of(const T&)`.
//! - `static std::size_t size(const T&)`: the number of elements.
//! - where it lives: `static constexpr memory_location location` when the type knows it,
//!   otherwise `static memory_location location_of(const T&)`.
//! - optionally, `static constexpr bool contiguous = false` for a type that is never contiguous
//!   (it is then rejected at compile time), or `static bool is_contiguous(const T&)` for a type
//!   that may or may not be (a non-contiguous one is rejected with `invalid_argument`).
//! - optionally, `static void resize(T&, std::size_t)`, growing with zeros: lets cohort give a
//!   missing gradient its storage when a parameter's gradient is zero-filled.
//! - optionally, `static std::size_t rows(const T&)`: the elements seen as a matrix of that many
//!   rows, row after row in memory (0: not a matrix). Only gradient hooks that compress matrices
//!   (`powersgd`) read it; a tensor without it is reduced whole.
//!
//! `cohort/tensor/std.hpp` holds the specializations for the standard containers; see
//! `test/tensor/traits.cpp` (a run-time dtype) and `test/communicator/collectives.cpp` for user
//! types.
template <class T>
struct tensor_traits;

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
