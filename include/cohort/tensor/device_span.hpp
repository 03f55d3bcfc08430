// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/location.hpp>
#include <cohort/tensor/traits.hpp>

#include <cstddef>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! A non-owning view of `count` elements in GPU memory: how a trainer hands cohort a buffer it
//! allocated with cudaMalloc (or got from a framework). Its type says it lives on the device, so
//! a host-only strategy refuses it at compile time.
template <element T>
class device_span {
public:
  constexpr device_span() = default;
  constexpr device_span(T* data, std::size_t count) noexcept
      : data_(data)
      , count_(count) {}

  constexpr T* data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return count_; }
  constexpr bool empty() const noexcept { return count_ == 0; }

private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

template <element T>
struct tensor_traits<device_span<T>> {
  static constexpr memory_location location = memory_location::device;
  static T* data(const device_span<T>& s) noexcept { return s.data(); }
  static std::size_t size(const device_span<T>& s) noexcept { return s.size(); }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
