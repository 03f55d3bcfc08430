// SPDX-License-Identifier: Apache-2.0
#pragma once

// A LibTorch sampler that gives each rank its share of a dataset every rank can read, for
// `torch::data::make_data_loader(dataset, sampler, options)`: scatter_index's split (a new global
// permutation each epoch, the same on every rank) behind LibTorch's Sampler interface.
//
// Its one rule beyond scatter_index: every rank yields the same number of batches per epoch. A
// rank with one batch more would take an extra optimizer step, whose gradient reduction pairs
// with its peers' first step of the next epoch: the replicas drift apart, or the job hangs at its
// end. LibTorch's DistributedRandomSampler leaves that to the trainer.
//
// LibTorch's StatelessDataLoader calls `reset()` (no size) at every `begin()` and then `next()`
// with its own batch size, on the thread that iterates it; with `drop_last` it ends the epoch at
// the first batch shorter than the batch size. It holds its own copy of the sampler, out of
// reach: hence the epoch advancing by itself at each `reset()`.

#include <cohort/communicator/agreement.hpp>
#include <cohort/communicator/concepts.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/training/scatter_dataset.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <torch/data/samplers/base.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {

//! How `distributed_sampler` splits a dataset and batches its shards.
struct sampler_options {
  //! A new permutation of the whole dataset each epoch, the same on every rank (so each rank sees
  //! other examples from epoch to epoch, as with PyTorch's DistributedSampler). The root's is
  //! used.
  bool shuffle = true;
  //! The permutations' seed; the root's is used. Without one the root draws one and sends it, so
  //! the ranks still agree.
  std::optional<std::uint64_t> seed = std::nullopt;
  //! false: an exact partition, no example twice, shards one example apart (for evaluation, and
  //! for training where that small imbalance is acceptable). true: every rank ceil(n / ranks)
  //! examples, a few of them seen twice per epoch (scatter_options::force_equal_length).
  bool pad = false;
  //! Only full batches: every rank floor(smallest shard / batch size) of them, the tail dropped.
  //! Must match the loader's `DataLoaderOptions::drop_last`: a loader that drops a short batch
  //! this sampler hands it ends that rank's epoch one batch early.
  bool drop_last = false;
  //! The rank whose seed, shuffle and pad count.
  int root = 0;
};

//! This rank's share of a dataset every rank can read, in batches, for LibTorch's data loader.
//!
//! Epochs: after construction, `set_epoch(e)` or `load()`, the next `reset()` starts (or resumes)
//! that epoch; every other `reset()` starts the one after the current one. So a loader's first
//! `begin()` runs epoch 0 and each later one the next epoch, with no call into the loader.
//!
//! Batches: every rank yields `batches(batch_size)` non-empty batches per epoch, the same number:
//! without `drop_last` k = ceil(largest shard / batch_size), a shorter shard handing out its last
//! examples in smaller batches (B, ..., B, B/2, B/2 for a shard of (k-1)*B: never a last batch
//! of one example where the two before it can share) rather than stopping a batch early. Where a
//! shard cannot fill k batches (batch size 1 with uneven shards, fewer examples than ranks)
//! `next()` and `batches()` throw `invalid_argument` on every rank, naming the shards and the fix
//! (`pad` or `drop_last`).
//!
//! The sampler keeps a pointer to the communicator, which must outlive it and every copy (the
//! loader's included), for `reset(size)`.
class distributed_sampler : public ::torch::data::samplers::Sampler<std::vector<std::size_t>> {
public:
  //! Agrees with every rank of `comm` on the dataset's size, the seed and the options
  //! (collective). A size that differs across ranks is a `mismatch_error` on every rank naming
  //! both sizes; `shuffle`, `pad` or `drop_last` that differ, a `mismatch_error` naming the option;
  //! size 0 an `invalid_argument` on every rank.
  template <communicator Communicator>
  distributed_sampler(Communicator& comm, std::size_t dataset_size, sampler_options options = {})
      : agree_([&comm, shuffle = options.shuffle, pad = options.pad,
                root = options.root](std::size_t size, std::optional<std::uint64_t> seed) {
        return cohort::detail::agree_on_plan(
            comm, size,
            scatter_options{
                .shuffle = shuffle, .seed = seed, .root = root, .force_equal_length = pad},
            "distributed_sampler", true);
      })
      , ranks_(comm.size())
      , rank_(comm.rank())
      , drop_last_(options.drop_last) {
    // drop_last is not part of the root's plan, and ranks that differ on it differ on the batch
    // count; shuffle and pad would be overridden by the root's silently.
    const auto yes_no = [](bool value) { return std::string(value ? "true" : "false"); };
    agree_on_settings(comm,
                      {{"option 'shuffle'", yes_no(options.shuffle)},
                       {"option 'pad'", yes_no(options.pad)},
                       {"option 'drop_last'", yes_no(options.drop_last)}},
                      "distributed_sampler");
    adopt(agree_(dataset_size, options.seed));
  }

