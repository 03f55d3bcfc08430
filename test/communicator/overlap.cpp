// SPDX-License-Identifier: Apache-2.0
// allreduce_grad overlapped with backward: an overlapped step gives the bytes of a blocking one
// for every strategy, bucket size and order of readiness (which may differ between ranks); the
// order is learned and the steady state allocates nothing; mistakes throw on every rank.
#define BOOST_TEST_MODULE communicator.overlap
#include <cohort/cohort.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <list>
#include <new>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "support/allocation_counter.hpp"
#include "support/expect.hpp"
#include "support/fill.hpp"
#include "support/model.hpp"
#include "support/mpi_test_main.hpp"

using cohort::test::message_has;

namespace {

// Thirteen tensors of four dtypes and awkward sizes, in one parameter set.
struct mixed_model {
  static constexpr std::size_t tensors = 13;
  std::vector<std::vector<std::byte>> values, grads;
  std::vector<cohort::tensor_view> value_views, grad_views;
  std::vector<cohort::parameter_ref<cohort::tensor_view>> params;

  mixed_model(int ranks, int rank, int step) {
    const cohort::dtype types[] = {cohort::dtype::float32, cohort::dtype::float64,
                                   cohort::dtype::float16, cohort::dtype::int32};
    const std::size_t sizes[] = {1, 3, static_cast<std::size_t>(ranks) * 4 + 1, 1000, 4099, 0};
    for (std::size_t t = 0; t < tensors; ++t) {
      const cohort::dtype type = types[t % 4];
      const std::size_t count = sizes[t % 6];
      values.emplace_back(count * size_of(type));
      grads.emplace_back(count * size_of(type));
      std::vector<double> source(count);
      for (std::size_t i = 0; i < count; ++i) {
        source[i] = cohort::test::closed_form(i + t + static_cast<std::size_t>(step), rank);
      }
      cohort::kernels::host::cast(cohort::make_view(source), {grads.back().data(), count, type,
                                                              cohort::memory_location::host});
    }
    for (std::size_t t = 0; t < tensors; ++t) {
      const cohort::dtype type = types[t % 4];
      value_views.push_back({values[t].data(), values[t].size() / size_of(type), type,
                             cohort::memory_location::host});
      grad_views.push_back(
          {grads[t].data(), grads[t].size() / size_of(type), type, cohort::memory_location::host});
    }
    for (std::size_t t = 0; t < tensors; ++t) {
      // std::string("t") +, not "t" +: GCC 12 warns falsely (-Wrestrict) on the latter.
      params.push_back({std::string("t") + std::to_string(t), &value_views[t], &grad_views[t]});
    }
  }
};

// The order a rank marks gradients ready in at `step`: reversed, or rotated by the rank, and
// only the first `marked` of them (wait() marks the rest).
std::vector<std::size_t> readiness(int rank, int step) {
  std::vector<std::size_t> order(mixed_model::tensors);
  std::iota(order.rbegin(), order.rend(), std::size_t{0});
  if (step % 2 == 1) {
    std::rotate(order.begin(), order.begin() + (rank * 5 + step) % order.size(), order.end());
  }
  order.resize(order.size() - static_cast<std::size_t>(step % 3) * 2);
  return order;
}

void require_same_bytes(const mixed_model& got, const mixed_model& expected, int step) {
  for (std::size_t t = 0; t < mixed_model::tensors; ++t) {
    BOOST_TEST_REQUIRE(got.grads[t] == expected.grads[t],
                       "step " << step << ", tensor " << t << " differs from the blocking result");
  }
}

template <class Strategy>
void check_overlap_equals_blocking(const cohort::communicator_options& options) {
  auto overlapped = cohort::make_communicator<Strategy>(options);
  auto blocking = cohort::make_communicator<Strategy>(options);
  for (int step = 0; step < 6; ++step) {
    mixed_model a(overlapped.size(), overlapped.rank(), step);
    mixed_model b(overlapped.size(), overlapped.rank(), step);
    auto request = overlapped.begin_allreduce_grad(a.params, cohort::mean{});
    for (const std::size_t t : readiness(overlapped.rank(), step)) {
      request.ready(t);
    }
    request.wait();
    blocking.allreduce_grad(b.params, cohort::mean{});
    require_same_bytes(a, b, step);
  }
}

} // namespace

