// SPDX-License-Identifier: Apache-2.0
#pragma once

// Metric reduction: the global mean of a metric over all ranks, weighted by how many samples
// each rank saw, so that uneven shards (an exact evaluation split, a last partial batch) give the
// exact mean over the whole dataset. ChainerMN averaged the ranks' means with equal weights.

#include <cohort/communicator/agreement.hpp>
#include <cohort/communicator/concepts.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Named metrics accumulated on one rank: for each name, a weighted sum and its total weight.
class local_metrics {
public:
  //! Adds `value` (a per-sample value, or a batch mean) with `weight` (1, or the batch size).
  void add(std::string_view name, double value, double weight = 1.0) {
    auto& [sum, total] = sums_[std::string(name)];
    sum += value * weight;
    total += weight;
  }

  //! This rank's own means.
  std::map<std::string, double> means() const {
    std::map<std::string, double> result;
    for (const auto& [name, s] : sums_) {
      result[name] = s.first / s.second;
    }
    return result;
  }

  //! name -> (weighted sum, total weight), in name order.
  const std::map<std::string, std::pair<double, double>>& sums() const noexcept { return sums_; }

private:
  std::map<std::string, std::pair<double, double>> sums_;
};

//! The global mean of each metric: (sum over ranks of weighted sums) / (sum of weights).
//! Collective; every rank must have the same metric names (else `mismatch_error` naming the
//! first that differs). A metric whose total weight is zero on every rank has no mean: throws.
template <communicator Communicator>
std::map<std::string, double> allreduce_mean(Communicator& comm, const local_metrics& metrics) {
  const auto& sums = metrics.sums();
  if (comm.options().check_agreement) {
    detail::fingerprint f;
    f.add(sums.size());
    for (const auto& entry : sums) {
      f.add(entry.first);
    }
    detail::require_agreement(comm.mpi_comm(), "allreduce_mean", f.value(), [&] {
      std::vector<detail::signature_entry> entries;
      for (const auto& entry : sums) {
        entries.push_back({"a metric", "'" + entry.first + "'"});
      }
      return entries;
    });
  }
  std::vector<double> packed;
  packed.reserve(2 * sums.size());
  for (const auto& entry : sums) {
    packed.push_back(entry.second.first);
    packed.push_back(entry.second.second);
  }
  comm.allreduce(packed, reduce_op::sum);
  std::map<std::string, double> result;
  std::size_t i = 0;
  for (const auto& entry : sums) {
    const double weight = packed[i + 1];
    if (weight == 0.0) {
      throw invalid_argument("cohort: allreduce_mean: metric '" + entry.first +
                             "' has no samples on any rank");
    }
    result[entry.first] = packed[i] / weight;
    i += 2;
  }
  return result;
}

//! The global mean of one metric given each rank's mean over `count` samples. Collective.
template <communicator Communicator>
double allreduce_mean(Communicator& comm, double local_mean, std::size_t count) {
  local_metrics metrics;
  metrics.add("value", count == 0 ? 0.0 : local_mean, static_cast<double>(count));
  return allreduce_mean(comm, metrics).at("value");
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
