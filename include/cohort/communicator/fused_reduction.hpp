// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/kernels/host.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

//! Packs the gradients of each dtype into one reusable buffer in the reducer's wire dtype
//! (casting and pre-scaling on the way), hands it to `exchange`, and unpacks it (post-scaling).
//! The buffer and the lists only ever grow, so after the first step nothing is allocated.
class fused_reduction {
public:
  template <reducer Reducer, class Exchange>
  void run(std::span<const grad_slot> slots, const Reducer& reducer, int ranks,
           Exchange&& exchange) {
    for (const dtype type : all_dtypes) {
      sources_.clear();
      targets_.clear();
      for (const auto& slot : slots) {
        if (slot.grad.type == type) {
          sources_.push_back(slot.grad);
          targets_.push_back(slot.grad);
        }
      }
      if (targets_.empty()) {
        continue;
      }
      const grad_reduction plan = reducer.plan(type, ranks);
      const std::size_t count = kernels::host::packed_count(sources_);
      const std::size_t bytes = count * size_of(plan.wire);
      if (buffer_.size() < bytes) {
        buffer_.resize(bytes);
      }
      const tensor_view packed{buffer_.data(), count, plan.wire, memory_location::host};
      kernels::host::pack(sources_, packed, plan.pre_scale);
      exchange(packed, plan.op);
      kernels::host::unpack(packed, targets_, plan.post_scale);
    }
  }

  //! Bytes held by the fusion buffer (for tests and memory accounting).
  std::size_t buffer_bytes() const noexcept { return buffer_.size(); }

private:
  std::vector<std::byte> buffer_;
  std::vector<const_tensor_view> sources_;
  std::vector<tensor_view> targets_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
