// SPDX-License-Identifier: Apache-2.0
#pragma once

// What communicator_base.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/communicator_base.hpp>
#include <cohort/communicator/engine/liveness.hpp>
#include <cohort/detail/fingerprint.hpp>
#include <cohort/trace/recorder.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

COHORT_DECL communicator_base::~communicator_base() = default;

COHORT_DECL std::filesystem::path communicator_base::trace_file() const {
  return traced() ? checks_.trace_file()->file() : std::filesystem::path();
}

COHORT_DECL void communicator_base::set_trace_recording(bool on) const noexcept {
  if (checks_.trace_file() != nullptr) {
    checks_.trace_file()->set_recording(on);
  }
}

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

COHORT_DECL void communicator_base::broadcast_each(std::span<const tensor_view> values,
                                                   std::span<const int> roots) {
  constexpr const char* operation = "broadcast_each";
  detail::operation_scope scope(operation);
  const auto where = [&] {
    return "cohort: broadcast_each on rank " + std::to_string(rank()) + ": ";
  };
  std::size_t bytes = 0;
  detail::fingerprint f;
  f.add(operation).add(values.size());
  const std::string problem = engine::local_checks([&] {
    if (values.size() != roots.size()) {
      throw invalid_argument(where() + std::to_string(values.size()) + " values but " +
                             std::to_string(roots.size()) + " roots");
    }
    for (std::size_t i = 0; i < values.size(); ++i) {
      checks_.require_location(values[i].location, false, operation);
      checks_.check_root(roots[i], operation);
      f.add(values[i].count).add(static_cast<std::uint64_t>(values[i].type));
      f.add(static_cast<std::uint64_t>(roots[i]));
      bytes += values[i].size_bytes();
    }
    // Two copies into one byte from different roots would race inside MPI.
    std::vector<std::size_t> by_address(values.size());
    std::iota(by_address.begin(), by_address.end(), std::size_t{0});
    const auto begin = [&](std::size_t i) { return static_cast<const std::byte*>(values[i].data); };
    std::sort(by_address.begin(), by_address.end(),
              [&](std::size_t a, std::size_t b) { return std::less<>()(begin(a), begin(b)); });
    for (std::size_t k = 1; k < by_address.size(); ++k) {
      const std::size_t a = by_address[k - 1];
      const std::size_t b = by_address[k];
      if (values[a].size_bytes() != 0 && values[b].size_bytes() != 0 &&
          std::less<>()(begin(b), begin(a) + values[a].size_bytes())) {
        throw invalid_argument(where() + "values " + std::to_string(std::min(a, b)) + " and " +
                               std::to_string(std::max(a, b)) + " overlap in memory");
      }
    }
  });
  checks_.settle(
      operation, f.value(),
      [&] {
        std::vector<engine::signature_entry> described;
        described.push_back({"values", std::to_string(values.size())});
        for (std::size_t i = 0; i < values.size() && i < roots.size(); ++i) {
          described.push_back({"value " + std::to_string(i),
                               engine::describe_tensor(values[i].count, values[i].type) +
                                   " from rank " + std::to_string(roots[i])});
        }
        return described;
      },
      problem, bytes);
  const auto watch = checks_.watch_transfer(operation, bytes);
  // Once the ranks agreed, a copy this rank fails to start or finish leaves the others in theirs:
  // the job ends instead of hanging.
  checks_.fatal_on_failure(operation, [&] {
    copies_.clear(); // (what a failed call on one rank left)
    if (layout_.nodes_alike && inter_size() > 1 && intra_size() > 1) {
      return broadcast_each_across_nodes(values, roots);
    }
    for (std::size_t i = 0; i < values.size(); ++i) {
      copies_.push_back(mpi::ibroadcast(comm_, values[i], roots[i]));
    }
    wait_for_copies();
  });
}

COHORT_DECL void communicator_base::broadcast_each_across_nodes(std::span<const tensor_view> values,
                                                                std::span<const int> roots) {
  // One broadcast over every rank follows MPI's tree, numbered from the root, which may cross
  // between two nodes more than once (on 2 nodes of 2 ranks, 4 copies of 4 MiB took 223 ms that
  // way and 75 ms in two waves: bench/results/multihost-owners-2x2.txt). Here each value
  // crosses to each other node once: first among the ranks of its root's intra_rank
  // (one a node, inter_comm), then from that rank to the rest of its node (intra_comm); a value
  // whose root is on this node spreads inside it at once.
  const auto& placement = layout_.placement;
  const auto root_of = [&](std::size_t i) { return placement[static_cast<std::size_t>(roots[i])]; };
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto [intra, inter] = root_of(i);
    if (intra == intra_rank()) { // (the root among them)
      copies_.push_back(mpi::ibroadcast(inter_comm(), values[i], inter));
    }
    if (inter == inter_rank()) {
      copies_.push_back(mpi::ibroadcast(intra_comm(), values[i], intra));
    }
  }
  wait_for_copies();
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto [intra, inter] = root_of(i);
    if (inter != inter_rank()) {
      copies_.push_back(mpi::ibroadcast(intra_comm(), values[i], intra));
    }
  }
  wait_for_copies();
}

COHORT_DECL void communicator_base::wait_for_copies() {
  for (mpi::request& copy : copies_) {
    copy.wait();
  }
  copies_.clear(); // (the capacity stays)
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
