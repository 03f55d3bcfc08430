// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE tensor.dtype
#include <cohort/tensor/bfloat16.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/float16.hpp>

#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

using cohort::bfloat16;
using cohort::dtype;
using cohort::float16;

namespace {
std::uint16_t h(float f) {
  return float16(f).bits();
}
std::uint16_t b(float f) {
  return bfloat16(f).bits();
}
float from_bits(std::uint32_t u) {
  return std::bit_cast<float>(u);
}

// The nearest value of `Half` to `f`, ties to the even bit pattern, found by brute force over the
// neighbours of a candidate: the reference the fast conversions are checked against.
template <class Half>
bool is_correctly_rounded(float f) {
  const Half got(f);
  const double target = f;
  const double value = static_cast<float>(got);
  if (std::isinf(value)) {
    // Overflow: f must be at least halfway between the largest finite value and the next power.
    const double max_finite = static_cast<float>(Half::from_bits(got.bits() - 1));
    const double ulp = max_finite - static_cast<float>(Half::from_bits(got.bits() - 2));
    return std::abs(target) >= max_finite + ulp / 2;
  }
  const double error = std::abs(value - target);
  for (int step : {-1, 1}) {
    const auto bits = static_cast<std::uint16_t>(got.bits() + step);
    const double neighbour = static_cast<float>(Half::from_bits(bits));
    if (std::isnan(neighbour) || std::signbit(neighbour) != std::signbit(value)) {
      continue;
    }
    const double other = std::abs(neighbour - target);
    if (other < error || (other == error && (got.bits() & 1) != 0)) {
      return false;
    }
  }
  return true;
}
} // namespace

BOOST_AUTO_TEST_CASE(float16_reference_values) {
  BOOST_TEST(h(0.0f) == 0x0000);
  BOOST_TEST(h(-0.0f) == 0x8000);
  BOOST_TEST(h(1.0f) == 0x3c00);
  BOOST_TEST(h(-2.0f) == 0xc000);
  BOOST_TEST(h(65504.0f) == 0x7bff);              // largest finite
  BOOST_TEST(h(65519.99f) == 0x7bff);             // below the halfway point: stays finite
  BOOST_TEST(h(65520.0f) == 0x7c00);              // halfway to 2^16 rounds to infinity
  BOOST_TEST(h(std::ldexp(1.0f, -24)) == 0x0001); // smallest subnormal
  BOOST_TEST(h(std::ldexp(1.0f, -25)) == 0x0000); // tie between 0 and the smallest: even is 0
  BOOST_TEST(h(std::ldexp(3.0f, -25)) == 0x0002); // tie between 1 and 2 ulps: even is 2
  BOOST_TEST(h(std::ldexp(1.0f, -14)) == 0x0400); // smallest normal
  BOOST_TEST(h(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);     // tie: even mantissa
  BOOST_TEST(h(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02); // tie: even mantissa, upward
  BOOST_TEST(h(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3c01); // above tie
  BOOST_TEST(h(std::numeric_limits<float>::infinity()) == 0x7c00);
  BOOST_TEST(h(-std::numeric_limits<float>::infinity()) == 0xfc00);
  BOOST_TEST(std::isnan(static_cast<float>(float16(std::nanf("")))));
  BOOST_TEST(static_cast<float>(float16::from_bits(0x3555)) == 0.333251953125f);
}

BOOST_AUTO_TEST_CASE(bfloat16_reference_values) {
  BOOST_TEST(b(1.0f) == 0x3f80);
  BOOST_TEST(b(-1.0f) == 0xbf80);
  BOOST_TEST(b(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);     // tie: even mantissa
  BOOST_TEST(b(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82); // tie: even mantissa, upward
  BOOST_TEST(b(from_bits(0x7f7f7fff)) == 0x7f7f);           // largest finite, below the tie
  BOOST_TEST(b(from_bits(0x7f7f8000)) == 0x7f80);           // tie to even overflows to infinity
  BOOST_TEST(b(std::numeric_limits<float>::infinity()) == 0x7f80);
  BOOST_TEST(std::isnan(static_cast<float>(bfloat16(from_bits(0x7f800001))))); // not infinity
  BOOST_TEST(static_cast<float>(bfloat16::from_bits(0x4049)) == 3.140625f);
}

BOOST_AUTO_TEST_CASE(every_half_pattern_round_trips_through_float) {
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto pattern = static_cast<std::uint16_t>(bits);
    const float f16 = float16::from_bits(pattern);
    if (!std::isnan(f16)) {
      BOOST_TEST_REQUIRE(float16(f16).bits() == pattern);
    }
    const float bf16 = bfloat16::from_bits(pattern);
    if (!std::isnan(bf16)) {
      BOOST_TEST_REQUIRE(bfloat16(bf16).bits() == pattern);
    }
  }
}

BOOST_AUTO_TEST_CASE(random_floats_round_to_nearest_even) {
  std::mt19937 engine(12345);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    // Finite floats of every magnitude, including those beyond fp16's range.
    const float f = from_bits(any_bits(engine) & 0xbfffffffu);
    BOOST_TEST_REQUIRE(is_correctly_rounded<bfloat16>(f), "bf16 of " << f);
    // Within fp16's range (and slightly beyond) where the interesting roundings are.
    const float g = std::ldexp(static_cast<float>(any_bits(engine) % 100000) / 1000.0f,
                               static_cast<int>(any_bits(engine) % 44) - 30);
    BOOST_TEST_REQUIRE(is_correctly_rounded<float16>(g), "fp16 of " << g);
    BOOST_TEST_REQUIRE(is_correctly_rounded<float16>(-g), "fp16 of " << -g);
  }
}

BOOST_AUTO_TEST_CASE(conversions_are_constexpr) {
  static_assert(float16(1.5f).bits() == 0x3e00);
  static_assert(static_cast<float>(bfloat16(2.0f)) == 2.0f);
}

BOOST_AUTO_TEST_CASE(dtype_properties) {
  static_assert(cohort::dtype_of_v<float> == dtype::float32);
  static_assert(cohort::dtype_of_v<const double> == dtype::float64);
  static_assert(cohort::dtype_of_v<float16> == dtype::float16);
  static_assert(cohort::dtype_of_v<bfloat16> == dtype::bfloat16);
  static_assert(cohort::dtype_of_v<std::int32_t> == dtype::int32);
  static_assert(cohort::dtype_of_v<std::int64_t> == dtype::int64);
  static_assert(cohort::dtype_of_v<std::uint8_t> == dtype::uint8);
  static_assert(!cohort::element<char>);
  static_assert(!cohort::element<bool>);
  static_assert(std::is_same_v<cohort::element_type_of_t<dtype::bfloat16>, bfloat16>);
  for (const dtype type : cohort::all_dtypes) {
    const auto size = cohort::visit(type, []<class T>(std::type_identity<T>) { return sizeof(T); });
    BOOST_TEST(size == cohort::size_of(type));
    const auto back =
        cohort::visit(type, []<class T>(std::type_identity<T>) { return cohort::dtype_of_v<T>; });
    BOOST_TEST((back == type));
    BOOST_TEST(!cohort::to_string(type).empty());
  }
  BOOST_TEST(cohort::to_string(dtype::bfloat16) == "bfloat16");
  BOOST_TEST(cohort::is_floating_point(dtype::float16));
  BOOST_TEST(!cohort::is_floating_point(dtype::int64));
}
