// SPDX-License-Identifier: Apache-2.0
// How gradients are grouped into buckets: the walk order, the limits, the first bucket, in-place
// tensors, dtypes, and the order buckets are reduced in.
#define BOOST_TEST_MODULE communicator.bucket_plan
#include <cohort/communicator/engine/bucket_plan.hpp>
#include <cohort/reducer/compressed.hpp>
#include <cohort/reducer/mean.hpp>

#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace {
using cohort::dtype;
using cohort::grad_slot;
using cohort::engine::bucket_limits;
using cohort::engine::bucket_plan;

// Slots of the given element counts and dtypes; the data pointers are never read.
std::vector<grad_slot> layout(const std::vector<std::pair<std::size_t, dtype>>& shapes) {
  std::vector<grad_slot> slots;
  for (const auto& [count, type] : shapes) {
    grad_slot slot;
    slot.grad = {nullptr, count, type, cohort::memory_location::host};
    slot.value_count = count;
    slots.push_back(slot);
  }
  return slots;
}

// Each bucket's members, in reduction order: "5|4,3|2,1|0".
std::string groups(const bucket_plan& plan) {
  std::string result;
  for (const auto& b : plan.buckets()) {
    if (!result.empty()) {
      result += '|';
    }
    bool first = true;
    for (const std::size_t s : plan.members(b)) {
      if (!first) {
        result += ',';
      }
      first = false;
      result += std::to_string(s);
    }
  }
  return result;
}

std::vector<std::size_t> reversed(std::size_t n) {
  std::vector<std::size_t> order;
  bucket_plan::reverse_order(n, order);
  return order;
}
} // namespace

BOOST_AUTO_TEST_CASE(reverse_registration_order_and_the_limits) {
  // Six float32 tensors of 4 bytes each; buckets of 8 bytes, the first of 4.
  const auto slots = layout({{1, dtype::float32},
                             {1, dtype::float32},
                             {1, dtype::float32},
                             {1, dtype::float32},
                             {1, dtype::float32},
                             {1, dtype::float32}});
  bucket_plan plan;
  plan.build(slots, reversed(6), cohort::reduction_table(cohort::mean{}, 2),
             bucket_limits{8, 4, 1000});
  const std::string expected = "5|4,3|2,1|0";
  BOOST_TEST(groups(plan) == expected);
  BOOST_TEST(plan.bucket_of(5) == 0u);
  BOOST_TEST(plan.bucket_of(0) == 3u);
  for (const auto& b : plan.buckets()) {
    BOOST_TEST(!b.in_place);
    BOOST_TEST(b.plan.post_scale == 0.5);
  }
}

BOOST_AUTO_TEST_CASE(large_tensors_alone_and_in_place_small_ones_fused) {
  // 0: 100 floats (400 bytes, over the threshold: in place); 1, 2: small; 3: empty (no bucket).
  const auto slots = layout(
      {{100, dtype::float32}, {2, dtype::float32}, {2, dtype::float32}, {0, dtype::float32}});
  bucket_plan plan;
  plan.build(slots, reversed(4), cohort::reduction_table(cohort::mean{}, 4),
             bucket_limits{1024, 1024, 256});
  const std::string expected = "2,1|0";
  BOOST_TEST(groups(plan) == expected);
  BOOST_TEST(!plan.buckets()[0].in_place);
  BOOST_TEST(plan.buckets()[0].count == 4u);
  BOOST_TEST(plan.buckets()[1].in_place);
  BOOST_TEST(plan.bucket_of(3) == bucket_plan::no_bucket);
}

BOOST_AUTO_TEST_CASE(a_cast_on_the_wire_is_never_in_place_and_limits_count_wire_bytes) {
  // float32 gradients sent as float16: 100 floats are 200 wire bytes, so two fit in 400.
  const auto slots = layout({{100, dtype::float32}, {100, dtype::float32}, {100, dtype::float32}});
  bucket_plan plan;
  plan.build(slots, reversed(3), cohort::reduction_table(cohort::compressed<cohort::float16>{}, 2),
             bucket_limits{400, 400, 0});
  const std::string expected = "2,1|0";
  BOOST_TEST(groups(plan) == expected);
  BOOST_TEST(to_string(plan.buckets()[0].plan.wire) == "float16");
}

BOOST_AUTO_TEST_CASE(dtypes_never_share_and_buckets_go_in_order_of_completion) {
  // Walk: 3 (f64), 2 (f32), 1 (f64), 0 (f32). The f64 bucket {3, 1} completes at 1, before the
  // f32 bucket {2, 0} completes at 0.
  const auto slots =
      layout({{1, dtype::float32}, {1, dtype::float64}, {1, dtype::float32}, {1, dtype::float64}});
  bucket_plan plan;
  plan.build(slots, reversed(4), cohort::reduction_table(cohort::mean{}, 2),
             bucket_limits{64, 64, 64});
  const std::string expected = "3,1|2,0";
  BOOST_TEST(groups(plan) == expected);
  BOOST_TEST(to_string(plan.buckets()[0].type) == "float64");
}

BOOST_AUTO_TEST_CASE(a_learned_order_regroups_the_buckets) {
  const auto slots =
      layout({{1, dtype::float32}, {1, dtype::float32}, {1, dtype::float32}, {1, dtype::float32}});
  bucket_plan plan;
  const std::vector<std::size_t> seen = {1, 3, 0, 2};
  plan.build(slots, seen, cohort::reduction_table(cohort::mean{}, 2), bucket_limits{8, 8, 64});
  const std::string expected = "1,3|0,2";
  BOOST_TEST(groups(plan) == expected);
  BOOST_TEST(std::vector<std::size_t>(plan.order().begin(), plan.order().end()) == seen,
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(zero_limits_put_every_tensor_alone) {
  const auto slots = layout({{3, dtype::float32}, {5, dtype::int32}, {2, dtype::float32}});
  bucket_plan plan;
  plan.build(slots, reversed(3), cohort::reduction_table(cohort::mean{}, 3),
             bucket_limits{0, 0, 0});
  const std::string expected = "2|1|0";
  BOOST_TEST(groups(plan) == expected);
  BOOST_TEST(plan.buckets()[0].in_place);
  BOOST_TEST(!plan.buckets()[1].in_place); // an int32 mean travels as int64
}
