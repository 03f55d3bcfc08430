// SPDX-License-Identifier: Apache-2.0
// The data side of a LibTorch trainer, part of the adapters.torch suite (its main() is
// torch.cpp's) and run alone at 4 ranks too (adapters.torch_sampler.np4): distributed_sampler
// under LibTorch's own data loader (every example once per epoch across the ranks, the same batch
// count on every rank, the errors where that cannot be), evaluate() over such a loader against
// the mean over the whole dataset, and seeds per rank.

// (Compiled with -Wno-maybe-uninitialized under GCC: test/CMakeLists.txt says why.)

#include <cohort/adapters/torch.hpp>
#include <cohort/cohort.hpp>

#include <boost/serialization/vector.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <torch/torch.h>
#include <vector>

#include "support/expect.hpp"

using cohort::test::message_has;

namespace {

namespace ctorch = cohort::torch;

// N examples whose target is their index (and whose data is the index, twice).
class indexed_dataset : public torch::data::datasets::Dataset<indexed_dataset> {
public:
  explicit indexed_dataset(std::size_t size)
      : size_(size) {}
  torch::data::Example<> get(std::size_t index) override {
    return {torch::full({2}, static_cast<double>(index)),
            torch::tensor(static_cast<std::int64_t>(index))};
  }
  torch::optional<std::size_t> size() const override { return size_; }

private:
  std::size_t size_;
};

// One epoch's batches, each as its examples' indices.
using epoch_batches = std::vector<std::vector<std::size_t>>;

// A loader over `n` indexed examples; it takes its own copy of `sampler`.
auto loader_of(std::size_t n, const ctorch::distributed_sampler& sampler, std::size_t batch_size,
               bool drop_last = false) {
  return torch::data::make_data_loader(
      indexed_dataset(n), sampler, torch::data::DataLoaderOptions(batch_size).drop_last(drop_last));
}

// One pass over `loader`: its begin() starts the sampler's next epoch.
template <class Loader>
epoch_batches one_epoch(Loader& loader) {
  epoch_batches epoch;
  for (auto& batch : loader) {
    std::vector<std::size_t> indices;
    for (const auto& example : batch) {
      indices.push_back(static_cast<std::size_t>(example.target.template item<std::int64_t>()));
    }
    epoch.push_back(std::move(indices));
  }
  return epoch;
}

// One epoch drawn from the sampler itself, as the loader would.
epoch_batches one_epoch(ctorch::distributed_sampler& sampler, std::size_t batch_size) {
  sampler.reset();
  epoch_batches epoch;
  while (auto batch = sampler.next(batch_size)) {
    epoch.push_back(*batch);
  }
  return epoch;
}

std::vector<std::size_t> flattened(const epoch_batches& epoch) {
  std::vector<std::size_t> all;
  for (const auto& batch : epoch) {
    all.insert(all.end(), batch.begin(), batch.end());
  }
  return all;
}

// Every rank's epoch, in rank order (collective).
template <class Communicator>
std::vector<epoch_batches> every_ranks(Communicator& comm, const epoch_batches& mine) {
  return comm.allgather_obj(mine);
}

// Every rank yields `count` non-empty batches of at most `batch_size` (so the ranks step
// together), and across the ranks every example of 0..n-1 comes exactly once.
void check_exactly_once(const std::vector<epoch_batches>& ranks, std::size_t n,
                        std::size_t batch_size, std::size_t count) {
  std::vector<std::size_t> all;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    BOOST_TEST_CONTEXT("rank " << r) {
      BOOST_TEST(ranks[r].size() == count);
      for (const auto& batch : ranks[r]) {
        BOOST_TEST(!batch.empty());
        BOOST_TEST(batch.size() <= batch_size);
      }
      const auto mine = flattened(ranks[r]);
      all.insert(all.end(), mine.begin(), mine.end());
    }
  }
  std::sort(all.begin(), all.end());
  std::vector<std::size_t> expected(n);
  std::iota(expected.begin(), expected.end(), std::size_t{0});
  BOOST_TEST(all == expected, boost::test_tools::per_element());
}

// The global order of an epoch: rank 0's examples, then rank 1's...
std::vector<std::size_t> global_order(const std::vector<epoch_batches>& ranks) {
  std::vector<std::size_t> order;
  for (const auto& epoch : ranks) {
    const auto mine = flattened(epoch);
    order.insert(order.end(), mine.begin(), mine.end());
  }
  return order;
}

