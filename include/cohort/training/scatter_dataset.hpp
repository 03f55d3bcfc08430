// SPDX-License-Identifier: Apache-2.0
#pragma once

// Giving each rank its shard of the data: scatter_index when every rank can read the whole
// dataset (only indices are computed, nothing moves), scatter_dataset when only the root has it
// (the root sends each rank its own examples, never the whole dataset to everyone).

#include <cohort/communicator/agreement.hpp>
#include <cohort/communicator/concepts.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <boost/serialization/array.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/utility.hpp>
#include <boost/serialization/vector.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Anything with a size and indexed access to examples.
template <class D>
concept dataset = requires(const D& d, std::size_t i) {
  { d.size() } -> std::convertible_to<std::size_t>;
  d[i];
};

//! The example type of a dataset.
template <dataset D>
using example_t = std::remove_cvref_t<decltype(std::declval<const D&>()[std::size_t{}])>;

//! How a dataset is split across ranks.
struct scatter_options {
  //! Permute the examples before splitting. With `scatter_index` (every rank can read the whole
  //! dataset), each `set_epoch` draws a new permutation of the whole dataset, the same on every
  //! rank, and splits it again, so a rank sees other examples each epoch (as PyTorch's
  //! DistributedSampler). With `scatter_dataset` the examples were sent once and stay on their
  //! rank: `set_epoch` reorders this rank's own examples only.
  bool shuffle = false;
  //! The seed of the permutation; the root's is used. Without one, the root draws one at random
  //! and sends it to every rank, so the ranks still agree.
  std::optional<std::uint64_t> seed = std::nullopt;
  //! The rank whose dataset and seed count.
  int root = 0;
  //! true (for training): every rank gets ceil(n / size) examples, so that every rank runs the
  //! same number of iterations; when size does not divide n, neighbouring shards share a few
  //! examples (ChainerMN's rule: rank i gets [n*i/size, n*i/size + ceil(n/size))).
  //! false (for evaluation): an exact partition without duplicates; the first n % size ranks get
  //! one example more.
  bool force_equal_length = true;
  //! scatter_dataset sends examples in messages of at most this many, which bounds the size of
  //! one serialized message (MPI counts are int: keep a chunk well under 2 GiB).
  std::size_t chunk_examples = 4096;
};

//! A half-open range of positions in the (permuted) dataset.
struct index_range {
  std::size_t begin = 0;
  std::size_t end = 0;
  constexpr std::size_t size() const noexcept { return end - begin; }
  friend constexpr bool operator==(const index_range&, const index_range&) = default;
};

//! The positions of rank `rank`'s shard among `n` examples split over `ranks` ranks.
constexpr index_range shard_range(std::size_t n, int ranks, int rank, bool force_equal_length) {
  const auto size = static_cast<std::size_t>(ranks);
  const auto r = static_cast<std::size_t>(rank);
  if (force_equal_length) {
    const std::size_t length = (n + size - 1) / size;
    // n * r / size without overflowing for huge n.
    const std::size_t begin = (n / size) * r + (n % size) * r / size;
    return {begin, begin + length};
  }
  const std::size_t base = n / size;
  const std::size_t extra = n % size;
  const std::size_t begin = base * r + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

namespace detail {
// A permutation that is the same on every platform for a seed: std::shuffle and the standard
// distributions are implementation-defined, std::mt19937_64's output is not. Fisher-Yates with
// an unbiased bounded draw (rejection of the top remainder).
COHORT_DECL std::vector<std::size_t> permutation(std::size_t n, std::uint64_t seed,
                                                 std::uint64_t epoch);

// A seed drawn at random (std::random_device), for a shuffle the user gave none.
COHORT_DECL std::uint64_t random_seed();

struct dataset_split {
  std::uint64_t total = 0;
  bool shuffle = false;
  std::uint64_t seed = 0;
  bool force_equal_length = true;

  template <class Archive>
  void serialize(Archive& archive, unsigned) {
    // clang-format would take Boost's `archive & member` for a declaration.
    // clang-format off
    archive & total;
    archive & shuffle;
    archive & seed;
    archive & force_equal_length;
    // clang-format on
  }
};

template <communicator Communicator>
dataset_split agree_on_plan(Communicator& comm, std::size_t n, const scatter_options& options,
                            const char* operation, bool every_rank_knows_n) {
  // The root's plan first: bcast_obj settles a bad or disputed root on every rank alike.
  dataset_split plan;
  if (comm.rank() == options.root) {
    plan.total = n;
    plan.shuffle = options.shuffle;
    plan.seed = options.seed ? *options.seed : detail::random_seed();
    plan.force_equal_length = options.force_equal_length;
  }
  plan = comm.bcast_obj(plan, options.root);
  // On every rank alike, from the root's plan: an empty dataset would give every rank nothing to
  // train on, silently.
  if (plan.total == 0) {
    throw invalid_argument(std::string("cohort: ") + operation + " on rank " +
                           std::to_string(comm.rank()) + ": the dataset on rank " +
                           std::to_string(options.root) +
                           " (the root) is empty: there is nothing to split across the " +
                           std::to_string(comm.size()) + " ranks");
  }
  if (every_rank_knows_n) {
    const auto all = comm.allgather_obj(static_cast<std::uint64_t>(n));
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (all[r] != plan.total) {
        throw mismatch_error(std::string("cohort: ") + operation + ": the dataset has " +
                             std::to_string(plan.total) + " examples on rank " +
                             std::to_string(options.root) + " (the root) but " +
                             std::to_string(all[r]) + " on rank " + std::to_string(r));
      }
    }
  }
  return plan;
}
} // namespace detail

