// SPDX-License-Identifier: Apache-2.0
// cohort::torch::sharded_optimizer (ZeRO stages 1 and 2) against cohort::torch::
// distributed_optimizer: the same parameters after 20 steps of SGD with momentum, Adam and
// AdamW, overlapped and not; the state of the rank's shard alone; the gradients it does not own
// freed at stage 2; a checkpoint of the shards resumed at another number of ranks (2 -> 3 and
// 3 -> 2) as the unsharded wrapper's checkpoint resumes.
#include <cohort/adapters/torch.hpp>
#include <cohort/cohort.hpp>
#if __has_include(<xxhash.h>)
#include <cohort/adapters/torch/checkpoint.hpp>
#include <cohort/checkpoint.hpp>

#endif

#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <torch/torch.h>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/expect.hpp"
#include "support/first_ranks.hpp"
#include "torch_models.hpp"
#if __has_include(<xxhash.h>)
#include "checkpoint/fresh_directory.hpp"
#endif

using cohort::test::message_has;
using cohort::test::on_first;

namespace {

enum class kind { momentum, adam, adamw };

constexpr int steps = 20;

// The module's parameters after `steps` steps of the sharded or the unsharded wrapper over `Opt`.
template <bool Sharded, class Opt, class Options, class Make>
std::vector<at::Tensor> train(cohort::flat& comm, Make make, Options options,
                              std::size_t* states = nullptr) {
  using wrapper = std::conditional_t<Sharded, cohort::torch::sharded_optimizer<Opt, cohort::flat>,
                                     cohort::torch::distributed_optimizer<Opt, cohort::flat>>;
  auto model = torch_models::wide_seeded(comm.rank() + 1); // (the broadcast makes them one)
  wrapper opt(make(model->parameters()), comm, *model, options);
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    torch_models::loss_of(model, comm.rank(), s).backward();
    opt.step();
  }
  if (states != nullptr) {
    *states = opt.state().size();
  }
  std::vector<at::Tensor> values;
  for (const auto& p : model->parameters()) {
    values.push_back(p.detach().clone());
  }
  return values;
}

template <class Opt, class Make>
void compare(cohort::flat& comm, Make make, bool overlap) {
  const auto reference =
      train<false, Opt>(comm, make, cohort::torch::distributed_options{.overlap = overlap});
  for (const auto stage : {cohort::zero_stage::optimizer_state, cohort::zero_stage::gradients}) {
    std::size_t states = 0;
    const auto sharded = train<true, Opt>(
        comm, make, cohort::torch::sharded_options{.overlap = overlap, .stage = stage}, &states);
    BOOST_TEST_CONTEXT("stage " << static_cast<int>(stage) << ", overlap " << overlap) {
      double worst = 0;
      for (std::size_t i = 0; i < sharded.size(); ++i) {
        worst = std::max(worst, (sharded[i] - reference[i]).abs().max().template item<double>());
      }
      // Stage 1 reduces as distributed_optimizer does: the same bits. Stage 2's reduce-scatter
      // may sum in another order: to rounding.
      BOOST_TEST(worst <= (stage == cohort::zero_stage::optimizer_state ? 0.0 : 1e-5));
      BOOST_TEST(torch_models::same_on_every_rank(comm, sharded));
      // State for this rank's parameters alone (wide: 6 tensors, by bytes over the ranks).
      const auto plan = cohort::balance_shards(
          [] {
            std::vector<std::size_t> bytes;
            for (const auto& p : torch_models::wide()->parameters()) {
              bytes.push_back(static_cast<std::size_t>(p.numel()) * sizeof(float));
            }
            return bytes;
          }(),
          comm.size());
      BOOST_TEST(states == plan.owned_by(comm.rank()).size());
    }
  }
}