std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

} // namespace

BOOST_AUTO_TEST_SUITE(distributed_sampler)

BOOST_AUTO_TEST_CASE(every_example_once_per_epoch_and_the_same_batch_count_on_every_rank) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const auto ranks = static_cast<std::size_t>(comm.size());
  constexpr std::size_t batch = 4;
  // Divisible by ranks * batch, one more, one rank short, shards of exactly 2 batches but rank
  // 0's, one example per rank, and sizes with no relation to either.
  for (const std::size_t n : {3 * ranks * batch, 3 * ranks * batch + 1, 3 * ranks * batch - 1,
                              2 * ranks * batch + 1, ranks, std::size_t{37}, std::size_t{101}}) {
    BOOST_TEST_CONTEXT("n = " << n) {
      // Without a seed: the root's random one, which every rank must use.
      const ctorch::distributed_sampler sampler(comm, n);
      const std::size_t count = ceil_div(ceil_div(n, ranks), batch);
      BOOST_TEST(sampler.batches(batch) == count);
      BOOST_TEST(sampler.size() == cohort::shard_range(n, comm.size(), comm.rank(), false).size());
      auto loader = loader_of(n, sampler, batch);
      for (int epoch = 0; epoch < 3; ++epoch) {
        BOOST_TEST_CONTEXT("epoch " << epoch) {
          check_exactly_once(every_ranks(comm, one_epoch(*loader)), n, batch, count);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_shard_of_one_batch_less_still_yields_as_many_non_empty_batches) {
  auto comm = cohort::make_communicator<cohort::flat>();
  constexpr std::size_t batch = 4;
  // Rank 0's shard: 2 batches and one example (3 batches); every other rank's: exactly 2 batches,
  // which it hands out as 4, 2, 2 (never a last batch of one where two can share: BatchNorm
  // refuses a batch of 1 in training, on that rank alone); rank 0's, as 4, 3, 2 likewise.
  const std::size_t n = 2 * batch * static_cast<std::size_t>(comm.size()) + 1;
  const ctorch::distributed_sampler sampler(comm, n, {.seed = 3});
  auto loader = loader_of(n, sampler, batch);
  for (int epoch = 0; epoch < 2; ++epoch) {
    const auto mine = one_epoch(*loader);
    std::vector<std::size_t> sizes;
    for (const auto& b : mine) {
      sizes.push_back(b.size());
    }
    const std::vector<std::size_t> expected =
        comm.rank() == 0 ? std::vector<std::size_t>{4, 3, 2} : std::vector<std::size_t>{4, 2, 2};
    BOOST_TEST(sizes == expected, boost::test_tools::per_element());
    check_exactly_once(every_ranks(comm, mine), n, batch, 3);
  }
}

BOOST_AUTO_TEST_CASE(each_epoch_a_new_permutation_the_same_for_a_seed) {
  auto comm = cohort::make_communicator<cohort::flat>();
  constexpr std::size_t n = 64;
  constexpr std::size_t batch = 4;
  const ctorch::distributed_sampler seeded(comm, n, {.seed = 42});
  const ctorch::distributed_sampler again(comm, n, {.seed = 42});
  const ctorch::distributed_sampler other(comm, n, {.seed = 43});
  auto a = loader_of(n, seeded, batch);
  auto b = loader_of(n, again, batch);
  auto c = loader_of(n, other, batch);
  const auto a0 = every_ranks(comm, one_epoch(*a));
  const auto a1 = every_ranks(comm, one_epoch(*a));
  const auto b0 = every_ranks(comm, one_epoch(*b));
  const auto b1 = every_ranks(comm, one_epoch(*b));
  const auto c0 = every_ranks(comm, one_epoch(*c));
  const std::size_t count = ceil_div(ceil_div(n, static_cast<std::size_t>(comm.size())), batch);
  for (const auto* epoch : {&a0, &a1, &c0}) {
    check_exactly_once(*epoch, n, batch, count);
  }
  BOOST_TEST((a0 == b0));
  BOOST_TEST((a1 == b1));
  BOOST_TEST((global_order(a0) != global_order(a1)));
  BOOST_TEST((global_order(a0) != global_order(c0)));

  // Without shuffling: each rank its own contiguous range, in order, every epoch.
  const ctorch::distributed_sampler in_order(comm, n, {.shuffle = false});
  auto d = loader_of(n, in_order, batch);
  const auto range = cohort::shard_range(n, comm.size(), comm.rank(), false);
  std::vector<std::size_t> expected(range.size());
  std::iota(expected.begin(), expected.end(), range.begin);
  for (int epoch = 0; epoch < 2; ++epoch) {
    BOOST_TEST(flattened(one_epoch(*d)) == expected, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(set_epoch_starts_that_epoch_and_load_carries_on_mid_epoch) {
  auto comm = cohort::make_communicator<cohort::flat>();
  constexpr std::size_t n = 50;
  constexpr std::size_t batch = 4;
  ctorch::distributed_sampler first(comm, n, {.seed = 7});
  BOOST_TEST(first.epoch() == 0u);
  auto loader = loader_of(n, first, batch);
  const auto e0 = one_epoch(*loader);
  one_epoch(*loader);
  const auto e2 = one_epoch(*loader);

  ctorch::distributed_sampler resumed(comm, n, {.seed = 7});
  resumed.set_epoch(2);
  BOOST_TEST(resumed.epoch() == 2u);
  auto resumed_loader = loader_of(n, resumed, batch);
  BOOST_TEST((one_epoch(*resumed_loader) == e2));

  // Two batches into epoch 0, saved; a sampler made without a seed (another one) loads it and
  // hands out the rest of epoch 0, then epoch 1, as the saved one does.
  ctorch::distributed_sampler saved(comm, n, {.seed = 7});
  saved.reset();
  const epoch_batches head{*saved.next(batch), *saved.next(batch)};
  torch::serialize::OutputArchive archive;
  saved.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  epoch_batches rest;
  while (auto b = saved.next(batch)) {
    rest.push_back(*b);
  }
  epoch_batches whole = head;
  whole.insert(whole.end(), rest.begin(), rest.end());
  BOOST_TEST((whole == e0));

  ctorch::distributed_sampler loaded(comm, n);
  std::istringstream input(bytes.str());
  torch::serialize::InputArchive in;
  in.load_from(input);
  loaded.load(in);
  BOOST_TEST(loaded.epoch() == 0u);
  loaded.reset(); // carries on where the saved one was
  epoch_batches carried;
  while (auto b = loaded.next(batch)) {
    carried.push_back(*b);
  }
  BOOST_TEST((carried == rest));
  BOOST_TEST((one_epoch(loaded, batch) == one_epoch(saved, batch)));

  // A state saved for another dataset is refused by name.
  ctorch::distributed_sampler bigger(comm, n + 1);
  std::istringstream again(bytes.str());
  torch::serialize::InputArchive in_again;
  in_again.load_from(again);
  BOOST_CHECK_EXCEPTION(bigger.load(in_again), cohort::invalid_argument,
                        message_has({"50 examples", "51"}));
}

BOOST_AUTO_TEST_CASE(pad_gives_every_rank_the_same_share_repeating_only_the_padding) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const auto ranks = static_cast<std::size_t>(comm.size());
  constexpr std::size_t batch = 4;
  for (const std::size_t n : {2 * ranks * batch + 1, ranks * batch, std::size_t{37}}) {
    BOOST_TEST_CONTEXT("n = " << n) {
      const ctorch::distributed_sampler sampler(comm, n, {.pad = true});
      const std::size_t share = ceil_div(n, ranks);
      BOOST_TEST(sampler.size() == share);
      auto loader = loader_of(n, sampler, batch);
      for (int epoch = 0; epoch < 2; ++epoch) {
        const auto all = every_ranks(comm, one_epoch(*loader));
        std::map<std::size_t, std::size_t> seen;
        for (const auto& epoch_of_rank : all) {
          BOOST_TEST(epoch_of_rank.size() == ceil_div(share, batch));
          const auto mine = flattened(epoch_of_rank);
          BOOST_TEST(mine.size() == share);
          for (const std::size_t i : mine) {
            ++seen[i];
          }
        }
        BOOST_TEST(seen.size() == n);
        BOOST_TEST(seen.rbegin()->first == n - 1);
        std::size_t repeats = 0;
        for (const auto& [index, times] : seen) {
          repeats += times - 1;
        }
        BOOST_TEST(repeats == ranks * share - n);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(drop_last_yields_only_full_batches_the_same_count_everywhere) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const auto ranks = static_cast<std::size_t>(comm.size());
  constexpr std::size_t batch = 4;
  for (const std::size_t n : {2 * ranks * batch + ranks + 1, 3 * ranks * batch, std::size_t{37}}) {
    BOOST_TEST_CONTEXT("n = " << n) {
      const ctorch::distributed_sampler sampler(comm, n, {.drop_last = true});
      const std::size_t count = (n / ranks) / batch;
      BOOST_TEST(sampler.batches(batch) == count);
      auto loader = loader_of(n, sampler, batch, /*drop_last=*/true);
      const auto all = every_ranks(comm, one_epoch(*loader));
      std::set<std::size_t> seen;
      for (const auto& epoch_of_rank : all) {
        BOOST_TEST(epoch_of_rank.size() == count);
        for (const auto& b : epoch_of_rank) {
          BOOST_TEST(b.size() == batch);
          for (const std::size_t i : b) {
            BOOST_TEST(i < n);
            BOOST_TEST(seen.insert(i).second); // no example twice
          }
        }
      }
    }
  }
  // Fewer examples on a rank than one batch holds: no rank would have a batch.
  const ctorch::distributed_sampler tiny(comm, ranks * (batch - 1), {.drop_last = true});
  BOOST_CHECK_EXCEPTION(tiny.batches(batch), cohort::invalid_argument,
                        message_has({"drop_last = true", "no rank has a full batch",
                                     "at most " + std::to_string(batch - 1)}));
}

BOOST_AUTO_TEST_CASE(shards_that_cannot_yield_as_many_batches_are_a_clear_error) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const auto ranks = static_cast<std::size_t>(comm.size());
  const std::string here = "on rank " + std::to_string(comm.rank());
  if (ranks == 1) {
    const ctorch::distributed_sampler whole(comm, 5);
    BOOST_TEST(whole.batches(1) == 5u);
    return;
  }
  const std::string last = std::to_string(ranks - 1);
  // Batch size 1 with uneven shards: rank 0 has 4 examples, so 4 batches, and the others 3.
  const std::size_t n = 3 * ranks + 1;
  const ctorch::distributed_sampler uneven(comm, n);
  const auto names_it = message_has(
      {here, "4 examples (rank 0)", "3 examples (rank " + last, "pad = true", "drop_last = true"});
  BOOST_CHECK_EXCEPTION(uneven.batches(1), cohort::invalid_argument, names_it);
  auto loader = loader_of(n, uneven, 1);
  BOOST_CHECK_EXCEPTION(one_epoch(*loader), cohort::invalid_argument, names_it);
  BOOST_CHECK_EXCEPTION(uneven.batches(0), cohort::invalid_argument,
                        message_has({here, "batch size is 0"}));

  // Either fix works.
  const ctorch::distributed_sampler padded(comm, n, {.pad = true});
  auto padded_loader = loader_of(n, padded, 1);
  BOOST_TEST(one_epoch(*padded_loader).size() == 4u);
  const ctorch::distributed_sampler dropped(comm, n, {.drop_last = true});
  auto dropped_loader = loader_of(n, dropped, 1, /*drop_last=*/true);
  BOOST_TEST(one_epoch(*dropped_loader).size() == 3u);

  // Fewer examples than ranks: the last rank has none.
  const ctorch::distributed_sampler scarce(comm, ranks - 1);
  BOOST_CHECK_EXCEPTION(scarce.batches(4), cohort::invalid_argument,
                        message_has({here, "0 examples (rank " + last, "pad = true"}));
}

BOOST_AUTO_TEST_CASE(a_size_that_differs_across_ranks_is_a_mismatch_on_every_rank) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const bool last = comm.rank() == comm.size() - 1;
  const std::string last_rank = std::to_string(comm.size() - 1);
  constexpr std::size_t batch = 4;
  if (comm.size() > 1) {
    BOOST_CHECK_EXCEPTION(
        (void)ctorch::distributed_sampler(comm, last ? std::size_t{21} : std::size_t{20}),
        cohort::mismatch_error,
        message_has({"distributed_sampler", "20 examples", "21 on rank " + last_rank}));
    BOOST_CHECK_EXCEPTION((void)ctorch::distributed_sampler(comm, 20, {.pad = last}),
                          cohort::mismatch_error, message_has({"option 'pad'"}));
  }
  ctorch::distributed_sampler sampler(comm, 20);
  if (comm.size() > 1) {
    BOOST_CHECK_EXCEPTION(sampler.reset(last ? std::size_t{31} : std::size_t{30}),
                          cohort::mismatch_error,
                          message_has({"30 examples", "31 on rank " + last_rank}));
  }
  // A new size agreed: the epoch it starts covers it, exactly once.
  sampler.reset(std::size_t{30});
  BOOST_TEST(sampler.dataset_size() == 30u);
  epoch_batches epoch;
  while (auto b = sampler.next(batch)) {
    epoch.push_back(*b);
  }
  check_exactly_once(every_ranks(comm, epoch), 30, batch, sampler.batches(batch));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(evaluate_over_a_loader)

BOOST_AUTO_TEST_CASE(uneven_shards_give_the_mean_over_every_example_exactly_once) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const auto ranks = static_cast<std::size_t>(comm.size());
  constexpr std::size_t batch = 4;
  for (const std::size_t n : {2 * ranks * batch + 1, 7 * ranks + 3, std::size_t{50}}) {
    BOOST_TEST_CONTEXT("n = " << n) {
      const ctorch::distributed_sampler sampler(comm, n);
      auto loader =
          torch::data::make_data_loader(indexed_dataset(n).map(torch::data::transforms::Stack<>()),
                                        sampler, torch::data::DataLoaderOptions(batch));
      const auto measure = [](torch::data::Example<>& b, cohort::local_metrics& local) {
        const auto index = b.target.to(torch::kFloat64);
        const auto size = static_cast<double>(index.size(0));
        local.add("index", index.mean().item<double>(), size);
        local.add("square", index.pow(2).mean().item<double>(), size);
        local.add("grad_enabled", torch::GradMode::is_enabled() ? 1.0 : 0.0);
      };
      const double last = static_cast<double>(n - 1);
      // Over 0..n-1: the mean index and the mean square.
      const double mean = last / 2;
      const double square = last * (2 * last + 1) / 6;
      for (int epoch = 0; epoch < 2; ++epoch) {
        const auto means = ctorch::evaluate(comm, *loader, measure);
        BOOST_TEST(means.at("index") == mean, boost::test_tools::tolerance(1e-12));
        BOOST_TEST(means.at("square") == square, boost::test_tools::tolerance(1e-12));
        BOOST_TEST(means.at("grad_enabled") == 0.0);
        BOOST_TEST(torch::GradMode::is_enabled());
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(seed_per_rank)

// The rule's values, pinned: the same on every platform, for every build.
static_assert(ctorch::per_rank_seed(0, 0) == 0xa706dd2f4d197e6full);
static_assert(ctorch::per_rank_seed(42, 3) == 0x6a18965c8a3cca10ull);
// base + rank would collide here.
static_assert(ctorch::per_rank_seed(1, 0) != ctorch::per_rank_seed(0, 1));

BOOST_AUTO_TEST_CASE(a_seed_of_its_own_on_each_rank_the_same_for_the_same_base) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const std::uint64_t seed = ctorch::seed_per_rank(comm, 1234);
  const torch::Tensor drawn = torch::randn({8});
  BOOST_TEST(seed == ctorch::per_rank_seed(comm, 1234));
  BOOST_TEST(seed == ctorch::per_rank_seed(1234, comm.rank()));
  BOOST_TEST(ctorch::seed_per_rank(comm, 1234) == seed);
  BOOST_TEST(torch::equal(torch::randn({8}), drawn));

  const auto seeds = comm.allgather_obj(seed);
  const auto values = comm.allgather_obj(
      std::vector<float>(drawn.data_ptr<float>(), drawn.data_ptr<float>() + drawn.numel()));
  for (std::size_t r = 0; r < seeds.size(); ++r) {
    for (std::size_t s = r + 1; s < seeds.size(); ++s) {
      BOOST_TEST_CONTEXT("ranks " << r << " and " << s) {
        BOOST_TEST(seeds[r] != seeds[s]);
        BOOST_TEST((values[r] != values[s]));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(bases_and_ranks_do_not_collide_the_way_base_plus_rank_would) {
  std::set<std::uint64_t> seen;
  for (std::uint64_t base = 0; base < 256; ++base) {
    for (int rank = 0; rank < 256; ++rank) {
      seen.insert(ctorch::per_rank_seed(base, rank));
    }
  }
  BOOST_TEST(seen.size() == 256u * 256u);
}

BOOST_AUTO_TEST_SUITE_END()
