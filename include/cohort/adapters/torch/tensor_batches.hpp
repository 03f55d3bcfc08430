// SPDX-License-Identifier: Apache-2.0
#pragma once

// LibTorch batches sent from the root to every rank, for cohort::multi_node_iterator: their dtypes
// and shapes first (one small broadcast), then each tensor's values (one broadcast each), so that
// no rank needs to know the batch's shape beforehand and nothing is serialised element by element.

#include <cohort/adapters/torch/functions.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <boost/serialization/vector.hpp>

#include <ATen/ATen.h>
#include <cstddef>
#include <cstdint>
#include <string>
#include <torch/data/example.h>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {

//! The `Send` policy of cohort::multi_node_iterator for a batch of CPU tensors: a
//! `std::vector<at::Tensor>` or a `::torch::data::Example<>` (data and target).
struct tensor_batches {
  template <class Communicator>
  void operator()(Communicator& comm, std::vector<at::Tensor>& batch, int root) const {
    // The root's tensors described; a tensor outside CPU memory is described as such, and every
    // rank throws alike (the root alone throwing would leave the others waiting).
    std::vector<std::vector<std::int64_t>> described;
    if (comm.rank() == root) {
      for (at::Tensor& t : batch) {
        if (t.defined() && t.device().is_cpu()) {
          t = t.contiguous();
        }
        described.push_back(detail::description(t));
      }
    }
    described = comm.bcast_obj(described, root);
    for (std::size_t i = 0; i < described.size(); ++i) {
      if (described[i].empty() || (described[i][0] < 0 && described[i][0] != detail::no_tensor)) {
        throw invalid_argument("cohort::torch::tensor_batches on rank " +
                               std::to_string(comm.rank()) + ": tensor " + std::to_string(i) +
                               " of the root's (rank " + std::to_string(root) + ") batch is " +
                               detail::describe(described[i]));
      }
    }
    if (comm.rank() != root) {
      batch.clear();
      for (const auto& d : described) {
        batch.push_back(d[0] == detail::no_tensor
                            ? at::Tensor()
                            : at::empty(detail::sizes_of(d), detail::options_of(d)));
      }
    }
    for (at::Tensor& t : batch) {
      if (t.defined()) {
        comm.broadcast(t, root);
      }
    }
  }

  template <class Communicator>
  void operator()(Communicator& comm, ::torch::data::Example<>& batch, int root) const {
    std::vector<at::Tensor> both{batch.data, batch.target};
    (*this)(comm, both, root);
    batch.data = both[0];
    batch.target = both[1];
  }
};

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
