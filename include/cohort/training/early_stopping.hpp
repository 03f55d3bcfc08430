// SPDX-License-Identifier: Apache-2.0
#pragma once

// An early-stopping trigger that every rank agrees on (ChainerMN's trigger over its aggregated
// observations): the monitored metric is the exact mean over every rank's samples
// (allreduce_mean), and the value the decision is taken on is the root's, sent to every rank, so
// that all of them stop at the same evaluation even where an all-reduce leaves the ranks' last bits
// different (MPI does not promise the same bits everywhere).

#include <cohort/communicator/agreement.hpp>
#include <cohort/communicator/concepts.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/training/evaluator.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

struct early_stopping_options {
  //! The metric watched, a name given to `local_metrics::add` on every rank.
  std::string monitor = "loss";
  //! Whether a larger value is better (an accuracy), else a smaller one (a loss).
  bool maximize = false;
  //! Evaluations in a row without improvement after which training stops.
  int patience = 3;
  //! The least change from the best value so far that counts as an improvement.
  double min_delta = 0.0;
};

//! Call `update` after each evaluation, on every rank; it says whether to stop, the same on every
//! rank.
class early_stopping {
public:
  explicit early_stopping(early_stopping_options options = {})
      : options_(std::move(options)) {
    if (options_.patience < 1 || !(options_.min_delta >= 0.0)) {
      throw invalid_argument("cohort: early_stopping: patience must be at least 1 (it is " +
                             std::to_string(options_.patience) +
                             ") and min_delta a number >= 0 (it is " +
                             std::to_string(options_.min_delta) + ")");
    }
  }

  //! Collective. The monitored metric's mean over every rank's samples, the root's value taken
  //! everywhere; true when it has not improved for `patience` evaluations in a row. A metric
  //! missing from the evaluation (on every rank alike, since allreduce_mean agrees on the names)
  //! throws `invalid_argument` on every rank; a value that is not a number throws too.
  //!
  //! Every rank must hold the same options, pass the same `root` and have counted the same
  //! evaluations: the ranks compare them first, and a difference (patience 2 on one rank and 3 on
  //! another, which would stop them at different evaluations) is a `mismatch_error` on every
  //! rank naming the option and both values.
  template <communicator Communicator>
  bool update(Communicator& comm, const local_metrics& metrics, int root = 0) {
    agree_on_settings(
        comm,
        {{"option 'monitor'", "'" + options_.monitor + "'"},
         {"option 'maximize'", options_.maximize ? "true" : "false"},
         {"option 'patience'", std::to_string(options_.patience)},
         {"option 'min_delta'", exact_text(options_.min_delta)},
         {"the root", std::to_string(root)},
         {"the evaluations counted", std::to_string(evaluations_)},
         {"the evaluations without improvement", std::to_string(without_improvement_)}},
        "early_stopping");
    const std::map<std::string, double> means = allreduce_mean(comm, metrics);
    const auto found = means.find(options_.monitor);
    if (found == means.end()) {
      throw invalid_argument("cohort: early_stopping on rank " + std::to_string(comm.rank()) +
                             ": the evaluation has no metric '" + options_.monitor + "'");
    }
    std::vector<double> value{found->second};
    comm.broadcast(value, root);
    if (std::isnan(value[0])) {
      throw invalid_argument("cohort: early_stopping on rank " + std::to_string(comm.rank()) +
                             ": metric '" + options_.monitor + "' is not a number");
    }
    last_ = value[0];
    ++evaluations_;
    const double gain = options_.maximize ? last_ - best_ : best_ - last_;
    if (evaluations_ == 1 || gain > options_.min_delta) {
      best_ = last_;
      best_evaluation_ = evaluations_;
      without_improvement_ = 0;
    } else {
      ++without_improvement_;
    }
    return without_improvement_ >= options_.patience;
  }

  //! The best value so far, and the evaluation (1, 2, ...) that gave it.
  double best() const noexcept { return best_; }
  int best_evaluation() const noexcept { return best_evaluation_; }
  //! The last value, and how many evaluations in a row have not improved on the best.
  double last() const noexcept { return last_; }
  int evaluations_without_improvement() const noexcept { return without_improvement_; }
  const early_stopping_options& options() const noexcept { return options_; }

private:
  early_stopping_options options_;
  double best_ = std::numeric_limits<double>::quiet_NaN();
  double last_ = std::numeric_limits<double>::quiet_NaN();
  int evaluations_ = 0;
  int best_evaluation_ = 0;
  int without_improvement_ = 0;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
