// SPDX-License-Identifier: Apache-2.0
// The GPU strategies against the host oracle (flat on copies of the same data), at 1 to N ranks,
// one GPU per rank. Skipped (77) where fewer devices are visible than ranks: NCCL does not
// support two ranks on one device.
#define BOOST_TEST_MODULE gpu.strategies
#include <cohort/nccl.hpp>

#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "support/device_vector.hpp"
#include "support/fill.hpp"

using cohort::test::closed_form;
using cohort::test::closed_form_sum;
using cohort::test::device_array;

namespace {
template <class T>
void expect_equal(const std::vector<T>& got, const std::vector<T>& expected) {
  BOOST_CHECK_EQUAL_COLLECTIONS(got.begin(), got.end(), expected.begin(), expected.end());
}

template <class Strategy>
Strategy make(cohort::gpu_options gpu = {}, cohort::communicator_options options = {}) {
  return Strategy(boost::mpi::communicator(), options, gpu);
}
template <>
cohort::host_staged make<cohort::host_staged>(cohort::gpu_options,
                                              cohort::communicator_options options) {
  return cohort::host_staged(boost::mpi::communicator(), options);
}
template <>
cohort::cuda_aware_flat make<cohort::cuda_aware_flat>(cohort::gpu_options,
                                                      cohort::communicator_options options) {
  return cohort::cuda_aware_flat(boost::mpi::communicator(), options);
}

// Mixed sizes and dtypes on the device; the same on the host for the oracle.
// The oracle has the same buckets: the host's under the same options, with everything that fits a
// bucket packed, as on the device.
template <class Strategy, class Reducer>
void check_allreduce_grad(Reducer reducer, double tolerance,
                          cohort::communicator_options options = {}) {
  auto comm = make<Strategy>({}, options);
  cohort::communicator_options packed = options;
  packed.fusion_threshold_bytes = options.bucket_bytes;
  auto oracle = cohort::make_communicator<cohort::flat>(packed);
  const int r = comm.rank();
  const std::size_t sizes[] = {0, 1, 7, 1000, 4099};
  std::vector<std::vector<float>> host_values, host_grads;
  std::vector<std::unique_ptr<device_array<float>>> values, grads;
  for (const std::size_t n : sizes) {
    host_values.emplace_back(n);
    host_grads.push_back(cohort::test::filled<float>(n, r));
    values.push_back(std::make_unique<device_array<float>>(host_values.back()));
    grads.push_back(std::make_unique<device_array<float>>(host_grads.back()));
  }
  std::vector<cohort::parameter_ref<cohort::device_span<float>>> params;
  std::vector<cohort::device_span<float>> spans;
  spans.reserve(2 * values.size());
  std::vector<cohort::parameter_ref<std::vector<float>>> host_params;
  for (std::size_t i = 0; i < values.size(); ++i) {
    spans.push_back(values[i]->span());
    spans.push_back(grads[i]->span());
    params.push_back({"p" + std::to_string(i), &spans[2 * i], &spans[2 * i + 1]});
    host_params.push_back({"p" + std::to_string(i), &host_values[i], &host_grads[i]});
  }
  comm.allreduce_grad(params, reducer);
  oracle.allreduce_grad(host_params, reducer);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const auto got = grads[i]->read();
    for (std::size_t j = 0; j < got.size(); ++j) {
      const double expected = host_grads[i][j];
      BOOST_REQUIRE_MESSAGE(std::abs(got[j] - expected) <= tolerance * std::max(1.0, expected),
                            "tensor " << i << " element " << j << ": " << got[j] << " vs "
                                      << expected);
    }
  }
  BOOST_CHECK_EQUAL(comm.bucket_count(), oracle.bucket_count());
  // The statistics count the device's collectives, as the host's.
  const cohort::grad_sync_stats stats = comm.take_grad_sync_stats();
  BOOST_CHECK_EQUAL(stats.steps, 1u);
  BOOST_CHECK_EQUAL(stats.buckets, comm.bucket_count());
  BOOST_CHECK_EQUAL(stats.buckets, oracle.take_grad_sync_stats().buckets);
}
} // namespace

