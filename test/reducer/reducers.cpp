// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE reducer.reducers
#include <cohort/reducer/compressed.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/reducer/sum.hpp>

#include <boost/test/unit_test.hpp>

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

BOOST_AUTO_TEST_CASE(mean_divides_before_the_sum_in_16_bit_types) {
  // A sum of 4 fp16 gradients of 40000 overflows 65504; their quarters do not.
  for (const dtype type : {dtype::float16, dtype::bfloat16}) {
    const auto plan = cohort::mean{}.plan(type, 4);
    BOOST_TEST((plan.wire == type));
    BOOST_TEST(plan.pre_scale == 0.25);
    BOOST_TEST(plan.post_scale == 1.0);
  }
}

BOOST_AUTO_TEST_CASE(sum_does_not_scale) {
  const auto plan = cohort::sum{}.plan(dtype::float16, 3);
  BOOST_TEST((plan == cohort::grad_reduction{dtype::float16, 1.0, 1.0, cohort::reduce_op::sum}));
  constexpr auto at_compile_time = cohort::mean{}.plan(dtype::float32, 2);
  static_assert(at_compile_time.post_scale == 0.5);
}

BOOST_AUTO_TEST_CASE(compressed_sends_16_bits_and_divides_first) {
  const cohort::compressed<cohort::float16> half;
  const cohort::compressed<cohort::bfloat16> brain;
  for (const dtype type : {dtype::float32, dtype::float64}) {
    const auto plan = half.plan(type, 8);
    BOOST_TEST((plan.wire == dtype::float16));
    BOOST_TEST(plan.pre_scale == 0.125);
    BOOST_TEST(plan.post_scale == 1.0);
    BOOST_TEST((brain.plan(type, 8).wire == dtype::bfloat16));
  }
  // 16-bit gradients keep their own type; integers are not compressed.
  BOOST_TEST((half.plan(dtype::bfloat16, 2).wire == dtype::bfloat16));
  BOOST_TEST((half.plan(dtype::int32, 2) == cohort::mean{}.plan(dtype::int32, 2)));
}
