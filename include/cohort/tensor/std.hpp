// SPDX-License-Identifier: Apache-2.0
#pragma once

// tensor_traits for the standard containers: std::vector, std::array, std::span and C arrays of
// any `element`. All of them live in host memory and know their dtype at compile time.

#include <cohort/config.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/location.hpp>
#include <cohort/tensor/traits.hpp>

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

template <element E, class Allocator>
struct tensor_traits<std::vector<E, Allocator>> {
  static constexpr memory_location location = memory_location::host;
  static E* data(std::vector<E, Allocator>& v) noexcept { return v.data(); }
  static const E* data(const std::vector<E, Allocator>& v) noexcept { return v.data(); }
  static std::size_t size(const std::vector<E, Allocator>& v) noexcept { return v.size(); }
  static void resize(std::vector<E, Allocator>& v, std::size_t n) { v.resize(n, E{}); }
};

template <element E, std::size_t N>
struct tensor_traits<std::array<E, N>> {
  static constexpr memory_location location = memory_location::host;
  static E* data(std::array<E, N>& a) noexcept { return a.data(); }
  static const E* data(const std::array<E, N>& a) noexcept { return a.data(); }
  static constexpr std::size_t size(const std::array<E, N>&) noexcept { return N; }
};

// A span of const elements is a read-only tensor: it can be sent, not received into.
template <element E, std::size_t Extent>
struct tensor_traits<std::span<E, Extent>> {
  static constexpr memory_location location = memory_location::host;
  static E* data(const std::span<E, Extent>& s) noexcept { return s.data(); }
  static std::size_t size(const std::span<E, Extent>& s) noexcept { return s.size(); }
};

template <element E, std::size_t N>
struct tensor_traits<E[N]> {
  static constexpr memory_location location = memory_location::host;
  static E* data(E (&a)[N]) noexcept { return a; }
  static const E* data(const E (&a)[N]) noexcept { return a; }
  static constexpr std::size_t size(const E (&)[N]) noexcept { return N; }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
