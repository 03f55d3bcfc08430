// SPDX-License-Identifier: Apache-2.0
// allreduce_grad on every strategy: results against closed forms and the naive oracle, every
// dtype and awkward size, reducers, missing gradients, cross-rank agreement, and no allocation in
// the steady state.
#define BOOST_TEST_MODULE communicator.allreduce_grad
#include <cohort/cohort.hpp>
#include <cohort/communicator/engine/liveness.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ranges>
#include <string>
#include <tuple>
#include <vector>

#include "support/allocation_counter.hpp"
#include "support/closed_form.hpp"
#include "support/expect.hpp"
#include "support/fill.hpp"
#include "support/model.hpp"
#include "support/mpi_test_main.hpp"

using cohort::dtype;
using cohort::test::as_double;
using cohort::test::closed_form;
using cohort::test::closed_form_sum;
using cohort::test::message_has;

namespace {
using cohort::test::model;
using cohort::test::param;

using cohort::test::tolerance;

template <class T, class Strategy, class Reducer>
void check_model(Strategy& comm, Reducer reducer, bool mean) {
  model<T> m(comm.size(), comm.rank());
  comm.allreduce_grad(m.params, reducer);
  cohort::test::require_closed_form(m, comm.size(), mean);
}

template <class Strategy, class Reducer>
void check_every_dtype(Strategy& comm, Reducer reducer, bool mean) {
  check_model<float>(comm, reducer, mean);
  check_model<double>(comm, reducer, mean);
  check_model<cohort::float16>(comm, reducer, mean);
  check_model<cohort::bfloat16>(comm, reducer, mean);
  check_model<std::int32_t>(comm, reducer, mean);
  check_model<std::int64_t>(comm, reducer, mean);
  check_model<std::uint8_t>(comm, reducer, mean);
}
} // namespace

using reducing_strategies = std::tuple<cohort::naive, cohort::flat>;

BOOST_AUTO_TEST_CASE_TEMPLATE(sum_and_mean_of_every_dtype, Strategy, reducing_strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  check_every_dtype(comm, cohort::sum{}, false);
  check_every_dtype(comm, cohort::mean{}, true);
}

// The two-level strategies on the nodes MPI finds (one here; several on tools/cluster.sh's hosts:
// the multihost tests) and on simulated nodes of every size (1 rank per node up to all ranks on
// one), with tiny fusion buffers too, against the closed forms.
using two_level_strategies = std::tuple<cohort::hierarchical<>, cohort::two_dimensional<>>;

BOOST_AUTO_TEST_CASE_TEMPLATE(two_level_strategies_on_simulated_nodes, Strategy,
                              two_level_strategies) {
  const int n = boost::mpi::communicator().size();
  for (int per_node = 0; per_node <= n; ++per_node) {
    const cohort::communicator_options options{.simulated_ranks_per_node = per_node};
    if (std::is_same_v<Strategy, cohort::two_dimensional<>> && per_node > 0 && n % per_node != 0) {
      // Nodes of different sizes: refused on every rank, naming the sizes.
      BOOST_CHECK_EXCEPTION(cohort::make_communicator<Strategy>(options), cohort::invalid_argument,
                            message_has({"two_dimensional", "same number on every node"}));
      continue;
    }
    auto comm = cohort::make_communicator<Strategy>(options);
    check_every_dtype(comm, cohort::sum{}, false);
    check_every_dtype(comm, cohort::mean{}, true);
    auto tiny = cohort::make_communicator<Strategy>(
        {.simulated_ranks_per_node = per_node, .bucket_bytes = 64});
    check_every_dtype(tiny, cohort::mean{}, true);
    // Each level's reduce, broadcast and all-reduce in the smallest segments, which do not divide
    // the tensors (4100 bytes: not a multiple of every dtype's size).
    auto segmented = cohort::make_communicator<Strategy>(
        {.simulated_ranks_per_node = per_node, .bucket_bytes = 1 << 16, .segment_bytes = 4100});
    check_every_dtype(segmented, cohort::mean{}, true);
  }
}