//! This rank's share of the positions 0..n-1 of a dataset that every rank can read: indices
//! only, no data moves. When shuffling, `set_epoch` permutes the whole dataset anew (the same
//! permutation on every rank, from the seed and the epoch) and takes this rank's share of it, so
//! the ranks' subsets change from epoch to epoch, as with PyTorch's DistributedSampler.
class index_shard {
public:
  index_shard() = default;
  index_shard(std::size_t total, int ranks, int rank, bool shuffle, std::uint64_t seed,
              bool force_equal_length)
      : total_(total)
      , range_(shard_range(total, ranks, rank, force_equal_length))
      , shuffle_(shuffle)
      , seed_(seed) {
    set_epoch(0);
  }

  //! Recomputes the shard for another epoch (a new permutation when shuffling). No communication.
  void set_epoch(std::uint64_t epoch) {
    epoch_ = epoch;
    indices_.resize(range_.size());
    if (!shuffle_) {
      std::iota(indices_.begin(), indices_.end(), range_.begin);
      return;
    }
    const auto order = detail::permutation(total_, seed_, epoch);
    // ChainerMN-style overlapping shards may run past n when n < size: positions wrap.
    for (std::size_t i = 0; i < indices_.size(); ++i) {
      indices_[i] = order[(range_.begin + i) % std::max<std::size_t>(total_, 1)];
    }
  }

  std::size_t size() const noexcept { return indices_.size(); }
  //! The dataset index of this rank's i-th example.
  std::size_t operator[](std::size_t i) const { return indices_[i]; }
  auto begin() const noexcept { return indices_.begin(); }
  auto end() const noexcept { return indices_.end(); }
  const std::vector<std::size_t>& indices() const noexcept { return indices_; }
  //! The positions in the (permuted) dataset this shard covers.
  index_range range() const noexcept { return range_; }
  std::size_t total() const noexcept { return total_; }
  std::uint64_t epoch() const noexcept { return epoch_; }
  std::uint64_t seed() const noexcept { return seed_; }

private:
  std::size_t total_ = 0;
  index_range range_;
  bool shuffle_ = false;
  std::uint64_t seed_ = 0;
  std::uint64_t epoch_ = 0;
  std::vector<std::size_t> indices_;
};

//! Splits positions 0..n-1 across the ranks of `comm` (collective). Every rank must pass the same
//! `n` (else `mismatch_error` on every rank, naming both sizes); n = 0 throws `invalid_argument`
//! on every rank.
template <communicator Communicator>
index_shard scatter_index(std::size_t n, Communicator& comm, const scatter_options& options = {}) {
  const auto plan = detail::agree_on_plan(comm, n, options, "scatter_index", true);
  return index_shard(plan.total, comm.size(), comm.rank(), plan.shuffle, plan.seed,
                     plan.force_equal_length);
}

//! Every position 0..n-1, in the same order on every rank of `comm` (collective): ChainerMN's
//! synchronized iterator, which model parallelism needs (the ranks that hold the parts of one
//! model must see the same batches in the same order). When shuffling, each `set_epoch` draws a
//! new order, the same on every rank, from the root's seed (drawn at random and shared when none
//! is given); no data moves. Every rank must pass the same `n` (else `mismatch_error` on every
//! rank, naming both sizes); n = 0 throws `invalid_argument` on every rank.
template <communicator Communicator>
index_shard synchronized_index(std::size_t n, Communicator& comm,
                               const scatter_options& options = {}) {
  const auto plan = detail::agree_on_plan(comm, n, options, "synchronized_index", true);
  // One shard of the whole: what scatter_index gives a job of one rank, on every rank.
  return index_shard(plan.total, 1, 0, plan.shuffle, plan.seed, true);
}

