// SPDX-License-Identifier: Apache-2.0
// Issue 30: the LibTorch adapter under misuse, part of the adapters.torch suite (its main() is
// torch.cpp's). A trainer that touches the gradients between backward and step() while
// cohort's thread still reduces them (ASan runs these), optimizers and messages that differ from
// rank to rank, buffers that drift apart, and the step after an error.

#include <cohort/adapters/torch.hpp>
#include <cohort/cohort.hpp>
#if __has_include(<xxhash.h>)
#include <cohort/adapters/torch/checkpoint.hpp>
#include <cohort/checkpoint.hpp>
#endif

#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <string>
#include <torch/torch.h>
#include <unistd.h>
#include <vector>

#include "support/expect.hpp"
#include "torch_models.hpp"

using cohort::test::message_has;

namespace {

using torch_models::batch;
using torch_models::loss_of;
using torch_models::same_on_every_rank;
using torch_models::wide;
using torch_models::wide_seeded;

// A one-process reference: the mean of every rank's loss, stepped with SGD, for `steps` steps,
// taking the steps `taken` says.
std::vector<at::Tensor> reference(int ranks, int steps, const std::vector<bool>& taken) {
  wide m = wide_seeded(0);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.05));
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    torch::Tensor total = torch::zeros({});
    for (int r = 0; r < ranks; ++r) {
      total = total + loss_of(m, r, s);
    }
    (total / ranks).backward();
    if (taken[static_cast<std::size_t>(s)]) {
      opt.step();
    }
  }
  return m->parameters();
}

bool close_to(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!torch::allclose(a[i], b[i], 1e-4, 1e-5)) {
      return false;
    }
  }
  return true;
}

// A trainer on every rank: its own model (made equal by the optimizer), SGD over it, overlapped.
struct trainer {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  int n = comm.size();
  int r = comm.rank();
  wide m = wide_seeded(r);
  cohort::torch::distributed_optimizer<torch::optim::SGD, cohort::flat> opt{
      torch::optim::SGD(m->parameters(), 0.05), comm, *m};

  // After an error: the next step reduces and steps as usual, and the replicas are one.
  bool next_step_works(int step) {
    opt.zero_grad();
    loss_of(m, r, step).backward();
    opt.step();
    return !comm.grad_sync_pending() && same_on_every_rank(comm, m->parameters());
  }
};

} // namespace

// Point 1: between backward and step() a trainer replaces a gradient. Since issue 31 backward
// waits for its reduction (as DDP's does): the old gradient is let go only once cohort's thread
// is done with it (ASan), and the replaced one, holding what the trainer put there, is the one
// stepped with, on every rank alike.
BOOST_FIXTURE_TEST_CASE(a_gradient_replaced_between_backward_and_step_is_the_one_stepped_with,
                        trainer) {
  loss_of(m, r, 0).backward();
  for (auto& p : m->named_parameters()) {
    if (p.key() == "fc2.weight") {
      p.value().mutable_grad() = p.value().grad().clone(); // the old one let go here
    }
  }
  opt.step();
  BOOST_TEST(!comm.grad_sync_pending());
  BOOST_TEST(same_on_every_rank(comm, m->parameters()));
  BOOST_TEST(next_step_works(1));
}

// Point 1: zero_grad() between backward and step() (a loop that skips step() for a few
// iterations) ends the reduction first, its gradients dropped on every rank; inner().step()
// waits for the reduction and steps with the averaged gradients. Either way the replicas stay
// identical and equal to one process taking the same steps.
BOOST_FIXTURE_TEST_CASE(a_loop_that_skips_step_or_steps_the_inner_optimizer_stays_correct,
                        trainer) {
  const int steps = 6;
  std::vector<bool> taken;
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad(); // with a reduction in flight after a skipped step: dropped first
    loss_of(m, r, s).backward();
    switch (s % 3) {
    case 0:
      opt.step();
      taken.push_back(true);
      break;
    case 1:
      taken.push_back(false); // no step: the next zero_grad drops the reduction
      break;
    default:
      opt.inner().step(); // waits for the reduction, steps with the averaged gradients
      taken.push_back(true);
      break;
    }
  }
  opt.zero_grad();
  BOOST_TEST(!comm.grad_sync_pending());
  BOOST_TEST(same_on_every_rank(comm, m->parameters()));
  BOOST_TEST(close_to(m->parameters(), reference(n, steps, taken)));
  // zero_grad(false) zeros in place: the same, with the reduction in flight.
  loss_of(m, r, steps).backward();
  opt.zero_grad(false);
  BOOST_TEST(!comm.grad_sync_pending());
  for (const at::Tensor& p : m->parameters()) {
    BOOST_TEST(p.grad().abs().max().item<float>() == 0.0f);
  }
}

