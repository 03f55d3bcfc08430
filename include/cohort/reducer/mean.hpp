// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/dtype.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The average over ranks. For float32 and float64 the sum comes first and the division last,
//! in the gradient's own dtype (the rounding of a plain sum). float16 and bfloat16 gradients are
//! summed in float32 (two bytes more per element on the wire): a sum of 16-bit values rounded at
//! each step can overflow even when every value was divided by the number of ranks first (at 3
//! ranks, three thirds of 65504 round up to 65520, which is inf in float16), and a float32 sum of
//! n float16 values cannot. bfloat16's range is float32's, so bfloat16 gradients are divided
//! first. No representable input overflows, at any number of ranks. Integer gradients are summed
//! in int64 (a sum of uint8 or int32 gradients would wrap in its own type), then divided,
//! rounding to nearest.
struct mean {
  constexpr grad_reduction plan(dtype type, int ranks) const noexcept {
    const double inverse = 1.0 / static_cast<double>(ranks);
    if (type == dtype::float16) {
      return {dtype::float32, 1.0, inverse, reduce_op::sum};
    }
    if (type == dtype::bfloat16) {
      return {dtype::float32, inverse, 1.0, reduce_op::sum};
    }
    if (type == dtype::int32 || type == dtype::uint8) {
      return {dtype::int64, 1.0, inverse, reduce_op::sum};
    }
    return {type, 1.0, inverse, reduce_op::sum};
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
