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