BOOST_AUTO_TEST_CASE(pure_nccl_mean_sum_and_compressed_match_the_oracle) {
  check_allreduce_grad<cohort::pure_nccl>(cohort::mean{}, 1e-6);
  check_allreduce_grad<cohort::pure_nccl>(cohort::sum{}, 0.0);
  check_allreduce_grad<cohort::pure_nccl>(cohort::compressed<cohort::float16>{}, 4e-3);
}

BOOST_AUTO_TEST_CASE(device_buckets_follow_the_bucket_options) {
  // Buckets of 64 bytes after a first of 16: many buckets, packed, and the tensors of 1000 and
  // 4099 floats in place.
  const cohort::communicator_options small{.bucket_bytes = 64, .first_bucket_bytes = 16};
  check_allreduce_grad<cohort::pure_nccl>(cohort::mean{}, 1e-6, small);
  check_allreduce_grad<cohort::pure_nccl>(cohort::compressed<cohort::float16>{}, 4e-3, small);
  check_allreduce_grad<cohort::hierarchical<cohort::nccl_links>>(cohort::mean{}, 1e-6, small);
  check_allreduce_grad<cohort::pure_nccl>(cohort::sum{}, 0.0, {.bucket_bytes = 0});
}

// Gradients of 16-bit and integer dtypes: the mean of fp16 divides before the sum, the mean of
// int32 travels as int64 and rounds, exactly as on the host.
template <class T, class Strategy, class Reducer>
void check_gradients_of(Reducer reducer, double tolerance) {
  auto comm = make<Strategy>();
  auto oracle = cohort::make_communicator<cohort::flat>();
  std::vector<T> host_value(4099), host_grad = cohort::test::filled<T>(4099, comm.rank());
  device_array<T> value(host_value), grad(host_grad);
  auto value_view = value.span();
  auto grad_view = grad.span();
  std::vector<cohort::parameter_ref<cohort::device_span<T>>> params{{"g", &value_view, &grad_view}};
  std::vector<cohort::parameter_ref<std::vector<T>>> host_params{{"g", &host_value, &host_grad}};
  comm.allreduce_grad(params, reducer);
  oracle.allreduce_grad(host_params, reducer);
  const auto got = grad.read();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double a = cohort::test::as_double(got[i]);
    const double b = cohort::test::as_double(host_grad[i]);
    BOOST_REQUIRE_MESSAGE(std::abs(a - b) <= tolerance * std::max(1.0, std::abs(b)),
                          "element " << i << ": " << a << " vs " << b);
  }
}

BOOST_AUTO_TEST_CASE(sixteen_bit_and_integer_gradients_match_the_oracle) {
  check_gradients_of<cohort::float16, cohort::pure_nccl>(cohort::mean{}, 1e-3);
  check_gradients_of<cohort::bfloat16, cohort::pure_nccl>(cohort::mean{}, 1e-2);
  check_gradients_of<std::int32_t, cohort::pure_nccl>(cohort::mean{}, 0.0);
  check_gradients_of<std::int32_t, cohort::pure_nccl>(cohort::sum{}, 0.0);
}

BOOST_AUTO_TEST_CASE(single_node_matches_the_oracle) {
  check_allreduce_grad<cohort::single_node>(cohort::mean{}, 1e-6);
}

// The cases labelled mpi_on_device use no NCCL: the device kit runs them with ranks sharing one
// GPU (COHORT_TEST_SHARED_DEVICE, gpu_mpi_main.hpp).
BOOST_TEST_DECORATOR(*boost::unit_test::label("mpi_on_device"))
BOOST_AUTO_TEST_CASE(host_staged_matches_the_oracle) {
  check_allreduce_grad<cohort::host_staged>(cohort::mean{}, 1e-6);
  check_allreduce_grad<cohort::host_staged>(cohort::compressed<cohort::bfloat16>{}, 3e-2);
  check_allreduce_grad<cohort::host_staged>(cohort::mean{}, 1e-6,
                                            {.bucket_bytes = 64, .first_bucket_bytes = 16});
  check_gradients_of<double, cohort::host_staged>(cohort::mean{}, 1e-12);
  check_gradients_of<float, cohort::host_staged>(cohort::sum{}, 1e-6);
}

