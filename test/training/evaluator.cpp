// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE training.evaluator
#include <cohort/cohort.hpp>

#include <boost/serialization/vector.hpp>

#include <optional>
#include <stdexcept>
#include <vector>

#include "support/expect.hpp"
#include "support/mpi_test_main.hpp"

using cohort::test::message_has;

BOOST_AUTO_TEST_CASE(uneven_shards_give_the_exact_global_mean) {
  auto comm = cohort::make_communicator<cohort::flat>();
  // Rank r saw r + 1 samples, each of value r: the global mean weights rank r by r + 1.
  cohort::local_metrics metrics;
  for (int i = 0; i <= comm.rank(); ++i) {
    metrics.add("accuracy", comm.rank());
  }
  metrics.add("loss", 2.0 * comm.rank(), comm.rank() + 1.0); // a batch mean with its batch size
  const auto global = cohort::allreduce_mean(comm, metrics);
  double weighted = 0, count = 0;
  for (int r = 0; r < comm.size(); ++r) {
    weighted += static_cast<double>(r) * (r + 1);
    count += r + 1;
  }
  BOOST_TEST(global.at("accuracy") == weighted / count, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(global.at("loss") == 2 * weighted / count, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(metrics.means().at("loss") == 2.0 * comm.rank(), boost::test_tools::tolerance(1e-12));

  // One scalar: a rank with no samples does not count (and alone, there is no mean at all).
  const auto scalar = [&] {
    return cohort::allreduce_mean(comm, comm.rank() == 0 ? 0.0 : 5.0,
                                  comm.rank() == 0 ? std::size_t{0} : std::size_t{3});
  };
  if (comm.size() > 1) {
    BOOST_TEST(scalar() == 5.0);
  } else {
    BOOST_CHECK_EXCEPTION(scalar(), cohort::invalid_argument, message_has({"no samples"}));
  }
}

BOOST_AUTO_TEST_CASE(a_rank_without_samples_contributes_nothing) {
  auto comm = cohort::make_communicator<cohort::flat>();
  // An exact evaluation split of fewer examples than ranks leaves the last rank empty.
  cohort::local_metrics metrics;
  const bool empty = comm.size() > 1 && comm.rank() == comm.size() - 1;
  if (!empty) {
    metrics.add("accuracy", 1.0);
    metrics.add("loss", 0.5);
  }
  const auto global = cohort::allreduce_mean(comm, metrics);
  BOOST_TEST(global.at("accuracy") == 1.0);
  BOOST_TEST(global.at("loss") == 0.5);
  BOOST_TEST(global.size() == 2u);
}

BOOST_AUTO_TEST_CASE(metric_names_must_agree) {
  auto comm = cohort::make_communicator<cohort::flat>();
  cohort::local_metrics metrics;
  metrics.add(comm.rank() == comm.size() - 1 && comm.size() > 1 ? "los" : "loss", 1.0);
  if (comm.size() > 1) {
    BOOST_CHECK_EXCEPTION(cohort::allreduce_mean(comm, metrics), cohort::mismatch_error,
                          message_has({"allreduce_mean", "'loss'", "'los'",
                                       "rank " + std::to_string(comm.size() - 1)}));
  }
  cohort::local_metrics empty_weight;
  empty_weight.add("nothing", 1.0, 0.0);
  BOOST_CHECK_EXCEPTION(cohort::allreduce_mean(comm, empty_weight), cohort::invalid_argument,
                        message_has({"'nothing'", "no samples"}));
}

namespace {
// Evaluations whose mean over the ranks is `means[e]` (each rank off by its own amount, the
// offsets summing to zero), until `stopper` says stop: the evaluation it stopped at (1, 2, ...),
// or 0 if it never did; checked the same on every rank.
int stops_at(cohort::flat& comm, cohort::early_stopping& stopper, const std::vector<double>& means,
             const std::string& name = "loss") {
  const double offset = 0.25 * (comm.rank() - (comm.size() - 1) / 2.0);
  int stopped = 0;
  for (std::size_t e = 0; e < means.size() && stopped == 0; ++e) {
    cohort::local_metrics metrics;
    metrics.add(name, means[e] + offset);
    if (stopper.update(comm, metrics)) {
      stopped = static_cast<int>(e) + 1;
    }
  }
  for (const int theirs : comm.allgather_obj(stopped)) {
    BOOST_TEST_REQUIRE(theirs == stopped, "the ranks stopped at different evaluations");
  }
  return stopped;
}
} // namespace

// Issue 15: an early-stopping trigger every rank agrees on, from the exact cross-rank mean.
BOOST_AUTO_TEST_CASE(early_stopping_decides_the_same_on_every_rank) {
  auto comm = cohort::make_communicator<cohort::flat>();
  {
    // Best 4.0 at evaluation 2; 4.5 and 4.2 do not improve on it: stops at 4 with patience 2.
    cohort::early_stopping stopper({.patience = 2});
    BOOST_TEST(stops_at(comm, stopper, {5.0, 4.0, 4.5, 4.2, 3.0}) == 4);
    BOOST_TEST(stopper.best() == 4.0, boost::test_tools::tolerance(1e-12));
    BOOST_TEST(stopper.best_evaluation() == 2);
    BOOST_TEST(stopper.last() == 4.2, boost::test_tools::tolerance(1e-12));
  }
  {
    // min_delta: 3.98 and 3.97 are within 0.05 of the best (4.0), 3.9 is not.
    cohort::early_stopping stopper({.patience = 3, .min_delta = 0.05});
    BOOST_TEST(stops_at(comm, stopper, {4.0, 3.98, 3.97, 3.9, 3.89, 3.88, 3.87}) == 7);
    BOOST_TEST(stopper.best_evaluation() == 4);
  }
  {
    // An accuracy: larger is better; it keeps improving, so it never stops.
    cohort::early_stopping stopper({.monitor = "accuracy", .maximize = true, .patience = 1});
    BOOST_TEST(stops_at(comm, stopper, {0.5, 0.6, 0.7, 0.8}, "accuracy") == 0);
    BOOST_TEST(stopper.best() == 0.8, boost::test_tools::tolerance(1e-12));
    BOOST_TEST(stops_at(comm, stopper, {0.7}, "accuracy") == 1); // worse, patience 1
  }
  // A metric the evaluation does not have: an error on every rank.
  cohort::early_stopping stopper({.monitor = "accuracy"});
  cohort::local_metrics metrics;
  metrics.add("loss", 1.0);
  BOOST_CHECK_EXCEPTION(stopper.update(comm, metrics), cohort::invalid_argument,
                        message_has({"early_stopping", "no metric 'accuracy'"}));
  BOOST_CHECK_EXCEPTION(cohort::early_stopping({.patience = 0}), cohort::invalid_argument,
                        message_has({"patience must be at least 1 (it is 0)"}));
  BOOST_CHECK_EXCEPTION(cohort::early_stopping({.min_delta = -1.0}), cohort::invalid_argument,
                        message_has({"min_delta"}));
}

// Issue 30, point 2: ranks whose stopping options differ would stop at different evaluations:
// every option is compared, a difference an error on every rank naming it and both values.
BOOST_AUTO_TEST_CASE(early_stopping_options_that_differ_are_an_error_naming_them) {
  auto comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() == 1) {
    return;
  }
  const bool last = comm.rank() == comm.size() - 1;
  cohort::local_metrics metrics;
  metrics.add("loss", 1.0);
  cohort::early_stopping patience({.patience = last ? 3 : 2});
  BOOST_CHECK_EXCEPTION(patience.update(comm, metrics), cohort::mismatch_error,
                        message_has({"early_stopping", "option 'patience'", "has 2 on rank 0 but 3",
                                     "rank " + std::to_string(comm.size() - 1)}));
  cohort::early_stopping delta({.min_delta = last ? 0.1 : 0.0});
  BOOST_CHECK_EXCEPTION(delta.update(comm, metrics), cohort::mismatch_error,
                        message_has({"option 'min_delta'", "0.10000000000000001"}));
  cohort::early_stopping monitor({.monitor = last ? "accuracy" : "loss"});
  BOOST_CHECK_EXCEPTION(monitor.update(comm, metrics), cohort::mismatch_error,
                        message_has({"option 'monitor'", "'accuracy'"}));
  // A root that differs, and a count of evaluations that differs (one rank updated once more).
  cohort::early_stopping same;
  BOOST_CHECK_EXCEPTION(same.update(comm, metrics, last ? 1 : 0), cohort::mismatch_error,
                        message_has({"the root"}));
  auto alone = comm.split(last ? 1 : 0, 0); // (collective: the last rank's own communicator)
  if (last) {
    (void)same.update(alone, metrics);
  }
  BOOST_CHECK_EXCEPTION(same.update(comm, metrics), cohort::mismatch_error,
                        message_has({"the evaluations counted", "0 on rank 0 but 1"}));
}

// Issue 15: ChainerMN's multi-node iterator. Only the root reads (a counter no other rank
// touches); every rank gets its batches, then the end of the epoch, together.
BOOST_AUTO_TEST_CASE(multi_node_iterator_gives_every_rank_the_roots_batches) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const int root = comm.size() - 1;
  int reads = 0;
  auto batches = cohort::make_multi_node_iterator(
      comm,
      [&reads]() -> std::optional<std::vector<int>> {
        if (reads == 3) {
          return std::nullopt;
        }
        ++reads;
        return std::vector<int>(static_cast<std::size_t>(reads), reads * 10);
      },
      root);
  for (int i = 1; i <= 3; ++i) {
    const std::optional<std::vector<int>> batch = batches.next();
    BOOST_TEST_REQUIRE(batch.has_value());
    BOOST_TEST(*batch == std::vector<int>(static_cast<std::size_t>(i), i * 10));
  }
  BOOST_TEST(!batches.next().has_value());
  BOOST_TEST(reads == (comm.rank() == root ? 3 : 0));
}

// The root's reader failing is an error on every rank (the root's own exception there), not a
// rank waiting for a batch that will not come.
BOOST_AUTO_TEST_CASE(a_failing_reader_on_the_root_is_an_error_on_every_rank) {
  auto comm = cohort::make_communicator<cohort::flat>();
  auto batches = cohort::make_multi_node_iterator(
      comm, []() -> std::optional<int> { throw std::runtime_error("disk on fire"); });
  if (comm.rank() == 0) {
    BOOST_CHECK_EXCEPTION(batches.next(), std::runtime_error, message_has({"disk on fire"}));
  } else {
    BOOST_CHECK_EXCEPTION(
        batches.next(), cohort::error,
        message_has({"multi_node_iterator", "root (rank 0) failed: disk on fire"}));
  }
  // The communicator goes on.
  BOOST_TEST(comm.allreduce_obj(1) == comm.size());
}