using strategies = std::tuple<cohort::naive, cohort::flat, cohort::hierarchical<>,
                              cohort::two_dimensional<>, cohort::dummy>;

BOOST_AUTO_TEST_CASE_TEMPLATE(overlapped_steps_equal_blocking_ones, Strategy, strategies) {
  check_overlap_equals_blocking<Strategy>({});
  check_overlap_equals_blocking<Strategy>({.bucket_bytes = 64, .first_bucket_bytes = 8});
  check_overlap_equals_blocking<Strategy>({.bucket_bytes = 0});
  check_overlap_equals_blocking<Strategy>({.bucket_bytes = 8192, .fusion_threshold_bytes = 0});
}

BOOST_AUTO_TEST_CASE(overlapped_steps_equal_the_closed_forms) {
  // Not only the blocking path: the sums themselves, for a model of one dtype.
  auto comm = cohort::make_communicator<cohort::flat>({.bucket_bytes = 256});
  cohort::test::model<double> m(comm.size(), comm.rank());
  auto request = comm.begin_allreduce_grad(m.params, cohort::sum{});
  for (std::size_t t = m.params.size(); t-- > 0;) {
    request.ready(t);
  }
  request.wait();
  for (const auto& grad : m.grads) {
    for (std::size_t i = 0; i < grad.size(); ++i) {
      BOOST_TEST_REQUIRE(grad[i] == cohort::test::closed_form_sum(i, comm.size()));
    }
  }
}

BOOST_AUTO_TEST_CASE(progress_does_not_need_the_caller) {
  // Once every gradient is ready, the reduction completes while this thread only asks whether it
  // has (the watchdog fails the test if it never does); the gradients are read after wait(), as
  // the contract says (reading them before, as this test once did, is a data race).
  auto comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() == 1) {
    return; // a sum over one rank changes nothing to watch
  }
  cohort::test::model<double> m(comm.size(), comm.rank());
  const double expected = cohort::test::closed_form_sum(4000, comm.size());
  auto request = comm.iallreduce_grad(m.params, cohort::sum{});
  while (!request.test()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  request.wait();
  BOOST_TEST(request.test());
  BOOST_TEST(m.grads[5][4000] == expected);
}

BOOST_AUTO_TEST_CASE(grad_sync_stats_of_overlapped_steps) {
  auto comm = cohort::make_communicator<cohort::flat>({.bucket_bytes = 512});
  mixed_model a(comm.size(), comm.rank(), 0);
  auto request = comm.begin_allreduce_grad(a.params, cohort::mean{});
  // Not while a reduction is in flight: cohort's thread counts its buckets.
  BOOST_CHECK_EXCEPTION(comm.take_grad_sync_stats(), cohort::invalid_argument,
                        message_has({"take_grad_sync_stats"}));
  for (std::size_t t = 0; t < mixed_model::tensors; ++t) {
    request.ready(t);
  }
  request.wait();
  const cohort::grad_sync_stats stats = comm.take_grad_sync_stats();
  BOOST_TEST(stats.steps == 1u);
  BOOST_TEST(stats.buckets == comm.bucket_count());
  std::uint64_t bytes = 0;
  for (const auto& g : a.grads) {
    bytes += g.size();
  }
  BOOST_TEST(stats.bytes == bytes);
  BOOST_TEST_MESSAGE("1 step: " << stats.reducing.count() << " ns reducing, "
                                << stats.exposed.count() << " ns waited for");
}

BOOST_AUTO_TEST_CASE(iallreduce_grad_and_a_request_left_to_its_destructor) {
  auto comm = cohort::make_communicator<cohort::flat>({.bucket_bytes = 512});
  auto oracle = cohort::make_communicator<cohort::flat>({.bucket_bytes = 512});
  mixed_model a(comm.size(), comm.rank(), 0);
  mixed_model b(comm.size(), comm.rank(), 0);
  auto request = comm.iallreduce_grad(a.params, cohort::mean{});
  BOOST_TEST(request.pending());
  request.wait();
  BOOST_TEST(!request.pending());
  oracle.allreduce_grad(b.params, cohort::mean{});
  require_same_bytes(a, b, 0);

  mixed_model c(comm.size(), comm.rank(), 1);
  mixed_model d(comm.size(), comm.rank(), 1);
  { auto dropped = comm.iallreduce_grad(c.params, cohort::mean{}); }
  BOOST_TEST(!comm.grad_sync_pending());
  oracle.allreduce_grad(d.params, cohort::mean{});
  require_same_bytes(c, d, 1);
}