// NCCL inside the node, MPI between nodes (COHORT_RANKS_PER_NODE simulates several nodes; the
// 2x2 run of this test does).
BOOST_AUTO_TEST_CASE(two_level_strategies_on_nccl_links_match_the_oracle) {
  using gpu_hierarchical = cohort::hierarchical<cohort::nccl_links>;
  using gpu_two_dimensional = cohort::two_dimensional<cohort::nccl_links>;
  check_allreduce_grad<gpu_hierarchical>(cohort::mean{}, 1e-6);
  check_allreduce_grad<gpu_hierarchical>(cohort::sum{}, 0.0);
  check_allreduce_grad<gpu_hierarchical>(cohort::compressed<cohort::bfloat16>{}, 3e-2);
  check_allreduce_grad<gpu_two_dimensional>(cohort::mean{}, 1e-6);
  check_allreduce_grad<gpu_two_dimensional>(cohort::sum{}, 0.0);
  check_allreduce_grad<gpu_two_dimensional>(cohort::compressed<cohort::float16>{}, 4e-3);
}

static_assert(cohort::communicator<cohort::any_gpu_communicator>);
// What basic_communicator asks before the ranks agree on the gradients.
static_assert(requires(cohort::pure_nccl & s, const cohort::grad_slot& slot) {
  s.check_gradient_memory(slot);
});
static_assert(requires(cohort::hierarchical<cohort::nccl_links> & s,
                       const cohort::grad_slot& slot) { s.check_gradient_memory(slot); });
static_assert(!cohort::overlapping_communicator<cohort::any_gpu_communicator>);

BOOST_AUTO_TEST_CASE(any_gpu_communicator_by_name) {
  BOOST_CHECK_EQUAL(
      cohort::any_gpu_communicator::known_names(),
      "pure_nccl, single_node, hierarchical, two_dimensional, host_staged, cuda_aware_flat");
  for (const char* name : {"pure_nccl", "hierarchical", "two_dimensional", "host_staged"}) {
    cohort::any_gpu_communicator comm(name);
    BOOST_CHECK_EQUAL(std::string(comm.name()), name);
    device_array<float> grad(std::vector<float>(5, static_cast<float>(comm.rank())));
    device_array<float> value(std::vector<float>(5));
    cohort::device_span<float> g = grad.span(), v = value.span();
    std::vector<cohort::parameter_ref<cohort::device_span<float>>> params{{"w", &v, &g}};
    comm.allreduce_grad(params, cohort::sum{});
    const float expected = static_cast<float>(comm.size() * (comm.size() - 1) / 2);
    expect_equal(grad.read(), std::vector<float>(5, expected));
    // The NCCL communicator's end through the variant (nothing to end for host_staged), twice.
    comm.finalize();
    comm.finalize();
  }
  {
    cohort::any_gpu_communicator comm("pure_nccl");
    comm.connect();
    comm.abort();
  }
  try {
    cohort::any_gpu_communicator("non_cuda_aware");
    BOOST_ERROR("an unknown name was accepted");
  } catch (const cohort::invalid_argument& e) {
    BOOST_CHECK(std::string(e.what()).find("cohort's host_staged") != std::string::npos);
  }
}

BOOST_TEST_DECORATOR(*boost::unit_test::label("mpi_on_device"))
BOOST_AUTO_TEST_CASE(cuda_aware_flat_matches_the_oracle_or_refuses_a_plain_mpi) {
  if (!cohort::mpi_is_cuda_aware()) {
    BOOST_CHECK_THROW(cohort::cuda_aware_flat{boost::mpi::communicator()},
                      cohort::invalid_argument);
    return;
  }
  check_allreduce_grad<cohort::cuda_aware_flat>(cohort::mean{}, 1e-6);
  // A 16-bit wire is refused on every rank before anything moves, and the communicator goes on.
  auto comm = make<cohort::cuda_aware_flat>();
  std::vector<float> host_value(64), host_grad(64, 1.0f);
  device_array<float> value(host_value), grad(host_grad);
  auto value_view = value.span();
  auto grad_view = grad.span();
  std::vector<cohort::parameter_ref<cohort::device_span<float>>> params{
      {"g", &value_view, &grad_view}};
  BOOST_CHECK_THROW(comm.allreduce_grad(params, cohort::compressed<cohort::float16>{}),
                    cohort::invalid_argument);
  comm.allreduce_grad(params, cohort::sum{});
  const auto got = grad.read();
  BOOST_CHECK_EQUAL(got[0], static_cast<float>(comm.size()));
}

