// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/tensor/bfloat16.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/float16.hpp>

#include <type_traits>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The power of two that keeps a sum of `ranks` values of the 16-bit type `wire`, each divided by
//! `ranks` and by it, below the type's largest value: each of the ranks + 1 roundings (the cast,
//! then every addition) grows it by at most a factor 1 + u (u = 2^-11 for float16, 2^-8 for
//! bfloat16), so the headroom must reach (1 + u)^(ranks + 1) <= e^((ranks + 1) u). 2 up to 1418
//! ranks in float16 (176 in bfloat16), more beyond; 1 for a single rank, which adds nothing.
constexpr double compressed_headroom(int ranks, dtype wire) noexcept {
  if (ranks <= 1) {
    return 1.0;
  }
  const double u = wire == dtype::float16 ? 1.0 / 2048.0 : 1.0 / 256.0;
  const double exponent = static_cast<double>(ranks + 1) * u; // e^exponent <= 2^(exponent/ln 2)
  double headroom = 2.0;
  for (double covered = 0.6931471805599453; covered < exponent; covered += 0.6931471805599453) {
    headroom *= 2.0;
  }
  return headroom;
}

//! The average over ranks with float32 and float64 gradients sent as `Wire` (float16 or
//! bfloat16): half the bytes on the wire, at the precision of the 16-bit type. Each rank's
//! gradient is divided before it is cast and summed, by the number of ranks times a power of two
//! of headroom (`compressed_headroom`), and multiplied by that headroom after: the sum of n
//! values each at most the wire type's largest then stays below it even after the rounding of
//! every step (ChainerMN summed fp16 first, then divided, and overflowed; dividing by n alone
//! still overflows at 3 ranks near 65504). No input whose values the wire type can represent
//! overflows, at any number of ranks. The price: gradients below 2^-24 * ranks * headroom (float16)
//! flush to zero. Gradients that are already 16-bit are averaged as `mean` does (in float32);
//! integer gradients are not compressed (they are averaged as `mean` does, through int64).
template <class Wire>
requires std::is_same_v<Wire, float16> || std::is_same_v<Wire, bfloat16>
struct compressed {
  constexpr grad_reduction plan(dtype type, int ranks) const noexcept {
    if (type == dtype::float32 || type == dtype::float64) {
      const double headroom = compressed_headroom(ranks, dtype_of_v<Wire>);
      return {dtype_of_v<Wire>, 1.0 / (static_cast<double>(ranks) * headroom), headroom,
              reduce_op::sum};
    }
    return mean{}.plan(type, ranks);
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