// Point 2: Adam on one rank and AdamW on another have the same options and state: they would
// load each other's and drift apart. Their types are compared, naming both.
BOOST_AUTO_TEST_CASE(optimizers_of_other_types_are_refused_naming_both) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() == 1) {
    return;
  }
  wide m = wide_seeded(comm.rank());
  const auto options = torch::optim::AdamOptions(0.01).weight_decay(0.1);
  const auto refused = message_has({"the optimizer's type", "torch::optim::Adam on rank 0 but",
                                    "torch::optim::AdamW on rank 1"});
  if (comm.rank() == 0) {
    BOOST_CHECK_EXCEPTION((cohort::torch::distributed_optimizer{
                              torch::optim::Adam(m->parameters(), options), comm, *m}),
                          cohort::mismatch_error, refused);
  } else {
    BOOST_CHECK_EXCEPTION(
        (cohort::torch::distributed_optimizer{
            torch::optim::AdamW(m->parameters(),
                                torch::optim::AdamWOptions(0.01).weight_decay(0.1)),
            comm, *m}),
        cohort::mismatch_error, refused);
  }
  // The options themselves, compared where they are not the root's (a group of its own).
  torch::optim::SGD sgd(m->parameters(),
                        torch::optim::SGDOptions(0.1).momentum(comm.rank() == 0 ? 0.9 : 0.5));
  BOOST_CHECK_EXCEPTION(
      cohort::torch::agree_on_optimizer(comm, sgd), cohort::mismatch_error,
      message_has({"param group 0's option 'momentum'", "0.90000000000000002", "0.5"}));
}

// Point 3: a message is described; a receive that expects another dtype or shape is an error on
// both ends naming both, and nothing is received.
BOOST_AUTO_TEST_CASE(a_recv_that_expects_another_tensor_is_an_error_on_both_ends) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const int r = comm.rank();
  // To itself: the receive checks, and drains what it refuses.
  (void)cohort::torch::send(comm, torch::ones({4}), r, 2);
  BOOST_CHECK_EXCEPTION(cohort::torch::recv(comm, r, {2}, torch::kDouble, 2),
                        cohort::mismatch_error,
                        message_has({"sends Float [4]", "expects Double [2]"}));
  (void)cohort::torch::send(comm, torch::full({3}, 7.0), r, 2);
  BOOST_TEST(
      torch::equal(cohort::torch::recv(comm, r, {3}, torch::kFloat, 2), torch::full({3}, 7.0)));
  if (comm.size() == 1) {
    return;
  }
  const auto both = message_has({"rank 0 sends Float [4]", "rank 1 expects Double [2]"});
  if (r == 0) {
    BOOST_CHECK_EXCEPTION(cohort::torch::send(comm, torch::ones({4}), 1, 3), cohort::mismatch_error,
                          both);
  } else if (r == 1) {
    BOOST_CHECK_EXCEPTION(cohort::torch::recv(comm, 0, {2}, torch::kDouble, 3),
                          cohort::mismatch_error, both);
  }
  // Nothing is left queued: the next message of the tag is the right one.
  if (r == 0) {
    (void)cohort::torch::send(comm, torch::arange(4, torch::kFloat), 1, 3);
  } else if (r == 1) {
    const at::Tensor got = cohort::torch::recv(comm, 0, {4}, torch::kFloat, 3);
    BOOST_TEST(torch::equal(got, torch::arange(4, torch::kFloat)));
  }
  // Two ranks that both send first are told so (each waits for the other's receive).
  if (comm.size() == 2) {
    BOOST_CHECK_EXCEPTION(cohort::torch::send(comm, torch::ones({2}), 1 - r, 4),
                          cohort::mismatch_error, message_has({"both ranks sent"}));
  }
  comm.barrier();
}

