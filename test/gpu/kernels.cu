// SPDX-License-Identifier: Apache-2.0
// The device kernels against the host implementation (the oracle, tested in kernels/host.cpp and
// kernels/batch.cpp): same inputs, same results, bit for bit.
#define BOOST_TEST_MODULE gpu.kernels
#include <cohort/cuda.hpp>

#include <cstdint>
#include <vector>

#include "support/device_vector.hpp"
#include "support/gpu_test_main.hpp"

using cohort::bfloat16;
using cohort::dtype;
using cohort::float16;
using cohort::test::device_array;
namespace device = cohort::kernels::device;
namespace host = cohort::kernels::host;

namespace {
// Boost.Test's BOOST_TEST needs variadic macros, which Boost leaves off under nvcc: the classic
// macros it is.
template <class T>
void expect_equal(const std::vector<T>& got, const std::vector<T>& expected) {
  BOOST_CHECK_EQUAL_COLLECTIONS(got.begin(), got.end(), expected.begin(), expected.end());
}

struct fixture {
  cohort::cuda::stream stream;
  device::batch_workspace workspace;
  void sync() { stream.synchronize(); }
};
} // namespace

BOOST_FIXTURE_TEST_CASE(pack_and_unpack_mixed_dtypes_match_the_host, fixture) {
  const std::vector<float> a{1.5f, -2.25f, 3.0f, 65520.0f};
  const std::vector<double> empty;
  std::vector<std::int32_t> c(1000);
  for (std::size_t i = 0; i < c.size(); ++i) {
    c[i] = static_cast<std::int32_t>(i) - 500;
  }
  const std::vector<bfloat16> d{bfloat16(-0.75f)};
  device_array<float> da(a);
  device_array<double> db(empty);
  device_array<std::int32_t> dc(c);
  device_array<bfloat16> dd(d);
  const std::vector<cohort::const_tensor_view> on_device{da.view(), db.view(), dc.view(),
                                                         dd.view()};
  const std::vector<cohort::const_tensor_view> on_host{
      cohort::make_const_view(a), cohort::make_const_view(empty), cohort::make_const_view(c),
      cohort::make_const_view(d)};
  const std::size_t total = host::packed_count(on_host);

  for (const double factor : {1.0, 0.125}) {
    device_array<float16> buffer{std::vector<float16>(total)};
    device::pack(on_device, buffer.view(), factor, stream.get(), workspace);
    std::vector<float16> expected(total);
    host::pack(on_host, cohort::make_view(expected), factor);
    sync();
    const auto got = buffer.read();
    for (std::size_t i = 0; i < total; ++i) {
      BOOST_REQUIRE_MESSAGE(got[i].bits() == expected[i].bits(), "element " << i);
    }
    // And back, into fresh tensors.
    device_array<float> ra{std::vector<float>(a.size())};
    device_array<double> rb(empty);
    device_array<std::int32_t> rc{std::vector<std::int32_t>(c.size())};
    device_array<bfloat16> rd{std::vector<bfloat16>(1)};
    const std::vector<cohort::tensor_view> targets{ra.view(), rb.view(), rc.view(), rd.view()};
    device::unpack(buffer.view(), targets, 1.0 / factor, stream.get(), workspace);
    std::vector<float> ha(a.size());
    std::vector<double> hb;
    std::vector<std::int32_t> hc(c.size());
    std::vector<bfloat16> hd(1);
    host::unpack(cohort::make_const_view(expected),
                 std::vector<cohort::tensor_view>{cohort::make_view(ha), cohort::make_view(hb),
                                                  cohort::make_view(hc), cohort::make_view(hd)},
                 1.0 / factor);
    sync();
    expect_equal(ra.read(), ha);
    expect_equal(rc.read(), hc);
    BOOST_CHECK_EQUAL(rd.read()[0].bits(), hd[0].bits());
  }
}

BOOST_FIXTURE_TEST_CASE(scale_cast_and_reduce_match_the_host, fixture) {
  std::vector<float> values(4099);
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<float>(i) * 0.37f - 700.0f;
  }
  device_array<float> x(values);
  device::scale(x.view(), 0.5, stream.get());
  std::vector<float> expected = values;
  host::scale(cohort::make_view(expected), 0.5);
  sync();
  expect_equal(x.read(), expected);

  device_array<bfloat16> halves{std::vector<bfloat16>(values.size())};
  device::cast(x.view(), halves.view(), stream.get());
  std::vector<bfloat16> expected_halves(values.size());
  host::cast(cohort::make_const_view(expected), cohort::make_view(expected_halves));
  sync();
  const auto got = halves.read();
  for (std::size_t i = 0; i < got.size(); ++i) {
    BOOST_REQUIRE_MESSAGE(got[i].bits() == expected_halves[i].bits(), "element " << i);
  }

  for (const auto op : {cohort::reduce_op::sum, cohort::reduce_op::max}) {
    device_array<double> a{std::vector<double>{1, -2, 3}};
    device_array<double> b{std::vector<double>{4, 5, -6}};
    device::reduce(a.view(), b.view(), op, stream.get());
    sync();
    const auto sum = op == cohort::reduce_op::sum;
    expect_equal(a.read(), sum ? std::vector<double>{5, 3, -3} : std::vector<double>{4, 5, 3});
  }
}

BOOST_FIXTURE_TEST_CASE(host_memory_is_refused_on_the_device, fixture) {
  std::vector<float> on_host(4);
  device_array<float> buffer{std::vector<float>(4)};
  const std::vector<cohort::const_tensor_view> sources{cohort::make_const_view(on_host)};
  BOOST_CHECK_THROW(device::pack(sources, buffer.view(), 1.0, stream.get(), workspace),
                    cohort::invalid_argument);
}
