// SPDX-License-Identifier: Apache-2.0
#pragma once

// A model whose stages run on different ranks (ChainerMN's MultiNodeChainList). Every rank builds
// the same multi_node_sequential over one communicator and adds to it the stages it runs, each
// with where its input comes from and where its output goes:
//
//   cohort::torch::multi_node_sequential model(comm);
//   if (comm.rank() == 0) model->add(encoder, cohort::torch::from_input, 1);   // x -> rank 1
//   if (comm.rank() == 1) model->add(decoder, 0, cohort::torch::to_output);    // rank 0 -> y
//   at::Tensor y = model(x);   // on rank 1 the output; on rank 0 a zero delegate
//   loss_of(y).backward();     // on rank 0: y.backward(); the gradient comes back from rank 1
//
// A stage's input is the forward's argument (`from_input`), the output of the stage added before
// it on this rank (`from_previous`, the default; the first stage's is then the argument), or what
// a rank sent (its number). Its output goes to a rank (its number) or stays here (`to_output`):
// the next stage's input, or the forward's result.
// Tensors cross ranks with send and recv (functions.hpp), their shapes and dtypes sent first, so
// the receiver needs to know nothing of them. What forward returns carries, added as a zero,
// every delegate of the outputs this rank sent, so that one backward from it runs the whole
// rank's part of the graph (ChainerMN's pseudo_connect, done for the user).
//
// The communicator may be a sub-communicator (`comm.split`): a 2-D grid runs the model's stages
// over the ranks of one split and averages their gradients over another (see
// docs/model-parallelism.md).

#include <cohort/adapters/torch/functions.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <ATen/ATen.h>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace torch {

//! A stage's input: the forward's argument.
inline constexpr int from_input = -1;
//! A stage's input: the output of the stage added before it on this rank (for the first stage on
//! a rank: the forward's argument).
inline constexpr int from_previous = -2;
//! A stage's output: kept on this rank (the next stage's input, or the forward's result).
inline constexpr int to_output = -1;

//! The stages of a model this rank runs, and the ranks their tensors cross to. Make it with the
//! communicator the stages talk over (it must outlive the module and any graph it built).
class multi_node_sequential_impl : public ::torch::nn::Module {
public:
  template <class Communicator>
  explicit multi_node_sequential_impl(Communicator& comm, int tag = 0)
      : comm_(detail::collectives_of(comm))
      , tag_(tag) {}

  //! Adds a stage run on this rank: a module holder (torch::nn::Linear, Sequential, one of
  //! TORCH_MODULE's) or a std::shared_ptr to a module, whose forward takes and returns a tensor.
  //! `from`: a rank, `from_input` or `from_previous`; `to`: a rank or `to_output`. The module's
  //! parameters become this module's ("stage<i>.<name>"). Every stage is added before the first
  //! forward.
  template <class Module>
  multi_node_sequential_impl& add(Module module, int from = from_previous, int to = to_output) {
    const std::string where = "cohort::torch::multi_node_sequential on rank " +
                              std::to_string(comm_->rank) + ": stage " +
                              std::to_string(stages_.size());
    if (wiring_agreed_) {
      // The ranks agreed on the wiring at the first forward; a stage added on some rank since
      // would need them to agree again, in a collective the others do not know to enter.
      throw invalid_argument(where + " added after the first forward: add every stage first");
    }
    if (from < from_previous || from >= comm_->size || from == comm_->rank) {
      throw invalid_argument(where + " takes its input from " + std::to_string(from) +
                             ": not another rank (0 to " + std::to_string(comm_->size - 1) +
                             "), from_input or from_previous");
    }
    if (to < to_output || to >= comm_->size || to == comm_->rank) {
      throw invalid_argument(where + " sends its output to " + std::to_string(to) +
                             ": not another rank (0 to " + std::to_string(comm_->size - 1) +
                             ") or to_output");
    }
    if (from == from_previous && stages_.empty()) {
      from = from_input;
    }
    if (from == from_previous && stages_.back().to != to_output) {
      throw invalid_argument(where +
                             " takes the previous stage's output, but that stage sends it "
                             "to rank " +
                             std::to_string(stages_.back().to));
    }
    std::shared_ptr<::torch::nn::Module> registered;
    if constexpr (requires { module.ptr(); }) {
      registered = module.ptr(); // a module holder: torch::nn::Linear, Sequential, ...
    } else {
      registered = module; // a std::shared_ptr to a module
    }
    register_module("stage" + std::to_string(stages_.size()), registered);
    stages_.push_back(
        {[module](const at::Tensor& x) mutable -> at::Tensor { return module->forward(x); }, from,
         to});
    return *this;
  }