#if __has_include(<xxhash.h>)
// 5 steps of Adam on `before` ranks, a checkpoint, a new model and optimizer on `after` ranks
// resumed from it, 5 steps more: the parameters after, and the resumed optimizer's state count.
template <bool Sharded>
std::pair<std::vector<at::Tensor>, std::size_t>
train_across(cohort::flat& comm, const std::filesystem::path& dir, int before, int after,
             cohort::zero_stage stage) {
  using wrapper =
      std::conditional_t<Sharded,
                         cohort::torch::sharded_optimizer<torch::optim::Adam, cohort::flat>,
                         cohort::torch::distributed_optimizer<torch::optim::Adam, cohort::flat>>;
  const auto make = [&](cohort::flat& job, torch_models::wide& model) {
    if constexpr (Sharded) {
      return wrapper(torch::optim::Adam(model->parameters(), 1e-2), job, *model,
                     cohort::torch::sharded_options{.stage = stage});
    } else {
      return wrapper(torch::optim::Adam(model->parameters(), 1e-2), job, *model);
    }
  };
  const auto state_of = [](wrapper& opt, torch_models::wide& model) {
    if constexpr (Sharded) {
      return cohort::torch::sharded_optimizer_state(opt, *model);
    } else {
      return cohort::torch::optimizer_state(opt.inner(), *model);
    }
  };
  std::vector<at::Tensor> values;
  std::size_t states = 0;
  on_first(comm, before, [&](cohort::flat& job) {
    auto model = torch_models::wide_seeded(job.rank() + 1);
    auto opt = make(job, model);
    for (int s = 0; s < 5; ++s) {
      opt.zero_grad();
      torch_models::loss_of(model, job.rank(), s).backward();
      opt.step();
    }
    cohort::checkpointer ckpt{job, dir};
    ckpt.save(5, cohort::torch::module_state(*model), state_of(opt, model));
  });
  on_first(comm, after, [&](cohort::flat& job) {
    auto model = torch_models::wide_seeded(job.rank() + 7); // all from the checkpoint
    auto opt = make(job, model);
    cohort::checkpointer ckpt{job, dir};
    auto module = cohort::torch::module_state(*model);
    auto state = state_of(opt, model);
    BOOST_TEST(ckpt.resume(module, state).value_or(0) == 5u);
    states = opt.state().size();
    for (int s = 5; s < 10; ++s) {
      opt.zero_grad();
      torch_models::loss_of(model, job.rank(), s).backward();
      opt.step();
    }
    for (const auto& p : model->parameters()) {
      values.push_back(p.detach().clone());
    }
    BOOST_TEST(torch_models::same_on_every_rank(job, values));
  });
  return {values, states};
}
#endif

} // namespace

BOOST_AUTO_TEST_SUITE(sharded_optimizer)

#if __has_include(<xxhash.h>)
BOOST_AUTO_TEST_CASE(a_checkpoint_of_the_shards_resumes_at_another_number_of_ranks) {
  auto comm = cohort::make_communicator<cohort::flat>();
  const int n = comm.size();
  // At 3 ranks 3 -> 3, 2 -> 3 and 3 -> 2; at 2, 2 -> 2, 1 -> 2 and 2 -> 1; at 1, 1 -> 1.
  std::vector<std::pair<int, int>> cases = {{n, n}};
  if (n > 1) {
    cases.insert(cases.end(), {{n - 1, n}, {n, n - 1}});
  }
  std::vector<std::size_t> bytes;
  for (const auto& p : torch_models::wide()->parameters()) {
    bytes.push_back(static_cast<std::size_t>(p.numel()) * sizeof(float));
  }
  for (const auto stage : {cohort::zero_stage::optimizer_state, cohort::zero_stage::gradients}) {
    for (const auto& [before, after] : cases) {
      BOOST_TEST_CONTEXT("stage " << static_cast<int>(stage) << ", " << before << " -> " << after
                                  << " ranks") {
        const cohort::test::fresh_directory unsharded_dir(comm, "torch-unsharded");
        const cohort::test::fresh_directory sharded_dir(comm, "torch-sharded");
        const auto [reference, all_states] =
            train_across<false>(comm, unsharded_dir.path(), before, after, stage);
        const auto [sharded, states] =
            train_across<true>(comm, sharded_dir.path(), before, after, stage);
        if (comm.rank() < after) {
          double worst = 0;
          for (std::size_t i = 0; i < sharded.size(); ++i) {
            worst = std::max(worst, (sharded[i] - reference[i]).abs().max().item<double>());
          }
          // Stage 1 reduces as distributed_optimizer does: the same bits; stage 2, to rounding.
          BOOST_TEST(worst <= (stage == cohort::zero_stage::optimizer_state ? 0.0 : 1e-5));
          // Each rank resumed the state of the parameters it owns now, and no other.
          BOOST_TEST(all_states == bytes.size());
          BOOST_TEST(states == cohort::balance_shards(bytes, after).owned_by(comm.rank()).size());
        }
      }
    }
  }
}
#endif

