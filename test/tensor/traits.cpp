// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE tensor.traits
#include <cohort/error.hpp>
#include <cohort/tensor/concepts.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/std.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <boost/test/unit_test.hpp>

#include <array>
#include <cstdint>
#include <span>
#include <vector>

using cohort::dtype;
using cohort::memory_location;

// ---- a user's own tensor types, adapted by specializing the trait ------------------------------

namespace user {
// A framework-like tensor whose element type is a run-time value, with a stride.
struct dynamic_tensor {
  std::vector<std::byte> storage;
  dtype type = dtype::float32;
  std::size_t count = 0;
  std::size_t stride = 1;
  bool on_gpu = false;
};

// A fixed-size typed matrix.
struct matrix3 {
  double m[9] = {};
};
} // namespace user

template <>
struct cohort::tensor_traits<user::dynamic_tensor> {
  static void* data(user::dynamic_tensor& t) { return t.storage.data(); }
  static const void* data(const user::dynamic_tensor& t) { return t.storage.data(); }
  static std::size_t size(const user::dynamic_tensor& t) { return t.count; }
  static cohort::dtype dtype_of(const user::dynamic_tensor& t) { return t.type; }
  static memory_location location_of(const user::dynamic_tensor& t) {
    return t.on_gpu ? memory_location::device : memory_location::host;
  }
  static bool is_contiguous(const user::dynamic_tensor& t) { return t.stride == 1; }
};

template <>
struct cohort::tensor_traits<user::matrix3> {
  static constexpr memory_location location = memory_location::host;
  static double* data(user::matrix3& t) { return t.m; }
  static const double* data(const user::matrix3& t) { return t.m; }
  static std::size_t size(const user::matrix3&) { return 9; }
};

// ---- what the concepts accept, at compile time --------------------------------------------------

static_assert(cohort::writable_tensor<std::vector<float>>);
static_assert(cohort::writable_tensor<std::array<cohort::float16, 3>>);
static_assert(cohort::writable_tensor<std::span<std::int64_t>>);
static_assert(cohort::writable_tensor<std::uint8_t[4]>);
static_assert(cohort::writable_tensor<cohort::tensor_view>);
static_assert(cohort::writable_tensor<user::dynamic_tensor>);
static_assert(cohort::writable_tensor<user::matrix3>);
static_assert(cohort::tensor<const std::vector<float>>);
static_assert(!cohort::writable_tensor<const std::vector<float>>);
static_assert(cohort::tensor<std::span<const float>>);
static_assert(!cohort::writable_tensor<std::span<const float>>);
static_assert(cohort::tensor<cohort::const_tensor_view>);
static_assert(!cohort::writable_tensor<cohort::const_tensor_view>);
static_assert(!cohort::tensor<std::vector<bool>>);
static_assert(!cohort::tensor<std::vector<char>>);
static_assert(!cohort::tensor<int>);
static_assert(cohort::statically_typed_tensor<std::vector<double>>);
static_assert(!cohort::statically_typed_tensor<user::dynamic_tensor>);
static_assert(cohort::statically_located_tensor<user::matrix3>);
static_assert(!cohort::statically_located_tensor<user::dynamic_tensor>);
static_assert(cohort::resizable_tensor<std::vector<float>>);
static_assert(!cohort::resizable_tensor<std::array<float, 2>>);

using param = cohort::parameter_ref<std::vector<float>>;
static_assert(cohort::parameter<param>);
static_assert(cohort::parameter_set<std::vector<param>>);
static_assert(cohort::parameter_set<std::array<cohort::parameter_ref<user::matrix3>, 2>>);
static_assert(!cohort::parameter_set<std::vector<std::vector<float>>>);

BOOST_AUTO_TEST_CASE(std_containers) {
  std::vector<float> v{1, 2, 3};
  const auto view = cohort::make_view(v);
  BOOST_TEST(view.data == v.data());
  BOOST_TEST(view.count == 3u);
  BOOST_TEST((view.type == dtype::float32));
  BOOST_TEST((view.location == memory_location::host));
  BOOST_TEST(view.size_bytes() == 12u);

  std::array<cohort::bfloat16, 5> a{};
  BOOST_TEST((cohort::make_view(a).type == dtype::bfloat16));
  BOOST_TEST(cohort::make_view(a).count == 5u);

  std::int32_t c[7] = {};
  BOOST_TEST(cohort::make_view(c).count == 7u);
  BOOST_TEST((cohort::make_view(c).type == dtype::int32));

  std::span<std::int32_t> s(c, 4);
  BOOST_TEST(cohort::make_view(s).data == c);
  BOOST_TEST(cohort::make_view(s).count == 4u);

  const std::vector<double> constant(2);
  const auto read_only = cohort::make_const_view(constant);
  BOOST_TEST(read_only.data == constant.data());
  BOOST_TEST((read_only.type == dtype::float64));

  std::vector<std::uint8_t> empty;
  BOOST_TEST(cohort::make_view(empty).count == 0u);

  static_assert(cohort::tensor_dtype(std::vector<std::int64_t>{}) == dtype::int64);
}

BOOST_AUTO_TEST_CASE(user_tensor_with_runtime_dtype) {
  user::dynamic_tensor t;
  t.type = dtype::float16;
  t.count = 6;
  t.storage.resize(12);
  const auto view = cohort::make_view(t, "activations");
  BOOST_TEST(view.data == t.storage.data());
  BOOST_TEST((view.type == dtype::float16));
  BOOST_TEST((view.location == memory_location::host));
  BOOST_TEST(view.size_bytes() == 12u);

  t.on_gpu = true;
  BOOST_TEST((cohort::make_view(t).location == memory_location::device));
}

BOOST_AUTO_TEST_CASE(non_contiguous_is_rejected_with_its_name) {
  user::dynamic_tensor t;
  t.stride = 2;
  BOOST_CHECK_EXCEPTION(cohort::make_view(t, "fc1.weight"), cohort::invalid_argument,
                        [](const cohort::invalid_argument& e) {
                          return std::string(e.what()).find("fc1.weight is not contiguous") !=
                                 std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(user_typed_tensor) {
  user::matrix3 m;
  const auto view = cohort::make_view(m);
  BOOST_TEST(view.count == 9u);
  BOOST_TEST((view.type == dtype::float64));
  static_assert(cohort::tensor_location(user::matrix3{}) == memory_location::host);
}

BOOST_AUTO_TEST_CASE(views_are_tensors) {
  std::vector<float> v(4);
  cohort::tensor_view view = cohort::make_view(v);
  const auto again = cohort::make_view(view);
  BOOST_TEST(again.data == v.data());
  const cohort::const_tensor_view read_only = view;
  BOOST_TEST(cohort::make_const_view(read_only).count == 4u);
}

BOOST_AUTO_TEST_CASE(parameter_ref_traits) {
  std::vector<float> value(3), grad(3);
  param p{"fc.bias", &value, &grad};
  using traits = cohort::parameter_traits<param>;
  BOOST_TEST(traits::name(p) == "fc.bias");
  BOOST_TEST(&traits::value(p) == &value);
  BOOST_TEST(traits::grad(p) == &grad);
}
