// SPDX-License-Identifier: Apache-2.0
// The per-element logic of the batched pack and unpack, run on the host: the same code the
// device kernels run (kernels/pack.cuh calls nothing else).
#define BOOST_TEST_MODULE kernels.batch
#include <cohort/kernels/batch.hpp>
#include <cohort/kernels/host.hpp>
#include <cohort/tensor/std.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <vector>

using cohort::bfloat16;
using cohort::dtype;
using cohort::float16;
using cohort::kernels::batch_entry;
using cohort::kernels::batch_factor;

namespace {
// Builds the table of `views` as pack.cuh's workspace does: one after the other from 0.
template <class View>
std::vector<batch_entry> table(const std::vector<View>& views) {
  std::vector<batch_entry> entries;
  std::uint64_t begin = 0;
  for (const auto& v : views) {
    entries.push_back({const_cast<void*>(static_cast<const void*>(v.data)), begin, v.type});
    begin += v.count;
  }
  return entries;
}
} // namespace

BOOST_AUTO_TEST_CASE(locate_finds_the_tensor_of_every_element_and_skips_empty_ones) {
  // Tensors of 3, 0, 1, 0, 0 and 5 elements.
  const std::vector<batch_entry> entries{
      {nullptr, 0, dtype::float32}, {nullptr, 3, dtype::float32}, {nullptr, 3, dtype::float32},
      {nullptr, 4, dtype::float32}, {nullptr, 4, dtype::float32}, {nullptr, 4, dtype::float32}};
  const std::size_t expected[] = {0, 0, 0, 2, 5, 5, 5, 5, 5};
  for (std::uint64_t i = 0; i < 9; ++i) {
    BOOST_TEST(cohort::kernels::locate(entries.data(), entries.size(), i) == expected[i]);
  }
  BOOST_TEST(cohort::kernels::locate(entries.data(), 1, 0) == 0u);
}

BOOST_AUTO_TEST_CASE(offsets_beyond_2_to_the_31_are_exact) {
  // Three tensors whose buffer positions lie beyond int32 (ChainerMN's limit) and uint32: the
  // table holds only offsets, so no memory of that size is needed to check the arithmetic.
  std::vector<float> a{1.0f, 2.0f};
  std::vector<double> b{3.0, 4.0, 5.0};
  std::vector<float16> c{float16(6.0f)};
  const std::uint64_t two_31 = std::uint64_t{1} << 31;
  const std::uint64_t beyond_32 = (std::uint64_t{1} << 32) + 7;
  const std::vector<batch_entry> entries{{a.data(), two_31 - 2, dtype::float32},
                                         {b.data(), two_31, dtype::float64},
                                         {c.data(), beyond_32, dtype::float16}};
  const batch_factor one{};
  BOOST_TEST(cohort::kernels::locate(entries.data(), 3, two_31 - 1) == 0u);
  BOOST_TEST(cohort::kernels::locate(entries.data(), 3, two_31 + 2) == 1u);
  BOOST_TEST(cohort::kernels::locate(entries.data(), 3, beyond_32) == 2u);
  BOOST_TEST(cohort::kernels::packed_value<float>(entries[0], two_31 - 1, one) == 2.0f);
  BOOST_TEST(cohort::kernels::packed_value<float>(entries[1], two_31 + 2, one) == 5.0f);
  BOOST_TEST(cohort::kernels::packed_value<float>(entries[2], beyond_32, one) == 6.0f);
  cohort::kernels::unpack_value<float>(entries[1], two_31 + 1, 40.0f, {0.5f, 0.5});
  BOOST_TEST(b[1] == 20.0);
}

BOOST_AUTO_TEST_CASE(batched_pack_matches_the_host_pack_for_mixed_sizes_and_dtypes) {
  std::vector<float> f32{1.5f, -2.25f, 3.0f};
  std::vector<double> empty;
  std::vector<float16> f16(7);
  std::vector<bfloat16> b16(1, bfloat16(-0.5f));
  std::vector<std::int32_t> i32(33);
  std::vector<std::uint8_t> u8{250};
  for (std::size_t i = 0; i < f16.size(); ++i) {
    f16[i] = float16(static_cast<float>(i) / 4);
  }
  for (std::size_t i = 0; i < i32.size(); ++i) {
    i32[i] = static_cast<std::int32_t>(i) - 16;
  }
  const std::vector<cohort::const_tensor_view> sources{
      cohort::make_const_view(f32), cohort::make_const_view(empty), cohort::make_const_view(f16),
      cohort::make_const_view(b16), cohort::make_const_view(i32),   cohort::make_const_view(u8)};
  const auto entries = table(sources);
  const std::size_t total = cohort::kernels::host::packed_count(sources);

  for (const double factor : {1.0, 0.25}) {
    // Every wire dtype the reducers use: the kernel is instantiated for each.
    std::vector<float> by_kernel(total), by_host(total);
    for (std::uint64_t i = 0; i < total; ++i) {
      cohort::kernels::pack_element(entries.data(), entries.size(), i, by_kernel.data(),
                                    {static_cast<float>(factor), factor});
    }
    cohort::kernels::host::pack(sources, cohort::make_view(by_host), factor);
    BOOST_TEST(by_kernel == by_host, boost::test_tools::per_element());

    std::vector<float16> half_kernel(total), half_host(total);
    for (std::uint64_t i = 0; i < total; ++i) {
      cohort::kernels::pack_element(entries.data(), entries.size(), i, half_kernel.data(),
                                    {static_cast<float>(factor), factor});
    }
    cohort::kernels::host::pack(sources, cohort::make_view(half_host), factor);
    for (std::size_t i = 0; i < total; ++i) {
      BOOST_TEST_REQUIRE(half_kernel[i].bits() == half_host[i].bits(), "element " << i);
    }
  }
}

BOOST_AUTO_TEST_CASE(batched_unpack_round_trips) {
  std::vector<double> f64{0.1, 0.2, 0.3, 0.4};
  std::vector<std::int64_t> i64{-3, 9};
  std::vector<bfloat16> b16{bfloat16(2.0f)};
  const std::vector<cohort::tensor_view> targets{cohort::make_view(f64), cohort::make_view(i64),
                                                 cohort::make_view(b16)};
  const auto entries = table(targets);
  std::vector<double> buffer(7);
  for (std::uint64_t i = 0; i < buffer.size(); ++i) {
    cohort::kernels::pack_element(entries.data(), entries.size(), i, buffer.data(), {});
  }
  BOOST_TEST(buffer == (std::vector<double>{0.1, 0.2, 0.3, 0.4, -3, 9, 2}),
             boost::test_tools::per_element());
  for (auto& x : buffer) {
    x *= 3;
  }
  for (std::uint64_t i = 0; i < buffer.size(); ++i) {
    cohort::kernels::unpack_element(entries.data(), entries.size(), i, buffer.data(),
                                    {1.0f / 3, 1.0 / 3});
  }
  BOOST_TEST(f64[2] == 0.3, boost::test_tools::tolerance(1e-15));
  BOOST_TEST(i64 == (std::vector<std::int64_t>{-3, 9}), boost::test_tools::per_element());
  BOOST_TEST(static_cast<float>(b16[0]) == 2.0f);
}
