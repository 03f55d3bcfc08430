// SPDX-License-Identifier: Apache-2.0
#pragma once

// `at::Tensor` as a cohort tensor: dtype and device read at run time. A tensor is taken when it
// is one dense block of memory (`is_non_overlapping_and_dense`, not only `is_contiguous`: a
// transposed weight is dense too, and its gradient has its layout on every rank alike); a strided
// slice, or a sparse tensor, is a gradient cohort refuses with an error naming the parameter on
// every rank. A dtype cohort has no wire for (complex, bool, int8, int16...) throws
// `invalid_argument` naming it. CPU tensors are in host memory, CUDA tensors in device memory
// (reduce them with a GPU strategy).

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/location.hpp>
#include <cohort/tensor/traits.hpp>

#include <ATen/ATen.h>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {

//! cohort's dtype of a LibTorch scalar type; throws `invalid_argument` naming the others.
inline dtype dtype_of(c10::ScalarType type) {
  switch (type) {
  case c10::ScalarType::Float:
    return dtype::float32;
  case c10::ScalarType::Double:
    return dtype::float64;
  case c10::ScalarType::Half:
    return dtype::float16;
  case c10::ScalarType::BFloat16:
    return dtype::bfloat16;
  case c10::ScalarType::Int:
    return dtype::int32;
  case c10::ScalarType::Long:
    return dtype::int64;
  case c10::ScalarType::Byte:
    return dtype::uint8;
  default:
    throw invalid_argument("cohort: a tensor of torch dtype " + std::string(c10::toString(type)) +
                           " has no cohort dtype (float32, float64, float16, bfloat16, int32, "
                           "int64, uint8); convert it first");
  }
}

//! Where a LibTorch device's memory is, for cohort; throws `invalid_argument` for devices other
//! than the CPU and CUDA.
inline memory_location location_of(const c10::Device& device) {
  if (device.is_cpu()) {
    return memory_location::host;
  }
  if (device.is_cuda()) {
    return memory_location::device;
  }
  std::ostringstream name;
  name << device;
  throw invalid_argument("cohort: a tensor on torch device " + name.str() +
                         ": cohort reduces CPU (host) and CUDA (device) memory only");
}

} // namespace torch

//! `at::Tensor` (and so `torch::Tensor`): dtype and device at run time. An undefined tensor (a
//! gradient backward has not produced) has no elements.
template <>
struct tensor_traits<at::Tensor> {
  static void* data(at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
  static const void* data(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
  static std::size_t size(const at::Tensor& t) {
    return t.defined() ? static_cast<std::size_t>(t.numel()) : 0;
  }
  static dtype dtype_of(const at::Tensor& t) {
    return t.defined() ? torch::dtype_of(t.scalar_type()) : dtype::float32;
  }
  static memory_location location_of(const at::Tensor& t) {
    return t.defined() ? torch::location_of(t.device()) : memory_location::host;
  }
  //! As DDP's communication hooks see it (`view(size(0), -1)`): the outermost dimension is the
  //! rows, provided it is also outermost in memory (standard and channels-last layouts both);
  //! 0 for a scalar, or one whose first dimension is not outermost.
  static std::size_t rows(const at::Tensor& t) {
    if (!t.defined() || t.dim() == 0 || t.size(0) == 0) {
      return 0;
    }
    const std::int64_t rows = t.size(0);
    return t.size(0) == 1 || t.stride(0) == t.numel() / rows ? static_cast<std::size_t>(rows) : 0;
  }
  //! One dense block, whatever its strides; a sparse tensor is not.
  static bool is_contiguous(const at::Tensor& t) {
    return !t.defined() || (t.layout() == c10::kStrided && t.is_non_overlapping_and_dense());
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