//! This rank's examples, received from the root by `scatter_dataset`: itself a dataset. When
//! shuffling, `set_epoch` reorders this rank's own examples; which examples a rank has is fixed
//! when they are sent (moving them each epoch would send the dataset again). Where every rank can
//! read the whole dataset, `scatter_index` gives each epoch a new global split instead.
template <class Example>
class scattered_dataset {
public:
  scattered_dataset() = default;
  scattered_dataset(std::vector<Example> examples, index_range range, bool shuffle,
                    std::uint64_t seed, int rank)
      : examples_(std::move(examples))
      , range_(range)
      , shuffle_(shuffle)
      , seed_(seed ^ (0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(rank + 1))) {}

  std::size_t size() const noexcept { return examples_.size(); }
  const Example& operator[](std::size_t i) const {
    return examples_[order_.empty() ? i : order_[i]];
  }
  //! The examples in the order they were received.
  const std::vector<Example>& examples() const noexcept { return examples_; }
  //! The positions in the root's (permuted) dataset that this shard covers.
  index_range range() const noexcept { return range_; }

  //! A new local order for another epoch when shuffling (epoch 0 is the order received).
  void set_epoch(std::uint64_t epoch) {
    if (!shuffle_ || epoch == 0) {
      order_.clear();
      return;
    }
    order_ = detail::permutation(examples_.size(), seed_, epoch);
  }

private:
  std::vector<Example> examples_;
  index_range range_;
  bool shuffle_ = false;
  std::uint64_t seed_ = 0;
  std::vector<std::size_t> order_;
};

//! Sends each rank its own examples of the root's `data` (collective; only the root's `data` is
//! read, the others may pass an empty dataset). Examples travel through Boost.Serialization, in
//! messages of at most `options.chunk_examples` examples. An empty dataset at the root throws
//! `invalid_argument` on every rank.
template <dataset Dataset, communicator Communicator>
scattered_dataset<example_t<Dataset>> scatter_dataset(const Dataset& data, Communicator& comm,
                                                      const scatter_options& options = {}) {
  using example = example_t<Dataset>;
  constexpr int tag = 0x5ca7;
  // (Compared first: a rank that threw alone would leave the others waiting for its chunks.)
  agree_on_settings(comm, {{"option 'chunk_examples'", options.chunk_examples == 0 ? "0" : "> 0"}},
                    "scatter_dataset");
  if (options.chunk_examples == 0) {
    throw invalid_argument("cohort: scatter_dataset: chunk_examples must be positive");
  }
  const auto plan = detail::agree_on_plan(comm, static_cast<std::size_t>(data.size()), options,
                                          "scatter_dataset", false);
  const auto total = static_cast<std::size_t>(plan.total);
  const auto range_of = [&](int r) {
    return shard_range(total, comm.size(), r, plan.force_equal_length);
  };
  const index_range mine = range_of(comm.rank());
  std::vector<example> local;
  local.reserve(mine.size());

  if (comm.rank() == options.root) {
    std::vector<std::size_t> order(total);
    if (plan.shuffle) {
      order = detail::permutation(total, plan.seed, 0);
    } else {
      std::iota(order.begin(), order.end(), std::size_t{0});
    }
    const auto at = [&](std::size_t position) -> decltype(auto) {
      return data[order[position % std::max<std::size_t>(total, 1)]];
    };
    std::vector<example> chunk;
    for (int r = 0; r < comm.size(); ++r) {
      const index_range range = range_of(r);
      if (r == options.root) {
        for (std::size_t p = range.begin; p < range.end; ++p) {
          local.push_back(at(p));
        }
        continue;
      }
      for (std::size_t p = range.begin; p < range.end; p += options.chunk_examples) {
        chunk.clear();
        const std::size_t last = std::min(range.end, p + options.chunk_examples);
        for (std::size_t q = p; q < last; ++q) {
          chunk.push_back(at(q));
        }
        comm.send_obj(chunk, r, tag);
      }
    }
  } else {
    while (local.size() < mine.size()) {
      auto chunk = comm.template recv_obj<std::vector<example>>(options.root, tag);
      if (chunk.empty() || local.size() + chunk.size() > mine.size()) {
        throw error("cohort: scatter_dataset on rank " + std::to_string(comm.rank()) +
                    ": received " + std::to_string(local.size() + chunk.size()) +
                    " examples in all where " + std::to_string(mine.size()) + " were expected");
      }
      std::move(chunk.begin(), chunk.end(), std::back_inserter(local));
    }
  }
  return scattered_dataset<example>(std::move(local), mine, plan.shuffle, plan.seed, comm.rank());
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/training/impl/scatter_dataset.ipp>
#endif
