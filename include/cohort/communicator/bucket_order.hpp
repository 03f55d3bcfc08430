// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The order a communicator learned the gradients of one layout to become ready in, with
//! overlap, and built that layout's buckets in. Which gradients share a bucket decides how MPI
//! splits each collective, and so, at 3 ranks and more, the order it sums an element's terms in:
//! a checkpoint keeps these orders (`cohort::bucket_orders`) so that a resumed run builds the
//! buckets of the run it continues and computes bit for bit what that run would have.
struct bucket_order {
  std::uint64_t layout = 0;       //!< the layout and reducer (names, sizes, dtypes, scaling)
  std::vector<std::size_t> order; //!< gradient indices, the first bucket's first
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
