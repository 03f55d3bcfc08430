// SPDX-License-Identifier: Apache-2.0
// The shared_memory strategy and what it stands on: the window's all-reduce against the closed
// forms for every dtype and operation, buckets in the window and outside it, ranks that disagree
// about where a buffer lies, simulated nodes, overlap, and the arena's allocator.
#define BOOST_TEST_MODULE communicator.shared_memory
#include <cohort/cohort.hpp>

#include <boost/mpi/communicator.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "support/allocation_counter.hpp"
#include "support/closed_form.hpp"
#include "support/expect.hpp"
#include "support/fill.hpp"
#include "support/model.hpp"
#include "support/mpi_test_main.hpp"

using cohort::test::as_double;
using cohort::test::closed_form_sum;
using cohort::test::message_has;

namespace {

template <class T>
using shared_vector = std::vector<T, cohort::shared_allocator<T>>;

// One step of `m` with `reducer`, against the closed forms.
template <class Model, class Comm, class Reducer>
void check_step(Model& m, Comm& comm, Reducer reducer, bool mean) {
  comm.allreduce_grad(m.params, reducer);
  cohort::test::require_closed_form(m, comm.size(), mean);
}

// Every dtype, its gradients in the window: summed and averaged.
template <class Comm>
void check_every_dtype(Comm& comm) {
  const auto each = [&]<class T>(std::type_identity<T>) {
    cohort::test::model<T, cohort::shared_allocator<T>> m(comm.size(), comm.rank(),
                                                          comm.template allocator<T>());
    check_step(m, comm, cohort::sum{}, false);
    cohort::test::model<T, cohort::shared_allocator<T>> again(comm.size(), comm.rank(),
                                                              comm.template allocator<T>());
    check_step(again, comm, cohort::mean{}, true);
  };
  each(std::type_identity<float>{});
  each(std::type_identity<double>{});
  each(std::type_identity<cohort::float16>{});
  each(std::type_identity<cohort::bfloat16>{});
  each(std::type_identity<std::int32_t>{});
  each(std::type_identity<std::int64_t>{});
  each(std::type_identity<std::uint8_t>{});
}

// The ranks on this rank's host (all of them, but on tools/cluster.sh's hosts).
boost::mpi::communicator host_ranks() {
  MPI_Comm host = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
  return boost::mpi::communicator(host, boost::mpi::comm_take_ownership);
}

// A node's window straight from MPI, for the algorithm alone.
struct node_window {
  boost::mpi::communicator node;
  cohort::mpi::shared_window window;
  cohort::algorithm::window_allreduce exchange;

  explicit node_window(std::size_t bytes)
      : node(host_ranks())
      , window(node, cohort::algorithm::window_allreduce::header_bytes, bytes)
      , exchange(window) {}
};

} // namespace

BOOST_AUTO_TEST_CASE(window_allreduce_of_every_dtype_and_operation) {
  node_window w(std::size_t{1} << 20);
  const int n = w.window.size();
  const int me = w.window.rank();
  // Counts that the ranks do not divide, one past a chunk, and none.
  for (const std::size_t count :
       {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{4099}, std::size_t{70001}}) {
    auto* data = reinterpret_cast<double*>(w.window.data(me) + 128); // not at the window's start
    for (std::size_t i = 0; i < count; ++i) {
      data[i] = static_cast<double>(i % 7) + me;
    }
    for (const cohort::reduce_op op :
         {cohort::reduce_op::sum, cohort::reduce_op::max, cohort::reduce_op::min}) {
      for (std::size_t i = 0; i < count; ++i) {
        data[i] = static_cast<double>(i % 7) + me;
      }
      const bool in_window = w.exchange.allreduce(
          {data, count, cohort::dtype::float64, cohort::memory_location::host}, op);
      BOOST_TEST(in_window == (count > 0)); // nothing to place, nothing in the window
      for (std::size_t i = 0; i < count; ++i) {
        const double x = static_cast<double>(i % 7);
        const double expected = op == cohort::reduce_op::sum   ? x * n + n * (n - 1) / 2.0
                                : op == cohort::reduce_op::max ? x + n - 1
                                                               : x;
        BOOST_TEST_REQUIRE(data[i] == expected, "element " << i << " of " << count);
      }
    }
  }
  // A 16-bit type, whose sums are rounded at each step: still the same bytes on every rank.
  auto* halves = reinterpret_cast<cohort::float16*>(w.window.data(me));
  for (std::size_t i = 0; i < 3001; ++i) {
    halves[i] = cohort::float16(0.1f * static_cast<float>(me + 1));
  }
  BOOST_TEST(
      w.exchange.allreduce({halves, 3001, cohort::dtype::float16, cohort::memory_location::host},
                           cohort::reduce_op::sum));
  std::vector<std::uint16_t> bits(3001);
  std::memcpy(bits.data(), halves, bits.size() * 2);
  std::vector<std::uint16_t> first = bits;
  boost::mpi::broadcast(w.node, first, 0);
  BOOST_TEST((bits == first));
}

