// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE training.distributed_optimizer
#include <cohort/cohort.hpp>

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
