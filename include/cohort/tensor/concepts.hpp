// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/location.hpp>
#include <cohort/tensor/traits.hpp>

#include <concepts>
#include <cstddef>
#include <type_traits>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The traits of a (possibly cv- or ref-qualified) tensor type.
template <class T>
using traits_of = tensor_traits<std::remove_cvref_t<T>>;

namespace detail {
template <class T>
using data_pointer_t = decltype(traits_of<T>::data(std::declval<std::remove_reference_t<T>&>()));
template <class T>
using data_element_t = std::remove_cv_t<std::remove_pointer_t<data_pointer_t<T>>>;

template <class T>
concept has_static_dtype = element<data_element_t<T>>;
template <class T>
concept has_dynamic_dtype = std::same_as < data_element_t<T>,
void > &&requires(const T& t) {
  { traits_of<T>::dtype_of(t) } -> std::same_as<dtype>;
};

template <class T>
concept has_static_location = requires {
  { traits_of<T>::location } -> std::convertible_to<memory_location>;
  std::integral_constant<memory_location, traits_of<T>::location>{};
};
template <class T>
concept has_dynamic_location = requires(const T& t) {
  { traits_of<T>::location_of(t) } -> std::same_as<memory_location>;
};

template <class T>
concept statically_non_contiguous = requires {
  requires !static_cast<bool>(traits_of<T>::contiguous);
};
} // namespace detail

//! A contiguous run of elements of one dtype that cohort can read: a type with a complete
//! `tensor_traits` specialization (see traits.hpp). `const` tensors are tensors too.
template <class T>
concept tensor = requires(std::remove_reference_t<T>& t) {
  requires std::is_pointer_v<detail::data_pointer_t<T>>;
  { traits_of<T>::size(t) } -> std::convertible_to<std::size_t>;
}
&&(detail::has_static_dtype<T> || detail::has_dynamic_dtype<T>)&&(
    detail::has_static_location<T> ||
    detail::has_dynamic_location<T>)&&!detail::statically_non_contiguous<T>;

//! A tensor cohort may write into: its data pointer is not a pointer to const.
template <class T>
concept writable_tensor =
    tensor<T> && !std::is_const_v<std::remove_pointer_t<detail::data_pointer_t<T>>>;

//! A tensor whose element type is known at compile time.
template <class T>
concept statically_typed_tensor = tensor<T> && detail::has_static_dtype<T>;

//! A tensor whose memory location is known at compile time.
template <class T>
concept statically_located_tensor = tensor<T> && detail::has_static_location<T>;

//! A tensor that cohort can resize (used to give a missing gradient its storage).
template <class T>
concept resizable_tensor = writable_tensor<T> && requires(std::remove_cvref_t<T>& t) {
  traits_of<T>::resize(t, std::size_t{});
};

//! The dtype of a tensor: a compile-time constant when the type knows it.
template <tensor T>
constexpr dtype tensor_dtype(const T& t) {
  if constexpr (detail::has_static_dtype<T>) {
    (void)t;
    return dtype_of_v<detail::data_element_t<T>>;
  } else {
    return traits_of<T>::dtype_of(t);
  }
}

//! Where a tensor lives: a compile-time constant when the type knows it.
template <tensor T>
constexpr memory_location tensor_location(const T& t) {
  if constexpr (detail::has_static_location<T>) {
    (void)t;
    return traits_of<T>::location;
  } else {
    return traits_of<T>::location_of(t);
  }
}

//! The number of elements of a tensor.
template <tensor T>
constexpr std::size_t tensor_size(const T& t) {
  return static_cast<std::size_t>(traits_of<T>::size(t));
}

//! Whether a tensor's elements are contiguous (true unless its traits say otherwise).
template <tensor T>
constexpr bool tensor_is_contiguous(const T& t) {
  if constexpr (requires { traits_of<T>::is_contiguous(t); }) {
    return traits_of<T>::is_contiguous(t);
  } else {
    (void)t;
    return true;
  }
}

//! The rows of a tensor seen as a matrix stored row after row (its traits' `rows`), or 0 where
//! its traits do not say: a gradient hook then treats it as a vector.
template <tensor T>
constexpr std::size_t tensor_rows(const T& t) {
  if constexpr (requires { traits_of<T>::rows(t); }) {
    return static_cast<std::size_t>(traits_of<T>::rows(t));
  } else {
    (void)t;
    return 0;
  }
}

namespace detail {
//! Whether a tensor is in GPU memory (device or managed): a compile-time answer where its type
//! says where it lives.
template <tensor T>
constexpr bool on_device(const T& t) {
  return tensor_location(t) != memory_location::host;
}
} // namespace detail

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
