// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/detail/bit_cast.hpp>

#include <cstdint>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! bfloat16 (the upper half of an IEEE binary32) on the host and the device. Conversion from
//! float rounds to nearest, ties to even; NaN stays NaN. Arithmetic goes through float.
class bfloat16 {
public:
  bfloat16() = default;
  COHORT_HOST_DEVICE constexpr explicit bfloat16(float value) noexcept
      : bits_(from_float(value)) {}

  COHORT_HOST_DEVICE constexpr operator float() const noexcept {
    return detail::bit_cast<float>(static_cast<std::uint32_t>(bits_) << 16);
  }

  COHORT_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t bits) noexcept {
    bfloat16 b{};
    b.bits_ = bits;
    return b;
  }
  COHORT_HOST_DEVICE constexpr std::uint16_t bits() const noexcept { return bits_; }

  COHORT_HOST_DEVICE friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept {
    return static_cast<float>(a) == static_cast<float>(b);
  }

private:
  COHORT_HOST_DEVICE static constexpr std::uint16_t from_float(float value) noexcept {
    const std::uint32_t u = detail::bit_cast<std::uint32_t>(value);
    if ((u & 0x7fffffffu) > 0x7f800000u) { // NaN: truncation could turn it into infinity
      return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    }
    const std::uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>((u + rounding_bias) >> 16);
  }

  std::uint16_t bits_;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
