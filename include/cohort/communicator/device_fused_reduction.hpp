// SPDX-License-Identifier: Apache-2.0
#pragma once

#if !defined(__CUDACC__)
#error                                                                                             \
    "<cohort/communicator/device_fused_reduction.hpp> launches CUDA kernels: compile this translation unit with nvcc and include <cohort/cuda.hpp>"
#endif

#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/kernels/pack.cuh>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/cuda.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <iterator>
#include <span>
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
  template <reducer Reducer, class Exchange>
  void run(std::span<const grad_slot> slots, const Reducer& reducer, int ranks, cudaStream_t stream,
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
      const grad_reduction plan = reducer.plan(type, ranks);
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

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