BOOST_AUTO_TEST_CASE(device_tensor_collectives) {
  auto comm = make<cohort::pure_nccl>();
  const int n = comm.size();
  device_array<double> x(cohort::test::filled<double>(33, comm.rank()));
  auto view = x.span();
  comm.allreduce(view);
  auto got = x.read();
  for (std::size_t i = 0; i < got.size(); ++i) {
    BOOST_REQUIRE_EQUAL(got[i], closed_form_sum(i, n));
  }
  device_array<std::int32_t> b(std::vector<std::int32_t>(5, comm.rank() == n - 1 ? 42 : 0));
  auto bview = b.span();
  comm.broadcast(bview, n - 1);
  expect_equal(b.read(), std::vector<std::int32_t>(5, 42));
  device_array<float> mine(std::vector<float>(2, static_cast<float>(comm.rank())));
  device_array<float> all(std::vector<float>(2 * static_cast<std::size_t>(n)));
  auto mine_view = mine.span();
  auto all_view = all.span();
  comm.allgather(mine_view, all_view);
  const auto gathered = all.read();
  for (int rank = 0; rank < n; ++rank) {
    BOOST_CHECK_EQUAL(gathered[2 * static_cast<std::size_t>(rank)], static_cast<float>(rank));
  }
  // Reduce-scatter: rank r gets block r of the sum.
  device_array<float> blocks(std::vector<float>(3 * static_cast<std::size_t>(n), 1.0f));
  device_array<float> block(std::vector<float>(3));
  auto blocks_view = blocks.span();
  auto block_view = block.span();
  comm.reduce_scatter(blocks_view, block_view);
  expect_equal(block.read(), std::vector<float>(3, static_cast<float>(n)));
  // Point to point around a ring (NCCL needs the communicator made first).
  comm.connect();
  if (n > 1) {
    device_array<std::int64_t> out(std::vector<std::int64_t>(4, comm.rank()));
    device_array<std::int64_t> in(std::vector<std::int64_t>(4));
    auto out_view = out.span();
    auto in_view = in.span();
    if (comm.rank() % 2 == 0) {
      comm.send(out_view, (comm.rank() + 1) % n);
      comm.recv(in_view, (comm.rank() + n - 1) % n);
    } else {
      comm.recv(in_view, (comm.rank() + n - 1) % n);
      comm.send(out_view, (comm.rank() + 1) % n);
    }
    expect_equal(in.read(), std::vector<std::int64_t>(4, (comm.rank() + n - 1) % n));
  }
  // A split keeps the strategy and its GPU options, and reduces over its own ranks only.
  auto half = comm.split(comm.rank() % 2, comm.rank());
  device_array<float> ones(std::vector<float>(6, 1.0f));
  auto ones_view = ones.span();
  half.allreduce(ones_view);
  expect_equal(ones.read(), std::vector<float>(6, static_cast<float>(half.size())));
  BOOST_CHECK_EQUAL(half.gpu().timeout.count(), comm.gpu().timeout.count());
  // Host memory still goes through MPI on the same communicator.
  std::vector<float> host(3, 1.0f);
  comm.allreduce(host);
  BOOST_CHECK_EQUAL(host[0], static_cast<float>(n));
  auto staged = make<cohort::host_staged>();
  device_array<float> y(std::vector<float>(9, 2.0f));
  auto y_view = y.span();
  staged.allreduce(y_view);
  expect_equal(y.read(), std::vector<float>(9, 2.0f * static_cast<float>(n)));
}

