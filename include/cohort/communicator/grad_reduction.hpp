// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>

#include <concepts>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! What a reducer asks of a communicator for gradients of one dtype: the dtype they travel in,
//! the factor applied to each element before the reduction and after it, and the reduction.
//! A strategy casts and scales while it packs and unpacks, so none of this costs a pass of its
//! own over the data.
struct grad_reduction {
  dtype wire = dtype::float32;
  double pre_scale = 1.0;
  double post_scale = 1.0;
  reduce_op op = reduce_op::sum;

  friend constexpr bool operator==(const grad_reduction&, const grad_reduction&) = default;
};

//! A gradient reducer policy (`mean`, `sum`, ...): says, for the gradients of one dtype and a
//! number of ranks, how they are reduced. It lives beside the communicator, which consumes it;
//! the reducers themselves are in `cohort/reducer/`.
template <class R>
concept reducer = std::copy_constructible<R> && requires(const R& r, dtype type, int ranks) {
  { r.plan(type, ranks) } -> std::same_as<grad_reduction>;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
