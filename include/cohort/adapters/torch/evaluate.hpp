// SPDX-License-Identifier: Apache-2.0
#pragma once

// Evaluation over a LibTorch data loader on every rank: each rank measures its own shard, and the
// means are weighted by what each rank measured (allreduce_mean), so that shards of unequal size
// (distributed_sampler's exact partition, without pad) give the mean over every example exactly
// once, as one process evaluating the whole dataset would.

#include <cohort/communicator/concepts.hpp>
#include <cohort/config.hpp>
#include <cohort/training/evaluator.hpp>

#include <concepts>
#include <map>
#include <string>
#include <torch/utils.h>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {
namespace detail {

// What iterating a LibTorch loader yields (its iterator is not a std::input_iterator).
template <class Loader>
using loader_batch_t = decltype(*std::declval<Loader&>().begin());

} // namespace detail

//! The mean of each metric over every rank's batches of `loader` (collective): `metrics(batch,
//! local)` is called for each batch of this rank's loader under `torch::NoGradGuard`, adding to
//! `local` (a batch mean weighted by the batch size, or per-example values), and the ranks'
//! sums are reduced by `cohort::allreduce_mean`. Pass the loader itself (`*loader` for
//! `make_data_loader`'s pointer). With a `distributed_sampler` without `pad` (and without
//! `drop_last`) every example counts exactly once. Throws what `allreduce_mean` throws: metric
//! names that differ across ranks (`mismatch_error`), a metric with no weight anywhere
//! (`invalid_argument`). An exception from `metrics` leaves the other ranks waiting in the
//! reduction: the communicator's timeout ends the job.
template <communicator Communicator, class Loader, class Metrics>
requires std::invocable<Metrics&, detail::loader_batch_t<Loader>, local_metrics&>
    std::map<std::string, double> evaluate(Communicator& comm, Loader& loader, Metrics&& metrics) {
  local_metrics local;
  {
    const ::torch::NoGradGuard no_grad;
    for (auto&& batch : loader) {
      metrics(batch, local);
    }
  }
  return allreduce_mean(comm, local);
}

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
