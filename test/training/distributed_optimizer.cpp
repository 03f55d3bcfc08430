// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE training.distributed_optimizer
#include <cohort/cohort.hpp>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "support/expect.hpp"
#include "support/mpi_test_main.hpp"

using cohort::test::message_has;

namespace {
// A user's optimizer, unaware of cohort: w -= lr * g.
struct sgd {
  std::vector<std::vector<float>*> weights, grads;
  float lr = 1.0f;
  int steps = 0;
  void step() {
    for (std::size_t p = 0; p < weights.size(); ++p) {
      for (std::size_t i = 0; i < weights[p]->size(); ++i) {
        (*weights[p])[i] -= lr * (*grads[p])[i];
      }
    }
    ++steps;
  }
};

struct replica {
  std::vector<float> w1, g1, w2, g2;
  std::vector<cohort::parameter_ref<std::vector<float>>> params;
  explicit replica(int rank)
      : w1(5, 10.0f * rank)
      , g1(5)
      , w2(3, -1.0f * rank)
      , g2(3) {
    params = {{"w1", &w1, &g1}, {"w2", &w2, &g2}};
  }
  sgd optimizer() { return sgd{{&w1, &w2}, {&g1, &g2}}; }
};
} // namespace

using strategies = std::tuple<cohort::naive, cohort::flat>;

