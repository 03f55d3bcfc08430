// SPDX-License-Identifier: Apache-2.0
#pragma once

#if !defined(__CUDACC__)
#error                                                                                             \
    "<cohort/communicator/device_fused_reduction.hpp> launches CUDA kernels: compile this translation unit with nvcc and include <cohort/cuda.hpp>"
#endif

#include <cohort/communicator/agreement.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/kernels/pack.cuh>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/concepts.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/cuda.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

//! The device counterpart of bucketed_reduction, one bucket per dtype: the gradients of each
//! dtype packed by one kernel launch into a reused device buffer in the reducer's wire dtype (cast
//! and pre-scaled on the way), handed to `exchange`, and unpacked by one launch (post-scaled), all
//! queued on `stream`.
//! Nothing is allocated once the buffers have grown to the model's size.
class device_fused_reduction {
public:
  template <class Exchange>
  void run(std::span<const grad_slot> slots, const reduction_table& reduction, cudaStream_t stream,
           Exchange&& exchange) {
    for (const dtype type : all_dtypes) {
      sources_.clear();
      targets_.clear();
      for (const auto& slot : slots) {
        if (slot.grad.type == type && slot.grad.count != 0) {
          sources_.push_back(slot.grad);
          targets_.push_back(slot.grad);
        }
      }
      if (targets_.empty()) {
        continue;
      }
      const grad_reduction& plan = reduction(type);
      std::size_t count = 0;
      for (const auto& t : targets_) {
        count += t.count;
      }
      const tensor_view packed{buffer_.reserve(count * size_of(plan.wire)), count, plan.wire,
                               memory_location::device};
      const auto index = static_cast<std::size_t>(type);
      kernels::device::pack(sources_, packed, plan.pre_scale, stream, pack_workspaces_[index]);
      exchange(packed, plan.op);
      kernels::device::unpack(packed, targets_, plan.post_scale, stream, unpack_workspaces_[index]);
    }
  }

private:
  cuda::device_buffer buffer_;
  // One table per dtype and direction: the host never waits, in the middle of a step, for the
  // copy of a table that the same step queued earlier.
  std::array<kernels::device::batch_workspace, std::size(all_dtypes)> pack_workspaces_;
  std::array<kernels::device::batch_workspace, std::size(all_dtypes)> unpack_workspaces_;
  std::vector<const_tensor_view> sources_;
  std::vector<tensor_view> targets_;
};

//! The device counterpart of the host strategies' parameter broadcast: a value of at least
//! `threshold` bytes travels in place; smaller ones are packed, a bucket of at most `capacity`
//! bytes at a time, into one reused device buffer by one kernel on the root, and unpacked by one
//! on the others, all queued on `stream`. The extra device memory is one bucket, not a copy of
//! the model. `move(void* data, std::size_t bytes)` broadcasts one device range from the root:
//! queued on `stream` (NCCL), or done when it returns (MPI, which must first wait for `stream`).
class device_fused_broadcast {
public:
  template <class Move>
  void run(std::span<const tensor_view> values, bool root, std::size_t capacity,
           std::size_t threshold, cudaStream_t stream, Move&& move) {
    capacity = std::max<std::size_t>(1, capacity);
    threshold = std::min(threshold, capacity);
    pending_.clear();
    std::size_t filled = 0;
    const auto flush = [&] {
      if (pending_.empty()) {
        return;
      }
      const tensor_view packed{buffer_.reserve(capacity), filled, dtype::uint8,
                               memory_location::device};
      if (root) {
        sources_.assign(pending_.begin(), pending_.end());
        kernels::device::pack(sources_, packed, 1.0, stream, workspace_);
      }
      move(packed.data, filled);
      if (!root) {
        kernels::device::unpack(packed, pending_, 1.0, stream, workspace_);
      }
      pending_.clear();
      filled = 0;
    };
    for (const tensor_view& v : values) {
      const std::size_t bytes = v.size_bytes();
      if (bytes == 0) {
        continue;
      }
      if (bytes >= threshold) {
        move(v.data, bytes);
        continue;
      }
      if (filled + bytes > capacity) {
        flush();
      }
      pending_.push_back({v.data, bytes, dtype::uint8, v.location});
      filled += bytes;
    }
    flush();
  }

private:
  cuda::device_buffer buffer_;
  kernels::device::batch_workspace workspace_;
  std::vector<tensor_view> pending_;
  std::vector<const_tensor_view> sources_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