// Point 6: an empty batch on every rank has no statistics: the running ones stay as they were,
// as LibTorch's BatchNorm leaves them (not NaN).
BOOST_AUTO_TEST_CASE(an_empty_global_batch_leaves_the_running_statistics_as_they_were) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  cohort::torch::multi_node_batch_norm bn(comm, 3);
  bn->train();
  (void)bn->forward(torch::randn({4, 3}) + comm.rank());
  const at::Tensor mean = bn->running_mean.clone(), var = bn->running_var.clone();
  const at::Tensor out = bn->forward(torch::zeros({0, 3}));
  BOOST_TEST(out.size(0) == 0);
  BOOST_TEST(torch::equal(bn->running_mean, mean));
  BOOST_TEST(torch::equal(bn->running_var, var));
  // Empty on some ranks only: the others' values are the batch.
  (void)bn->forward(comm.rank() == 0 ? torch::ones({2, 3}) : torch::zeros({0, 3}));
  BOOST_TEST(torch::allclose(bn->running_mean, mean * 0.9 + 0.1));
}

// Point 6: integer buffers (num_batches_tracked) drift apart when one rank alone runs a
// training-mode forward (a GAN sampling on rank 0): average_buffers makes them the root's.
BOOST_AUTO_TEST_CASE(average_buffers_makes_integer_buffers_the_roots) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  torch::nn::BatchNorm1d bn(3);
  bn->train();
  (void)bn->forward(torch::randn({4, 3}));
  if (comm.rank() == 0) {
    (void)bn->forward(torch::randn({4, 3})); // rank 0 alone samples
  }
  BOOST_TEST(bn->num_batches_tracked.item<std::int64_t>() == (comm.rank() == 0 ? 2 : 1));
  cohort::torch::average_buffers(comm, *bn);
  BOOST_TEST(bn->num_batches_tracked.item<std::int64_t>() == 2);
  BOOST_TEST(same_on_every_rank(comm, {bn->running_mean, bn->running_var}));
}

#if __has_include(<xxhash.h>)
// Point 6: a checkpoint's replica check names the buffer that differs.
BOOST_AUTO_TEST_CASE(the_replica_check_of_a_checkpoint_names_the_buffer_that_differs) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() == 1) {
    return;
  }
  torch::nn::Sequential model(torch::nn::Linear(3, 3), torch::nn::BatchNorm1d(3));
  cohort::torch::broadcast_module(comm, *model);
  if (comm.rank() == comm.size() - 1) {
    model[1]->named_buffers()["num_batches_tracked"].add_(1);
  }
  std::string where;
  if (comm.rank() == 0) {
    where = (std::filesystem::temp_directory_path() /
             ("cohort-torch-differ-" + std::to_string(::getpid())))
                .string();
  }
  where = comm.bcast_obj(where);
  {
    cohort::checkpointer ckpt{comm, where};
    BOOST_CHECK_EXCEPTION(
        ckpt.save(1, cohort::torch::module_state(*model)), cohort::checkpoint_error,
        message_has({"the replicas are not identical", "the first part that differs: tensor "
                                                       "'1.num_batches_tracked'"}));
  }
  comm.barrier();
  if (comm.rank() == 0) {
    std::filesystem::remove_all(where);
  }
}
#endif

