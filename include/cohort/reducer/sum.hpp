// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/dtype.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The sum over ranks, in the gradient's own dtype: for losses already divided by the global
//! batch size, or for gradient accumulation by hand.
struct sum {
  constexpr grad_reduction plan(dtype type, int) const noexcept {
    return {type, 1.0, 1.0, reduce_op::sum};
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
