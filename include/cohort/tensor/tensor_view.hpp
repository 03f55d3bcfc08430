// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/tensor/concepts.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/location.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! A non-owning, type-erased view of a contiguous tensor: what the algorithms and engines work
//! on, so that templates stay at the edges and the heavy code is compiled once per program.
struct tensor_view {
  void* data = nullptr;
  std::size_t count = 0;
  dtype type = dtype::float32;
  memory_location location = memory_location::host;

  constexpr std::size_t size_bytes() const noexcept { return count * size_of(type); }
};

//! The read-only counterpart of `tensor_view`; every `tensor_view` converts to it.
struct const_tensor_view {
  const void* data = nullptr;
  std::size_t count = 0;
  dtype type = dtype::float32;
  memory_location location = memory_location::host;

  const_tensor_view() = default;
  constexpr const_tensor_view(const void* d, std::size_t n, dtype t, memory_location l) noexcept
      : data(d)
      , count(n)
      , type(t)
      , location(l) {}
  constexpr const_tensor_view(const tensor_view& v) noexcept
      : data(v.data)
      , count(v.count)
      , type(v.type)
      , location(v.location) {}

  constexpr std::size_t size_bytes() const noexcept { return count * size_of(type); }
};

// Views are tensors themselves, so every entry point accepts them as well.
template <>
struct tensor_traits<tensor_view> {
  static void* data(const tensor_view& v) noexcept { return v.data; }
  static std::size_t size(const tensor_view& v) noexcept { return v.count; }
  static dtype dtype_of(const tensor_view& v) noexcept { return v.type; }
  static memory_location location_of(const tensor_view& v) noexcept { return v.location; }
};
template <>
struct tensor_traits<const_tensor_view> {
  static const void* data(const const_tensor_view& v) noexcept { return v.data; }
  static std::size_t size(const const_tensor_view& v) noexcept { return v.count; }
  static dtype dtype_of(const const_tensor_view& v) noexcept { return v.type; }
  static memory_location location_of(const const_tensor_view& v) noexcept { return v.location; }
};

namespace detail {
template <tensor T>
void require_contiguous(const T& t, std::string_view what) {
  if (!tensor_is_contiguous(t)) {
    throw invalid_argument("cohort: " + std::string(what) +
                           " is not contiguous; cohort moves contiguous tensors only "
                           "(make a contiguous copy first)");
  }
}
} // namespace detail

//! A writable view of a tensor. Throws `invalid_argument` naming `what` if the tensor is not
//! contiguous.
template <writable_tensor T>
tensor_view make_view(T& t, std::string_view what = "tensor") {
  detail::require_contiguous(t, what);
  return {static_cast<void*>(traits_of<T>::data(t)), tensor_size(t), tensor_dtype(t),
          tensor_location(t)};
}

//! A read-only view of a tensor. Throws `invalid_argument` naming `what` if the tensor is not
//! contiguous.
template <tensor T>
const_tensor_view make_const_view(const T& t, std::string_view what = "tensor") {
  detail::require_contiguous(t, what);
  return {static_cast<const void*>(traits_of<T>::data(t)), tensor_size(t), tensor_dtype(t),
          tensor_location(t)};
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