// Point 8: a reduction that fails to start on every rank (a strided gradient on one) makes that
// backward throw everywhere; the next iteration starts afresh with no call between, on every
// rank alike.
BOOST_FIXTURE_TEST_CASE(after_a_failed_start_the_next_backward_starts_afresh_on_every_rank,
                        trainer) {
  if (r == n - 1) { // a gradient that is a strided view: cohort refuses it, by name
    at::Tensor& grad = m->fc3->bias.mutable_grad();
    grad = torch::zeros({16}).slice(0, 0, 16, 2);
  }
  BOOST_CHECK_EXCEPTION(loss_of(m, r, 0).backward(), std::exception, message_has({"fc3.bias"}));
  BOOST_TEST(!comm.grad_sync_pending());
  // No call of cohort's between: LibTorch's own zero_grad, and the next backward.
  m->zero_grad(/*set_to_none=*/true);
  loss_of(m, r, 1).backward();
  opt.step();
  BOOST_TEST(next_step_works(2));
}

// Point 1, further: a second backward before step() with the module's own zero_grad between
// (a loop that skips a step): the first backward's reduction was over when it returned, the
// gradients it left are let go (ASan), and the step reduces the second backward's alone.
BOOST_FIXTURE_TEST_CASE(a_second_backward_after_the_modules_zero_grad_reduces_the_second_alone,
                        trainer) {
  wide alone = wide_seeded(r);
  cohort::torch::distributed_optimizer alone_opt{torch::optim::SGD(alone->parameters(), 0.05), comm,
                                                 *alone};
  loss_of(m, r, 0).backward();
  m->zero_grad(/*set_to_none=*/true);
  loss_of(m, r, 1).backward();
  opt.step();
  alone_opt.zero_grad();
  loss_of(alone, r, 1).backward();
  alone_opt.step();
  BOOST_TEST(!comm.grad_sync_pending());
  for (std::size_t i = 0; i < m->parameters().size(); ++i) {
    BOOST_TEST(torch::equal(m->parameters()[i], alone->parameters()[i]));
  }
  BOOST_TEST(next_step_works(2));
}

// Point 1, further: an optimizer destroyed in the middle of a step (its gradients replaced on one
// rank) abandons its reduction before the tensors it holds go (ASan); the communicator goes on.
BOOST_AUTO_TEST_CASE(an_optimizer_destroyed_mid_step_lets_go_of_nothing_in_flight) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const int n = comm.size(), r = comm.rank();
  wide m = wide_seeded(r);
  {
    cohort::torch::distributed_optimizer opt{torch::optim::SGD(m->parameters(), 0.05), comm, *m};
    loss_of(m, r, 0).backward();
    if (r == n - 1) {
      m->fc1->weight.mutable_grad() = torch::zeros_like(m->fc1->weight);
    }
  }
  BOOST_TEST(!comm.grad_sync_pending());
  std::vector<float> one(1, 1.0f);
  comm.allreduce(one);
  BOOST_TEST(one[0] == static_cast<float>(n));
}

// Point 1, further: a growing resize_ would swap a new buffer into a gradient's storage and free
// the old one cohort's thread still writes: LibTorch refuses it while the reduction is in flight
// (here from a hook later in the same backward, on every rank), and the storage is resizable
// again once backward is over (its reduction done).
BOOST_FIXTURE_TEST_CASE(a_gradient_cannot_be_resized_while_it_is_reduced, trainer) {
  bool refused = false;
  const unsigned hook = m->fc1->weight.register_hook([&](const at::Tensor&) {
    at::Tensor grad = m->fc2->weight.grad(); // (marked ready before fc1's gradient arrives)
    const std::vector<std::int64_t> sizes = grad.sizes().vec();
    try {
      grad.resize_({grad.numel() * 4});
    } catch (const c10::Error&) {
      refused = true;
      grad.resize_(sizes); // (LibTorch changed the sizes before it refused the storage)
    }
  });
  loss_of(m, r, 0).backward();
  m->fc1->weight.remove_hook(hook);
  BOOST_TEST(refused);
  BOOST_TEST(m->fc2->weight.grad().storage().resizable());
  opt.step();
  BOOST_TEST(same_on_every_rank(comm, m->parameters()));
  BOOST_TEST(next_step_works(1));
}
