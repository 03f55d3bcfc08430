// SPDX-License-Identifier: Apache-2.0
#pragma once

#if !defined(__CUDACC__)
#error                                                                                             \
    "<cohort/communicator/engine/gpu/bucketed_reduction.hpp> launches CUDA kernels: compile this translation unit with nvcc and include <cohort/cuda.hpp>"
#endif

#include <cohort/communicator/engine/agreement.hpp>
#include <cohort/communicator/engine/bucket_plan.hpp>
#include <cohort/communicator/engine/bucketed_reduction.hpp>
#include <cohort/communicator/engine/slots.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/kernels/pack.cuh>
#include <cohort/kernels/scale.cuh>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/concepts.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/trace/nvtx.hpp>
#include <cohort/transport/cuda.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! The device strategies' buckets: the host strategies' sizes, with every gradient that fits a
//! bucket packed. `fusion_threshold_bytes` weighs a host copy against a collective's latency; on
//! the device a copy costs far less, so the threshold is the bucket size: only a gradient already
//! of the wire dtype and at least a bucket large is reduced in place.
inline bucket_limits device_bucket_limits(const communicator_options& options) {
  return {options.bucket_bytes, options.first_bucket_bytes, options.bucket_bytes};
}

//! The device packer of `bucketed_reduction`: its plans (made of `device_bucket_limits`, kept per
//! layout), each bucket packed by one kernel launch into a reused device buffer in the reducer's
//! wire dtype (cast and pre-scaled on the way), handed to `exchange`, and unpacked by one launch
//! (post-scaled); a gradient alone in an in-place bucket is scaled and exchanged where it lies.
//! All queued on `stream`. Nothing is allocated once the buffer has grown to the largest bucket.
class device_fused_reduction {
public:
  explicit device_fused_reduction(bucket_limits limits)
      : plans_(limits, /*host_buffers=*/false) {}

  //! The plan of this layout and everything it needs allocated: before the ranks agree, so that
  //! a failure is an error on every rank instead of one rank's inside the exchange. Returns it.
  const bucket_plan& prepare(std::span<const grad_slot> slots, const reduction_table& reduction) {
    const bucket_plan& plan = plans_.prepare(slots, reduction);
    // Grown before the first launch: growing between buckets would free memory that queued work
    // still reads.
    std::size_t largest = 0;
    for (const bucket& k : plan.buckets()) {
      largest = std::max(largest, k.in_place ? 0 : k.count * size_of(k.plan.wire));
    }
    buffer_.reserve(largest);
    while (workspaces_.size() < plan.buckets().size()) {
      workspaces_.push_back(std::make_unique<bucket_workspaces>());
    }
    return plan;
  }

  //! Reduces every bucket of the plan `prepare` made for these slots (the engine calls it before
  //! the ranks agree: nothing is looked up or allocated again here).
  template <class Exchange>
  void run(std::span<const grad_slot> slots, cudaStream_t stream, Exchange&& exchange) {
    for (std::size_t b = 0; b < plans_.bucket_count(); ++b) {
      const device_packer packer{stream, workspaces_[b]->pack, workspaces_[b]->unpack};
      plans_.reduce_bucket_with(packer, buffer_.data(), b, slots,
                                [&](tensor_view packed, reduce_op op) {
                                  const nvtx_range range("cohort reduce");
                                  exchange(packed, op);
                                });
    }
  }

  //! Buckets of the last layout reduced.
  std::size_t bucket_count() const noexcept { return plans_.bucket_count(); }

private:
  // The device's packer for bucketed_reduction::reduce_bucket_with, all on `stream`.
  struct device_packer {
    static constexpr memory_location where = memory_location::device;
    cudaStream_t stream;
    kernels::device::batch_workspace& pack_tables;
    kernels::device::batch_workspace& unpack_tables;
    void scale(tensor_view data, double factor) const {
      const nvtx_range range("cohort scale");
      kernels::device::scale(data, factor, stream);
    }
    void pack(std::span<const const_tensor_view> sources, tensor_view buffer, double factor) const {
      const nvtx_range range("cohort pack");
      kernels::device::pack(sources, buffer, factor, stream, pack_tables);
    }
    void unpack(const_tensor_view buffer, std::span<const tensor_view> targets,
                double factor) const {
      const nvtx_range range("cohort unpack");
      kernels::device::unpack(buffer, targets, factor, stream, unpack_tables);
    }
  };

  // One table per bucket and direction: the host never waits, in the middle of a step, for the
  // copy of a table that the same step queued earlier.
  struct bucket_workspaces {
    kernels::device::batch_workspace pack;
    kernels::device::batch_workspace unpack;
  };

  bucketed_reduction plans_;
  cuda::device_buffer buffer_;
  std::vector<std::unique_ptr<bucket_workspaces>> workspaces_;
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

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