BOOST_AUTO_TEST_CASE(ranks_that_disagree_about_the_window_all_throw) {
  node_window w(4096);
  const int n = w.window.size();
  const int me = w.window.rank();
  if (n == 1) {
    return;
  }
  std::vector<float> heap(16, 1.0f);
  auto* in_window = reinterpret_cast<float*>(w.window.data(me));
  const auto view = [](float* p) {
    return cohort::tensor_view{p, 16, cohort::dtype::float32, cohort::memory_location::host};
  };
  // The last rank's buffer 64 bytes further on.
  BOOST_CHECK_EXCEPTION(
      w.exchange.allreduce(view(me == n - 1 ? in_window + 16 : in_window), cohort::reduce_op::sum),
      cohort::mismatch_error,
      message_has(
          {"shared_memory exchange #1", "16 float32 elements (sum)", "at offset 0 of the window",
           "at offset 64 of the window on rank " + std::to_string(n - 1), "same order and sizes"}));
  // The last rank's on the heap.
  BOOST_CHECK_EXCEPTION(
      w.exchange.allreduce(view(me == n - 1 ? heap.data() : in_window), cohort::reduce_op::sum),
      cohort::mismatch_error, message_has({"exchange #2", "outside the window"}));
  // At the same offset, but another count or operation on the last rank (what the step's
  // agreement catches first, unless it is off): never a block read past another rank's buffer.
  BOOST_CHECK_EXCEPTION(
      w.exchange.allreduce({in_window, me == n - 1 ? std::size_t{15} : std::size_t{16},
                            cohort::dtype::float32, cohort::memory_location::host},
                           cohort::reduce_op::sum),
      cohort::mismatch_error, message_has({"exchange #3", "15 float32 elements", "16 float32"}));
  BOOST_CHECK_EXCEPTION(w.exchange.allreduce(view(in_window), me == n - 1 ? cohort::reduce_op::max
                                                                          : cohort::reduce_op::sum),
                        cohort::mismatch_error, message_has({"exchange #4", "(max)", "(sum)"}));
  // Every rank's on the heap: nothing done, the caller reduces it another way.
  BOOST_TEST(!w.exchange.allreduce(view(heap.data()), cohort::reduce_op::sum));
  BOOST_TEST(heap[0] == 1.0f);
  // And the ranks are still in step.
  std::fill_n(in_window, 16, 1.0f);
  BOOST_TEST(w.exchange.allreduce(view(in_window), cohort::reduce_op::sum));
  BOOST_TEST(in_window[15] == static_cast<float>(n));
  BOOST_TEST(w.exchange.exchanges() == 6u);
}