BOOST_AUTO_TEST_CASE(the_order_is_learned_and_the_steady_state_allocates_nothing) {
  auto comm =
      cohort::make_communicator<cohort::flat>({.bucket_bytes = 256, .first_bucket_bytes = 64});
  mixed_model m(comm.size(), comm.rank(), 0);
  // Registration order, not its reverse: after the first step, the buckets follow it.
  const auto step = [&] {
    auto request = comm.begin_allreduce_grad(m.params, cohort::sum{});
    for (std::size_t t = 0; t < mixed_model::tensors; ++t) {
      request.ready(t);
    }
    request.wait();
  };
  step();
  step();
  const long before = cohort::test::allocations();
  for (int i = 0; i < 5; ++i) {
    step();
  }
  BOOST_TEST(cohort::test::allocations() - before == 0);
}

BOOST_AUTO_TEST_CASE(a_gradient_changed_on_one_rank_throws_on_every_rank) {
  auto comm = cohort::make_communicator<cohort::flat>({.bucket_bytes = 64});
  const int last = comm.size() - 1;
  mixed_model m(comm.size(), comm.rank(), 0);
  auto request = comm.begin_allreduce_grad(m.params, cohort::mean{});
  if (comm.rank() == last) {
    m.grad_views[4].count = 7; // tensor 4 had 4099 float32 elements when the step began
  }
  for (std::size_t t = mixed_model::tensors; t-- > 0;) {
    request.ready(t);
  }
  BOOST_CHECK_EXCEPTION(
      request.wait(), cohort::error,
      message_has({"parameter 't4'", "4099 float32", "now has a gradient of 7 float32"}));
  // The communicator is usable again.
  mixed_model again(comm.size(), comm.rank(), 1);
  auto next = comm.begin_allreduce_grad(again.params, cohort::mean{});
  next.wait();
}

BOOST_AUTO_TEST_CASE(a_set_that_is_not_random_access_is_read_again_where_it_lives) {
  // A std::list of parameters: grad_ready reads parameter t again through the address kept when
  // the reduction began (not by walking t elements), so a change made through the list is seen.
  auto comm = cohort::make_communicator<cohort::flat>({.bucket_bytes = 64});
  for (int step = 0; step < 2; ++step) {
    mixed_model a(comm.size(), comm.rank(), step);
    mixed_model b(comm.size(), comm.rank(), step);
    std::list<cohort::parameter_ref<cohort::tensor_view>> listed(a.params.begin(), a.params.end());
    auto request = comm.begin_allreduce_grad(listed, cohort::mean{});
    for (const std::size_t t : readiness(comm.rank(), step)) {
      request.ready(t);
    }
    request.wait();
    comm.allreduce_grad(b.params, cohort::mean{});
    require_same_bytes(a, b, step);
  }
  mixed_model m(comm.size(), comm.rank(), 0);
  std::list<cohort::parameter_ref<cohort::tensor_view>> listed(m.params.begin(), m.params.end());
  auto request = comm.begin_allreduce_grad(listed, cohort::mean{});
  // Another list of the same parameters is not the set the reduction read: refused, by name.
  auto other = listed;
  BOOST_CHECK_EXCEPTION(comm.grad_ready(other, 0), cohort::invalid_argument,
                        message_has({"grad_ready(0)", "not the one the reduction began with"}));
  if (comm.rank() == comm.size() - 1) {
    m.grad_views[1].count = 2; // tensor 1 had 3 float64 elements when the step began
  }
  for (std::size_t t = mixed_model::tensors; t-- > 0;) {
    request.ready(t);
  }
  BOOST_CHECK_EXCEPTION(request.wait(), cohort::error,
                        message_has({"parameter 't1'", "now has a gradient of 2 float64"}));
}

// A parameter_source refers to its set: one made of a temporary set would dangle.
static_assert(std::is_constructible_v<cohort::parameter_source,
                                      std::vector<cohort::parameter_ref<cohort::tensor_view>>&>);