BOOST_AUTO_TEST_CASE(every_bucket_size_gives_the_same_results) {
  // 0: every tensor alone; 8 and 64 bytes: a few elements per bucket, and first buckets smaller
  // still; the threshold (capped at the bucket size) packs every tensor smaller than a bucket, and
  // 0 reduces every tensor of the wire dtype in place.
  const cohort::communicator_options shapes[] = {
      {.bucket_bytes = 0},
      {.bucket_bytes = 8, .first_bucket_bytes = 2},
      {.bucket_bytes = 64, .first_bucket_bytes = 8},
      {.bucket_bytes = 4096},
      {.bucket_bytes = 4096, .fusion_threshold_bytes = 0},
      {.bucket_bytes = std::size_t{1} << 20, .first_bucket_bytes = 100},
      {.bucket_bytes = 1 << 16, .segment_bytes = 4096},     // buckets in segments
      {.fusion_threshold_bytes = 0, .segment_bytes = 4100}, // tensors in place, in segments
      {},
  };
  for (const auto& options : shapes) {
    auto comm = cohort::make_communicator<cohort::flat>(options);
    check_every_dtype(comm, cohort::mean{}, true);
  }
  auto comm = cohort::make_communicator<cohort::flat>({.bucket_bytes = 64});
  check_every_dtype(comm, cohort::sum{}, false);
  // Everything in place: but for the int32 and uint8 gradients, whose mean travels as int64 and
  // so goes through the buckets (all of a model's 5104 + 4n elements, as int64, in one bucket).
  auto in_place = cohort::make_communicator<cohort::flat>({.fusion_threshold_bytes = 0});
  check_every_dtype(in_place, cohort::mean{}, true);
  BOOST_TEST(in_place.bucket_buffer_bytes() == (5104u + 4u * comm.size()) * 8);
  auto staged = cohort::make_communicator<cohort::dummy>({.bucket_bytes = 8});
  model<double> m(comm.size(), comm.rank());
  staged.allreduce_grad(m.params, cohort::sum{});
  BOOST_TEST(m.grads[5] == cohort::test::filled<double>(4099, comm.rank()),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(overlap_needs_mpi_thread_multiple) {
  // This test's MPI is single-threaded: overlap refuses to start, naming the level and the fix.
  auto comm = cohort::make_communicator<cohort::flat>();
  model<float> m(comm.size(), comm.rank());
  BOOST_CHECK_EXCEPTION(
      comm.begin_allreduce_grad(m.params, cohort::mean{}), cohort::error,
      message_has({"MPI_THREAD_MULTIPLE", "MPI_THREAD_SINGLE", "boost::mpi::threading::multiple"}));
  BOOST_TEST(!comm.grad_sync_pending());
  comm.allreduce_grad(m.params, cohort::mean{}); // the blocking path needs no thread
}

BOOST_AUTO_TEST_CASE(naive_reduces_in_place_and_flat_fuses) {
  auto naive = cohort::make_communicator<cohort::naive>();
  auto flat = cohort::make_communicator<cohort::flat>();
  model<float> m(naive.size(), naive.rank());
  naive.allreduce_grad(m.params, cohort::sum{});
  flat.allreduce_grad(m.params, cohort::sum{});
  BOOST_TEST(naive.bucket_buffer_bytes() == 0u);
  // Every tensor is under 64 KiB: all of them packed, the first bucket (1 MiB) holds them all.
  BOOST_TEST(flat.bucket_buffer_bytes() == (1 + 3 + (naive.size() * 4 + 1) + 1000 + 4099) * 4u);
}

BOOST_AUTO_TEST_CASE(grad_sync_stats_count_steps_bytes_and_collectives) {
  auto flat = cohort::make_communicator<cohort::flat>({.bucket_bytes = 4096});
  model<float> m(flat.size(), flat.rank());
  const std::uint64_t bytes = (1 + 3 + (flat.size() * 4 + 1) + 1000 + 4099) * 4u;
  BOOST_TEST(flat.take_grad_sync_stats().steps == 0u);
  for (int step = 0; step < 3; ++step) {
    flat.allreduce_grad(m.params, cohort::sum{});
  }
  const cohort::grad_sync_stats stats = flat.take_grad_sync_stats();
  BOOST_TEST(stats.steps == 3u);
  BOOST_TEST(stats.bytes == 3 * bytes);
  BOOST_TEST(stats.buckets == 3 * flat.bucket_count());
  // The times are filled in (how long they are is printed, never asserted on): a step cannot
  // reduce in no time, and the trainer waited for a blocking step at least as long as it reduced.
  BOOST_TEST(stats.reducing.count() > 0);
  BOOST_TEST(stats.exposed >= stats.reducing);
  BOOST_TEST_MESSAGE("3 steps: " << stats.reducing.count() << " ns reducing, "
                                 << stats.exposed.count() << " ns waited for");
  // Taken: counting starts again.
  const cohort::grad_sync_stats again = flat.take_grad_sync_stats();
  BOOST_TEST(again.steps == 0u);
  BOOST_TEST(again.bytes == 0u);
  BOOST_TEST(again.exposed.count() == 0);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(mixed_dtypes_in_one_model_match_the_naive_oracle, Strategy,
                              reducing_strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  auto oracle = cohort::make_communicator<cohort::naive>();
  // One parameter set of several dtypes, in an order that interleaves them.
  auto make = [&](auto& f32, auto& f16, auto& f64, auto& g32, auto& g16, auto& g64) {
    g32 = cohort::test::filled<float>(f32.size(), comm.rank());
    g16 = cohort::test::filled<cohort::float16>(f16.size(), comm.rank());
    g64 = cohort::test::filled<double>(f64.size(), comm.rank());
  };
  std::vector<float> a(13), ga;
  std::vector<cohort::float16> b(6), gb;
  std::vector<double> c(29), gc;
  std::vector<float> a2(13), ga2;
  std::vector<cohort::float16> b2(6), gb2;
  std::vector<double> c2(29), gc2;
  make(a, b, c, ga, gb, gc);
  make(a2, b2, c2, ga2, gb2, gc2);
  // The parameter set is a range of parameter_ref<tensor_view>: one range for all the dtypes.
  std::vector<cohort::parameter_ref<cohort::tensor_view>> params, oracle_params;
  std::vector<cohort::tensor_view> views{
      cohort::make_view(a),  cohort::make_view(ga),  cohort::make_view(b),  cohort::make_view(gb),
      cohort::make_view(c),  cohort::make_view(gc),  cohort::make_view(a2), cohort::make_view(ga2),
      cohort::make_view(b2), cohort::make_view(gb2), cohort::make_view(c2), cohort::make_view(gc2)};
  for (std::size_t i = 0; i < 6; i += 2) {
    params.push_back({"p" + std::to_string(i), &views[i], &views[i + 1]});
    oracle_params.push_back({"p" + std::to_string(i), &views[i + 6], &views[i + 7]});
  }
  comm.allreduce_grad(params, cohort::mean{});
  oracle.allreduce_grad(oracle_params, cohort::mean{});
  BOOST_TEST(ga == ga2, boost::test_tools::per_element());
  BOOST_TEST(gc == gc2, boost::test_tools::per_element());
  for (std::size_t i = 0; i < gb.size(); ++i) {
    BOOST_TEST(gb[i].bits() == gb2[i].bits());
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(fp16_mean_does_not_overflow_where_fp32_would_not, Strategy,
                              reducing_strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  // 40000 on every rank: the sum over 2+ ranks exceeds fp16's 65504, the mean does not.
  std::vector<cohort::float16> value(3), grad(3, cohort::float16(40000.0f));
  std::vector<param<cohort::float16>> params{{"big", &value, &grad}};
  comm.allreduce_grad(params, cohort::mean{});
  for (const auto g : grad) {
    BOOST_TEST(static_cast<float>(g) == 40000.0f);
  }
  // The largest fp16 values: divided by 3 and summed in fp16, three thirds of 65504 round up to
  // 65520, inf. Summed in float32 they cannot overflow, at any rank count.
  std::vector<cohort::float16> edge = {cohort::float16(65504.0f), cohort::float16(-65504.0f),
                                       cohort::float16(65504.0f)};
  std::vector<param<cohort::float16>> edges{{"edge", &value, &edge}};
  comm.allreduce_grad(edges, cohort::mean{});
  BOOST_TEST(static_cast<float>(edge[0]) == 65504.0f);
  BOOST_TEST(static_cast<float>(edge[1]) == -65504.0f);
  comm.allreduce_grad(edges, cohort::compressed<cohort::float16>{});
  BOOST_TEST(static_cast<float>(edge[0]) == 65504.0f);
  // bfloat16's largest value is float32's range: divided first, then summed in float32.
  const float top = static_cast<float>(cohort::bfloat16::from_bits(0x7f7f));
  std::vector<cohort::bfloat16> bvalue(1), bgrad(1, cohort::bfloat16(top));
  std::vector<param<cohort::bfloat16>> bparams{{"b", &bvalue, &bgrad}};
  comm.allreduce_grad(bparams, cohort::mean{});
  BOOST_TEST(static_cast<float>(bgrad[0]) == top);
  // float32 gradients at fp16's edge, compressed to fp16 on the wire.
  std::vector<float> fvalue(2), fgrad = {65504.0f, -65504.0f};
  std::vector<param<float>> fparams{{"f", &fvalue, &fgrad}};
  comm.allreduce_grad(fparams, cohort::compressed<cohort::float16>{});
  BOOST_TEST(std::isfinite(fgrad[0]));
  BOOST_TEST(std::abs(fgrad[0] - 65504.0f) <= 65504.0f * 1e-3f);
  BOOST_TEST(std::abs(fgrad[1] + 65504.0f) <= 65504.0f * 1e-3f);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(compressed_puts_16_bits_on_the_wire, Strategy, reducing_strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  const int n = comm.size();
  // fp32 gradients of 40000 on every rank: sent as fp16 after division by n, so the sum cannot
  // overflow fp16's 65504, and the mean comes back exactly.
  std::vector<float> value(5), grad(5, 40000.0f), small(3), g_small(3);
  for (std::size_t i = 0; i < g_small.size(); ++i) {
    g_small[i] = static_cast<float>(closed_form(i, comm.rank()));
  }
  std::vector<param<float>> params{{"big", &value, &grad}, {"small", &small, &g_small}};
  comm.allreduce_grad(params, cohort::compressed<cohort::float16>{});
  BOOST_TEST(grad == std::vector<float>(5, 40000.0f), boost::test_tools::per_element());
  for (std::size_t i = 0; i < g_small.size(); ++i) {
    // Each rank's value / n is rounded to fp16 (11 bits), and so is each partial sum.
    const double expected = closed_form_sum(i, n) / n;
    BOOST_TEST(std::abs(g_small[i] - expected) <= 4e-3 * std::max(1.0, expected));
  }
  // bfloat16 on the wire: 8 bits of mantissa.
  std::vector<double> w(2), g(2, 1.0 + 1.0 / 1024);
  std::vector<param<double>> doubles{{"w", &w, &g}};
  comm.allreduce_grad(doubles, cohort::compressed<cohort::bfloat16>{});
  BOOST_TEST(std::abs(g[0] - 1.0) <= 1.0 / 64);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(integer_means_do_not_wrap, Strategy, reducing_strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  // 200 on every rank: the uint8 sum wraps at 2 ranks, the int32 one at 2e9; the means do not.
  std::vector<std::uint8_t> small_value(3), small(3, 200);
  std::vector<std::int32_t> large_value(2), large(2, 2'000'000'000);
  std::vector<param<std::uint8_t>> bytes{{"bytes", &small_value, &small}};
  std::vector<param<std::int32_t>> ints{{"ints", &large_value, &large}};
  comm.allreduce_grad(bytes, cohort::mean{});
  comm.allreduce_grad(ints, cohort::mean{});
  BOOST_TEST(small == std::vector<std::uint8_t>(3, 200), boost::test_tools::per_element());
  BOOST_TEST(large == std::vector<std::int32_t>(2, 2'000'000'000),
             boost::test_tools::per_element());
}

namespace {
// A framework's layer whose parameter name is made on the fly (returned by value): cohort must
// keep its own copy of the name.
struct layer {
  int index = 0;
  std::vector<float> weight, grad;
};
struct layer_parameter {
  layer* l = nullptr;
};
} // namespace

template <>
struct cohort::parameter_traits<layer_parameter> {
  static std::string name(const layer_parameter& p) {
    return "model.encoder.layers." + std::to_string(p.l->index) + ".self_attention.weight";
  }
  static std::vector<float>& value(const layer_parameter& p) { return p.l->weight; }
  static std::vector<float>* grad(const layer_parameter& p) { return &p.l->grad; }
};

BOOST_AUTO_TEST_CASE_TEMPLATE(names_made_on_the_fly_and_ranges_of_temporaries, Strategy,
                              reducing_strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  std::vector<layer> layers(5);
  for (int i = 0; i < 5; ++i) {
    layers[static_cast<std::size_t>(i)] = {i, std::vector<float>(3), std::vector<float>(3, 1.0f)};
  }
  // A view that makes its parameters as it goes: prvalues, not references into a container.
  auto params = layers | std::views::transform([](layer& l) { return layer_parameter{&l}; });
  comm.allreduce_grad(params, cohort::sum{});
  BOOST_TEST(layers[4].grad[2] == static_cast<float>(comm.size()));
  layers[3].grad.clear();
  BOOST_CHECK_EXCEPTION(comm.allreduce_grad(params, cohort::sum{}), cohort::invalid_argument,
                        message_has({"parameter 'model.encoder.layers.3.self_attention.weight'"}));
  layers[3].grad.assign(3, 0.0f);
  comm.broadcast_parameters(params);
}

BOOST_AUTO_TEST_CASE(dummy_scales_but_does_not_communicate) {
  auto comm = cohort::make_communicator<cohort::dummy>();
  model<float> m(comm.size(), comm.rank());
  comm.allreduce_grad(m.params, cohort::mean{});
  for (std::size_t i = 0; i < m.grads[4].size(); ++i) {
    // float32 is scaled in float: the local value times the float nearest 1 / size.
    const float expected =
        static_cast<float>(closed_form(i, comm.rank())) * static_cast<float>(1.0 / comm.size());
    BOOST_TEST_REQUIRE(m.grads[4][i] == expected);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(missing_gradients_are_reported_or_zero_filled, Strategy,
                              reducing_strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  std::vector<float> w(4), gw(4, 1.0f), unused(3), g_unused;
  std::vector<param<float>> params{{"used", &w, &gw}, {"unused.bias", &unused, &g_unused}};
  BOOST_CHECK_EXCEPTION(
      comm.allreduce_grad(params, cohort::mean{}), cohort::invalid_argument,
      message_has({"parameter 'unused.bias' (#1)", "no gradient", "missing_grad::zero_fill"}));
  comm.allreduce_grad(params, cohort::sum{}, {.missing = cohort::missing_grad::zero_fill});
  BOOST_TEST(g_unused == std::vector<float>(3, 0.0f), boost::test_tools::per_element());
  BOOST_TEST(gw[0] == static_cast<float>(comm.size()));

  // A null gradient pointer cannot be filled: reported even in zero_fill mode.
  std::vector<param<float>> null_grad{{"frozen", &w, nullptr}};
  BOOST_CHECK_EXCEPTION(
      comm.allreduce_grad(null_grad, cohort::sum{}, {.missing = cohort::missing_grad::zero_fill}),
      cohort::invalid_argument, message_has({"'frozen'", "no gradient"}));

  if (comm.size() < 2) {
    return;
  }
  // Only the last rank misses a gradient: with zero_fill it contributes zeros.
  const bool last = comm.rank() == comm.size() - 1;
  std::vector<float> value(2), grad(last ? 0 : 2, 1.0f);
  std::vector<param<float>> uneven{{"sometimes", &value, &grad}};
  comm.allreduce_grad(uneven, cohort::sum{}, {.missing = cohort::missing_grad::zero_fill});
  BOOST_TEST(grad[1] == static_cast<float>(comm.size() - 1));
  // With report, every rank learns which rank misses it.
  grad.assign(last ? 0 : 2, 1.0f);
  BOOST_CHECK_EXCEPTION(comm.allreduce_grad(uneven, cohort::sum{}), cohort::mismatch_error,
                        message_has({"parameter 'sometimes'",
                                     "a gradient of 2 float32 elements in host memory on rank 0",
                                     "no gradient", "on rank " + std::to_string(comm.size() - 1)}));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(layout_mismatch_throws_on_every_rank, Strategy, reducing_strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  std::vector<float> w(8), gw(8), v(5), gv(5);
  std::vector<param<float>> params{{"w", &w, &gw}, {"v", &v, &gv}};
  // A gradient of the wrong size on every rank: a local error, the same everywhere.
  gv.resize(4);
  BOOST_CHECK_EXCEPTION(comm.allreduce_grad(params, cohort::mean{}), cohort::invalid_argument,
                        message_has({"parameter 'v' (#1)", "4 float32 elements", "value of 5"}));
  gv.resize(5);
  if (comm.size() < 2) {
    return;
  }
  const int last = comm.size() - 1;
  if (comm.rank() == last) {
    v.resize(6);
    gv.resize(6);
  }
  BOOST_CHECK_EXCEPTION(comm.allreduce_grad(params, cohort::mean{}), cohort::mismatch_error,
                        message_has({"allreduce_grad", "parameter 'v' (#1)",
                                     "5 float32 elements in host memory on rank 0",
                                     "6 float32 elements", "rank " + std::to_string(last)}));
  v.resize(5);
  gv.resize(5);
  std::vector<float> extra(1), g_extra(1);
  if (comm.rank() == last) {
    params.push_back({"extra", &extra, &g_extra});
  }
  BOOST_CHECK_EXCEPTION(
      comm.allreduce_grad(params, cohort::mean{}), cohort::mismatch_error,
      message_has({"rank 0 passes 2 items", "rank " + std::to_string(last) + " passes 3"}));
  if (comm.rank() == last) {
    params.pop_back();
  }
  comm.allreduce_grad(params, cohort::mean{}); // back in agreement
}

BOOST_AUTO_TEST_CASE_TEMPLATE(steady_state_allocates_nothing, Strategy, reducing_strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  model<float> m(comm.size(), comm.rank());
  model<double> doubles(comm.size(), comm.rank());
  const std::vector<param<float>> params = m.params;
  comm.allreduce_grad(params, cohort::mean{}); // the first steps size the buffers
  comm.allreduce_grad(doubles.params, cohort::compressed<cohort::bfloat16>{});
  const long before = cohort::test::allocations();
  for (int step = 0; step < 5; ++step) {
    comm.allreduce_grad(params, cohort::mean{});
    comm.allreduce_grad(doubles.params, cohort::compressed<cohort::bfloat16>{});
  }
  BOOST_TEST(cohort::test::allocations() - before == 0);
  if constexpr (std::is_same_v<Strategy, cohort::flat>) {
    // The last layout: float64 gradients, all of them cast to bfloat16 into one bucket.
    BOOST_TEST(comm.bucket_buffer_bytes() ==
               (0 + 1 + 3 + (comm.size() * 4 + 1) + 1000 + 4099) * 2u);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(broadcast_parameters_from_any_root, Strategy, reducing_strategies) {
  auto comm = cohort::make_communicator<Strategy>();
  for (int root = 0; root < comm.size(); ++root) {
    model<double> m(comm.size(), comm.rank());
    for (std::size_t t = 0; t < m.values.size(); ++t) {
      for (std::size_t i = 0; i < m.values[t].size(); ++i) {
        m.values[t][i] = closed_form(i + t, comm.rank());
      }
    }
    comm.broadcast_parameters(m.params, root);
    for (std::size_t t = 0; t < m.values.size(); ++t) {
      for (std::size_t i = 0; i < m.values[t].size(); ++i) {
        BOOST_TEST_REQUIRE(m.values[t][i] == closed_form(i + t, root));
      }
    }
  }
  if (comm.size() > 1) {
    std::vector<float> w(comm.rank() == 0 ? 3 : 4), g(w.size());
    std::vector<param<float>> params{{"embedding", &w, &g}};
    BOOST_CHECK_EXCEPTION(
        comm.broadcast_parameters(params), cohort::mismatch_error,
        message_has({"broadcast_parameters", "parameter 'embedding'", "3 float32", "4 float32"}));
  }
}

// Issue 10, point 1: ranks that would reduce differently (another reducer, other bucket options,
// another strategy) get a mismatch_error on every rank naming what differs and both values, and
// nothing is reduced; before, one rank saw an MPI truncation error and another wrong numbers.
BOOST_AUTO_TEST_CASE(ranks_that_would_reduce_differently_throw_on_every_rank) {
  auto comm = cohort::make_communicator<cohort::flat>();
  if (comm.size() < 2) {
    return;
  }
  const int last = comm.size() - 1;
  const bool odd_one = comm.rank() == last;
  const std::string last_rank = "rank " + std::to_string(last);
  std::vector<float> v(4), g(4, 1.0f);
  std::vector<param<float>> params{{"w", &v, &g}};
  const auto reduce_with_sum_on_last = [&] {
    if (odd_one) {
      comm.allreduce_grad(params, cohort::sum{});
    } else {
      comm.allreduce_grad(params, cohort::mean{});
    }
  };
  BOOST_CHECK_EXCEPTION(reduce_with_sum_on_last(), cohort::mismatch_error,
                        message_has({"allreduce_grad", "the reducer's plan for float32 gradients",
                                     "scaled by 1 before and 1 after", "rank 0", last_rank}));
  BOOST_TEST(g == std::vector<float>(4, 1.0f), boost::test_tools::per_element());
  const auto compress_on_last = [&] {
    if (odd_one) {
      comm.allreduce_grad(params, cohort::compressed<cohort::float16>{});
    } else {
      comm.allreduce_grad(params, cohort::mean{});
    }
  };
  BOOST_CHECK_EXCEPTION(compress_on_last(), cohort::mismatch_error,
                        message_has({"float16 on the wire", "float32 on the wire", last_rank}));
  // Blocking on some ranks, overlapped on others: the mode is part of the plan (the overlapped
  // path needs MPI_THREAD_MULTIPLE, which this test does not start; see communicator.overlap).

  // Options and strategies are compared when the communicator is made, whatever
  // check_agreement says.
  BOOST_CHECK_EXCEPTION(
      cohort::make_communicator<cohort::flat>({.bucket_bytes = odd_one ? 1024u : 4096u}),
      cohort::mismatch_error,
      message_has({"communicator creation", "bucket_bytes", "4096", "1024", last_rank}));
  BOOST_CHECK_EXCEPTION(
      cohort::make_communicator<cohort::flat>({.segment_bytes = odd_one ? 0u : 8192u}),
      cohort::mismatch_error,
      message_has({"communicator creation", "segment_bytes", "8192", "0", last_rank}));
  // Segments below the floor: refused on every rank, naming the option and the floor.
  BOOST_CHECK_EXCEPTION(
      cohort::make_communicator<cohort::flat>({.segment_bytes = 100}), cohort::invalid_argument,
      message_has({"communicator creation", "segment_bytes is 100 bytes", "at least 4096"}));
  // Issue 30: a negative timeout, refused on every rank (a rank that threw alone would leave the
  // others in the creation's collectives).
  BOOST_CHECK_EXCEPTION(
      cohort::make_communicator<cohort::flat>({.timeout = std::chrono::milliseconds(-1)}),
      cohort::invalid_argument, message_has({"communicator creation", "timeout must be >= 0"}));
  BOOST_CHECK_EXCEPTION(cohort::make_communicator<cohort::flat>(
                            {.timeout = std::chrono::milliseconds(odd_one ? -1 : 60000)}),
                        cohort::mismatch_error, message_has({"timeout", last_rank}));
  BOOST_CHECK_EXCEPTION(
      cohort::make_communicator<cohort::flat>({.stall_warning = std::chrono::milliseconds(-5)}),
      cohort::invalid_argument, message_has({"stall_warning must be >= 0", "-5 ms"}));
  BOOST_CHECK_EXCEPTION(cohort::make_communicator<cohort::flat>({.check_agreement = !odd_one}),
                        cohort::mismatch_error,
                        message_has({"check_agreement", "true", "false", last_rank}));
  BOOST_CHECK_EXCEPTION(cohort::any_communicator(odd_one ? "naive" : "flat"),
                        cohort::mismatch_error,
                        message_has({"the strategy", "flat", "naive", last_rank}));
  // In agreement again, the same communicator still works.
  comm.allreduce_grad(params, cohort::sum{});
  BOOST_TEST(g == std::vector<float>(4, static_cast<float>(comm.size())),
             boost::test_tools::per_element());
}

// Issue 33: COHORT_TIMEOUT and COHORT_STALL_WARNING stand in for the options left unset (an
// operator's setting per job), never for an explicit one; a bad value is refused on every rank.
BOOST_AUTO_TEST_CASE(timeout_and_stall_warning_from_the_environment) {
  using std::chrono::milliseconds;
  BOOST_TEST(*cohort::make_communicator<cohort::flat>().options().timeout ==
             cohort::communicator_options::default_timeout);
  BOOST_TEST(*cohort::make_communicator<cohort::flat>().options().stall_warning ==
             milliseconds(60000));
  setenv("COHORT_TIMEOUT", "2.5", 1);
  setenv("COHORT_STALL_WARNING", "0", 1);
  BOOST_TEST(*cohort::make_communicator<cohort::flat>().options().timeout == milliseconds(2500));
  BOOST_TEST(*cohort::make_communicator<cohort::flat>().options().stall_warning == milliseconds(0));
  BOOST_TEST(
      *cohort::make_communicator<cohort::flat>({.timeout = milliseconds(700)}).options().timeout ==
      milliseconds(700));
  // A split keeps what its parent resolved.
  auto parent = cohort::make_communicator<cohort::flat>();
  setenv("COHORT_TIMEOUT", "9", 1);
  BOOST_TEST(*parent.split(0, 0).options().timeout == milliseconds(2500));
  // A positive value never rounds to 0 ("never"). (The stall warning's: a 1 ms timeout could end
  // the job while the communicator is made.)
  setenv("COHORT_STALL_WARNING", "0.0001", 1);
  BOOST_TEST(*cohort::make_communicator<cohort::flat>().options().stall_warning == milliseconds(1));
  setenv("COHORT_STALL_WARNING", "0", 1);
  for (const char* bad : {"soon", "-1", "1e9", "3s"}) {
    setenv("COHORT_TIMEOUT", bad, 1);
    BOOST_CHECK_EXCEPTION(
        cohort::make_communicator<cohort::flat>(), cohort::invalid_argument,
        message_has({"COHORT_TIMEOUT must be a number of seconds", "'" + std::string(bad) + "'"}));
  }
  // One rank's operator set another value: every rank throws, naming both.
  const bool odd_one = boost::mpi::communicator().rank() == boost::mpi::communicator().size() - 1;
  setenv("COHORT_TIMEOUT", odd_one ? "4" : "5", 1);
  if (boost::mpi::communicator().size() > 1) {
    BOOST_CHECK_EXCEPTION(cohort::make_communicator<cohort::flat>(), cohort::mismatch_error,
                          message_has({"timeout (or COHORT_TIMEOUT)", "4000 ms", "5000 ms"}));
  }
  unsetenv("COHORT_TIMEOUT");
  unsetenv("COHORT_STALL_WARNING");
}

namespace {
// A model of `tensors` small gradients of T: one packed bucket of a few KiB at most.
template <class T>
struct small_model {
  std::vector<std::vector<T>> values, grads;
  std::vector<param<T>> params;
  small_model(int rank, std::size_t elements) {
    for (const std::size_t n : {std::size_t{1}, std::size_t{3}, elements}) {
      values.emplace_back(n);
      grads.push_back(cohort::test::filled<T>(n, rank));
    }
    for (std::size_t i = 0; i < values.size(); ++i) {
      params.push_back({"small" + std::to_string(i), &values[i], &grads[i]});
    }
  }
};

// A step of `Strategy` carried in its agreement (check on) gives what the same step reduced after
// it (check off: MPI's all-reduce) does, bit for bit where the sums are exact.
template <class T, class Strategy, class Reducer>
void check_carried(Strategy& carried, Strategy& uncarried, Reducer reducer, std::size_t elements,
                   bool packs) {
  small_model<T> a(carried.rank(), elements), b(carried.rank(), elements);
  (void)carried.take_grad_sync_stats();
  carried.allreduce_grad(a.params, reducer);
  uncarried.allreduce_grad(b.params, reducer);
  // Carried where the step is one packed bucket that fits the agreement (and only where the
  // agreement is on).
  const bool fits = (elements + 4) * sizeof(T) <= cohort::engine::liveness::max_carried_bytes;
  BOOST_TEST(carried.take_grad_sync_stats().carried == (packs && fits ? 1u : 0u),
             Strategy::name << ", " << elements << " elements");
  BOOST_TEST(uncarried.take_grad_sync_stats().carried == 0u);
  for (std::size_t t = 0; t < a.grads.size(); ++t) {
    for (std::size_t i = 0; i < a.grads[t].size(); ++i) {
      const double got = as_double(a.grads[t][i]);
      const double expected = as_double(b.grads[t][i]);
      BOOST_TEST_REQUIRE(std::abs(got - expected) <= tolerance<T>() * std::max(1.0, expected),
                         cohort::to_string(cohort::dtype_of_v<T>)
                             << " tensor " << t << " element " << i << ": " << got << " vs "
                             << expected);
    }
  }
}

template <class Strategy>
void check_carried_every_dtype(cohort::communicator_options options, bool packs = true) {
  auto carried = cohort::make_communicator<Strategy>(options);
  options.check_agreement = false;
  auto uncarried = cohort::make_communicator<Strategy>(options);
  // The largest fits the rendezvous exactly: max_carried_bytes of float32, less the two small
  // tensors.
  const std::size_t fits = cohort::engine::liveness::max_carried_bytes / sizeof(float) - 4;
  for (const std::size_t n : {std::size_t{5}, std::size_t{1000}, fits, fits + 1}) {
    check_carried<float>(carried, uncarried, cohort::sum{}, n, packs);
    check_carried<float>(carried, uncarried, cohort::mean{}, n, packs);
  }
  check_carried<double>(carried, uncarried, cohort::mean{}, 100, packs);
  check_carried<cohort::float16>(carried, uncarried, cohort::mean{}, 100, packs);
  check_carried<cohort::bfloat16>(carried, uncarried, cohort::sum{}, 100, packs);
  check_carried<std::int32_t>(carried, uncarried, cohort::mean{}, 100, packs);
  check_carried<std::uint8_t>(carried, uncarried, cohort::sum{}, 100, packs);
  check_carried<float>(carried, uncarried, cohort::compressed<cohort::float16>{}, 100, packs);
}
} // namespace

// Issue 14: a blocking step of one small packed bucket travels in the step's agreement and is
// reduced there (one round trip instead of two), on every strategy that packs the step into one
// bucket and whose exchange is an all-reduce (counted in grad_sync_stats::carried); what it gives
// is what the exchange gives, and a mismatch leaves every gradient as it was.
BOOST_AUTO_TEST_CASE(a_small_step_rides_its_agreement) {
  check_carried_every_dtype<cohort::flat>({});
  // naive reduces every gradient alone, in place: three buckets here, never carried (the same
  // results all the same).
  check_carried_every_dtype<cohort::naive>({}, /*packs=*/false);
  check_carried_every_dtype<cohort::hierarchical<>>({.simulated_ranks_per_node = 2});
  const int n = boost::mpi::communicator().size();
  if (n % 2 == 0) {
    check_carried_every_dtype<cohort::two_dimensional<>>({.simulated_ranks_per_node = 2});
  }
  auto comm = cohort::make_communicator<cohort::flat>();
  // Counted as one collective.
  small_model<float> m(comm.rank(), 10);
  (void)comm.take_grad_sync_stats();
  comm.allreduce_grad(m.params, cohort::sum{});
  const cohort::grad_sync_stats stats = comm.take_grad_sync_stats();
  BOOST_TEST(stats.steps == 1u);
  BOOST_TEST(stats.buckets == 1u);
  BOOST_TEST(stats.bytes == 14u * sizeof(float));
  if (comm.size() < 2) {
    return;
  }
  // A rank whose layout differs: an error on every rank, every gradient untouched.
  const int last = comm.size() - 1;
  small_model<float> odd(comm.rank(), comm.rank() == last ? 11 : 10);
  const auto before = odd.grads;
  BOOST_CHECK_EXCEPTION(
      comm.allreduce_grad(odd.params, cohort::sum{}), cohort::mismatch_error,
      message_has({"parameter 'small2' (#2)", "10 float32 elements", "11 float32 elements"}));
  BOOST_TEST((odd.grads == before));
  // A rank that reduces otherwise (another reducer): the same.
  small_model<float> other(comm.rank(), 10);
  const auto other_before = other.grads;
  const auto differently = [&] {
    if (comm.rank() == last) {
      comm.allreduce_grad(other.params, cohort::mean{});
    } else {
      comm.allreduce_grad(other.params, cohort::sum{});
    }
  };
  BOOST_CHECK_THROW(differently(), cohort::mismatch_error);
  BOOST_TEST((other.grads == other_before));
  comm.allreduce_grad(m.params, cohort::sum{}); // in step again
}