namespace {
// Blocks of any size in device memory (what a sharded optimizer gathers): rank r's block holds
// 2r + 1 elements, rank 1's none (a rank that owns nothing); then blocks all of one size, NCCL's
// own all-gather and reduce-scatter. Integers: the sums are exact.
template <class Strategy>
void check_blocks_of_any_size() {
  auto comm = make<Strategy>();
  const int n = comm.size();
  for (const bool even : {false, true}) {
    std::vector<std::size_t> counts, offsets;
    std::size_t total = 0;
    for (int r = 0; r < n; ++r) {
      counts.push_back(even ? 3 : (r == 1 ? 0 : 2 * static_cast<std::size_t>(r) + 1));
      offsets.push_back(total);
      total += counts.back();
    }
    const auto me = static_cast<std::size_t>(comm.rank());
    std::vector<std::int32_t> mine(counts[me]);
    for (std::size_t j = 0; j < mine.size(); ++j) {
      mine[j] = 100 * comm.rank() + static_cast<std::int32_t>(j);
    }
    device_array<std::int32_t> block(mine);
    device_array<std::int32_t> whole(std::vector<std::int32_t>(total, -1));
    auto block_view = block.span();
    auto whole_view = whole.span();
    comm.allgather(block_view, whole_view, counts);
    const auto gathered = whole.read();
    for (int r = 0; r < n; ++r) {
      for (std::size_t j = 0; j < counts[static_cast<std::size_t>(r)]; ++j) {
        BOOST_REQUIRE_EQUAL(gathered[offsets[static_cast<std::size_t>(r)] + j],
                            100 * r + static_cast<std::int32_t>(j));
      }
    }
    // Rank q contributes (q + 1) * k at element k: rank r's block sums to n(n+1)/2 * k.
    std::vector<std::int32_t> contribution(total);
    for (std::size_t k = 0; k < total; ++k) {
      contribution[k] = (comm.rank() + 1) * static_cast<std::int32_t>(k);
    }
    device_array<std::int32_t> in(contribution);
    device_array<std::int32_t> out(std::vector<std::int32_t>(counts[me], -1));
    auto in_view = in.span();
    auto out_view = out.span();
    comm.reduce_scatter(in_view, out_view, counts);
    const auto reduced = out.read();
    for (std::size_t j = 0; j < reduced.size(); ++j) {
      BOOST_REQUIRE_EQUAL(reduced[j], n * (n + 1) / 2 * static_cast<std::int32_t>(offsets[me] + j));
    }
  }
  // Counts that differ between the ranks: an error on every rank, before NCCL is called.
  if (n > 1) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(n), 2);
    counts[0] = comm.rank() == 0 ? 3 : 2;
    device_array<float> block{std::vector<float>(counts[static_cast<std::size_t>(comm.rank())])};
    device_array<float> whole(std::vector<float>(2 * static_cast<std::size_t>(n) + counts[0] - 2));
    auto block_view = block.span();
    auto whole_view = whole.span();
    BOOST_CHECK_EXCEPTION(comm.allgather(block_view, whole_view, counts), cohort::mismatch_error,
                          [](const cohort::mismatch_error& e) {
                            return std::string(e.what()).find("the counts") != std::string::npos;
                          });
    BOOST_CHECK_EXCEPTION(comm.reduce_scatter(whole_view, block_view, counts),
                          cohort::mismatch_error, [](const cohort::mismatch_error& e) {
                            return std::string(e.what()).find("the counts") != std::string::npos;
                          });
    // The same counts, another op on one rank.
    std::vector<std::size_t> even(static_cast<std::size_t>(n), 2);
    device_array<float> two{std::vector<float>(2)};
    device_array<float> all{std::vector<float>(2 * static_cast<std::size_t>(n))};
    auto two_view = two.span();
    auto all_view = all.span();
    BOOST_CHECK_EXCEPTION(
        comm.reduce_scatter(all_view, two_view, even,
                            comm.rank() == 0 ? cohort::reduce_op::max : cohort::reduce_op::sum),
        cohort::mismatch_error, [](const cohort::mismatch_error& e) {
          return std::string(e.what()).find("op") != std::string::npos;
        });
  }
  // A block of another size than this rank's count: named on this rank, an error on every rank.
  std::vector<std::size_t> counts(static_cast<std::size_t>(n), 2);
  device_array<float> wrong(std::vector<float>(comm.rank() == 0 ? 1 : 2));
  device_array<float> whole(std::vector<float>(2 * static_cast<std::size_t>(n)));
  auto wrong_view = wrong.span();
  auto whole_view = whole.span();
  BOOST_CHECK_THROW(comm.allgather(wrong_view, whole_view, counts), cohort::error);
  // The communicator is still usable after the refused calls.
  device_array<float> ones(std::vector<float>(4, 1.0f));
  auto ones_view = ones.span();
  comm.allreduce(ones_view);
  expect_equal(ones.read(), std::vector<float>(4, static_cast<float>(n)));
}
} // namespace