static_assert(!std::is_constructible_v<cohort::parameter_source,
                                       std::vector<cohort::parameter_ref<cohort::tensor_view>>&&>);

BOOST_AUTO_TEST_CASE(a_set_erased_once_reduces_as_its_own_type) {
  // The optimizer wrapper's path: the set's type erased into a parameter_source, read by the
  // communicator itself (collect, remember where a list's elements live, read one again).
  auto comm = cohort::make_communicator<cohort::flat>({.bucket_bytes = 64});
  int owner = 0;
  for (int step = 0; step < 2; ++step) {
    mixed_model a(comm.size(), comm.rank(), step);
    mixed_model b(comm.size(), comm.rank(), step);
    mixed_model c(comm.size(), comm.rank(), step);
    std::list<cohort::parameter_ref<cohort::tensor_view>> listed(a.params.begin(), a.params.end());
    const cohort::parameter_source erased(listed);
    for (const std::size_t t : readiness(comm.rank(), step)) {
      comm.grad_ready_for(&owner, erased, cohort::mean{}, {}, t);
    }
    comm.wait_grad_sync();
    comm.allreduce_grad(cohort::parameter_source(b.params), cohort::mean{});
    comm.allreduce_grad(c.params, cohort::mean{});
    require_same_bytes(a, c, step);
    require_same_bytes(b, c, step);
  }
  mixed_model m(comm.size(), comm.rank(), 0);
  std::list<cohort::parameter_ref<cohort::tensor_view>> listed(m.params.begin(), m.params.end());
  auto other = listed;
  comm.grad_ready_for(&owner, cohort::parameter_source(listed), cohort::mean{}, {}, 0);
  // Another list of the same parameters is not the set the reduction read: refused, by name.
  BOOST_CHECK_EXCEPTION(
      comm.grad_ready_for(&owner, cohort::parameter_source(other), cohort::mean{}, {}, 1),
      cohort::invalid_argument,
      message_has({"grad_ready(1)", "not the one the reduction began with"}));
  comm.wait_grad_sync();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(views_marked_ready_by_index_reduce_as_the_set, Strategy, strategies) {
  // The path of a wrapper that reduces copies (double buffering): views given to
  // start_grad_sync, then marked ready by index, for an owner and for none.
  auto comm = cohort::make_communicator<Strategy>({.bucket_bytes = 64});
  int owner = 0;
  for (int step = 0; step < 2; ++step) {
    mixed_model a(comm.size(), comm.rank(), step);
    mixed_model b(comm.size(), comm.rank(), step);
    std::vector<cohort::grad_slot> slots;
    std::vector<std::string> names;
    cohort::collect_gradients(a.params, cohort::missing_grad::report, slots, names);
    const void* const whose = step == 0 ? static_cast<const void*>(&owner) : nullptr;
    comm.start_grad_sync(std::span<const cohort::grad_slot>(slots), cohort::mean{}, whose);
    for (const std::size_t t : readiness(comm.rank(), step)) {
      if (whose == nullptr) {
        comm.grad_ready(t);
      } else {
        comm.grad_ready(t, whose);
      }
    }
    comm.wait_grad_sync(cohort::step_end::update, {}, whose); // (marks the rest)
    comm.allreduce_grad(b.params, cohort::mean{});
    require_same_bytes(a, b, step);
  }
}

BOOST_AUTO_TEST_CASE(misuse_is_named) {
  auto comm = cohort::make_communicator<cohort::flat>();
  mixed_model m(comm.size(), comm.rank(), 0);
  BOOST_CHECK_EXCEPTION(comm.grad_ready(m.params, 0), cohort::invalid_argument,
                        message_has({"grad_ready", "no overlapped allreduce_grad is pending"}));
  {
    auto request = comm.begin_allreduce_grad(m.params, cohort::mean{});
    BOOST_CHECK_EXCEPTION(comm.allreduce_grad(m.params, cohort::mean{}), cohort::invalid_argument,
                          message_has({"allreduce_grad", "still pending"}));
    BOOST_CHECK_EXCEPTION(comm.begin_allreduce_grad(m.params, cohort::mean{}),
                          cohort::invalid_argument, message_has({"still pending"}));
    request.ready(2);
    request.ready(2);
    BOOST_CHECK_EXCEPTION(request.wait(), cohort::invalid_argument,
                          message_has({"parameter 't2'", "marked ready twice"}));
  }
  auto request = comm.begin_allreduce_grad(m.params, cohort::mean{});
  request.ready(99);
  BOOST_CHECK_EXCEPTION(request.wait(), cohort::invalid_argument,
                        message_has({"index 99", "13-parameter set"}));
}

BOOST_AUTO_TEST_CASE(ranks_reducing_in_different_ways_are_told_not_hung) {
  auto comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() < 2) {
    return;
  }
  mixed_model m(comm.size(), comm.rank(), 0);
  // Rank 0 overlaps, the others block: different collectives, so every rank throws.
  const auto attempt = [&] {
    if (comm.rank() == 0) {
      comm.begin_allreduce_grad(m.params, cohort::mean{}).wait();
    } else {
      comm.allreduce_grad(m.params, cohort::mean{});
    }
  };
  BOOST_CHECK_EXCEPTION(attempt(), cohort::mismatch_error,
                        message_has({"the ranks disagree", "the reduction", "overlapped"}));
  BOOST_TEST(!comm.grad_sync_pending());
  comm.allreduce_grad(m.params, cohort::mean{}); // back in step
}

