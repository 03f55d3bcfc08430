// SPDX-License-Identifier: Apache-2.0
#pragma once

// What communicator_base.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/communicator_base.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

COHORT_DECL void communicator_base::barrier() const {
  detail::operation_scope scope("barrier");
  std::array<std::uint64_t, 1> nothing{};
  detail::liveness& live = checks_.live();
  live.allreduce_max(detail::waiter::caller, nothing, "barrier",
                     live.next_sequence(detail::waiter::caller));
}

COHORT_DECL void communicator_base::connect(const boost::mpi::communicator& comm) {
  const detail::watch_scope watch(checks_.live().slot(detail::waiter::caller),
                                  "communicator creation",
                                  checks_.live().sequence(detail::waiter::caller), 0, true);
  comm_ = checked_duplicate(comm);
  layout_ = discover_topology(comm_, options().simulated_ranks_per_node);
  grad_world_ = checked_duplicate(comm_);
  grad_intra_ = checked_duplicate(layout_.intra);
  grad_inter_ = checked_duplicate(layout_.inter);
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
