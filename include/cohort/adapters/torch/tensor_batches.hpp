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
    std::vector<std::vector<std::int64_t>> described;
    if (comm.rank() == root) {
      for (at::Tensor& t : batch) {
        if (t.defined() && !t.device().is_cpu()) {
          throw invalid_argument("cohort::torch::tensor_batches: tensor " +
                                 std::to_string(&t - batch.data()) + " of the batch is on " +
                                 t.device().str() + ": batches travel from CPU memory");
        }
        t = t.defined() ? t.contiguous() : t;
        described.push_back(detail::description(t));
      }
    }
    described = comm.bcast_obj(described, root);
    if (comm.rank() != root) {
      batch.clear();
      for (const auto& d : described) {
        batch.push_back(d.empty() || d[0] < 0
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