BOOST_AUTO_TEST_CASE(a_request_is_over_once_waited_on) {
  auto comm = cohort::make_communicator<cohort::flat>();
  mixed_model m(comm.size(), comm.rank(), 0);
  auto request = comm.begin_allreduce_grad(m.params, cohort::mean{});
  request.wait();
  BOOST_CHECK_EXCEPTION(request.wait(), cohort::invalid_argument,
                        message_has({"grad_sync_request::wait", "over"}));
  BOOST_CHECK_EXCEPTION(request.ready(0), cohort::invalid_argument,
                        message_has({"grad_sync_request::ready"}));
  // A request whose reduction was waited on through the communicator does not touch the next.
  auto stale = comm.begin_allreduce_grad(m.params, cohort::mean{});
  comm.wait_grad_sync();
  auto next = comm.begin_allreduce_grad(m.params, cohort::mean{});
  BOOST_TEST(!stale.pending());
  BOOST_TEST(next.pending());
  next.wait();
}

BOOST_AUTO_TEST_CASE(a_communicator_destroyed_mid_reduction_abandons_it) {
  mixed_model a(boost::mpi::communicator().size(), boost::mpi::communicator().rank(), 2);
  mixed_model untouched(boost::mpi::communicator().size(), boost::mpi::communicator().rank(), 2);
  {
    auto comm = cohort::make_communicator<cohort::two_dimensional<>>({.bucket_bytes = 64});
    comm.start_grad_sync(a.params, cohort::sum{});
    comm.grad_ready(a.params, 12);
  } // abandoned here on every rank: no hang, and the ring's workspace outlives the thread
  // Only what was marked ready may have been sent: every other gradient is as backward left it.
  for (std::size_t t = 0; t + 1 < mixed_model::tensors; ++t) {
    BOOST_TEST_REQUIRE(a.grads[t] == untouched.grads[t],
                       "tensor " << t << " was never marked ready, and it changed");
  }
  // The ranks can go on with a communicator of their own.
  auto next = cohort::make_communicator<cohort::two_dimensional<>>({.bucket_bytes = 64});
  mixed_model b(next.size(), next.rank(), 2);
  mixed_model c(next.size(), next.rank(), 2);
  next.allreduce_grad(b.params, cohort::sum{});
  auto request = next.begin_allreduce_grad(c.params, cohort::sum{});
  request.wait();
  require_same_bytes(c, b, 2);
}

namespace {
// Issue 10, point 7: a strategy whose buffers cannot be allocated on the last rank (as when the
// two_dimensional ring's workspace grows), while `fail` is set.
class flaky_flat : public cohort::basic_communicator<flaky_flat> {
public:
  static constexpr std::string_view name = "flaky_flat";
  using cohort::basic_communicator<flaky_flat>::basic_communicator;
  bool fail = false;

private:
  friend cohort::strategy_access;
  void prepare_exchange(const cohort::engine::bucket&) {
    if (fail && rank() == size() - 1) {
      throw std::bad_alloc();
    }
  }
  void exchange(cohort::tensor_view bucket, cohort::reduce_op op) {
    cohort::mpi::allreduce(grad_comm(), bucket, op);
  }
};
} // namespace

