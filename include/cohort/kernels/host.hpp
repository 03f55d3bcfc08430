// SPDX-License-Identifier: Apache-2.0
#pragma once

// The kernels' operations for tensors in host memory, built on the same functors as the CUDA
// kernels: pack many tensors into one fusion buffer and back (casting and scaling on the way),
// scale, cast and elementwise reduce.

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/kernels/functors.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/location.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace kernels::host {

namespace detail {
inline void require_host(memory_location location, std::string_view operation) {
  if (location == memory_location::device) {
    throw invalid_argument("cohort: " + std::string(operation) +
                           " on the host was given a tensor in device memory");
  }
}

// dst[i] = To(src[i] * factor) for `count` elements; a plain copy when nothing changes.
COHORT_DECL void scale_cast_n(const void* src, dtype from, void* dst, dtype to, std::size_t count,
                              double factor);
} // namespace detail

//! The number of elements that `pack` writes for these tensors.
inline std::size_t packed_count(std::span<const const_tensor_view> tensors) noexcept {
  std::size_t total = 0;
  for (const auto& t : tensors) {
    total += t.count;
  }
  return total;
}

//! Copies `sources` one after the other into `buffer`, each element cast to the buffer's dtype and
//! multiplied by `factor`. Throws `invalid_argument` if the buffer is too small.
inline void pack(std::span<const const_tensor_view> sources, tensor_view buffer,
                 double factor = 1.0) {
  detail::require_host(buffer.location, "pack");
  const std::size_t needed = packed_count(sources);
  if (needed > buffer.count) {
    throw invalid_argument("cohort: pack needs a buffer of " + std::to_string(needed) +
                           " elements but has " + std::to_string(buffer.count));
  }
  std::size_t offset = 0;
  for (const auto& source : sources) {
    detail::require_host(source.location, "pack");
    detail::scale_cast_n(source.data, source.type,
                         static_cast<std::byte*>(buffer.data) + offset * size_of(buffer.type),
                         buffer.type, source.count, factor);
    offset += source.count;
  }
}

//! The inverse of `pack`: copies consecutive parts of `buffer` into `targets`, each element cast
//! to its target's dtype and multiplied by `factor`.
inline void unpack(const_tensor_view buffer, std::span<const tensor_view> targets,
                   double factor = 1.0) {
  detail::require_host(buffer.location, "unpack");
  std::size_t needed = 0;
  for (const auto& t : targets) {
    needed += t.count;
  }
  if (needed > buffer.count) {
    throw invalid_argument("cohort: unpack needs a buffer of " + std::to_string(needed) +
                           " elements but has " + std::to_string(buffer.count));
  }
  std::size_t offset = 0;
  for (const auto& target : targets) {
    detail::require_host(target.location, "unpack");
    detail::scale_cast_n(static_cast<const std::byte*>(buffer.data) + offset * size_of(buffer.type),
                         buffer.type, target.data, target.type, target.count, factor);
    offset += target.count;
  }
}

//! Multiplies every element by `factor` in place.
inline void scale(tensor_view data, double factor) {
  detail::require_host(data.location, "scale");
  detail::scale_cast_n(data.data, data.type, data.data, data.type, data.count, factor);
}

//! Converts `source` into `target` elementwise (same count, any dtypes).
inline void cast(const_tensor_view source, tensor_view target) {
  detail::require_host(source.location, "cast");
  detail::require_host(target.location, "cast");
  if (source.count != target.count) {
    throw invalid_argument("cohort: cast from " + std::to_string(source.count) + " elements to " +
                           std::to_string(target.count));
  }
  detail::scale_cast_n(source.data, source.type, target.data, target.type, source.count, 1.0);
}

//! `inout[i] = op(inout[i], in[i])` elementwise (same count and dtype).
inline void reduce(tensor_view inout, const_tensor_view in, reduce_op op) {
  detail::require_host(inout.location, "reduce");
  detail::require_host(in.location, "reduce");
  if (inout.count != in.count || inout.type != in.type) {
    throw invalid_argument("cohort: reduce of " + std::to_string(in.count) + " " +
                           std::string(to_string(in.type)) + " elements into " +
                           std::to_string(inout.count) + " " + std::string(to_string(inout.type)) +
                           " elements");
  }
  visit(inout.type, [&]<class T>(std::type_identity<T>) {
    const combine<T> f{op};
    auto* a = static_cast<T*>(inout.data);
    const auto* b = static_cast<const T*>(in.data);
    for (std::size_t i = 0; i < inout.count; ++i) {
      a[i] = f(a[i], b[i]);
    }
  });
}

} // namespace kernels::host
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/kernels/impl/host.ipp>
#endif
