// SPDX-License-Identifier: Apache-2.0
#pragma once

// What a rank passed to a collective, item by item, and the message that names the first item on
// which the ranks differ: what the checks' front door needs of the agreement (agreement.hpp)
// without its templates or the liveness under them.

#include <cohort/config.hpp>
#include <cohort/tensor/dtype.hpp>

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! One item of what a rank passes to a collective: a label ("parameter 'fc1.w'", "tensor") and a
//! description of what it is on this rank ("100 float32 elements").
struct signature_entry {
  std::string label;
  std::string description;
};

//! What a rank passed to a collective, item by item: asked for only when the ranks' fingerprints
//! differ, to name what differs. Made from a reference to the caller's callable (std::ref), so
//! that no call allocates for it.
using describe_fn = std::function<std::vector<signature_entry>()>;

//! The message from every rank's full description: the first item on which some rank differs
//! from the reference rank (the lowest, unless told), with both sides.
COHORT_DECL std::string describe_mismatch(std::string_view operation,
                                          const std::vector<std::vector<signature_entry>>& all,
                                          std::size_t reference_rank = 0);

//! "N dtype elements", the description of a tensor in messages.
COHORT_DECL std::string describe_tensor(std::size_t count, dtype type);

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/engine/impl/signature.ipp>
#endif