BOOST_AUTO_TEST_CASE(every_dtype_reduced_in_the_window) {
  // Every gradient in place, so in the window: the model's smallest tensors too.
  auto comm = cohort::make_communicator<cohort::shared_memory<>>({.fusion_threshold_bytes = 0});
  check_every_dtype(comm);
  BOOST_TEST(comm.window_exchanges() > 0u);
  BOOST_TEST(comm.arena()->spilled_bytes() == 0u);
  // The defaults: the small tensors packed and reduced through MPI, beside the window.
  auto defaults = cohort::make_communicator<cohort::shared_memory<>>();
  check_every_dtype(defaults);
  cohort::test::model<float, cohort::shared_allocator<float>> large(
      defaults.size(), defaults.rank(), defaults.allocator<float>());
  for (auto& g : large.grads) {
    g.resize(g.size() + 20000); // reallocated in the window, past the fusion threshold
    for (std::size_t i = 0; i < g.size(); ++i) {
      g[i] = static_cast<float>(cohort::test::closed_form(i, defaults.rank()));
    }
  }
  for (auto& v : large.values) {
    v.resize(v.size() + 20000);
  }
  const auto before = defaults.window_exchanges();
  check_step(large, defaults, cohort::sum{}, false);
  BOOST_TEST(defaults.window_exchanges() - before == 6u);
}

BOOST_AUTO_TEST_CASE(gradients_on_the_heap_are_reduced_through_mpi) {
  auto comm = cohort::make_communicator<cohort::shared_memory<>>({.fusion_threshold_bytes = 0});
  cohort::test::model<float> m(comm.size(), comm.rank());
  check_step(m, comm, cohort::sum{}, false);
  BOOST_TEST(comm.window_exchanges() == 0u);
}

BOOST_AUTO_TEST_CASE(steps_after_steps_stay_in_step) {
  auto comm = cohort::make_communicator<cohort::shared_memory<>>(
      {.bucket_bytes = 4096, .fusion_threshold_bytes = 1024});
  cohort::test::model<double, cohort::shared_allocator<double>> m(comm.size(), comm.rank(),
                                                                  comm.allocator<double>());
  for (int step = 0; step < 5; ++step) {
    for (auto& g : m.grads) {
      for (std::size_t i = 0; i < g.size(); ++i) {
        g[i] = cohort::test::closed_form(i, comm.rank());
      }
    }
    check_step(m, comm, cohort::sum{}, false);
  }
}

BOOST_AUTO_TEST_CASE(simulated_nodes_of_every_size) {
  const int n = boost::mpi::communicator().size();
  const int on_host = host_ranks().size();
  for (int per_node = 1; per_node <= n; ++per_node) {
    const cohort::communicator_options options{.simulated_ranks_per_node = per_node,
                                               .fusion_threshold_bytes = 0};
    if (n % per_node == 0 && per_node > on_host) { // across real hosts
      BOOST_CHECK_EXCEPTION(cohort::make_communicator<cohort::shared_memory<>>(options),
                            cohort::invalid_argument,
                            message_has({"shared_memory", "spans more than one host"}));
      continue;
    }
    if (n % per_node != 0) {
      BOOST_CHECK_EXCEPTION(cohort::make_communicator<cohort::shared_memory<>>(options),
                            cohort::invalid_argument,
                            message_has({"shared_memory", "same number on every node"}));
      continue;
    }
    auto comm = cohort::make_communicator<cohort::shared_memory<>>(options);
    check_every_dtype(comm);
    BOOST_TEST(comm.window_exchanges() > 0u);
    // Gradients on the heap on every node: the nodes' vote sends them through MPI.
    const auto before = comm.window_exchanges();
    cohort::test::model<float> heap(comm.size(), comm.rank());
    check_step(heap, comm, cohort::sum{}, false);
    BOOST_TEST(comm.window_exchanges() == before);
  }
}

BOOST_AUTO_TEST_CASE(overlapped_reduction_in_the_window) {
  auto comm = cohort::make_communicator<cohort::shared_memory<>>(
      {.bucket_bytes = 8192, .fusion_threshold_bytes = 0});
  cohort::test::model<double, cohort::shared_allocator<double>> m(comm.size(), comm.rank(),
                                                                  comm.allocator<double>());
  auto request = comm.begin_allreduce_grad(m.params, cohort::sum{});
  for (std::size_t t = m.params.size(); t-- > 0;) {
    request.ready(t);
  }
  request.wait();
  for (const auto& grad : m.grads) {
    for (std::size_t i = 0; i < grad.size(); ++i) {
      BOOST_TEST_REQUIRE(grad[i] == closed_form_sum(i, comm.size()));
    }
  }
  BOOST_TEST(comm.window_exchanges() > 0u);
}

