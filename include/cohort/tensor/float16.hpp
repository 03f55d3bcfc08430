// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/detail/bit_cast.hpp>

#include <cstdint>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! IEEE 754 binary16 on the host (and the device), for tensors that hold half precision.
//! Conversion from float rounds to nearest, ties to even; overflow gives infinity and NaN stays
//! NaN, as the hardware conversion does. Arithmetic goes through float.
class float16 {
public:
  float16() = default;
  COHORT_HOST_DEVICE constexpr explicit float16(float value) noexcept
      : bits_(from_float(value)) {}

  COHORT_HOST_DEVICE constexpr operator float() const noexcept { return to_float(bits_); }

  COHORT_HOST_DEVICE static constexpr float16 from_bits(std::uint16_t bits) noexcept {
    float16 h{};
    h.bits_ = bits;
    return h;
  }
  COHORT_HOST_DEVICE constexpr std::uint16_t bits() const noexcept { return bits_; }

  COHORT_HOST_DEVICE friend constexpr bool operator==(float16 a, float16 b) noexcept {
    return static_cast<float>(a) == static_cast<float>(b);
  }

private:
  // F. Giesen's branch-light conversions (public domain "half.c"): the subnormal path lets the
  // floating-point adder do the round-to-nearest-even, so no rounding table is needed.
  COHORT_HOST_DEVICE static constexpr std::uint16_t from_float(float value) noexcept {
    std::uint32_t u = detail::bit_cast<std::uint32_t>(value);
    const std::uint32_t sign = u & 0x80000000u;
    u ^= sign;
    std::uint32_t out = 0;
    if (u >= (127u + 16u) << 23) { // >= 65536: infinity, or NaN kept quiet
      out = u > (255u << 23) ? 0x7e00u : 0x7c00u;
    } else if (u < (113u << 23)) { // result is subnormal or zero
      constexpr std::uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
      const float shifted = detail::bit_cast<float>(u) + detail::bit_cast<float>(denorm_magic);
      out = detail::bit_cast<std::uint32_t>(shifted) - denorm_magic;
    } else {
      const std::uint32_t mantissa_odd = (u >> 13) & 1u;
      u += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu;
      u += mantissa_odd;
      out = u >> 13;
    }
    return static_cast<std::uint16_t>(out | (sign >> 16));
  }

  COHORT_HOST_DEVICE static constexpr float to_float(std::uint16_t h) noexcept {
    constexpr std::uint32_t shifted_exponent = 0x7c00u << 13;
    std::uint32_t u = (static_cast<std::uint32_t>(h) & 0x7fffu) << 13;
    const std::uint32_t exponent = shifted_exponent & u;
    u += (127u - 15u) << 23;
    if (exponent == shifted_exponent) { // infinity or NaN
      u += (128u - 16u) << 23;
    } else if (exponent == 0) { // zero or subnormal: renormalise through the adder
      u += 1u << 23;
      u = detail::bit_cast<std::uint32_t>(detail::bit_cast<float>(u) -
                                          detail::bit_cast<float>(113u << 23));
    }
    u |= (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
    return detail::bit_cast<float>(u);
  }

  std::uint16_t bits_;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
