// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE training.evaluator
#include <cohort/cohort.hpp>

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