BOOST_AUTO_TEST_CASE(blocks_of_any_size_gathered_and_reduce_scattered_on_the_device) {
  check_blocks_of_any_size<cohort::pure_nccl>();
  check_blocks_of_any_size<cohort::hierarchical<cohort::nccl_links>>();
}

namespace {
template <class Strategy>
void check_broadcast_parameters() {
  auto comm = make<Strategy>();
  device_array<float> w(std::vector<float>(10, static_cast<float>(comm.rank())));
  device_array<float> g(std::vector<float>(10));
  auto w_view = w.span();
  auto g_view = g.span();
  std::vector<cohort::parameter_ref<cohort::device_span<float>>> params{{"w", &w_view, &g_view}};
  comm.broadcast_parameters(params, comm.size() - 1);
  expect_equal(w.read(), std::vector<float>(10, static_cast<float>(comm.size() - 1)));
}
} // namespace

namespace {
// Values of 1, 3 and 5 floats and more, with buckets of 16 bytes: packed on the device (values
// under 16 bytes) or broadcast in place, or staged through pinned memory 16 bytes at a time (a
// value of 100 floats in 25 pieces). With buckets of 0 bytes, each value travels alone.
template <class Strategy>
void check_broadcast_parameters_in_small_buckets(std::size_t bucket_bytes) {
  auto comm = make<Strategy>({}, {.bucket_bytes = bucket_bytes});
  const std::size_t sizes[] = {1, 3, 5, 100, 0, 2};
  std::vector<std::unique_ptr<device_array<float>>> values, grads;
  std::vector<cohort::device_span<float>> spans;
  spans.reserve(2 * std::size(sizes));
  std::vector<cohort::parameter_ref<cohort::device_span<float>>> params;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    values.push_back(std::make_unique<device_array<float>>(
        std::vector<float>(sizes[i], static_cast<float>(comm.rank() * 10 + static_cast<int>(i)))));
    grads.push_back(std::make_unique<device_array<float>>(std::vector<float>(sizes[i])));
    spans.push_back(values.back()->span());
    spans.push_back(grads.back()->span());
    params.push_back({"p" + std::to_string(i), &spans[2 * i], &spans[2 * i + 1]});
  }
  comm.broadcast_parameters(params, 0);
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    expect_equal(values[i]->read(), std::vector<float>(sizes[i], static_cast<float>(i)));
  }
}
} // namespace

BOOST_AUTO_TEST_CASE(broadcast_parameters_in_buckets_of_16_and_0_bytes) {
  for (const std::size_t bucket_bytes : {std::size_t{16}, std::size_t{0}}) {
    check_broadcast_parameters_in_small_buckets<cohort::pure_nccl>(bucket_bytes);
    check_broadcast_parameters_in_small_buckets<cohort::host_staged>(bucket_bytes);
    check_broadcast_parameters_in_small_buckets<cohort::hierarchical<cohort::nccl_links>>(
        bucket_bytes);
    if (cohort::mpi_is_cuda_aware()) {
      check_broadcast_parameters_in_small_buckets<cohort::cuda_aware_flat>(bucket_bytes);
    }
  }
}

BOOST_AUTO_TEST_CASE(broadcast_parameters_on_the_device) {
  check_broadcast_parameters<cohort::pure_nccl>();
  // Staged through host memory: the two-level strategies create no NCCL communicator over all
  // ranks.
  check_broadcast_parameters<cohort::hierarchical<cohort::nccl_links>>();
  check_broadcast_parameters<cohort::two_dimensional<cohort::nccl_links>>();
  // What distributed_optimizer calls first: staged through pinned memory, or MPI on the device.
  check_broadcast_parameters<cohort::host_staged>();
  if (cohort::mpi_is_cuda_aware()) {
    check_broadcast_parameters<cohort::cuda_aware_flat>();
  }
}

