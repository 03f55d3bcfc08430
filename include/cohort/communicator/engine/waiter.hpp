// SPDX-License-Identifier: Apache-2.0
#pragma once

// Which thread waits at a rendezvous (liveness.hpp), named by the checks without the liveness.

#include <cohort/config.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! The two threads that may wait on one communicator at once: the caller's, and cohort's own
//! reduction thread (overlap). Each has a rendezvous channel and a watch slot of its own.
enum class waiter : unsigned char { caller, reducer };

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
