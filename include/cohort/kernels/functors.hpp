// SPDX-License-Identifier: Apache-2.0
#pragma once

// The per-element logic of every kernel, written once as __host__ __device__ functors: the CUDA
// kernels and the host implementation (kernels/host.hpp) call the same code, so host tests
// check what runs on the device.

#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/bfloat16.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/float16.hpp>

#include <type_traits>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace kernels {

//! The type arithmetic on `T` is done in: float for the 16-bit floats (as the hardware does) and
//! for float; double for double and the integers (exact for every int32, and for int64 up to
//! 2^53).
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, float16> || std::is_same_v<T, bfloat16> ||
                                         std::is_same_v<T, float>,
                                     float, double>;

//! Converts one element between element types, rounding to nearest even into fp16 and bf16.
template <class To, class From>
COHORT_HOST_DEVICE constexpr To convert(From value) noexcept {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (std::is_same_v<To, float16> || std::is_same_v<To, bfloat16>) {
    return To(static_cast<float>(value));
  } else if constexpr (std::is_same_v<From, float16> || std::is_same_v<From, bfloat16>) {
    return static_cast<To>(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

//! `a * b` rounded once, and never fused with a later addition: nvcc contracts `a * b + c` into
//! a fused multiply-add by default, which rounds once where the host rounds twice, so a scaled
//! integer near a half could round differently on the device than on the host. (`mul.rn` in the
//! PTX: ptxas may not fuse it.)
template <class T>
COHORT_HOST_DEVICE constexpr T multiply_rounded(T a, T b) noexcept {
#if defined(__CUDA_ARCH__)
  if (!__builtin_is_constant_evaluated()) {
    if constexpr (std::is_same_v<T, float>) {
      return __fmul_rn(a, b);
    } else if constexpr (std::is_same_v<T, double>) {
      return __dmul_rn(a, b);
    }
  }
#endif
  return a * b;
}

//! `out = To(in * factor)`: the cast-and-scale of pack, unpack and scale. A factor of one is the
//! identity bit for bit (no rounding through the compute type when the types match). A scaled
//! integer rounds to nearest (half away from zero), so that the mean of integers is not biased
//! towards zero, and 9 * (1/3) is 3 even though 1/3 is not exact.
template <class From, class To>
struct scale_cast {
  using compute = std::conditional_t<(sizeof(compute_t<From>) > sizeof(compute_t<To>)),
                                     compute_t<From>, compute_t<To>>;
  compute factor;

  COHORT_HOST_DEVICE constexpr To operator()(From in) const noexcept {
    if (factor == compute(1)) {
      return convert<To>(in);
    }
    const compute scaled = multiply_rounded(convert<compute>(in), factor);
    if constexpr (std::is_integral_v<To>) {
      return static_cast<To>(scaled < compute(0) ? scaled - compute(0.5) : scaled + compute(0.5));
    } else {
      return convert<To>(scaled);
    }
  }
};

//! The binary operation of a reduction: on the compute type of a floating `T`; on the integer
//! itself for an integer `T` (exact, as MPI's: through a double, an int64 past 2^53 would round,
//! and a sum past the type's range would be undefined), a sum or product wrapping around in
//! unsigned arithmetic as two's complement hardware does.
template <class T>
struct combine {
  reduce_op op;

  COHORT_HOST_DEVICE constexpr T operator()(T a, T b) const noexcept {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      switch (op) {
      case reduce_op::sum:
        return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      case reduce_op::prod:
        return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case reduce_op::min:
        return b < a ? b : a;
      case reduce_op::max:
        return a < b ? b : a;
      }
      return a;
    }
    using C = compute_t<T>;
    const C x = convert<C>(a);
    const C y = convert<C>(b);
    switch (op) {
    case reduce_op::sum:
      return convert<T>(static_cast<C>(x + y));
    case reduce_op::prod:
      return convert<T>(static_cast<C>(x * y));
    case reduce_op::min:
      return convert<T>(y < x ? y : x);
    case reduce_op::max:
      return convert<T>(x < y ? y : x);
    }
    return a;
  }
};

} // namespace kernels
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
