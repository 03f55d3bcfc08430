// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE kernels.host
#include <cohort/kernels/functors.hpp>
#include <cohort/kernels/host.hpp>
#include <cohort/tensor/std.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <limits>
#include <vector>

using cohort::bfloat16;
using cohort::dtype;
using cohort::float16;
namespace host = cohort::kernels::host;

BOOST_AUTO_TEST_CASE(functors_convert_and_scale) {
  using cohort::kernels::convert;
  using cohort::kernels::scale_cast;
  static_assert(convert<float>(float16(0.5f)) == 0.5f);
  static_assert(convert<std::int32_t>(2.75) == 2);
  BOOST_TEST(convert<float16>(1.0f + 1.0f / 2048).bits() == 0x3c00); // ties to even
  BOOST_TEST(convert<bfloat16>(3.0) == bfloat16(3.0f));
  // A factor of one is the identity, bit for bit, even for values a float cannot hold.
  const scale_cast<std::int64_t, std::int64_t> identity{1.0};
  BOOST_TEST(identity((std::int64_t{1} << 60) + 1) == (std::int64_t{1} << 60) + 1);
  const scale_cast<float, float16> quarter{0.25f};
  BOOST_TEST(static_cast<float>(quarter(40000.0f)) == 10000.0f);
  const cohort::kernels::combine<float16> add{cohort::reduce_op::sum};
  BOOST_TEST(static_cast<float>(add(float16(1.5f), float16(2.25f))) == 3.75f);
  const cohort::kernels::combine<std::uint8_t> biggest{cohort::reduce_op::max};
  BOOST_TEST(biggest(3, 200) == 200);
}

BOOST_AUTO_TEST_CASE(pack_and_unpack_mixed_sizes_and_dtypes_round_trip) {
  std::vector<float> a{1.5f, -2.0f, 3.25f};
  std::vector<double> empty;
  std::vector<float16> c{float16(0.5f)};
  std::vector<std::int32_t> d(17);
  for (std::size_t i = 0; i < d.size(); ++i) {
    d[i] = static_cast<std::int32_t>(i * 3) - 20;
  }
  const std::vector<cohort::const_tensor_view> sources{
      cohort::make_const_view(a), cohort::make_const_view(empty), cohort::make_const_view(c),
      cohort::make_const_view(d)};
  BOOST_TEST(host::packed_count(sources) == 21u);

  std::vector<double> buffer(21, -1.0);
  host::pack(sources, cohort::make_view(buffer));
  BOOST_TEST(buffer[0] == 1.5);
  BOOST_TEST(buffer[2] == 3.25);
  BOOST_TEST(buffer[3] == 0.5);
  BOOST_TEST(buffer[4] == -20.0);
  BOOST_TEST(buffer[20] == 28.0);

  std::vector<float> a2(3);
  std::vector<double> empty2;
  std::vector<float16> c2(1);
  std::vector<std::int32_t> d2(17);
  const std::vector<cohort::tensor_view> targets{cohort::make_view(a2), cohort::make_view(empty2),
                                                 cohort::make_view(c2), cohort::make_view(d2)};
  host::unpack(cohort::make_const_view(buffer), targets);
  BOOST_TEST(a2 == a);
  BOOST_TEST(static_cast<float>(c2[0]) == 0.5f);
  BOOST_TEST(d2 == d);
}

BOOST_AUTO_TEST_CASE(pack_scales_and_casts_to_the_wire_dtype) {
  std::vector<float> grads{4.0f, 40000.0f, -8.0f};
  std::vector<float16> wire(3);
  const cohort::const_tensor_view source = cohort::make_const_view(grads);
  host::pack({&source, 1}, cohort::make_view(wire), 0.25);
  BOOST_TEST(static_cast<float>(wire[0]) == 1.0f);
  BOOST_TEST(static_cast<float>(wire[1]) == 10000.0f);
  BOOST_TEST(static_cast<float>(wire[2]) == -2.0f);
  std::vector<float> back(3);
  const cohort::tensor_view target = cohort::make_view(back);
  host::unpack(cohort::make_const_view(wire), {&target, 1}, 4.0);
  BOOST_TEST(back == grads);
}

