// SPDX-License-Identifier: Apache-2.0
#pragma once

// Seeds per rank. The rule: one seed on every rank for what must be the same everywhere (the
// initial weights, though distributed_optimizer broadcasts rank 0's anyway), a seed of its own on
// each rank for what must differ: noise, the dropout masks, data augmentation. With one seed
// everywhere, every rank would drop the same units and draw the same augmentations for its
// (different) examples, and the ranks' gradients would be correlated where they should be
// independent.
//
// The rank's seed is splitmix64(splitmix64(base) + rank). splitmix64 is a bijection on 64 bits,
// so the ranks of one base never share a seed, and two bases give overlapping seeds only if
// their mixed values lie within the rank count of each other (about ranks / 2^64), where base +
// rank would give rank 0 of base 1 the seed of rank 1 of base 0.

#include <cohort/communicator/concepts.hpp>
#include <cohort/config.hpp>

#include <cstdint>
#include <torch/utils.h>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {

//! Rank `rank`'s seed derived from `base` (the rule above); the same on every platform.
constexpr std::uint64_t per_rank_seed(std::uint64_t base, int rank) noexcept {
  const auto splitmix64 = [](std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  return splitmix64(splitmix64(base) + static_cast<std::uint64_t>(rank));
}

//! This rank's seed derived from `base`, without seeding anything. Local.
template <communicator Communicator>
std::uint64_t per_rank_seed(const Communicator& comm, std::uint64_t base) {
  return per_rank_seed(base, comm.rank());
}

//! Seeds LibTorch's default generators (the CPU's and every CUDA device's, as
//! `torch::manual_seed` does) with this rank's seed derived from `base`, and returns it. Local.
//! Call it after building the model if the model is built from a common seed.
template <communicator Communicator>
std::uint64_t seed_per_rank(const Communicator& comm, std::uint64_t base) {
  const std::uint64_t seed = per_rank_seed(comm, base);
  ::torch::manual_seed(seed);
  return seed;
}

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
