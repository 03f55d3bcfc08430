// SPDX-License-Identifier: Apache-2.0
#pragma once

// Which rank owns which parameter when the optimizer's state is sharded (ZeRO): whole
// parameters, balanced by bytes, largest first, each to the rank that owns the fewest bytes so
// far (PyTorch's ZeroRedundancyOptimizer balances so too, by elements, per parameter group). Whole
// parameters, because an optimizer steps whole tensors (LibTorch's cannot step a slice of one).
// The plan is a pure function of the sizes, so ranks that agree on the parameters (names and
// sizes, checked by plan_shards) hold the same plan without sending it.

#include <cohort/communicator/agreement.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! The owner of every parameter (in the parameter set's order) and the bytes each rank owns.
struct shard_plan {
  std::vector<int> owner;
  std::vector<std::size_t> load;

  int ranks() const noexcept { return static_cast<int>(load.size()); }

  //! The parameters `rank` owns, in the set's order.
  std::vector<std::size_t> owned_by(int rank) const {
    std::vector<std::size_t> owned;
    for (std::size_t i = 0; i < owner.size(); ++i) {
      if (owner[i] == rank) {
        owned.push_back(i);
      }
    }
    return owned;
  }

  //! The most bytes a rank owns: what sharding leaves of the largest shard (ideally the total
  //! over the ranks; one parameter larger than that sets it).
  std::size_t largest_load() const noexcept {
    return load.empty() ? 0 : *std::max_element(load.begin(), load.end());
  }
};

//! The plan for parameters of `bytes` each over `ranks` ranks: largest first (ties: the earlier
//! parameter), each to the rank owning the fewest bytes (ties: the lowest rank). Deterministic.
//! Throws `invalid_argument` unless `ranks` is at least 1.
inline shard_plan balance_shards(std::span<const std::size_t> bytes, int ranks) {
  if (ranks < 1) {
    throw invalid_argument("cohort: balance_shards: " + std::to_string(ranks) +
                           " ranks; at least 1 is needed");
  }
  shard_plan plan{std::vector<int>(bytes.size(), 0),
                  std::vector<std::size_t>(static_cast<std::size_t>(ranks), 0)};
  std::vector<std::size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return bytes[a] > bytes[b]; });
  for (const std::size_t i : order) {
    const auto least = std::min_element(plan.load.begin(), plan.load.end());
    plan.owner[i] = static_cast<int>(least - plan.load.begin());
    *least += bytes[i];
  }
  return plan;
}

//! The plan every rank of `comm` holds for the parameters `names` of `bytes` each: the ranks
//! first agree on both (one 16-byte all-reduce; ranks that differ throw, every one, the same
//! `mismatch_error` naming `operation` and the first parameter that differs, with both sides),
//! then each computes the same balance_shards. Collective. Throws `invalid_argument` (on every
//! rank alike) when the two lists differ in length.
template <class Communicator>
shard_plan plan_shards(Communicator& comm, std::span<const std::string> names,
                       std::span<const std::size_t> bytes, const char* operation) {
  if (names.size() != bytes.size()) {
    throw invalid_argument(std::string("cohort: ") + operation + ": " +
                           std::to_string(names.size()) + " parameter names but " +
                           std::to_string(bytes.size()) + " sizes");
  }
  std::vector<setting> layout;
  layout.reserve(names.size() + 1);
  layout.push_back({"parameters", std::to_string(names.size())});
  for (std::size_t i = 0; i < names.size(); ++i) {
    layout.push_back({"parameter '" + names[i] + "'", std::to_string(bytes[i]) + " bytes"});
  }
  agree_on_settings(comm, layout, operation);
  return balance_shards(bytes, comm.size());
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