BOOST_AUTO_TEST_CASE(pack_into_a_small_buffer_names_both_sizes) {
  std::vector<float> a(5);
  std::vector<float> small(4);
  const cohort::const_tensor_view source = cohort::make_const_view(a);
  BOOST_CHECK_EXCEPTION(host::pack({&source, 1}, cohort::make_view(small)),
                        cohort::invalid_argument, [](const cohort::invalid_argument& e) {
                          return std::string(e.what()).find("5 elements but has 4") !=
                                 std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(device_memory_is_refused_on_the_host) {
  float x = 0;
  const cohort::tensor_view device{&x, 1, dtype::float32, cohort::memory_location::device};
  BOOST_CHECK_THROW(host::scale(device, 2.0), cohort::invalid_argument);
}

BOOST_AUTO_TEST_CASE(scale_cast_and_reduce) {
  std::vector<double> v{1, 2, 3};
  host::scale(cohort::make_view(v), 0.5);
  BOOST_TEST(v == (std::vector<double>{0.5, 1, 1.5}), boost::test_tools::per_element());

  std::vector<float> f{1.0f, 1.0f + 1.0f / 2048, 65520.0f};
  std::vector<float16> h(3);
  host::cast(cohort::make_const_view(f), cohort::make_view(h));
  BOOST_TEST(h[0].bits() == 0x3c00);
  BOOST_TEST(h[1].bits() == 0x3c00);
  BOOST_TEST(h[2].bits() == 0x7c00);
  std::vector<float16> wrong(2);
  BOOST_CHECK_THROW(host::cast(cohort::make_const_view(f), cohort::make_view(wrong)),
                    cohort::invalid_argument);

  for (const auto op : {cohort::reduce_op::sum, cohort::reduce_op::prod, cohort::reduce_op::min,
                        cohort::reduce_op::max}) {
    std::vector<std::int64_t> x{2, -3, 5};
    const std::vector<std::int64_t> y{4, 7, -1};
    host::reduce(cohort::make_view(x), cohort::make_const_view(y), op);
    const std::vector<std::int64_t> expected =
        op == cohort::reduce_op::sum    ? std::vector<std::int64_t>{6, 4, 4}
        : op == cohort::reduce_op::prod ? std::vector<std::int64_t>{8, -21, -5}
        : op == cohort::reduce_op::min  ? std::vector<std::int64_t>{2, -3, -1}
                                        : std::vector<std::int64_t>{4, 7, 5};
    BOOST_TEST(x == expected, boost::test_tools::per_element());
  }
  // Issue 30: integers are combined exactly, as MPI does (through a double, an int64 past 2^53
  // rounded: a fingerprint's {h, ~h} maxima, carried in an agreement, never matched).
  {
    const std::int64_t big = (std::int64_t{1} << 61) + 1;
    std::vector<std::int64_t> x{big, -big, std::numeric_limits<std::int64_t>::max()};
    const std::vector<std::int64_t> y{big - 2, 3, 1};
    host::reduce(cohort::make_view(x), cohort::make_const_view(y), cohort::reduce_op::max);
    BOOST_TEST(x == (std::vector<std::int64_t>{big, 3, std::numeric_limits<std::int64_t>::max()}),
               boost::test_tools::per_element());
    std::vector<std::int64_t> s{big};
    host::reduce(cohort::make_view(s), cohort::make_const_view(std::vector<std::int64_t>{big}),
                 cohort::reduce_op::sum);
    BOOST_TEST(s[0] == 2 * big);
    std::vector<std::uint8_t> u{250};
    host::reduce(cohort::make_view(u), cohort::make_const_view(std::vector<std::uint8_t>{10}),
                 cohort::reduce_op::sum);
    BOOST_TEST(u[0] == 4); // wraps, as MPI's
  }
  std::vector<bfloat16> b{bfloat16(1.0f)};
  const std::vector<bfloat16> c{bfloat16(2.0f)};
  host::reduce(cohort::make_view(b), cohort::make_const_view(c), cohort::reduce_op::sum);
  BOOST_TEST(static_cast<float>(b[0]) == 3.0f);
  std::vector<float> other(1);
  BOOST_CHECK_THROW(
      host::reduce(cohort::make_view(b), cohort::make_const_view(other), cohort::reduce_op::sum),
      cohort::invalid_argument);
}
