// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/tensor/bfloat16.hpp>
#include <cohort/tensor/float16.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>
#include <type_traits>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The element types cohort moves and reduces.
enum class dtype : std::uint8_t { float32, float64, float16, bfloat16, int32, int64, uint8 };

//! Every dtype, in the order of the enum: for loops and tests that sweep them all.
inline constexpr dtype all_dtypes[] = {dtype::float32,  dtype::float64, dtype::float16,
                                       dtype::bfloat16, dtype::int32,   dtype::int64,
                                       dtype::uint8};
inline constexpr std::size_t dtype_count = std::size(all_dtypes);

//! The position of `type` in `all_dtypes` (the enumerators are numbered in that order): for tables
//! with one entry per dtype.
constexpr std::size_t dtype_index(dtype type) noexcept {
  return static_cast<std::size_t>(type);
}

constexpr std::string_view to_string(dtype type) noexcept {
  switch (type) {
  case dtype::float32:
    return "float32";
  case dtype::float64:
    return "float64";
  case dtype::float16:
    return "float16";
  case dtype::bfloat16:
    return "bfloat16";
  case dtype::int32:
    return "int32";
  case dtype::int64:
    return "int64";
  case dtype::uint8:
    return "uint8";
  }
  return "unknown";
}

constexpr std::size_t size_of(dtype type) noexcept {
  switch (type) {
  case dtype::float64:
  case dtype::int64:
    return 8;
  case dtype::float32:
  case dtype::int32:
    return 4;
  case dtype::float16:
  case dtype::bfloat16:
    return 2;
  case dtype::uint8:
    return 1;
  }
  return 0;
}

constexpr bool is_floating_point(dtype type) noexcept {
  return type == dtype::float32 || type == dtype::float64 || type == dtype::float16 ||
         type == dtype::bfloat16;
}

namespace detail {
template <class T>
struct dtype_of_impl {};
template <>
struct dtype_of_impl<float> : std::integral_constant<dtype, dtype::float32> {};
template <>
struct dtype_of_impl<double> : std::integral_constant<dtype, dtype::float64> {};
template <>
struct dtype_of_impl<float16> : std::integral_constant<dtype, dtype::float16> {};
template <>
struct dtype_of_impl<bfloat16> : std::integral_constant<dtype, dtype::bfloat16> {};
template <>
struct dtype_of_impl<std::int32_t> : std::integral_constant<dtype, dtype::int32> {};
template <>
struct dtype_of_impl<std::int64_t> : std::integral_constant<dtype, dtype::int64> {};
template <>
struct dtype_of_impl<std::uint8_t> : std::integral_constant<dtype, dtype::uint8> {};
} // namespace detail

//! An element type cohort knows: one of the C++ types behind a `dtype`.
template <class T>
concept element = requires {
  detail::dtype_of_impl<std::remove_cv_t<T>>::value;
};

//! The dtype of an element type, at compile time.
template <element T>
inline constexpr dtype dtype_of_v = detail::dtype_of_impl<std::remove_cv_t<T>>::value;

namespace detail {
template <dtype D>
struct type_of_impl;
template <>
struct type_of_impl<dtype::float32> : std::type_identity<float> {};
template <>
struct type_of_impl<dtype::float64> : std::type_identity<double> {};
template <>
struct type_of_impl<dtype::float16> : std::type_identity<float16> {};
template <>
struct type_of_impl<dtype::bfloat16> : std::type_identity<bfloat16> {};
template <>
struct type_of_impl<dtype::int32> : std::type_identity<std::int32_t> {};
template <>
struct type_of_impl<dtype::int64> : std::type_identity<std::int64_t> {};
template <>
struct type_of_impl<dtype::uint8> : std::type_identity<std::uint8_t> {};
} // namespace detail

//! The C++ element type of a dtype.
template <dtype D>
using element_type_of_t = typename detail::type_of_impl<D>::type;

//! Calls `f(std::type_identity<T>{})` with the element type of a run-time dtype: the one place
//! where a run-time dtype becomes a compile-time type.
template <class F>
constexpr decltype(auto) visit(dtype type, F&& f) {
  switch (type) {
  case dtype::float32:
    return f(std::type_identity<float>{});
  case dtype::float64:
    return f(std::type_identity<double>{});
  case dtype::float16:
    return f(std::type_identity<float16>{});
  case dtype::bfloat16:
    return f(std::type_identity<bfloat16>{});
  case dtype::int32:
    return f(std::type_identity<std::int32_t>{});
  case dtype::int64:
    return f(std::type_identity<std::int64_t>{});
  case dtype::uint8:
    break;
  }
  return f(std::type_identity<std::uint8_t>{});
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
