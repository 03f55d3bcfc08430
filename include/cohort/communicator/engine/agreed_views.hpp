// SPDX-License-Identifier: Apache-2.0
#pragma once

// The front doors' views of their tensors: checked on this rank, then agreed on by every rank
// (count, dtype, one detail, or every rank's block counts), so that a bad argument on one rank is
// an error on every rank instead of a collective that hangs or misreads. Templates over the
// caller's tensor types; the checks themselves are compiled once (checks.hpp).

#include <cohort/communicator/engine/checks.hpp>
#include <cohort/config.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

template <class T>
tensor_view host_view(const checks& c, T& t, std::string_view what) {
  const tensor_view v = make_view(t, what);
  c.require_location(v.location, false, what);
  return v;
}

template <class T>
const_tensor_view host_const_view(const checks& c, const T& t, std::string_view what) {
  const const_tensor_view v = make_const_view(t, what);
  c.require_location(v.location, false, what);
  return v;
}

// One tensor: its count, dtype and one detail (the op, or the root when `rooted`).
template <class T>
tensor_view agreed_view(const checks& c, T& t, const char* operation, int value,
                        std::string_view name, bool rooted = false) {
  tensor_view v;
  const std::string problem = local_checks([&] {
    v = host_view(c, t, operation);
    if (rooted) {
      c.check_root(value, operation);
    }
  });
  c.agree(operation, v.count, v.type, value, name, problem);
  return v;
}

// A gather (in is the block) or a scatter (out is), whose whole exists on `root` only: the ranks
// agree on the block's count and dtype, and on the root.
template <class In, class Out>
std::pair<const_tensor_view, tensor_view> rooted_blocks(const checks& c, const In& in, Out& out,
                                                        const char* operation, bool out_is_block,
                                                        int root) {
  const_tensor_view i;
  tensor_view o;
  const std::string problem = local_checks([&] {
    c.check_root(root, operation);
    const bool whole_here = c.rank() == root;
    if (out_is_block || whole_here) {
      o = host_view(c, out, operation);
    }
    if (!out_is_block || whole_here) {
      i = host_const_view(c, in, operation);
    }
    if (whole_here) {
      out_is_block ? c.check_blocks(o, i, operation) : c.check_blocks(i, o, operation);
    }
  });
  const const_tensor_view block = out_is_block ? const_tensor_view(o) : i;
  c.agree(operation, block.count, block.type, root, "root", problem);
  return {i, o};
}

// A per-rank block and a size()-rank whole (allgather: in is the block; reduce-scatter: out is),
// blocks of one size, or of `counts` where given (one per rank, compared too; `mpi_counts` then
// holds the counts and offsets as MPI takes them).
struct agreed_block_views {
  const_tensor_view in;
  tensor_view out;
  std::pair<std::vector<int>, std::vector<int>> mpi_counts;
};

template <class In, class Out>
agreed_block_views agreed_blocks(const checks& c, const In& in, Out& out, const char* operation,
                                 bool out_is_block, int value, std::string_view name,
                                 std::span<const std::size_t> counts = {}) {
  agreed_block_views v;
  const std::string problem = local_checks([&] {
    v.in = host_const_view(c, in, operation);
    v.out = host_view(c, out, operation);
    const const_tensor_view block = out_is_block ? const_tensor_view(v.out) : v.in;
    const const_tensor_view whole = out_is_block ? v.in : const_tensor_view(v.out);
    if (counts.empty()) {
      c.check_blocks(block, whole, operation);
    } else {
      v.mpi_counts = c.check_variable_blocks(block, whole, counts, operation);
    }
  });
  const const_tensor_view block = out_is_block ? const_tensor_view(v.out) : v.in;
  if (counts.empty()) {
    c.agree(operation, block.count, block.type, value, name, problem);
  } else {
    c.agree_on_counts(operation, counts, block.type, value, name, problem,
                      (out_is_block ? v.in.count : v.out.count) * size_of(block.type));
  }
  return v;
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
