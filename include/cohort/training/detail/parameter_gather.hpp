// SPDX-License-Identifier: Apache-2.0
#pragma once

// How a sharded optimizer's updated parameters reach every rank: each rank steps the parameters
// it owns, then one all-gather per bucket (parameters of one dtype, grouped by owner so that
// each rank's are one block) hands everyone the rest; a parameter alone in its bucket (a large
// one) is broadcast from its owner, in place, all such broadcasts in flight at once
// (`broadcast_each`: in turn, they would keep one direction of a link busy at a time). Buckets
// bound the buffers to the communicator's bucket size, not the model's: the point of sharding
// is memory.

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/training/shard_plan.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

class parameter_gather {
public:
  //! Plans the gathers of `values` (named `names`, owned as `plan` says) for `rank`, in buckets
  //! of at most `bucket_bytes` (a larger parameter is alone). Throws `invalid_argument` for a
  //! value outside host memory.
  void build(std::span<const tensor_view> values, std::span<const std::string> names,
             const shard_plan& plan, int rank, std::size_t bucket_bytes);

  //! Gathers every parameter from its owner (collective over `comm`: one agreed all-gather per
  //! bucket, then one `broadcast_each` of the buckets of one, or a broadcast of each where the
  //! communicator has no `broadcast_each`). `values` are the parameters as they are now: a
  //! value whose size or dtype changed since `build` throws `invalid_argument` naming it and both
  //! sizes, before anything is sent (every rank alike: the step's gradient agreement compared the
  //! sizes first).
  template <class Communicator>
  void run(Communicator& comm, std::span<const tensor_view> values,
           std::span<const std::string> names) {
    require_layout(values, names);
    constexpr bool at_once = requires {
      comm.broadcast_each(alone_, owners_);
    };
    alone_.clear();
    owners_.clear();
    for (const bucket& b : buckets_) {
      const auto members = std::span(members_).subspan(b.first_member, b.member_count);
      if (b.member_count == 1) {
        // A parameter alone (a large one): broadcast in place from its owner, no copy; all of
        // them at once, below, where the communicator can.
        if constexpr (at_once) {
          alone_.push_back(values[members.front()]);
          owners_.push_back(b.owner);
        } else {
          tensor_view value = values[members.front()];
          comm.broadcast(value, b.owner);
        }
        continue;
      }
      const std::size_t width = size_of(b.type);
      std::byte* in = in_.data();
      for (const std::size_t i : members.subspan(b.own_first, b.own_members)) {
        std::memcpy(in, values[i].data, values[i].size_bytes());
        in += values[i].size_bytes();
      }
      const const_tensor_view block{in_.data(), b.own_count, b.type, memory_location::host};
      tensor_view whole{out_.data(), b.count, b.type, memory_location::host};
      comm.allgather(block, whole,
                     std::span<const std::size_t>(blocks_).subspan(b.first_block, ranks_));
      const std::byte* out = out_.data();
      for (std::size_t m = 0; m < members.size(); ++m) {
        const tensor_view& value = values[members[m]];
        if (m < b.own_first || m >= b.own_first + b.own_members) {
          std::memcpy(value.data, out, value.count * width);
        }
        out += value.count * width;
      }
    }
    if constexpr (at_once) {
      if (!alone_.empty()) {
        comm.broadcast_each(alone_, owners_);
      }
    }
  }

  //! Bytes held by the gather's buffers (an own block and a bucket at most).
  std::size_t buffer_bytes() const noexcept { return in_.size() + out_.size(); }

  //! Throws `invalid_argument` naming a parameter whose size or dtype changed since `build`.
  void require_layout(std::span<const tensor_view> values,
                      std::span<const std::string> names) const;

private:
  struct bucket {
    dtype type = dtype::float32;
    std::size_t first_member = 0;
    std::size_t member_count = 0;
    std::size_t first_block = 0; // into blocks_: elements per rank
    std::size_t own_first = 0;   // this rank's members, within the bucket's
    std::size_t own_members = 0;
    std::size_t own_count = 0;
    std::size_t count = 0;
    int owner = 0; // (of a bucket of one member)
  };

  void add_bucket(dtype type, std::vector<std::size_t>& members,
                  std::span<const tensor_view> values, const shard_plan& plan,
                  std::size_t& in_bytes, std::size_t& out_bytes);

  int rank_ = 0;
  // The parameters broadcast alone at a run, and their owners: members, so that a step
  // allocates nothing once the first has sized them.
  std::vector<tensor_view> alone_;
  std::vector<int> owners_;
  std::size_t ranks_ = 1;
  std::vector<bucket> buckets_;
  std::vector<std::size_t> members_;
  std::vector<std::size_t> blocks_;
  std::vector<tensor_view> layout_; // sizes and dtypes the plan was made for
  std::vector<std::byte> in_;
  std::vector<std::byte> out_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/training/detail/impl/parameter_gather.ipp>
#endif
