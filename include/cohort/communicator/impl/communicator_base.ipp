// SPDX-License-Identifier: Apache-2.0
#pragma once

// What communicator_base.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/communicator_base.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

COHORT_DECL communicator_base::~communicator_base() = default;

COHORT_DECL void communicator_base::barrier() const {
  detail::operation_scope scope("barrier");
  std::array<std::uint64_t, 1> nothing{};
  engine::liveness& live = checks_.live();
  live.allreduce_max(engine::waiter::caller, nothing, "barrier",
                     live.next_sequence(engine::waiter::caller));
}

COHORT_DECL void communicator_base::connect(const boost::mpi::communicator& comm) {
  const detail::watch_scope watch(checks_.live().slot(engine::waiter::caller),
                                  "communicator creation",
                                  checks_.live().sequence(engine::waiter::caller), 0, true);
  comm_ = checked_duplicate(comm);
  layout_ = discover_topology(comm_, options().simulated_ranks_per_node);
  grad_world_ = checked_duplicate(comm_);
  grad_intra_ = checked_duplicate(layout_.intra);
  grad_inter_ = checked_duplicate(layout_.inter);
}

COHORT_DECL MPI_Comm communicator_base::split_comm(int color, int key) const {
  detail::operation_scope scope("split");
  const std::string problem = engine::local_checks([&] {
    if (color < 0) {
      throw invalid_argument("cohort: split on rank " + std::to_string(rank()) +
                             ": color must be >= 0, not " + std::to_string(color));
    }
  });
  checks_.settle("split", detail::fingerprint{}.value(), nullptr, problem);
  MPI_Comm part = MPI_COMM_NULL;
  const auto watch = checks_.watch_transfer("split", 0);
  mpi::check(MPI_Comm_split(mpi_comm(), color, key, &part), "MPI_Comm_split", mpi_comm());
  return part;
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
