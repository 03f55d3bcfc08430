// SPDX-License-Identifier: Apache-2.0
#pragma once

// PowerSGD's options, what it counts and what a checkpoint keeps of it (reducer/powersgd.hpp).

#include <cohort/config.hpp>
#include <cohort/tensor/dtype.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! PowerSGD's options, as PyTorch's `PowerSGDState` names them. Every rank must give the same:
//! the ranks agree on them (and on each layout's step count) at every step.
struct powersgd_options {
  //! r, the rank of the approximation (`matrix_approximation_rank`): per gradient,
  //! min(n, m, rank).
  int rank = 1;
  //! Steps of each parameter set reduced uncompressed first (`start_powerSGD_iter`). PyTorch
  //! defaults to 1000 and needs 2 or more; any value works here, 0 included.
  std::uint64_t start_step = 1000;
  //! A gradient is compressed only if (n + m) r · this < n m (`min_compression_rate`); 0
  //! compresses every matrix.
  double min_compression_rate = 2;
  bool error_feedback = true;
  //! Q starts each step from the last one's (one power iteration per step); false: a fresh
  //! random Q at every step.
  bool warm_start = true;
  //! Added to each norm before dividing by it (`orthogonalization_epsilon`).
  double orthogonalization_epsilon = 0;
  std::uint64_t seed = 0;
};

//! What PowerSGD sent, in values (elements), since its handle was made (this rank's).
struct powersgd_stats {
  std::uint64_t steps = 0;              //!< steps reduced (warm-up ones included)
  std::uint64_t compressed_steps = 0;   //!< of which compressed
  std::uint64_t values_before = 0;      //!< gradient elements the hook reduced
  std::uint64_t values_sent = 0;        //!< elements its exchanges carried
  std::uint64_t compressed_tensors = 0; //!< gradients compressed, counted at each step
  //! Of its compute (grad_sync_stats::hook), the time orthogonalizing P and Q; the rest is the
  //! matrix products, the error feedback and the copies.
  std::chrono::nanoseconds orthogonalizing{0};
};

//! One gradient's state, as a checkpoint keeps it.
struct powersgd_slot_record {
  std::uint64_t slot = 0;
  std::string name;
  dtype type = dtype::float32;
  std::uint64_t n = 0, m = 0, r = 0;
  bool compressed = false;
  bool q_ready = false;
  std::vector<std::byte> q; //!< Qᵀ, r x m (replicated)
  std::vector<std::byte> e; //!< the error, n x m (this rank's)
};

//! One parameter set's state, as a checkpoint keeps it.
struct powersgd_layout_record {
  std::uint64_t key = 0;
  std::uint64_t steps = 0;
  std::vector<powersgd_slot_record> slots;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
