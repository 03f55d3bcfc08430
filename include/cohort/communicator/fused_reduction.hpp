// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/grad_reduction.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/kernels/host.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

//! Streams the gradients of each dtype through one reusable fusion buffer: packs as many as fit
//! (casting to the reducer's wire dtype and pre-scaling on the way, splitting a gradient across
//! buffers where it does not fit), hands the buffer to `exchange`, and unpacks it (post-scaling).
//! A gradient of at least `threshold_bytes` (or a whole buffer) whose dtype is already the wire
//! dtype is reduced in place: for it, the two passes over memory of a copy cost more than the
//! all-reduce latency they save. The buffer and the lists only ever grow, so after the first step
//! nothing is allocated.
class fused_reduction {
public:
  fused_reduction(std::size_t buffer_bytes, std::size_t threshold_bytes)
      : buffer_bytes_(buffer_bytes)
      , threshold_bytes_(std::min(threshold_bytes, buffer_bytes)) {
    if (buffer_bytes == 0) {
      throw invalid_argument("cohort: fusion_buffer_bytes must be positive");
    }
  }

  template <reducer Reducer, class Exchange>
  void run(std::span<const grad_slot> slots, const Reducer& reducer, int ranks,
           Exchange&& exchange) {
    // A step that threw halfway (an MPI error) must not leave its views for the next one.
    sources_.clear();
    targets_.clear();
    filled_ = 0;
    for (const dtype type : all_dtypes) {
      const grad_reduction plan = reducer.plan(type, ranks);
      const std::size_t capacity = std::max<std::size_t>(1, buffer_bytes_ / size_of(plan.wire));
      for (const auto& slot : slots) {
        if (slot.grad.type != type || slot.grad.count == 0) {
          continue;
        }
        if (plan.wire == type && slot.grad.size_bytes() >= threshold_bytes_) {
          kernels::host::scale(slot.grad, plan.pre_scale);
          exchange(slot.grad, plan.op);
          kernels::host::scale(slot.grad, plan.post_scale);
          continue;
        }
        for (std::size_t offset = 0; offset < slot.grad.count;) {
          const std::size_t take = std::min(slot.grad.count - offset, capacity - filled_);
          const tensor_view part{static_cast<std::byte*>(slot.grad.data) + offset * size_of(type),
                                 take, type, slot.grad.location};
          sources_.push_back(part);
          targets_.push_back(part);
          filled_ += take;
          offset += take;
          if (filled_ == capacity) {
            flush(plan, exchange);
          }
        }
      }
      if (filled_ != 0) {
        flush(plan, exchange);
      }
    }
  }

  //! Bytes held by the fusion buffer (for tests and memory accounting).
  std::size_t buffer_bytes() const noexcept { return buffer_.size(); }

private:
  template <class Exchange>
  void flush(const grad_reduction& plan, Exchange& exchange) {
    const std::size_t bytes = filled_ * size_of(plan.wire);
    if (buffer_.size() < bytes) {
      buffer_.resize(bytes);
    }
    const tensor_view packed{buffer_.data(), filled_, plan.wire, memory_location::host};
    kernels::host::pack(sources_, packed, plan.pre_scale);
    exchange(packed, plan.op);
    kernels::host::unpack(packed, targets_, plan.post_scale);
    sources_.clear();
    targets_.clear();
    filled_ = 0;
  }

  std::size_t buffer_bytes_;
  std::size_t threshold_bytes_;
  std::vector<std::byte> buffer_;
  std::vector<const_tensor_view> sources_;
  std::vector<tensor_view> targets_;
  std::size_t filled_ = 0;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
