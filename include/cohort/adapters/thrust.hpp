// SPDX-License-Identifier: Apache-2.0
#pragma once

// tensor_traits for thrust::device_vector (in GPU memory) and thrust::host_vector (in host
// memory), for trainers that keep their parameters in Thrust containers. Include it only where
// Thrust is available (it comes with the CUDA toolkit).

#include <cohort/config.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/location.hpp>
#include <cohort/tensor/traits.hpp>

#include <cstddef>
#include <thrust/device_vector.h>
#include <thrust/host_vector.h>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

template <element E, class Allocator>
struct tensor_traits<thrust::device_vector<E, Allocator>> {
  static constexpr memory_location location = memory_location::device;
  static E* data(thrust::device_vector<E, Allocator>& v) noexcept {
    return thrust::raw_pointer_cast(v.data());
  }
  static const E* data(const thrust::device_vector<E, Allocator>& v) noexcept {
    return thrust::raw_pointer_cast(v.data());
  }
  static std::size_t size(const thrust::device_vector<E, Allocator>& v) noexcept {
    return v.size();
  }
  static void resize(thrust::device_vector<E, Allocator>& v, std::size_t n) { v.resize(n, E{}); }
};

template <element E, class Allocator>
struct tensor_traits<thrust::host_vector<E, Allocator>> {
  static constexpr memory_location location = memory_location::host;
  static E* data(thrust::host_vector<E, Allocator>& v) noexcept { return v.data(); }
  static const E* data(const thrust::host_vector<E, Allocator>& v) noexcept { return v.data(); }
  static std::size_t size(const thrust::host_vector<E, Allocator>& v) noexcept { return v.size(); }
  static void resize(thrust::host_vector<E, Allocator>& v, std::size_t n) { v.resize(n, E{}); }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
