// SPDX-License-Identifier: Apache-2.0
// any_communicator: every name builds its strategy, which reduces as the strategy itself does,
// through the same concept; an unknown name lists the known ones. (That it forwards every member
// of the front door is any_communicator_api.py's test.)
#define BOOST_TEST_MODULE communicator.any_communicator
#include <cohort/cohort.hpp>

#include <span>
#include <string>
#include <vector>

#include "support/expect.hpp"
#include "support/model.hpp"
#include "support/mpi_test_main.hpp"

using cohort::test::message_has;

static_assert(cohort::communicator<cohort::any_communicator>);
static_assert(cohort::overlapping_communicator<cohort::any_communicator>);

BOOST_AUTO_TEST_CASE(every_name_reduces_as_its_strategy) {
  const std::vector<std::string> expected = {"naive", "flat", "hierarchical", "two_dimensional",
                                             "dummy"};
  BOOST_TEST(cohort::any_communicator::known_names() ==
             "naive, flat, hierarchical, two_dimensional, dummy");
  auto oracle = cohort::make_communicator<cohort::naive>();
  for (const std::string& name : expected) {
    cohort::any_communicator comm(name, {.bucket_bytes = 64});
    BOOST_TEST(comm.name() == name);
    BOOST_TEST(comm.size() == oracle.size());
    BOOST_TEST(comm.rank() == oracle.rank());
    BOOST_TEST(comm.intra_comm().size() == oracle.intra_comm().size());
    BOOST_TEST(comm.inter_comm().rank() == oracle.inter_comm().rank());
    cohort::test::model<float> m(comm.size(), comm.rank());
    cohort::test::model<float> reference(comm.size(), comm.rank());
    comm.allreduce_grad(m.params, cohort::sum{});
    if (name != "dummy") {
      oracle.allreduce_grad(reference.params, cohort::sum{});
    }
    for (std::size_t t = 0; t < m.grads.size(); ++t) {
      BOOST_TEST_REQUIRE(m.grads[t] == reference.grads[t], boost::test_tools::per_element());
    }
    // Overlap through the variant, and a split that keeps the strategy.
    auto request = comm.begin_allreduce_grad(m.params, cohort::mean{});
    request.ready(1);
    request.wait();
    // Views marked ready by index, through the variant.
    cohort::test::model<float> viewed(comm.size(), comm.rank());
    cohort::test::model<float> blocking(comm.size(), comm.rank());
    std::vector<cohort::grad_slot> slots;
    std::vector<std::string> names;
    cohort::collect_gradients(viewed.params, cohort::missing_grad::report, slots, names);
    comm.start_grad_sync(std::span<const cohort::grad_slot>(slots), cohort::mean{}, &oracle);
    comm.grad_ready(1, &oracle);
    comm.wait_grad_sync(cohort::step_end::update, {}, &oracle);
    comm.allreduce_grad(blocking.params, cohort::mean{});
    for (std::size_t t = 0; t < viewed.grads.size(); ++t) {
      BOOST_TEST_REQUIRE(viewed.grads[t] == blocking.grads[t], boost::test_tools::per_element());
    }
    // A set started on behalf of an owner (an optimizer's), through the variant.
    cohort::test::model<float> owned(comm.size(), comm.rank());
    comm.start_grad_sync(owned.params, cohort::mean{}, {}, &viewed);
    BOOST_TEST(comm.grad_sync_pending_for(&viewed));
    comm.mark_all_ready(&viewed);
    comm.wait_grad_sync(cohort::step_end::update, {}, &viewed);
    for (std::size_t t = 0; t < owned.grads.size(); ++t) {
      BOOST_TEST_REQUIRE(owned.grads[t] == blocking.grads[t], boost::test_tools::per_element());
    }
    // Each value from its own root, through the variant.
    std::vector<float> mine(3, static_cast<float>(comm.rank()));
    std::vector<float> theirs(2, static_cast<float>(comm.rank()));
    const std::vector<cohort::tensor_view> values{cohort::make_view(mine),
                                                  cohort::make_view(theirs)};
    comm.broadcast_each(values, std::vector<int>{0, comm.size() - 1});
    BOOST_TEST(mine == std::vector<float>(3, 0.0f), boost::test_tools::per_element());
    BOOST_TEST(theirs == std::vector<float>(2, static_cast<float>(comm.size() - 1)),
               boost::test_tools::per_element());
    const auto half = comm.split(comm.rank() % 2, comm.rank());
    BOOST_TEST(half.name() == name);
    BOOST_TEST(half.size() == (comm.size() + 1 - comm.rank() % 2) / 2);
  }
}

BOOST_AUTO_TEST_CASE(the_optimizer_wrapper_takes_it) {
  cohort::any_communicator comm("flat");
  std::vector<float> w(4, static_cast<float>(comm.rank())), g(4, 1.0f);
  std::vector<cohort::parameter_ref<std::vector<float>>> params{{"w", &w, &g}};
  struct sgd {
    std::vector<float>* w;
    std::vector<float>* g;
    void step() {
      for (std::size_t i = 0; i < w->size(); ++i) {
        (*w)[i] -= (*g)[i];
      }
    }
  };
  cohort::distributed_optimizer opt{sgd{&w, &g}, comm, params};
  opt.grad_ready(0);
  opt.step();
  BOOST_TEST(w == std::vector<float>(4, -1.0f), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(an_unknown_name_lists_the_known_ones) {
  BOOST_CHECK_EXCEPTION(cohort::any_communicator("flatt"), cohort::invalid_argument,
                        message_has({"unknown communicator strategy 'flatt'",
                                     "naive, flat, hierarchical, two_dimensional, dummy"}));
  BOOST_CHECK_EXCEPTION(cohort::any_communicator("pure_nccl"), cohort::invalid_argument,
                        message_has({"'pure_nccl' reduces GPU memory", "any_gpu_communicator"}));
  BOOST_CHECK_EXCEPTION(cohort::any_communicator("non_cuda_aware"), cohort::invalid_argument,
                        message_has({"cohort's host_staged"}));
}
