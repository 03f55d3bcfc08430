// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The average over ranks, in the gradient's own dtype. For float32 and float64 the sum comes
//! first and the division last (the rounding of a plain sum). For float16 and bfloat16 the
//! division comes first: a sum of n fp16 gradients can overflow 65504 where their mean would not
//! (ChainerMN summed first); the price is that a gradient below 2^-24 * ranks underflows to zero.
//! Integer gradients are summed in int64 (a sum of uint8 or int32 gradients would wrap in its own
//! type), then divided, rounding to nearest.
struct mean {
  constexpr grad_reduction plan(dtype type, int ranks) const noexcept {
    const double inverse = 1.0 / static_cast<double>(ranks);
    if (type == dtype::float16 || type == dtype::bfloat16) {
      return {type, inverse, 1.0, reduce_op::sum};
    }
    if (type == dtype::int32 || type == dtype::uint8) {
      return {dtype::int64, 1.0, inverse, reduce_op::sum};
    }
    return {type, 1.0, inverse, reduce_op::sum};
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