BOOST_AUTO_TEST_CASE(sgd_adam_and_adamw_step_as_the_unsharded_wrapper) {
  auto comm = cohort::make_communicator<cohort::flat>();
  for (const bool overlap : {false, true}) {
    compare<torch::optim::SGD>(
        comm,
        [](std::vector<at::Tensor> p) {
          return torch::optim::SGD(p, torch::optim::SGDOptions(0.05).momentum(0.9));
        },
        overlap);
    compare<torch::optim::Adam>(
        comm, [](std::vector<at::Tensor> p) { return torch::optim::Adam(p, 1e-3); }, overlap);
    compare<torch::optim::AdamW>(
        comm,
        [](std::vector<at::Tensor> p) {
          return torch::optim::AdamW(p, torch::optim::AdamWOptions(1e-3).weight_decay(0.05));
        },
        overlap);
  }
}

BOOST_AUTO_TEST_CASE(stage_2_frees_the_gradients_a_rank_does_not_own) {
  auto comm = cohort::make_communicator<cohort::flat>();
  auto model = torch_models::wide_seeded(1);
  cohort::torch::sharded_optimizer<torch::optim::Adam, cohort::flat> opt(
      torch::optim::Adam(model->parameters(), 1e-3), comm, *model);
  torch_models::loss_of(model, comm.rank(), 0).backward();
  opt.step();
  const auto& params = opt.named_parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    BOOST_TEST_CONTEXT(params[i].name) {
      BOOST_TEST(params[i].value.grad().defined() == opt.owns(i));
    }
  }
  // Stage 1 keeps them, reduced.
  auto other = torch_models::wide_seeded(1);
  cohort::torch::sharded_optimizer<torch::optim::Adam, cohort::flat> first(
      torch::optim::Adam(other->parameters(), 1e-3), comm, *other,
      {.stage = cohort::zero_stage::optimizer_state});
  torch_models::loss_of(other, comm.rank(), 0).backward();
  first.step();
  for (const auto& p : other->parameters()) {
    BOOST_TEST(p.grad().defined());
  }
}

BOOST_AUTO_TEST_CASE(what_a_sharded_optimizer_refuses) {
  auto comm = cohort::make_communicator<cohort::flat>();
  auto model = torch_models::wide_seeded(1);
  cohort::torch::sharded_optimizer<torch::optim::Adam, cohort::flat> opt(
      torch::optim::Adam(model->parameters(), 1e-3), comm, *model);
  // A file of one rank's shard would pass for the whole optimizer's.
  const std::string path = "sharded_optimizer_" + std::to_string(comm.rank()) + ".pt";
  BOOST_CHECK_EXCEPTION(torch::save(opt, path), cohort::invalid_argument,
                        message_has({"torch::save", "shard"}));
  torch::serialize::InputArchive archive;
  BOOST_CHECK_EXCEPTION(opt.load(archive), cohort::invalid_argument,
                        message_has({"torch::load", "shard"}));
  BOOST_CHECK_EXCEPTION(opt.step([] { return torch::zeros({1}); }), cohort::invalid_argument,
                        message_has({"step(closure)"}));
  // Stage 2: a second backward onto reduced gradients, not inside no_sync().
  torch_models::loss_of(model, comm.rank(), 0).backward();
  opt.synchronize();
  BOOST_CHECK_EXCEPTION(torch_models::loss_of(model, comm.rank(), 1).backward(), std::exception,
                        message_has({"stage 2", "no_sync()"}));
  opt.zero_grad();
  // Inside no_sync() it accumulates, and the step reduces the sum once.
  {
    auto guard = opt.no_sync();
    torch_models::loss_of(model, comm.rank(), 2).backward();
  }
  torch_models::loss_of(model, comm.rank(), 3).backward();
  opt.step();
  BOOST_TEST(torch_models::same_on_every_rank(comm, model->parameters()));
}

BOOST_AUTO_TEST_SUITE_END()
