// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE training.sharding
#include <cohort/cohort.hpp>
#include <cohort/training/shard_plan.hpp>

#include <boost/serialization/vector.hpp>

#include <cstddef>
#include <numeric>
#include <string>
#include <vector>

#include "support/expect.hpp"
#include "support/mpi_test_main.hpp"

using cohort::test::message_has;

BOOST_AUTO_TEST_CASE(equal_parameters_balance_exactly) {
  const std::vector<std::size_t> bytes(12, 4096);
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const cohort::shard_plan plan = cohort::balance_shards(bytes, ranks);
    BOOST_TEST(plan.ranks() == ranks);
    for (int r = 0; r < ranks; ++r) {
      BOOST_TEST(plan.load[r] == 12 * 4096 / ranks);
      BOOST_TEST(plan.owned_by(r).size() == 12u / ranks);
    }
    BOOST_TEST(plan.largest_load() == 12u * 4096 / ranks);
  }
}

BOOST_AUTO_TEST_CASE(largest_first_to_the_least_loaded_rank) {
  // 10 -> 0; 7 -> 1; 5 -> 1 (7 < 10); 5 -> 0 (10 < 12); 3 -> 1 (12 < 15): 15 and 15.
  const std::vector<std::size_t> bytes = {5, 10, 3, 7, 5};
  const cohort::shard_plan plan = cohort::balance_shards(bytes, 2);
  BOOST_TEST(plan.owner == (std::vector<int>{1, 0, 1, 1, 0}), boost::test_tools::per_element());
  BOOST_TEST(plan.load == (std::vector<std::size_t>{15, 15}), boost::test_tools::per_element());
  BOOST_TEST(plan.owned_by(0) == (std::vector<std::size_t>{1, 4}),
             boost::test_tools::per_element());
  // The same sizes give the same plan, whatever else (deterministic: ties by position and rank).
  BOOST_TEST(cohort::balance_shards(bytes, 2).owner == plan.owner,
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(more_ranks_than_parameters_and_one_large_parameter) {
  const std::vector<std::size_t> two = {8, 8};
  const cohort::shard_plan plan = cohort::balance_shards(two, 4);
  BOOST_TEST(plan.load == (std::vector<std::size_t>{8, 8, 0, 0}), boost::test_tools::per_element());
  BOOST_TEST(plan.owned_by(3).empty());
  const std::vector<std::size_t> skewed = {100, 1, 1};
  BOOST_TEST(cohort::balance_shards(skewed, 3).largest_load() == 100u);
  BOOST_TEST(cohort::balance_shards(std::vector<std::size_t>{}, 2).owner.empty());
  BOOST_CHECK_EXCEPTION(cohort::balance_shards(two, 0), cohort::invalid_argument,
                        message_has({"balance_shards", "0 ranks"}));
}

BOOST_AUTO_TEST_CASE(every_rank_holds_the_same_plan) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const std::vector<std::string> names = {"fc1.w", "fc1.b", "fc2.w", "fc2.b", "out.w"};
  const std::vector<std::size_t> bytes = {4096, 64, 2048, 32, 1024};
  const cohort::shard_plan plan = cohort::plan_shards(comm, names, bytes, "sharding");
  BOOST_TEST(plan.ranks() == comm.size());
  const auto all = comm.allgather_obj(plan.owner);
  for (const auto& owners : all) {
    BOOST_TEST(owners == plan.owner, boost::test_tools::per_element());
  }
  BOOST_TEST(std::accumulate(plan.load.begin(), plan.load.end(), std::size_t{0}) == 7264u);
}

BOOST_AUTO_TEST_CASE(ranks_that_disagree_on_a_parameter_are_told_on_every_rank) {
  auto comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() < 2) {
    return;
  }
  const std::vector<std::string> names = {"a", "b", "c"};
  const std::vector<std::size_t> bytes = {16, comm.rank() == 1 ? std::size_t{24} : 32, 8};
  BOOST_CHECK_EXCEPTION(
      cohort::plan_shards(comm, names, bytes, "sharded_optimizer"), cohort::mismatch_error,
      message_has({"sharded_optimizer", "parameter 'b'", "32 bytes", "24 bytes", "rank 1"}));
  const std::vector<std::size_t> short_sizes = {16, 32};
  BOOST_CHECK_EXCEPTION(cohort::plan_shards(comm, names, short_sizes, "sharded_optimizer"),
                        cohort::invalid_argument, message_has({"3 parameter names but 2 sizes"}));
}
