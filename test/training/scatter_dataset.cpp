// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE training.scatter_dataset
#include <cohort/cohort.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "support/expect.hpp"
#include "support/mpi_test_main.hpp"

using cohort::test::message_has;

namespace {
std::vector<std::size_t> all_indices(cohort::flat& comm, const cohort::index_shard& shard) {
  std::vector<std::size_t> all;
  for (const auto& part : comm.allgather_obj(shard.indices())) {
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

const std::size_t totals[] = {1, 2, 3, 5, 10, 97};
} // namespace

BOOST_AUTO_TEST_CASE(shard_ranges_follow_chainermn) {
  // force_equal_length: rank i gets [n*i/size, n*i/size + ceil(n/size)).
  BOOST_TEST((cohort::shard_range(10, 4, 1, true) == cohort::index_range{2, 5}));
  BOOST_TEST((cohort::shard_range(10, 4, 3, true) == cohort::index_range{7, 10}));
  BOOST_TEST((cohort::shard_range(2, 4, 1, true) == cohort::index_range{0, 1}));
  BOOST_TEST((cohort::shard_range(2, 4, 3, true) == cohort::index_range{1, 2}));
  // exact: the first n % size ranks get one more.
  BOOST_TEST((cohort::shard_range(10, 3, 0, false) == cohort::index_range{0, 4}));
  BOOST_TEST((cohort::shard_range(10, 3, 2, false) == cohort::index_range{7, 10}));
  BOOST_TEST(cohort::shard_range(0, 3, 2, false).size() == 0u);
}

BOOST_AUTO_TEST_CASE(exact_mode_covers_every_index_once) {
  auto comm = cohort::make_communicator<cohort::flat>();
  for (const bool shuffle : {false, true}) {
    for (const std::size_t n : totals) {
      const auto shard = cohort::scatter_index(
          n, comm, {.shuffle = shuffle, .seed = 7, .force_equal_length = false});
      auto all = all_indices(comm, shard);
      std::sort(all.begin(), all.end());
      std::vector<std::size_t> expected(n);
      std::iota(expected.begin(), expected.end(), std::size_t{0});
      BOOST_TEST_REQUIRE(all == expected, "n = " << n << (shuffle ? " shuffled" : ""));
    }
  }
}

BOOST_AUTO_TEST_CASE(equal_length_mode_has_the_documented_duplicates) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const auto size = static_cast<std::size_t>(comm.size());
  for (const bool shuffle : {false, true}) {
    for (const std::size_t n : totals) {
      const auto shard = cohort::scatter_index(n, comm, {.shuffle = shuffle, .seed = 3});
      const std::size_t length = (n + size - 1) / size;
      BOOST_TEST_REQUIRE(shard.size() == length);
      const auto all = all_indices(comm, shard);
      std::map<std::size_t, int> seen;
      for (const auto i : all) {
        BOOST_TEST_REQUIRE(i < std::max<std::size_t>(n, 1));
        ++seen[i];
      }
      // Every index at least once; size * ceil(n / size) - n duplicates in all.
      BOOST_TEST_REQUIRE(seen.size() == n);
      BOOST_TEST_REQUIRE(all.size() - n == size * length - n);
    }
  }
}

BOOST_AUTO_TEST_CASE(same_seed_same_shards_and_a_new_order_each_epoch) {
  auto comm = cohort::make_communicator<cohort::flat>();
  auto a = cohort::scatter_index(1000, comm, {.shuffle = true, .seed = 42});
  const auto b = cohort::scatter_index(1000, comm, {.shuffle = true, .seed = 42});
  const auto c = cohort::scatter_index(1000, comm, {.shuffle = true, .seed = 43});
  BOOST_TEST(a.indices() == b.indices());
  BOOST_TEST(a.indices() != c.indices());
  const auto first_epoch = a.indices();
  a.set_epoch(1);
  BOOST_TEST(a.indices() != first_epoch);
  a.set_epoch(0);
  BOOST_TEST(a.indices() == first_epoch);

  // The permutation is fixed by the standard's mt19937_64: the same on every platform and run.
  const auto golden = cohort::detail::permutation(10, 42, 0);
  BOOST_TEST(golden == (std::vector<std::size_t>{0, 6, 5, 1, 3, 9, 7, 8, 4, 2}),
             boost::test_tools::per_element());

  // Without a seed the root draws one and every rank uses it.
  const auto unseeded = cohort::scatter_index(50, comm, {.shuffle = true});
  const auto seeds = comm.allgather_obj(unseeded.seed());
  BOOST_TEST(std::all_of(seeds.begin(), seeds.end(), [&](auto s) { return s == seeds[0]; }));
}

BOOST_AUTO_TEST_CASE(ranks_that_disagree_on_the_size_all_get_the_error) {
  auto comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() < 2) {
    return;
  }
  const int last = comm.size() - 1;
  BOOST_CHECK_EXCEPTION(cohort::scatter_index(comm.rank() == last ? 99 : 100, comm),
                        cohort::mismatch_error,
                        message_has({"scatter_index", "100 examples on rank 0",
                                     "99 on rank " + std::to_string(last)}));
  BOOST_CHECK_EXCEPTION(cohort::scatter_index(10, comm, {.root = comm.size()}),
                        cohort::invalid_argument, message_has({"root"}));
}

