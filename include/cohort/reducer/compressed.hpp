// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/tensor/bfloat16.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/float16.hpp>

#include <type_traits>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The average over ranks with float32 and float64 gradients sent as `Wire` (float16 or
//! bfloat16): half the bytes on the wire, at the precision of the 16-bit type. Each rank's
//! gradient is divided by the number of ranks before it is cast and summed, so the sum of n
//! gradients cannot overflow where their mean would not (ChainerMN summed fp16 first, then
//! divided). Gradients that are already 16-bit are averaged as `mean` does; integer gradients
//! are not compressed (they are averaged as `mean` does, through int64).
template <class Wire>
requires std::is_same_v<Wire, float16> || std::is_same_v<Wire, bfloat16>
struct compressed {
  constexpr grad_reduction plan(dtype type, int ranks) const noexcept {
    const double inverse = 1.0 / static_cast<double>(ranks);
    if (is_floating_point(type)) {
      const dtype wire =
          type == dtype::float16 || type == dtype::bfloat16 ? type : dtype_of_v<Wire>;
      return {wire, inverse, 1.0, reduce_op::sum};
    }
    return mean{}.plan(type, ranks);
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
