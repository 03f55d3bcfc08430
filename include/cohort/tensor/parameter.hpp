// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/tensor/concepts.hpp>

#include <concepts>
#include <cstddef>
#include <ranges>
#include <string>
#include <string_view>
#include <type_traits>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The customization point through which cohort sees one trainable parameter of a framework.
//! Declared and not defined, like `tensor_traits`. A specialization `parameter_traits<P>`
//! provides:
//! - `static std::string_view name(const P&)`: a name for error messages (may be empty);
//! - `static V& value(P&)`: the parameter's value, a writable tensor;
//! - `static G* grad(P&)`: its gradient, a writable tensor, or `nullptr` when it has none. A
//!   gradient with no elements while the value has some also counts as missing (this is how an
//!   unused layer shows up in frameworks that allocate gradients lazily).
//! - optionally, `static std::size_t rows(const P&)`: the gradient seen as a matrix of that many
//!   rows, stored row after row (0: not a matrix), where the gradient's own tensor type cannot
//!   say (a flat std::vector). Read by gradient hooks that compress matrices (`powersgd`).
template <class P>
struct parameter_traits;

//! A ready-made parameter for trainers that keep their weights in their own containers: a name
//! and pointers to the value and the gradient (both owned by the trainer), and, for a weight
//! matrix kept flat, its number of rows (0: what the gradient's tensor type says, if anything).
template <tensor Value, tensor Grad = Value>
struct parameter_ref {
  std::string name;
  Value* value = nullptr;
  Grad* grad = nullptr;
  std::size_t rows = 0;
};

template <class Value, class Grad>
struct parameter_traits<parameter_ref<Value, Grad>> {
  static std::string_view name(const parameter_ref<Value, Grad>& p) noexcept { return p.name; }
  static Value& value(const parameter_ref<Value, Grad>& p) noexcept { return *p.value; }
  static Grad* grad(const parameter_ref<Value, Grad>& p) noexcept { return p.grad; }
  static std::size_t rows(const parameter_ref<Value, Grad>& p) noexcept { return p.rows; }
};

//! A type with a `parameter_traits` specialization whose value and gradient are writable tensors.
template <class P>
concept parameter = requires(std::remove_cvref_t<P>& p) {
  { parameter_traits<std::remove_cvref_t<P>>::name(p) } -> std::convertible_to<std::string_view>;
  requires writable_tensor<decltype(parameter_traits<std::remove_cvref_t<P>>::value(p))>;
  requires std::is_pointer_v<decltype(parameter_traits<std::remove_cvref_t<P>>::grad(p))>;
  requires writable_tensor<
      std::remove_pointer_t<decltype(parameter_traits<std::remove_cvref_t<P>>::grad(p))>>;
};

//! A model's parameters: a forward range of `parameter`s, in the same order on every rank.
template <class R>
concept parameter_set = std::ranges::forward_range<R> && parameter<std::ranges::range_value_t<R>>;

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