BOOST_AUTO_TEST_CASE(scatter_dataset_sends_each_rank_its_own_examples) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const int root = comm.size() - 1;
  for (const bool equal : {true, false}) {
    for (const std::size_t n : totals) {
      // Only the root has the data.
      std::vector<std::string> data;
      if (comm.rank() == root) {
        for (std::size_t i = 0; i < n; ++i) {
          data.push_back("example " + std::to_string(i));
        }
      }
      const cohort::scatter_options options{.shuffle = true,
                                            .seed = 11,
                                            .root = root,
                                            .force_equal_length = equal,
                                            .chunk_examples = 3};
      const auto shard = cohort::scatter_dataset(data, comm, options);
      // The same examples as the index split with the same options.
      const auto indices = cohort::scatter_index(n, comm, options);
      BOOST_TEST_REQUIRE(shard.size() == indices.size());
      for (std::size_t i = 0; i < shard.size(); ++i) {
        BOOST_TEST_REQUIRE(shard[i] == "example " + std::to_string(indices[i]));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(scattered_examples_reshuffle_locally) {
  auto comm = cohort::make_communicator<cohort::flat>();
  std::vector<int> data(comm.rank() == 0 ? 400 : 0);
  std::iota(data.begin(), data.end(), 0);
  auto shard = cohort::scatter_dataset(data, comm, {.shuffle = true, .seed = 5});
  std::vector<int> epoch0, epoch1;
  for (std::size_t i = 0; i < shard.size(); ++i) {
    epoch0.push_back(shard[i]);
  }
  shard.set_epoch(1);
  for (std::size_t i = 0; i < shard.size(); ++i) {
    epoch1.push_back(shard[i]);
  }
  BOOST_TEST(epoch0 != epoch1);
  std::sort(epoch0.begin(), epoch0.end());
  std::sort(epoch1.begin(), epoch1.end());
  BOOST_TEST(epoch0 == epoch1);
}

// Issue 10, point 13: an empty dataset is an error on every rank, not 0 examples each.
BOOST_AUTO_TEST_CASE(an_empty_dataset_is_an_error_on_every_rank) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const auto says_empty = message_has({"the dataset on rank 0 (the root) is empty"});
  BOOST_CHECK_EXCEPTION(cohort::scatter_index(0, comm), cohort::invalid_argument, says_empty);
  const std::vector<int> nothing;
  BOOST_CHECK_EXCEPTION(cohort::scatter_dataset(nothing, comm), cohort::invalid_argument,
                        says_empty);
  // Still in step afterwards.
  BOOST_TEST(cohort::scatter_index(4, comm).total() == 4u);
}

// Every epoch a new permutation of the whole dataset, split again: the same on every rank, an
// exact cover each epoch, and a rank's subset changes (DistributedSampler's behaviour).
BOOST_AUTO_TEST_CASE(each_epoch_splits_a_new_global_permutation) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const std::size_t n = 101;
  auto shard =
      cohort::scatter_index(n, comm, {.shuffle = true, .seed = 9, .force_equal_length = false});
  std::vector<std::size_t> first;
  for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
    shard.set_epoch(epoch);
    auto all = all_indices(comm, shard);
    std::sort(all.begin(), all.end());
    std::vector<std::size_t> expected(n);
    std::iota(expected.begin(), expected.end(), std::size_t{0});
    BOOST_TEST_REQUIRE(all == expected, "epoch " << epoch << " is not an exact cover");
    std::vector<std::size_t> mine = shard.indices();
    std::sort(mine.begin(), mine.end());
    if (epoch == 0) {
      first = mine;
    } else if (comm.size() > 1) {
      BOOST_TEST(mine != first, "rank " << comm.rank() << " kept its subset at epoch " << epoch);
    }
  }
}

// Issue 15: the synchronized iterator. Every rank the whole dataset in one order, a new one each
// epoch when shuffling, the same on every rank even without a seed; sizes that differ are an
// error on every rank.
BOOST_AUTO_TEST_CASE(synchronized_index_gives_every_rank_the_same_order) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const std::size_t n = 37;
  auto shuffled = cohort::synchronized_index(n, comm, {.shuffle = true}); // the root's random seed
  const auto in_order = cohort::synchronized_index(n, comm);
  std::vector<std::size_t> expected(n);
  std::iota(expected.begin(), expected.end(), std::size_t{0});
  BOOST_TEST((in_order.indices() == expected));
  std::vector<std::vector<std::size_t>> epochs;
  for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
    shuffled.set_epoch(epoch);
    const std::vector<std::size_t>& mine = shuffled.indices();
    for (const auto& theirs : comm.allgather_obj(mine)) {
      BOOST_TEST_REQUIRE((theirs == mine), "epoch " << epoch << ": the ranks' orders differ");
    }
    std::vector<std::size_t> sorted = mine;
    std::sort(sorted.begin(), sorted.end());
    BOOST_TEST_REQUIRE((sorted == expected), "epoch " << epoch << " is not a permutation");
    epochs.push_back(mine);
  }
  BOOST_TEST((epochs[0] != expected)); // shuffled (37! orders: the identity is not drawn)
  BOOST_TEST((epochs[1] != epochs[0]));
  BOOST_TEST((epochs[2] != epochs[1]));
  if (comm.size() < 2) {
    return;
  }
  const int last = comm.size() - 1;
  BOOST_CHECK_EXCEPTION(cohort::synchronized_index(comm.rank() == last ? 36 : 37, comm),
                        cohort::mismatch_error,
                        message_has({"synchronized_index", "37 examples on rank 0",
                                     "36 on rank " + std::to_string(last)}));
}