BOOST_AUTO_TEST_CASE_TEMPLATE(replicas_start_identical_and_stay_identical, Strategy, strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  replica model(comm.rank());
  cohort::distributed_optimizer<sgd, Strategy, cohort::mean> opt{model.optimizer(), comm,
                                                                 model.params};
  // Rank 0's initial values everywhere, and no step lost to it.
  BOOST_TEST(model.w1[4] == 0.0f);
  BOOST_TEST(model.w2[0] == 0.0f);
  BOOST_TEST(opt.inner().steps == 0);

  const int n = comm.size();
  for (int step = 1; step <= 3; ++step) {
    // Each rank's local gradient is rank + 1: the mean is (n + 1) / 2.
    model.g1.assign(5, static_cast<float>(comm.rank() + 1));
    model.g2.assign(3, static_cast<float>(2 * (comm.rank() + 1)));
    opt.step();
    BOOST_TEST(opt.inner().steps == step);
    BOOST_TEST(model.w1[0] == -step * (n + 1) / 2.0f);
    BOOST_TEST(model.w2[2] == -step * static_cast<float>(n + 1));
  }
  // The replicas hold the same values bit for bit.
  const auto all = comm.allgather_obj(model.w1);
  for (const auto& other : all) {
    BOOST_TEST(other == model.w1, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(root_sum_reducer_and_synchronize) {
  auto comm = cohort::make_communicator<cohort::flat>();
  replica model(comm.rank());
  const int root = comm.size() - 1;
  cohort::distributed_optimizer<sgd, cohort::flat, cohort::sum> opt{
      model.optimizer(), comm, model.params, {.root = root}};
  BOOST_TEST(model.w1[0] == 10.0f * root);
  model.g1.assign(5, 1.0f);
  model.g2.assign(3, 1.0f);
  opt.synchronize();
  BOOST_TEST(model.g1[0] == static_cast<float>(comm.size()));
  BOOST_TEST(opt.inner().steps == 0);
}

BOOST_AUTO_TEST_CASE(missing_gradient_policy) {
  auto comm = cohort::make_communicator<cohort::flat>();
  replica model(comm.rank());
  cohort::distributed_optimizer<sgd, cohort::flat> strict{model.optimizer(), comm, model.params};
  model.g1.assign(5, 1.0f);
  model.g2.clear(); // w2 unused this step
  BOOST_CHECK_EXCEPTION(strict.step(), cohort::invalid_argument,
                        message_has({"parameter 'w2' (#1)", "no gradient"}));
  BOOST_TEST(strict.inner().steps == 0);

  cohort::distributed_optimizer<sgd, cohort::flat> lenient{
      model.optimizer(), comm, model.params, {.missing = cohort::missing_grad::zero_fill}};
  lenient.step();
  BOOST_TEST(model.g2 == std::vector<float>(3, 0.0f), boost::test_tools::per_element());
  BOOST_TEST(lenient.inner().steps == 1);
}

BOOST_AUTO_TEST_CASE(mismatched_models_are_caught_at_construction) {
  auto comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() < 2) {
    return;
  }
  replica model(comm.rank());
  if (comm.rank() == 1) {
    model.w2.resize(4);
    model.g2.resize(4);
  }
  using wrapped = cohort::distributed_optimizer<sgd, cohort::flat>;
  BOOST_CHECK_EXCEPTION(wrapped(model.optimizer(), comm, model.params), cohort::mismatch_error,
                        message_has({"parameter 'w2'", "3 float32 elements on rank 0",
                                     "4 float32 elements on rank 1"}));
}

// ---- overlap, double buffering, no_sync -------------------------------------------------------

namespace {
// An optimizer that records the gradients it is stepped with.
struct recorder {
  std::vector<std::vector<float>*> grads;
  std::vector<std::vector<std::vector<float>>> seen; // per step, per parameter
  void step() {
    seen.emplace_back();
    for (const auto* g : grads) {
      seen.back().push_back(*g);
    }
  }
};

// Gradients of step t on `rank`: g1 = rank + 1 + t, g2 = 2 * (rank + 1) + t, integers, so that
// every mean below is exact.
void fill_step(replica& model, int rank, int t) {
  model.g1.assign(5, static_cast<float>(rank + 1 + t));
  model.g2.assign(3, static_cast<float>(2 * (rank + 1) + t));
}
} // namespace

using host_strategies =
    std::tuple<cohort::naive, cohort::flat, cohort::hierarchical<>, cohort::two_dimensional<>>;

BOOST_AUTO_TEST_CASE_TEMPLATE(grad_ready_overlaps_and_steps_as_the_blocking_wrapper, Strategy,
                              host_strategies) {
  auto comm = cohort::make_communicator<Strategy>({.bucket_bytes = 12, .first_bucket_bytes = 4});
  replica overlapped(comm.rank()), blocking(comm.rank());
  cohort::distributed_optimizer a{overlapped.optimizer(), comm, overlapped.params};
  cohort::distributed_optimizer b{blocking.optimizer(), comm, blocking.params};
  for (int t = 0; t < 4; ++t) {
    fill_step(overlapped, comm.rank() * 3, t);
    fill_step(blocking, comm.rank() * 3, t);
    // Backward produces w2's gradient first; on odd steps only w2 is reported, step() does w1.
    a.grad_ready(1);
    BOOST_TEST(comm.grad_sync_pending());
    if (t % 2 == 0) {
      a.grad_ready(0);
    }
    a.step();
    BOOST_TEST(!comm.grad_sync_pending());
    b.step();
    BOOST_TEST_REQUIRE(overlapped.w1 == blocking.w1, boost::test_tools::per_element());
    BOOST_TEST_REQUIRE(overlapped.w2 == blocking.w2, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(double_buffering_applies_gradients_exactly_one_step_late) {
  auto comm = cohort::make_communicator<cohort::flat>();
  replica model(comm.rank());
  const int n = comm.size();
  cohort::distributed_optimizer opt{
      recorder{{&model.g1, &model.g2}, {}}, comm, model.params, {.double_buffering = true}};
  const int steps = 4;
  for (int t = 0; t < steps; ++t) {
    fill_step(model, comm.rank(), t);
    opt.step();
    // Step t updates with the mean of step t - 1's gradients; step 0 with none.
    BOOST_TEST_REQUIRE(opt.inner().seen.size() == static_cast<std::size_t>(t));
  }
  BOOST_CHECK_EXCEPTION(opt.synchronize(), cohort::invalid_argument,
                        message_has({"double_buffering", "finish()"}));
  // A parameter renamed between steps would get another's reduced gradient: refused.
  model.params[1].name = "renamed";
  BOOST_CHECK_EXCEPTION(opt.step(), cohort::invalid_argument,
                        message_has({"double_buffering", "names, sizes and dtypes"}));
  model.params[1].name = "w2";
  opt.finish(); // the last step's gradients are not lost
  BOOST_TEST_REQUIRE(opt.inner().seen.size() == static_cast<std::size_t>(steps));
  BOOST_TEST(!comm.grad_sync_pending());
  for (int t = 0; t < steps; ++t) {
    const auto& seen = opt.inner().seen[static_cast<std::size_t>(t)];
    BOOST_TEST(seen[0] == std::vector<float>(5, (n + 1) / 2.0f + t),
               boost::test_tools::per_element());
    BOOST_TEST(seen[1] == std::vector<float>(3, static_cast<float>(n + 1 + t)),
               boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(no_sync_accumulates_exactly_and_reduces_the_sum_once) {
  auto comm = cohort::make_communicator<cohort::flat>();
  replica model(comm.rank());
  const int n = comm.size();
  cohort::distributed_optimizer opt{recorder{{&model.g1, &model.g2}, {}}, comm, model.params};
  for (const bool overlap : {false, true}) {
    opt.inner().seen.clear();
    model.g1.assign(5, 0.0f);
    model.g2.assign(3, 0.0f);
    const int micro_batches = 3;
    for (int m = 0; m < micro_batches; ++m) {
      // A backward pass adds into the gradients; the hooks fire as always.
      const auto backward = [&] {
        for (auto& g : model.g1) {
          g += static_cast<float>(comm.rank() + 1 + m);
        }
        for (auto& g : model.g2) {
          g += static_cast<float>(m);
        }
        if (overlap) {
          opt.grad_ready(1);
          opt.grad_ready(0);
        }
      };
      if (m + 1 < micro_batches) {
        const auto guard = opt.no_sync();
        BOOST_TEST(!opt.syncing());
        backward();
        BOOST_TEST(!comm.grad_sync_pending());
        BOOST_CHECK_EXCEPTION(opt.step(), cohort::invalid_argument,
                              message_has({"step() inside no_sync()"}));
      } else {
        backward();
      }
    }
    BOOST_TEST(opt.syncing());
    if (!overlap) {
      // Only local sums so far (with overlap, the last hooks already started the reduction).
      BOOST_TEST(model.g1[0] == static_cast<float>(3 * (comm.rank() + 1) + 3));
    }
    opt.step();
    BOOST_TEST_REQUIRE(opt.inner().seen.size() == 1u);
    // The mean over ranks of the sums over micro-batches: 3 (n + 1) / 2 + 3, and 0 + 1 + 2.
    BOOST_TEST(opt.inner().seen[0][0] == std::vector<float>(5, 3.0f * (n + 1) / 2.0f + 3.0f),
               boost::test_tools::per_element());
    BOOST_TEST(opt.inner().seen[0][1] == std::vector<float>(3, 3.0f),
               boost::test_tools::per_element());
  }
  // Entering no_sync after this step's reduction has begun is refused.
  opt.grad_ready(0);
  BOOST_CHECK_EXCEPTION(static_cast<void>(opt.no_sync()), cohort::invalid_argument,
                        message_has({"no_sync()", "enter no_sync before backward"}));
  opt.step();
}

// ---- issue 10: two optimizers, once-only reduction, hooks from many threads -------------------

// Point 2: a GAN's generator and discriminator, each with its own parameters, on one
// communicator, stepping alternately: each reduces exactly its own gradients, blocking or
// overlapped. Issue 31: their overlapped reductions may be pending at once (the generator's
// hooks while the discriminator's reduction is pending begin the generator's own); what cannot
// work is an error naming it, never a silent exchange of reductions: a blocking step while the
// other's is pending, or a step whose reduction waits behind one still missing gradients.
BOOST_AUTO_TEST_CASE(two_optimizers_on_one_communicator_each_reduce_their_own) {
  auto comm = cohort::make_communicator<cohort::flat>({.bucket_bytes = 12});
  replica generator(comm.rank()), discriminator(comm.rank());
  cohort::distributed_optimizer g{
      recorder{{&generator.g1, &generator.g2}, {}}, comm, generator.params, {}, cohort::sum{}};
  cohort::distributed_optimizer d{recorder{{&discriminator.g1, &discriminator.g2}, {}},
                                  comm,
                                  discriminator.params,
                                  {},
                                  cohort::sum{}};
  const int n = comm.size();
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2); // sum over ranks of rank + 1
  for (int t = 0; t < 4; ++t) {
    const bool overlap = t % 2 == 1;
    fill_step(discriminator, comm.rank(), 0);
    fill_step(generator, comm.rank(), 100);
    if (overlap) {
      d.grad_ready(1);
      d.grad_ready(0);
    }
    d.step();
    if (overlap) {
      g.grad_ready(0);
      g.grad_ready(1);
    }
    g.step();
    // The sum over ranks of rank + 1 + offset: the discriminator's with offset 0, the
    // generator's with 100.
    BOOST_TEST_REQUIRE(d.inner().seen.back()[0] == std::vector<float>(5, ranks_sum),
                       boost::test_tools::per_element());
    BOOST_TEST_REQUIRE(g.inner().seen.back()[0] == std::vector<float>(5, ranks_sum + 100.0f * n),
                       boost::test_tools::per_element());
  }
  // Both pending at once, the generator stepping first: the discriminator's reduction (begun
  // before) ends with the generator's step, its gradients kept, and the discriminator's step
  // does not reduce them again (with `sum`, a second reduction would scale them by n).
  fill_step(discriminator, comm.rank(), 0);
  fill_step(generator, comm.rank(), 100);
  d.grad_ready(1);
  d.grad_ready(0);
  g.grad_ready(0);
  g.grad_ready(1);
  g.step();
  BOOST_TEST(!comm.grad_sync_pending());
  d.step();
  BOOST_TEST(d.inner().seen.back()[0] == std::vector<float>(5, ranks_sum),
             boost::test_tools::per_element());
  BOOST_TEST(g.inner().seen.back()[0] == std::vector<float>(5, ranks_sum + 100.0f * n),
             boost::test_tools::per_element());
  // A blocking step of the generator while the discriminator's reduction is pending.
  fill_step(discriminator, comm.rank(), 0);
  fill_step(generator, comm.rank(), 100);
  d.grad_ready(1);
  BOOST_CHECK_EXCEPTION(
      g.step(), cohort::invalid_argument,
      message_has({"allreduce_grad", "another optimizer's overlapped reduction"}));
  // Its hooks begin its own; its step would wait behind the discriminator's, which still waits
  // for a gradient: refused, naming that, with both reductions still pending.
  g.grad_ready(0);
  BOOST_CHECK_EXCEPTION(g.step(), cohort::invalid_argument,
                        message_has({"waits behind another's", "not all marked ready"}));
  BOOST_TEST(comm.grad_sync_pending_for(&d));
  BOOST_TEST(comm.grad_sync_pending_for(&g));
  d.step();
  g.step();
  BOOST_TEST(d.inner().seen.back()[1] == std::vector<float>(3, 2.0f * ranks_sum),
             boost::test_tools::per_element());
  BOOST_TEST(g.inner().seen.back()[1] == std::vector<float>(3, 2.0f * ranks_sum + 100.0f * n),
             boost::test_tools::per_element());
}

// Point 3: synchronize() then step() (to clip the reduced gradients) reduces once: with `sum`
// the update is n * g, not n^2 * g; with overlap hooks too. Misuse is an error.
BOOST_AUTO_TEST_CASE(synchronize_then_step_reduces_exactly_once) {
  auto comm = cohort::make_communicator<cohort::flat>();
  replica model(comm.rank());
  const int n = comm.size();
  cohort::distributed_optimizer opt{
      recorder{{&model.g1, &model.g2}, {}}, comm, model.params, {}, cohort::sum{}};
  for (const bool overlap : {false, true}) {
    model.g1.assign(5, 1.0f);
    model.g2.assign(3, 1.0f);
    if (overlap) {
      opt.grad_ready(0);
      opt.grad_ready(1);
    }
    opt.synchronize();
    BOOST_TEST(model.g1[0] == static_cast<float>(n));
    BOOST_CHECK_EXCEPTION(opt.synchronize(), cohort::invalid_argument,
                          message_has({"synchronize() on rank", "twice before a step"}));
    if (n > 1) { // (with `sum`: at 1 rank, a sum is a mean, and a backward could accumulate)
      BOOST_CHECK_EXCEPTION(opt.grad_ready(0), cohort::invalid_argument,
                            message_has({"after synchronize()", "no_sync()"}));
    }
    // Clipping, by the user, between the reduction and the update.
    for (auto& g : model.g2) {
      g = std::min(g, 1.5f);
    }
    opt.step();
    BOOST_TEST_REQUIRE(opt.inner().seen.back()[0] == std::vector<float>(5, static_cast<float>(n)),
                       boost::test_tools::per_element());
    BOOST_TEST_REQUIRE(opt.inner().seen.back()[1] ==
                           std::vector<float>(3, std::min(static_cast<float>(n), 1.5f)),
                       boost::test_tools::per_element());
  }
  // A step skipped after synchronize() (a loss scaler found inf): the next one starts afresh.
  model.g1.assign(5, 1.0f);
  model.g2.assign(3, 1.0f);
  opt.synchronize();
  const auto steps_before = opt.inner().seen.size();
  opt.skip_step();
  BOOST_TEST(opt.inner().seen.size() == steps_before);
  // And the next step reduces again.
  model.g1.assign(5, 1.0f);
  model.g2.assign(3, 1.0f);
  opt.step();
  BOOST_TEST(opt.inner().seen.back()[0] == std::vector<float>(5, static_cast<float>(n)),
             boost::test_tools::per_element());
  // A parameter marked ready twice in one step: an error on every rank at step().
  opt.grad_ready(0);
  opt.grad_ready(0);
  // (invalid_argument where the ranks saw it at the same point, mismatch_error where the
  // reduction thread of one rank had already agreed on the bucket: either names it.)
  BOOST_CHECK_EXCEPTION(opt.step(), cohort::error, message_has({"marked ready twice in one step"}));
  BOOST_TEST(!comm.grad_sync_pending());
}

// Point 6: LibTorch's autograd engine calls hooks from its own threads. grad_ready from several
// threads at once, from the very first step (which begins the reduction and agrees on the
// layout), gives the same result as the blocking wrapper. Run under ThreadSanitizer in CI.
BOOST_AUTO_TEST_CASE(grad_ready_from_many_threads_from_the_first_step) {
  auto comm = cohort::make_communicator<cohort::flat>({.bucket_bytes = 64});
  constexpr std::size_t tensors = 24;
  struct many {
    std::vector<std::vector<float>> w, g;
    std::vector<cohort::parameter_ref<std::vector<float>>> params;
    many()
        : w(tensors)
        , g(tensors) {
      for (std::size_t t = 0; t < tensors; ++t) {
        w[t].assign(t % 5 + 1, 0.0f);
        g[t].assign(t % 5 + 1, 0.0f);
      }
      for (std::size_t t = 0; t < tensors; ++t) {
        params.push_back({std::string("p") + std::to_string(t), &w[t], &g[t]});
      }
    }
  };
  many threaded, blocking;
  cohort::distributed_optimizer a{sgd{}, comm, threaded.params};
  cohort::distributed_optimizer b{sgd{}, comm, blocking.params};
  for (std::size_t t = 0; t < tensors; ++t) {
    a.inner().weights.push_back(&threaded.w[t]);
    a.inner().grads.push_back(&threaded.g[t]);
    b.inner().weights.push_back(&blocking.w[t]);
    b.inner().grads.push_back(&blocking.g[t]);
  }
  for (int step = 0; step < 5; ++step) {
    for (std::size_t t = 0; t < tensors; ++t) {
      const float value = static_cast<float>(comm.rank() * 7 + static_cast<int>(t) + step);
      threaded.g[t].assign(threaded.g[t].size(), value);
      blocking.g[t].assign(blocking.g[t].size(), value);
    }
    std::vector<std::thread> hooks;
    for (std::size_t worker = 0; worker < 4; ++worker) {
      hooks.emplace_back([&, worker] {
        for (std::size_t t = tensors; t-- > 0;) {
          if (t % 4 == worker) {
            a.grad_ready(t);
          }
        }
      });
    }
    for (auto& hook : hooks) {
      hook.join();
    }
    a.step();
    b.step();
    for (std::size_t t = 0; t < tensors; ++t) {
      BOOST_TEST_REQUIRE(threaded.w[t] == blocking.w[t], boost::test_tools::per_element());
    }
  }
}

// A backward pass whose gradients are all ones, its hooks marking them in `order`.
template <class Optimizer>
void backward_of_ones(replica& model, Optimizer& opt, std::initializer_list<std::size_t> order) {
  model.g1.assign(5, 1.0f);
  model.g2.assign(3, 1.0f);
  for (const std::size_t i : order) {
    opt.grad_ready(i);
  }
}

// Issue 30, point 1: a gradient that moved between grad_ready and step() (its vector replaced)
// would never receive its reduced value: an error naming it on every rank, and the next step
// reduces and steps as usual.
BOOST_AUTO_TEST_CASE(a_gradient_moved_after_grad_ready_is_an_error_at_step_on_every_rank) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const int n = comm.size();
  replica model(comm.rank());
  cohort::distributed_optimizer opt{model.optimizer(), comm, model.params};
  backward_of_ones(model, opt, {0, 1});
  std::vector<float> old; // keeps the buffer the reduction writes into alive
  if (comm.rank() == n - 1) {
    std::vector<float> fresh(5, 1.0f); // (not read from the old one: cohort's thread writes it)
    model.g1.swap(fresh);
    old.swap(fresh);
  }
  BOOST_CHECK_EXCEPTION(opt.step(), cohort::error,
                        message_has({"'w1'", "replaced after backward marked it ready",
                                     "rank " + std::to_string(n - 1)}));
  BOOST_TEST(opt.inner().steps == 0);
  BOOST_TEST(!comm.grad_sync_pending());
  backward_of_ones(model, opt, {1, 0});
  opt.step();
  BOOST_TEST(opt.inner().steps == 1);
  BOOST_TEST(model.g1 == std::vector<float>(5, 1.0f), boost::test_tools::per_element());
}

// Issue 30, point 1: the ranks agree on what becomes of an overlapped reduction's gradients. A
// rank that drops them (skip_step) while the others step with them would part the replicas.
BOOST_AUTO_TEST_CASE(dropping_the_reduced_gradients_on_one_rank_only_is_an_error_on_every_rank) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() < 2) {
    return;
  }
  replica model(comm.rank());
  cohort::distributed_optimizer opt{model.optimizer(), comm, model.params};
  backward_of_ones(model, opt, {0, 1});
  const auto ends = [&] { comm.rank() == 0 ? opt.skip_step() : opt.step(); };
  BOOST_CHECK_EXCEPTION(
      ends(), cohort::mismatch_error,
      message_has({"the reduced gradients", "are dropped", "update the parameters"}));
  BOOST_TEST(opt.inner().steps == 0);
  BOOST_TEST(!comm.grad_sync_pending());
}

// Issue 30, point 8: a reduction that failed to start on every rank (a gradient of the wrong size
// on one) fails that backward everywhere; the next backward starts afresh with no call between.
BOOST_AUTO_TEST_CASE(after_a_start_that_failed_on_every_rank_the_next_backward_starts_afresh) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const int n = comm.size();
  replica model(comm.rank());
  cohort::distributed_optimizer opt{model.optimizer(), comm, model.params};
  model.g1.assign(comm.rank() == n - 1 ? 4 : 5, 1.0f);
  model.g2.assign(3, 1.0f);
  BOOST_CHECK_EXCEPTION(opt.grad_ready(1), cohort::error, message_has({"w1"}));
  BOOST_TEST(!comm.grad_sync_pending());
  // The next backward (its hooks mark the same gradients again).
  backward_of_ones(model, opt, {1, 0});
  opt.step();
  BOOST_TEST(opt.inner().steps == 1);
  BOOST_TEST(model.g1 == std::vector<float>(5, 1.0f), boost::test_tools::per_element());
}