namespace {
// The root's value is written on the user's own (non-blocking) stream just before the broadcast,
// behind a long memset, and read on the others from that stream: the broadcast must start after
// the root's write and end before the others' read, although neither is ordered with the legacy
// default stream.
template <class Strategy>
void check_broadcast_parameters_after_the_users_stream() {
  auto comm = make<Strategy>();
  cohort::cuda::stream user;
  comm.set_stream(user.get());
  const bool root = comm.rank() == 0;
  device_array<std::int32_t> w(std::vector<std::int32_t>(4099, comm.rank() + 2));
  device_array<std::int32_t> g(std::vector<std::int32_t>(4099));
  cohort::cuda::device_buffer slow;
  const std::size_t slow_bytes = std::size_t{256} << 20;
  if (root) {
    cohort::cuda::check(cudaMemsetAsync(slow.reserve(slow_bytes), 0, slow_bytes, user.get()),
                        "cudaMemsetAsync");
    cohort::cuda::check(
        cudaMemsetAsync(w.span().data(), 1, 4099 * sizeof(std::int32_t), user.get()),
        "cudaMemsetAsync");
  }
  auto w_view = w.span();
  auto g_view = g.span();
  std::vector<cohort::parameter_ref<cohort::device_span<std::int32_t>>> params{
      {"w", &w_view, &g_view}};
  comm.broadcast_parameters(params, 0);
  user.synchronize(); // the user's stream waits for cohort's copies: once it is done, so are they
  expect_equal(w.read(), std::vector<std::int32_t>(4099, 0x01010101));
}
} // namespace

BOOST_AUTO_TEST_CASE(broadcast_parameters_is_ordered_with_the_users_stream) {
  check_broadcast_parameters_after_the_users_stream<cohort::pure_nccl>();
  check_broadcast_parameters_after_the_users_stream<cohort::host_staged>();
  check_broadcast_parameters_after_the_users_stream<cohort::hierarchical<cohort::nccl_links>>();
  check_broadcast_parameters_after_the_users_stream<cohort::two_dimensional<cohort::nccl_links>>();
  if (cohort::mpi_is_cuda_aware()) {
    check_broadcast_parameters_after_the_users_stream<cohort::cuda_aware_flat>();
  }
}

BOOST_AUTO_TEST_CASE(a_collective_one_rank_never_joins_times_out_instead_of_hanging) {
  const boost::mpi::communicator world;
  if (world.size() < 2) {
    return;
  }
  // Without the agreement check, so that only NCCL waits; a 2-second limit. Every rank but the
  // last enters an all-reduce the last never joins.
  cohort::pure_nccl comm(world, {.check_agreement = false}, {.timeout = std::chrono::seconds(2)});
  device_array<float> x(std::vector<float>(1 << 20, 1.0f));
  auto view = x.span();
  comm.allreduce(view); // connects every rank, on the same size the stuck call uses
  if (comm.rank() != comm.size() - 1) {
    const auto start = std::chrono::steady_clock::now();
    BOOST_CHECK_EXCEPTION(comm.allreduce(view), cohort::timeout_error,
                          [&](const cohort::timeout_error& e) {
                            const std::string what = e.what();
                            return what.find("aborted") != std::string::npos &&
                                   what.find("allreduce on rank " + std::to_string(world.rank())) !=
                                       std::string::npos &&
                                   what.find("waited") != std::string::npos;
                          });
    BOOST_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(60));
    // The abort ended this rank's part: the device is free again, and the communicator is gone
    // (a second call fails at once instead of waiting out another limit).
    BOOST_CHECK_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
    const auto again = std::chrono::steady_clock::now();
    BOOST_CHECK_THROW(comm.allreduce(view), cohort::error);
    BOOST_CHECK(std::chrono::steady_clock::now() - again < std::chrono::seconds(1));
  }
  world.barrier();
  comm.abort(); // every rank: the last one's communicator has lost its peers too
}

BOOST_AUTO_TEST_CASE(finalize_twice_and_use_after_finalize) {
  auto comm = make<cohort::pure_nccl>();
  device_array<float> x(std::vector<float>(4, 1.0f));
  auto view = x.span();
  comm.allreduce(view);
  comm.finalize();
  comm.finalize(); // a second "free" is harmless
  BOOST_CHECK_THROW(comm.allreduce(view), cohort::error);
}

