// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>

#include <chrono>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Options of the strategies for GPU memory (`pure_nccl`, `single_node`, `host_staged`).
struct gpu_options {
  //! How long a collective may take before the NCCL communicator is aborted and `timeout_error`
  //! thrown on every rank still waiting (PyTorch's default is also 10 minutes). The time counts
  //! from when the work the trainer queued before the collective (its backward pass, say) is
  //! done, so a long step never times out by itself. With zero, cohort does not wait for
  //! completion at all: the work is only ordered on the streams, and the host returns at once.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
