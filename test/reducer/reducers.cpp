// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE reducer.reducers
#include <cohort/reducer/compressed.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/reducer/sum.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <vector>

using cohort::dtype;

static_assert(cohort::reducer<cohort::mean>);
static_assert(cohort::reducer<cohort::sum>);
static_assert(cohort::reducer<cohort::compressed<cohort::float16>>);
static_assert(cohort::reducer<cohort::compressed<cohort::bfloat16>>);
static_assert(!cohort::reducer<int>);

BOOST_AUTO_TEST_CASE(mean_divides_after_the_sum_in_wide_types) {
  for (const dtype type :
       {dtype::float32, dtype::float64, dtype::int32, dtype::int64, dtype::uint8}) {
    const auto plan = cohort::mean{}.plan(type, 4);
    // Narrow integers are summed in int64, where the sum of their values cannot wrap.
    const bool widened = type == dtype::int32 || type == dtype::uint8;
    BOOST_TEST((plan.wire == (widened ? dtype::int64 : type)));
    BOOST_TEST(plan.pre_scale == 1.0);
    BOOST_TEST(plan.post_scale == 0.25);
    BOOST_TEST((plan.op == cohort::reduce_op::sum));
  }
}

BOOST_AUTO_TEST_CASE(mean_sums_16_bit_types_in_float32) {
  // A float16 sum of 3 thirds of 65504 rounds to 65520: inf. In float32 it cannot overflow.
  const auto half = cohort::mean{}.plan(dtype::float16, 4);
  BOOST_TEST((half.wire == dtype::float32));
  BOOST_TEST(half.pre_scale == 1.0);
  BOOST_TEST(half.post_scale == 0.25);
  // bfloat16 reaches float32's largest value: divided first.
  const auto brain = cohort::mean{}.plan(dtype::bfloat16, 4);
  BOOST_TEST((brain.wire == dtype::float32));
  BOOST_TEST(brain.pre_scale == 0.25);
  BOOST_TEST(brain.post_scale == 1.0);
}

BOOST_AUTO_TEST_CASE(sum_does_not_scale) {
  const auto plan = cohort::sum{}.plan(dtype::float16, 3);
  BOOST_TEST((plan == cohort::grad_reduction{dtype::float16, 1.0, 1.0, cohort::reduce_op::sum}));
  constexpr auto at_compile_time = cohort::mean{}.plan(dtype::float32, 2);
  static_assert(at_compile_time.post_scale == 0.5);
}

BOOST_AUTO_TEST_CASE(compressed_sends_16_bits_and_divides_first_with_headroom) {
  const cohort::compressed<cohort::float16> half;
  const cohort::compressed<cohort::bfloat16> brain;
  for (const dtype type : {dtype::float32, dtype::float64}) {
    const auto plan = half.plan(type, 8);
    BOOST_TEST((plan.wire == dtype::float16));
    BOOST_TEST(plan.pre_scale == 1.0 / 16.0);
    BOOST_TEST(plan.post_scale == 2.0);
    BOOST_TEST((brain.plan(type, 8).wire == dtype::bfloat16));
  }
  // 16-bit gradients are averaged as mean does; integers are not compressed.
  BOOST_TEST((half.plan(dtype::bfloat16, 2) == cohort::mean{}.plan(dtype::bfloat16, 2)));
  BOOST_TEST((half.plan(dtype::int32, 2) == cohort::mean{}.plan(dtype::int32, 2)));
  // One rank adds nothing: no headroom. Past e^((n+1)u) > 2, more.
  BOOST_TEST(half.plan(dtype::float32, 1).post_scale == 1.0);
  BOOST_TEST(cohort::compressed_headroom(1418, dtype::float16) == 2.0);
  BOOST_TEST(cohort::compressed_headroom(1419, dtype::float16) == 4.0);
  BOOST_TEST(cohort::compressed_headroom(176, dtype::bfloat16) == 2.0);
  BOOST_TEST(cohort::compressed_headroom(177, dtype::bfloat16) == 4.0);
  BOOST_TEST(cohort::compressed_headroom(1 << 20, dtype::float16) >= 512.0 * 1024.0 / 1000.0);
}

// The host's own 16-bit arithmetic, one rounding per pairwise step as MPI's user ops do.
template <class Half>
double simulated_mean(cohort::grad_reduction plan, const std::vector<double>& inputs) {
  // The wire's sum, rounded at each step, from the pre-scaled values as the packer casts them.
  double sum = 0.0;
  bool first = true;
  for (const double x : inputs) {
    const double scaled =
        plan.wire == cohort::dtype::float32
            ? static_cast<double>(static_cast<float>(x * plan.pre_scale))
            : static_cast<double>(static_cast<float>(Half(static_cast<float>(x * plan.pre_scale))));
    if (first) {
      sum = scaled;
      first = false;
    } else if (plan.wire == cohort::dtype::float32) {
      sum = static_cast<double>(static_cast<float>(sum) + static_cast<float>(scaled));
    } else {
      sum = static_cast<double>(
          static_cast<float>(Half(static_cast<float>(sum) + static_cast<float>(scaled))));
    }
  }
  return sum * plan.post_scale;
}

BOOST_AUTO_TEST_CASE(no_representable_input_overflows_at_any_rank_count) {
  for (int ranks = 1; ranks <= 64; ++ranks) {
    const std::vector<double> largest(static_cast<std::size_t>(ranks), 65504.0);
    const std::vector<double> smallest(static_cast<std::size_t>(ranks), -65504.0);
    for (const auto& inputs : {largest, smallest}) {
      // fp16 gradients averaged by mean, then cast back to fp16.
      const double m =
          simulated_mean<cohort::float16>(cohort::mean{}.plan(dtype::float16, ranks), inputs);
      BOOST_TEST(std::isfinite(static_cast<float>(cohort::float16(static_cast<float>(m)))),
                 "mean of fp16 at " << ranks << " ranks");
      // float32 gradients compressed to fp16 on the wire.
      const double c = simulated_mean<cohort::float16>(
          cohort::compressed<cohort::float16>{}.plan(dtype::float32, ranks), inputs);
      BOOST_TEST(std::isfinite(c), "compressed<float16> at " << ranks << " ranks");
      BOOST_TEST(std::abs(c - inputs[0]) <= std::abs(inputs[0]) * 0.01);
    }
    const std::vector<double> huge(static_cast<std::size_t>(ranks), 3.3e38);
    const double b = simulated_mean<cohort::bfloat16>(
        cohort::compressed<cohort::bfloat16>{}.plan(dtype::float32, ranks), huge);
    BOOST_TEST(std::isfinite(b), "compressed<bfloat16> at " << ranks << " ranks");
  }
}