  //! Starts the next epoch (see the class comment). With a size: collective on every rank,
  //! whether or not it changed (the ranks agree on it again: `mismatch_error` on every rank if
  //! they differ); the epoch it starts (or resumes, from its beginning) is split over the new
  //! size. Without one: local.
  void reset(::torch::optional<std::size_t> new_size = ::torch::nullopt) override {
    if (new_size) {
      const auto plan = agree_(*new_size, shard_.seed());
      if (plan.total != shard_.total()) {
        adopt(plan);
      }
    }
    if (!keep_epoch_on_reset_ || finished()) {
      shard_.set_epoch(shard_.epoch() + 1);
      rewind();
    }
    keep_epoch_on_reset_ = false;
  }

  //! The dataset indices of this rank's next batch, or none at the end of the epoch. Pass the
  //! same `batch_size` throughout an epoch (the loader passes its own); throws `invalid_argument`
  //! where every rank cannot yield the same number of batches (see `batches`).
  ::torch::optional<std::vector<std::size_t>> next(std::size_t batch_size) override {
    const std::size_t count = batches(batch_size);
    if (drawn_ > 0 && batch_size != batch_size_) {
      throw invalid_argument("cohort::torch::distributed_sampler on rank " + std::to_string(rank_) +
                             ": a batch size of " + std::to_string(batch_size) +
                             " in an epoch begun with batches of " + std::to_string(batch_size_) +
                             ": the batch count, the same on every rank, depends on it");
    }
    keep_epoch_on_reset_ = false;
    batch_size_ = batch_size;
    if (drawn_ >= count) {
      return ::torch::nullopt;
    }
    // As many as the batch holds, leaving one example for each batch still to come; but where
    // that would leave the last batch one example alone (BatchNorm refuses a batch of 1 in
    // training, on that rank alone), the last two share what is left.
    const std::size_t batches_left = count - drawn_;
    const std::size_t examples_left = shard_.size() - position_;
    std::size_t take = std::min(batch_size, examples_left - (batches_left - 1));
    if (batches_left == 2 && examples_left - take == 1 && examples_left > 2) {
      take = (examples_left + 1) / 2;
    }
    const auto first = shard_.indices().begin() + static_cast<std::ptrdiff_t>(position_);
    std::vector<std::size_t> batch(first, first + static_cast<std::ptrdiff_t>(take));
    position_ += take;
    ++drawn_;
    return batch;
  }

  //! The number of batches every rank yields per epoch for `batch_size`; from the agreed size,
  //! the rank count and the options alone, so the same on every rank without communication.
  //! Throws `invalid_argument` (on every rank alike) for batch size 0 and where a shard cannot
  //! fill that many non-empty batches, naming the shards and the fix.
  std::size_t batches(std::size_t batch_size) const {
    if (batch_size == 0) {
      throw invalid_argument("cohort::torch::distributed_sampler on rank " + std::to_string(rank_) +
                             ": the batch size is 0");
    }
    // shard_range gives rank 0 the largest shard and the last rank the smallest.
    const std::size_t largest = shard_range(shard_.total(), ranks_, 0, pad_).size();
    const std::size_t smallest = shard_range(shard_.total(), ranks_, ranks_ - 1, pad_).size();
    if (drop_last_) {
      const std::size_t count = smallest / batch_size;
      if (count == 0) {
        throw invalid_argument(describe(batch_size, largest, smallest) + ": with drop_last = " +
                               "true no rank has a full batch; use a batch size of at most " +
                               std::to_string(std::max<std::size_t>(smallest, 1)) +
                               (smallest == 0 ? " with pad = true" : ""));
      }
      return count;
    }
    const std::size_t count = (largest + batch_size - 1) / batch_size;
    if (smallest < count) {
      throw invalid_argument(
          describe(batch_size, largest, smallest) + ": every rank must yield " +
          std::to_string(count) +
          " non-empty batches (as many as rank 0's shard fills), and rank " +
          std::to_string(ranks_ - 1) + "'s cannot; pass pad = true (every shard " +
          std::to_string(shard_range(shard_.total(), ranks_, 0, true).size()) +
          " examples, a few seen twice) or drop_last = true (full batches only, on the loader "
          "too)");
    }
    return count;
  }

  //! Makes the next `reset()` start epoch `epoch` (to resume a job at an epoch's start). Local:
  //! call it with the same epoch on every rank, before the sampler goes into the loader.
  void set_epoch(std::uint64_t epoch) {
    shard_.set_epoch(epoch);
    rewind();
    keep_epoch_on_reset_ = true;
  }

  //! The epoch in progress, or the one the next `reset()` starts after construction, `set_epoch`
  //! or `load`.
  std::uint64_t epoch() const noexcept { return shard_.epoch(); }