  //! Runs this rank's stages in order. Collective over the communicator: every rank calls it once
  //! a step, and runs backward from what it returns (add it to a loss, or call backward on it).
  //! Returns the last output kept here plus a zero carrying the delegates of the outputs sent; a
  //! zero scalar if every output was sent. The first call after stages were added checks, on
  //! every rank alike, that every tensor a stage sends has a stage to receive it. A stage that
  //! fails (its module throws, its input is missing) tells the ranks its later stages send to, so
  //! they throw too instead of waiting; the ranks waiting for its gradients learn it from the
  //! communicator's timeout. After a failure, treat the communicator as lost (end the job, or
  //! make a new one): where stages form a cycle, a notice may be left queued. Send and receive
  //! ends must record gradients alike (no NoGradGuard on one side only: that is not checked).
  at::Tensor forward(const at::Tensor& input = {}) {
    if (!wiring_agreed_) {
      agree_on_wiring();
    }
    at::Tensor current;
    at::Tensor delegates;
    std::size_t told = 0; // the stages whose receivers have heard from this rank
    try {
      for (std::size_t i = 0; i < stages_.size(); ++i) {
        stage& s = stages_[i];
        at::Tensor in = s.from == from_input      ? input
                        : s.from == from_previous ? current
                                                  : receive(s.from);
        if (!in.defined()) {
          throw invalid_argument(where(i) + " takes the forward's argument, and none was given");
        }
        at::Tensor out = s.run(in);
        if (s.to == to_output) {
          current = std::move(out);
          told = i + 1;
          continue;
        }
        const std::vector<std::int64_t> d = detail::description(out);
        comm_->send_description(d, s.to, tag_);
        told = i + 1;
        if (d[0] < 0) { // the receiver throws on this description; the tensor is not sent
          throw invalid_argument(where(i) + "'s output is " + detail::describe(d));
        }
        at::Tensor delegate = detail::send_through(comm_, out, s.to, tag_, /*offered=*/false);
        delegates = delegates.defined() ? delegates + delegate : delegate;
        current = at::Tensor();
      }
    } catch (...) {
      for (std::size_t j = told; j < stages_.size(); ++j) {
        if (stages_[j].to != to_output) {
          comm_->send_description({detail::no_tensor}, stages_[j].to, tag_);
        }
      }
      throw;
    }
    if (!current.defined()) {
      return delegates.defined() ? delegates : at::zeros({});
    }
    return delegates.defined() ? current + delegates.to(current.scalar_type()) : current;
  }

  //! The stages this rank runs.
  std::size_t stages() const noexcept { return stages_.size(); }

private:
  struct stage {
    std::function<at::Tensor(const at::Tensor&)> run; // the module's forward
    int from;
    int to;
  };

  std::string who() const {
    return "cohort::torch::multi_node_sequential on rank " + std::to_string(comm_->rank);
  }
  std::string where(std::size_t i) const { return who() + ": stage " + std::to_string(i); }

  at::Tensor receive(int source) {
    const std::vector<std::int64_t> d = comm_->recv_description(source, tag_);
    if (d.empty() || d[0] < 0) {
      throw error(who() + ": rank " + std::to_string(source) +
                  (d.empty() || d[0] == detail::no_tensor
                       ? std::string(" sent no tensor (a stage of its failed)")
                       : " sent " + detail::describe(d)));
    }
    return detail::recv_through(comm_, d, source, tag_, /*offered=*/false);
  }

  // Collective: every rank's wiring, so that a tensor sent with no stage to receive it (or the
  // reverse) is an error on every rank now rather than a rank waiting for ever.
  void agree_on_wiring() {
    std::vector<std::int64_t> mine{tag_}; // the tag first: another one would never be received
    for (const stage& s : stages_) {
      mine.push_back(s.from);
      mine.push_back(s.to);
    }
    auto all = comm_->lists(mine);
    for (std::size_t q = 0; q < all.size(); ++q) {
      if (all[q].front() != all[0].front()) {
        throw mismatch_error(who() + ": the tag is " + std::to_string(all[0].front()) +
                             " on rank 0 but " + std::to_string(all[q].front()) + " on rank " +
                             std::to_string(q));
      }
    }
    for (auto& list : all) {
      list.erase(list.begin());
    }
    for (std::size_t a = 0; a < all.size(); ++a) {
      for (std::size_t b = 0; b < all.size(); ++b) {
        if (a == b) {
          continue;
        }
        std::int64_t sends = 0, receives = 0;
        for (std::size_t k = 0; k + 1 < all[a].size(); k += 2) {
          sends += all[a][k + 1] == static_cast<std::int64_t>(b) ? 1 : 0;
        }
        for (std::size_t k = 0; k + 1 < all[b].size(); k += 2) {
          receives += all[b][k] == static_cast<std::int64_t>(a) ? 1 : 0;
        }
        if (sends != receives) {
          throw invalid_argument(who() + ": rank " + std::to_string(a) + "'s stages send " +
                                 std::to_string(sends) + " tensor(s) to rank " + std::to_string(b) +
                                 ", whose stages receive " + std::to_string(receives) +
                                 " from rank " + std::to_string(a));
        }
      }
    }
    wiring_agreed_ = true;
  }

  c10::intrusive_ptr<detail::collectives> comm_;
  int tag_;
  bool wiring_agreed_ = false;
  std::vector<stage> stages_;
};

//! The module holder, as TORCH_MODULE makes them (see multi_node_batch_norm's).
class multi_node_sequential : public ::torch::nn::ModuleHolder<multi_node_sequential_impl> {
public:
  using ::torch::nn::ModuleHolder<multi_node_sequential_impl>::ModuleHolder;
  using Impl = multi_node_sequential_impl;
};

} // namespace torch
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