BOOST_AUTO_TEST_CASE(finalize_waits_for_work_still_queued) {
  // With no time limit cohort does not wait for its collectives: finalize comes while the
  // all-reduce may still be in flight, and must let it finish (ncclCommFinalize flushes it).
  auto comm = make<cohort::pure_nccl>({.timeout = std::chrono::milliseconds(0)});
  device_array<float> x(std::vector<float>(1 << 20, 1.0f));
  auto view = x.span();
  comm.allreduce(view);
  comm.finalize();
  expect_equal(x.read(), std::vector<float>(1 << 20, static_cast<float>(comm.size())));
}

BOOST_AUTO_TEST_CASE(a_rank_that_never_joins_the_communicator_times_out_the_others) {
  const boost::mpi::communicator world;
  if (world.size() < 2) {
    return;
  }
  // The id travels to every rank, but the last rank never joins: the others' ncclCommInitRankConfig
  // stays in progress until the 2-second limit aborts what it created, and throws.
  ncclUniqueId id{};
  if (world.rank() == 0) {
    BOOST_REQUIRE_EQUAL(ncclGetUniqueId(&id), ncclSuccess);
  }
  BOOST_REQUIRE_EQUAL(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, world), MPI_SUCCESS);
  if (world.rank() != world.size() - 1) {
    const auto start = std::chrono::steady_clock::now();
    BOOST_CHECK_EXCEPTION(
        cohort::nccl::communicator(id, world.size(), world.rank(), std::chrono::seconds(2)),
        cohort::error, [](const cohort::error& e) {
          return std::string(e.what()).find("ncclCommInitRankConfig") != std::string::npos;
        });
    BOOST_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(60));
  }
  world.barrier();
}

BOOST_AUTO_TEST_CASE(finalize_with_a_peer_gone_aborts_within_the_limit) {
  const boost::mpi::communicator world;
  if (world.size() < 2) {
    return;
  }
  cohort::nccl::communicator c(world, std::chrono::seconds(2));
  device_array<float> x(std::vector<float>(1 << 20, 1.0f));
  cohort::cuda::stream s;
  if (world.rank() != world.size() - 1) {
    // Queued, never waited for: the last rank never takes part, so it cannot finish, and
    // finalizing (which flushes it) cannot either. Past the limit the communicator is aborted.
    cohort::nccl::allreduce(c, x.span().data(), x.span().data(), 1 << 20, cohort::dtype::float32,
                            cohort::reduce_op::sum, s.get());
    const auto start = std::chrono::steady_clock::now();
    BOOST_CHECK_THROW(c.destroy(), cohort::error);
    BOOST_CHECK(!c.valid());
    BOOST_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(60));
  } else {
    c.abort(); // its peers are stuck in a collective it never joins: it cannot finalize with them
  }
  world.barrier();
}

BOOST_AUTO_TEST_CASE(memory_of_another_device_is_refused_by_name) {
  if (cohort::cuda::device_count() < 2 * boost::mpi::communicator().size()) {
    return; // needs a device that is not this rank's
  }
  auto comm = make<cohort::pure_nccl>();
  device_array<float> x(std::vector<float>(4));
  auto view = x.span();
  comm.allreduce(view);
  const int other = (cohort::cuda::current_device() + comm.size()) % cohort::cuda::device_count();
  float* elsewhere = nullptr;
  {
    const cohort::cuda::device_guard on(other);
    cohort::cuda::check(cudaMalloc(&elsewhere, 4 * sizeof(float)), "cudaMalloc");
  }
  cohort::device_span<float> wrong(elsewhere, 4);
  BOOST_CHECK_THROW(comm.allreduce(wrong), cohort::invalid_argument);
  // A gradient on another device on the last rank only: checked before the ranks agree, so every
  // rank throws (the last the problem itself, the others the disagreement) instead of the others
  // waiting in NCCL for it.
  device_array<float> value(std::vector<float>(4));
  auto value_view = value.span();
  const bool last = comm.rank() == comm.size() - 1;
  std::vector<cohort::parameter_ref<cohort::device_span<float>>> params{
      {"w", &value_view, last ? &wrong : &view}};
  try {
    comm.allreduce_grad(params, cohort::sum{});
    BOOST_ERROR("a gradient on another device was reduced");
  } catch (const cohort::error& e) {
    BOOST_CHECK(std::string(e.what()).find("parameter 'w'") != std::string::npos);
  }
  (void)cudaFree(elsewhere);
}

#include "gpu_mpi_main.hpp"