  //! This rank's share of the dataset per epoch.
  std::size_t size() const noexcept { return shard_.size(); }

  //! The dataset's size (agreed by every rank).
  std::size_t dataset_size() const noexcept { return shard_.total(); }

  //! The epoch, the position in it, the seed and the dataset's size.
  void save(::torch::serialize::OutputArchive& archive) const override {
    const auto put = [&](const char* key, std::uint64_t value) {
      archive.write(key, ::torch::tensor(static_cast<std::int64_t>(value)), /*is_buffer=*/true);
    };
    put("total", shard_.total());
    put("seed", shard_.seed());
    put("epoch", shard_.epoch());
    put("position", position_);
    put("batches_drawn", drawn_);
    put("batch_size", batch_size_);
  }

  //! Where the saved sampler was: the next `reset()` carries on from its position (or starts the
  //! epoch after it, if it was finished). The seed is restored, so a job started without one
  //! resumes the same permutations: load on every rank. Throws `invalid_argument` for a state
  //! saved for another dataset size, or at a position past this rank's shard. (The position
  //! counts the batches handed to the loader, which asks for up to `max_jobs` ahead of the
  //! trainer when it has workers.)
  void load(::torch::serialize::InputArchive& archive) override {
    const auto get = [&](const char* key) {
      ::torch::Tensor value = ::torch::empty({}, ::torch::kInt64);
      archive.read(key, value, /*is_buffer=*/true);
      return static_cast<std::uint64_t>(value.item<std::int64_t>());
    };
    const std::uint64_t total = get("total");
    if (total != shard_.total()) {
      throw invalid_argument("cohort::torch::distributed_sampler on rank " + std::to_string(rank_) +
                             ": the state loaded is for a dataset of " + std::to_string(total) +
                             " examples, this sampler's has " + std::to_string(shard_.total()));
    }
    const std::uint64_t seed = get("seed");
    const std::uint64_t epoch = get("epoch");
    const std::uint64_t position = get("position");
    const std::uint64_t drawn = get("batches_drawn");
    const std::uint64_t batch_size = get("batch_size");
    index_shard shard(shard_.total(), ranks_, rank_, shuffle_, seed, pad_);
    shard.set_epoch(epoch);
    if (position > shard.size() || drawn > position) {
      throw invalid_argument("cohort::torch::distributed_sampler on rank " + std::to_string(rank_) +
                             ": the state loaded is at position " + std::to_string(position) +
                             " (" + std::to_string(drawn) + " batches) of a shard of " +
                             std::to_string(shard.size()) +
                             " examples: saved by another rank count or rank?");
    }
    shard_ = std::move(shard);
    position_ = static_cast<std::size_t>(position);
    drawn_ = static_cast<std::size_t>(drawn);
    batch_size_ = static_cast<std::size_t>(batch_size);
    keep_epoch_on_reset_ = true;
  }

private:
  void adopt(const cohort::detail::dataset_split& plan) {
    shuffle_ = plan.shuffle;
    pad_ = plan.force_equal_length;
    const std::uint64_t epoch = shard_.epoch();
    shard_ = index_shard(static_cast<std::size_t>(plan.total), ranks_, rank_, plan.shuffle,
                         plan.seed, plan.force_equal_length);
    shard_.set_epoch(epoch);
    rewind();
  }

  void rewind() noexcept {
    position_ = 0;
    drawn_ = 0;
    batch_size_ = 0;
  }

  bool finished() const { return drawn_ > 0 && drawn_ == batches(batch_size_); }

  std::string describe(std::size_t batch_size, std::size_t largest, std::size_t smallest) const {
    return "cohort::torch::distributed_sampler on rank " + std::to_string(rank_) + ": batches of " +
           std::to_string(batch_size) + " from " + std::to_string(shard_.total()) +
           " examples over " + std::to_string(ranks_) + " ranks, shards of " +
           std::to_string(largest) + " examples (rank 0) to " + std::to_string(smallest) +
           " examples (rank " + std::to_string(ranks_ - 1) + ")";
  }

  // The ranks agreeing on a size (and the seed the plan keeps), with the communicator the
  // sampler was made with: what `reset(size)` needs, without the sampler being a template.
  std::function<cohort::detail::dataset_split(std::size_t, std::optional<std::uint64_t>)> agree_;
  int ranks_ = 1;
  int rank_ = 0;
  bool shuffle_ = true;
  bool pad_ = false;
  bool drop_last_ = false;
  index_shard shard_;
  std::size_t position_ = 0;   // examples of this epoch handed out
  std::size_t drawn_ = 0;      // batches of this epoch handed out
  std::size_t batch_size_ = 0; // this epoch's, once a batch is drawn
  bool keep_epoch_on_reset_ = true;
};

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
