// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>

#include <array>
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

//! A gradient reducer policy (`mean`, `sum`, `compressed<float16>`...): says, for the gradients
//! of one dtype and a number of ranks, how they are reduced. The communicator consumes it, so
//! this layer sits below the communicator's.
template <class R>
concept reducer = std::copy_constructible<R> && requires(const R& r, dtype type, int ranks) {
  { r.plan(type, ranks) } -> std::same_as<grad_reduction>;
};

//! A reducer's answers for every dtype at one number of ranks: the form in which a reducer
//! reaches the gradient-sync engine, which is then compiled once whatever the reducer's type.
class reduction_table {
public:
  template <reducer Reducer>
  constexpr reduction_table(const Reducer& reducer, int ranks) {
    for (const dtype type : all_dtypes) {
      plans_[dtype_index(type)] = reducer.plan(type, ranks);
    }
  }

  constexpr const grad_reduction& operator()(dtype type) const noexcept {
    return plans_[dtype_index(type)];
  }

  friend constexpr bool operator==(const reduction_table&, const reduction_table&) = default;

private:
  std::array<grad_reduction, dtype_count> plans_{};
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