// What a strategy needs for its exchange is allocated before the ranks agree to reduce: a failure
// on one rank is then an error on every rank naming the rank and the cause, blocking or
// overlapped, and nothing is reduced. Before, the failing rank went on to the next agreement
// while the others waited in the bucket's all-reduce: a truncation error there, a hang elsewhere.
BOOST_AUTO_TEST_CASE(a_failure_preparing_the_exchange_is_an_error_on_every_rank) {
  auto comm = cohort::make_communicator<flaky_flat>({.bucket_bytes = 64});
  const std::string culprit = "allreduce_grad on rank " + std::to_string(comm.size() - 1);
  mixed_model a(comm.size(), comm.rank(), 1);
  const mixed_model untouched(comm.size(), comm.rank(), 1);
  comm.fail = true;
  const auto expected = message_has({culprit, "preparing the reduction failed", "std::bad_alloc"});
  BOOST_CHECK_EXCEPTION(comm.allreduce_grad(a.params, cohort::sum{}), cohort::error, expected);
  BOOST_CHECK_EXCEPTION(comm.begin_allreduce_grad(a.params, cohort::sum{}), cohort::error,
                        expected);
  BOOST_TEST(!comm.grad_sync_pending());
  require_same_bytes(a, untouched, 1);
  // Once it can allocate again, the same communicator reduces as before.
  comm.fail = false;
  mixed_model b(comm.size(), comm.rank(), 1);
  auto oracle = cohort::make_communicator<cohort::naive>();
  oracle.allreduce_grad(b.params, cohort::sum{});
  auto request = comm.begin_allreduce_grad(a.params, cohort::sum{});
  request.wait();
  require_same_bytes(a, b, 1);
}

// A request destroyed by an exception (backward failed after some gradients were marked) sends
// nothing that was not marked: the ranks get an error naming the rank that abandoned it.
BOOST_AUTO_TEST_CASE(a_request_unwound_by_an_exception_abandons_its_reduction) {
  auto comm = cohort::make_communicator<cohort::flat>({.bucket_bytes = 64});
  mixed_model a(comm.size(), comm.rank(), 0);
  const mixed_model untouched(comm.size(), comm.rank(), 0);
  try {
    auto request = comm.begin_allreduce_grad(a.params, cohort::sum{});
    request.ready(12);
    throw std::runtime_error("backward failed");
  } catch (const std::runtime_error&) {
  }
  BOOST_TEST(!comm.grad_sync_pending());
  for (std::size_t t = 0; t + 1 < mixed_model::tensors; ++t) {
    BOOST_TEST_REQUIRE(a.grads[t] == untouched.grads[t], "tensor " << t << " was sent");
  }
}

// Issue 10, point 8: a communicator move-assigned, or moved from, with a reduction pending
// abandons it (every rank alike here): no hang, nothing unmarked sent, and the new one works.
BOOST_AUTO_TEST_CASE(a_communicator_moved_with_a_reduction_pending_abandons_it) {
  auto comm = cohort::make_communicator<cohort::flat>({.bucket_bytes = 64});
  mixed_model a(comm.size(), comm.rank(), 3);
  const mixed_model untouched(comm.size(), comm.rank(), 3);
  comm.start_grad_sync(a.params, cohort::sum{});
  comm.grad_ready(a.params, 12);
  comm = cohort::make_communicator<cohort::flat>({.bucket_bytes = 64});
  BOOST_TEST(!comm.grad_sync_pending());
  for (std::size_t t = 0; t + 1 < mixed_model::tensors; ++t) {
    BOOST_TEST_REQUIRE(a.grads[t] == untouched.grads[t], "tensor " << t << " was sent");
  }
  comm.start_grad_sync(a.params, cohort::sum{});
  cohort::flat moved(std::move(comm));
  BOOST_TEST(!moved.grad_sync_pending());
  mixed_model b(moved.size(), moved.rank(), 3);
  mixed_model c(moved.size(), moved.rank(), 3);
  moved.allreduce_grad(b.params, cohort::sum{});
  auto request = moved.begin_allreduce_grad(c.params, cohort::sum{});
  request.wait();
  require_same_bytes(c, b, 3);
}