BOOST_AUTO_TEST_CASE(steady_state_allocates_nothing) {
  auto comm = cohort::make_communicator<cohort::shared_memory<>>({.fusion_threshold_bytes = 1024});
  cohort::test::model<float, cohort::shared_allocator<float>> m(comm.size(), comm.rank(),
                                                                comm.allocator<float>());
  comm.allreduce_grad(m.params, cohort::mean{});
  const long before = cohort::test::allocations();
  for (int step = 0; step < 5; ++step) {
    comm.allreduce_grad(m.params, cohort::mean{});
  }
  BOOST_TEST(cohort::test::allocations() - before == 0);
}

BOOST_AUTO_TEST_CASE(the_arena_spills_to_the_heap_when_full_and_reuses_what_is_freed) {
  cohort::shared_memory<> comm(boost::mpi::communicator(), {.fusion_threshold_bytes = 0}, 4096);
  const cohort::shared_arena& arena = *comm.arena();
  BOOST_TEST(arena.capacity() == 4096u);
  {
    const auto alloc = comm.allocator<float>();
    std::vector<shared_vector<float>> grads;
    grads.reserve(3);
    grads.emplace_back(500, 0.0f, alloc); // 2000 bytes at 0
    grads.emplace_back(400, 0.0f, alloc); // 1600 at 2048: 64-byte aligned
    grads.emplace_back(200, 0.0f, alloc); // 800 more do not fit: from the heap
    BOOST_TEST(arena.window().offset_of(grads[0].data(), 2000).value() == 0u);
    BOOST_TEST(arena.window().offset_of(grads[1].data(), 1600).value() == 2048u);
    BOOST_TEST(!arena.window().offset_of(grads[2].data(), 800).has_value());
    BOOST_TEST(arena.spilled_bytes() == 800u);
    BOOST_TEST(arena.used_bytes() == 3648u);
    // Both kinds in one step: the window's buckets in it, the heap's through MPI.
    std::vector<shared_vector<float>> values;
    std::vector<cohort::parameter_ref<shared_vector<float>>> params;
    values.reserve(3);
    for (std::size_t t = 0; t < grads.size(); ++t) {
      values.emplace_back(grads[t].size(), 0.0f, alloc); // from the heap too: the arena is full
      for (std::size_t i = 0; i < grads[t].size(); ++i) {
        grads[t][i] = static_cast<float>(cohort::test::closed_form(i, comm.rank()));
      }
    }
    for (std::size_t t = 0; t < grads.size(); ++t) {
      params.push_back({"p" + std::to_string(t), &values[t], &grads[t]});
    }
    comm.allreduce_grad(params, cohort::sum{});
    for (const auto& g : grads) {
      for (std::size_t i = 0; i < g.size(); ++i) {
        BOOST_TEST_REQUIRE(g[i] == static_cast<float>(closed_form_sum(i, comm.size())));
      }
    }
    BOOST_TEST(comm.window_exchanges() == 2u);
  }
  BOOST_TEST(arena.used_bytes() == 0u); // all freed: the arena starts over
  shared_vector<float> again(10, 0.0f, comm.allocator<float>());
  BOOST_TEST(arena.window().offset_of(again.data(), 40).value() == 0u);
}

BOOST_AUTO_TEST_CASE(containers_may_outlive_their_communicator) {
  std::optional<shared_vector<double>> kept;
  {
    const cohort::shared_memory<> comm(boost::mpi::communicator(), {}, 1 << 16);
    kept.emplace(100, 1.0, comm.allocator<double>());
    BOOST_TEST(comm.arena()->window().offset_of(kept->data(), 800).has_value());
  }
  // The window went with the communicator (collectively): what it gave may not be used, but the
  // container may go, and a new allocation comes from the heap.
  const std::shared_ptr<cohort::shared_arena> arena = kept->get_allocator().arena();
  kept.reset();
  BOOST_TEST(arena->used_bytes() == 0u);
  shared_vector<double> later(10, 2.0, cohort::shared_allocator<double>(arena));
  BOOST_TEST(!arena->window().offset_of(later.data(), 80).has_value());
  BOOST_TEST(later[9] == 2.0);
}
