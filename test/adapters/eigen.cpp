// SPDX-License-Identifier: Apache-2.0
#define BOOST_TEST_MODULE adapters.eigen
#include <cohort/adapters/eigen.hpp>
#include <cohort/cohort.hpp>

#include <Eigen/Core>
#include <cmath>
#include <complex>
#include <cstdint>
#include <random>
#include <unsupported/Eigen/CXX11/Tensor>
#include <vector>

#include "support/expect.hpp"
#include "support/mpi_test_main.hpp"

using cohort::test::message_has;

// What each Eigen type is to cohort, at compile time.
static_assert(cohort::writable_tensor<Eigen::MatrixXf>);
static_assert(cohort::writable_tensor<Eigen::Matrix<double, 3, 4, Eigen::RowMajor>>);
static_assert(cohort::writable_tensor<Eigen::ArrayXXi>);
static_assert(cohort::writable_tensor<Eigen::Map<Eigen::VectorXd>>);
static_assert(cohort::tensor<Eigen::Map<const Eigen::VectorXd>>);
static_assert(!cohort::writable_tensor<Eigen::Map<const Eigen::VectorXd>>);
static_assert(cohort::writable_tensor<Eigen::Ref<Eigen::MatrixXf>>);
static_assert(cohort::writable_tensor<Eigen::Tensor<float, 3>>);
static_assert(cohort::writable_tensor<Eigen::TensorMap<Eigen::Tensor<std::int64_t, 2>>>);
static_assert(cohort::tensor<Eigen::TensorMap<const Eigen::Tensor<float, 2>>>);
static_assert(cohort::writable_tensor<Eigen::Matrix<Eigen::half, Eigen::Dynamic, 1>>);
static_assert(cohort::resizable_tensor<Eigen::VectorXf>);
static_assert(cohort::resizable_tensor<Eigen::Matrix<float, 4, Eigen::Dynamic>>);
static_assert(!cohort::resizable_tensor<Eigen::Matrix4f>);

BOOST_AUTO_TEST_CASE(dtype_size_and_location_follow_the_scalar_and_the_shape) {
  Eigen::Matrix<double, 3, 4, Eigen::RowMajor> m;
  const cohort::tensor_view v = cohort::make_view(m);
  BOOST_TEST(v.data == static_cast<void*>(m.data()));
  BOOST_TEST(v.count == 12u);
  BOOST_TEST((v.type == cohort::dtype::float64));
  BOOST_TEST((v.location == cohort::memory_location::host));

  Eigen::Tensor<std::uint8_t, 3> t(2, 3, 5);
  BOOST_TEST(cohort::make_view(t).count == 30u);
  BOOST_TEST((cohort::make_view(t).type == cohort::dtype::uint8));

  Eigen::Matrix<Eigen::half, Eigen::Dynamic, 1> h(7);
  BOOST_TEST((cohort::make_view(h).type == cohort::dtype::float16));
  Eigen::Array<Eigen::bfloat16, Eigen::Dynamic, Eigen::Dynamic> b(2, 2);
  BOOST_TEST((cohort::make_view(b).type == cohort::dtype::bfloat16));
  BOOST_TEST(cohort::make_view(b).count == 4u);
}

BOOST_AUTO_TEST_CASE(a_map_or_ref_with_gaps_is_refused_and_a_packed_one_taken) {
  Eigen::MatrixXf big = Eigen::MatrixXf::Zero(6, 5);
  // A block of rows leaves gaps between its columns.
  Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>> rows(big.data(), 3, 5,
                                                            Eigen::OuterStride<>(6));
  BOOST_CHECK_EXCEPTION((void)cohort::make_view(rows, "rows"), cohort::invalid_argument,
                        message_has({"rows", "not contiguous"}));
  // Whole columns do not.
  Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>> cols(big.data(), 6, 2,
                                                            Eigen::OuterStride<>(6));
  BOOST_TEST(cohort::make_view(cols).count == 12u);
  // Every other element.
  Eigen::Map<Eigen::VectorXf, 0, Eigen::InnerStride<2>> strided(big.data(), 10);
  BOOST_CHECK_EXCEPTION((void)cohort::make_view(strided, "strided"), cohort::invalid_argument,
                        message_has({"strided", "not contiguous"}));
  // A Ref to a block is the same as a Map of it.
  Eigen::Ref<Eigen::MatrixXf, 0, Eigen::OuterStride<>> block = big.topRows(2);
  BOOST_CHECK_EXCEPTION((void)cohort::make_view(block, "block"), cohort::invalid_argument,
                        message_has({"block", "not contiguous"}));
  Eigen::Ref<Eigen::VectorXf> column = big.col(3);
  BOOST_TEST(cohort::make_view(column).data == static_cast<void*>(big.col(3).data()));
}

BOOST_AUTO_TEST_CASE(collectives_on_eigen_types) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const int n = comm.size();
  Eigen::Tensor<double, 2> t(3, 2);
  t.setConstant(comm.rank() + 1.0);
  comm.allreduce(t, cohort::reduce_op::sum);
  BOOST_TEST(t(2, 1) == n * (n + 1) / 2.0);

  Eigen::ArrayXf a = Eigen::ArrayXf::Constant(5, comm.rank() == 0 ? 4.5f : -1.0f);
  comm.broadcast(a, 0);
  BOOST_TEST((a == 4.5f).all());

  std::vector<std::int64_t> storage(4, comm.rank());
  Eigen::Map<Eigen::Matrix<std::int64_t, 2, 2>> m(storage.data());
  comm.allreduce(m, cohort::reduce_op::max);
  BOOST_TEST(storage[3] == n - 1);
}

namespace {
// A small Eigen trainer, as a user of Eigen would write it: least squares y = W x + b, trained
// by a hand-written SGD with momentum over Maps of the parameters.
struct linear_model {
  Eigen::MatrixXf w, b, gw, gb; // b is one column
  linear_model(const Eigen::MatrixXf& w0)
      : w(w0)
      , b(Eigen::MatrixXf::Zero(w0.rows(), 1))
      , gw(Eigen::MatrixXf::Zero(w0.rows(), w0.cols()))
      , gb(Eigen::MatrixXf::Zero(w0.rows(), 1)) {}
  std::vector<cohort::parameter_ref<Eigen::MatrixXf>> params() {
    return {{"w", &w, &gw}, {"b", &b, &gb}};
  }
};

struct momentum_sgd {
  using vector_map = Eigen::Map<Eigen::VectorXf>;
  std::vector<vector_map> values, grads;
  std::vector<Eigen::VectorXf> velocity;
  float lr = 0.05f;
  float momentum = 0.9f;

  explicit momentum_sgd(linear_model& m) {
    for (Eigen::MatrixXf* p : {&m.w, &m.b}) {
      values.emplace_back(p->data(), p->size());
      velocity.push_back(Eigen::VectorXf::Zero(p->size()));
    }
    for (Eigen::MatrixXf* g : {&m.gw, &m.gb}) {
      grads.emplace_back(g->data(), g->size());
    }
  }
  void step() {
    for (std::size_t p = 0; p < values.size(); ++p) {
      velocity[p] = momentum * velocity[p] + grads[p];
      values[p] -= lr * velocity[p];
    }
  }
};

// The mean squared error's gradient over samples [first, first + count) of (x, y), written in
// place (the optimizer's Maps point at the gradients' storage).
void gradient(linear_model& m, const Eigen::MatrixXf& x, const Eigen::MatrixXf& y,
              Eigen::Index first, Eigen::Index count) {
  const Eigen::MatrixXf xs = x.middleCols(first, count);
  const Eigen::MatrixXf err = (m.w * xs).colwise() + m.b.col(0) - y.middleCols(first, count);
  const float scale = 2.0f / static_cast<float>(count);
  m.gw.noalias() = scale * err * xs.transpose();
  m.gb.noalias() = scale * err.rowwise().sum();
}
} // namespace

// N ranks with b samples each take the same steps as one process with N·b samples.
BOOST_AUTO_TEST_CASE(an_eigen_trainer_on_n_ranks_matches_one_process_with_n_times_the_batch) {
  cohort::flat comm = cohort::make_communicator<cohort::flat>();
  const int n = comm.size();
  constexpr Eigen::Index in = 6, out = 3, per_rank = 8, steps = 20;

  std::mt19937 gen(7); // the same on every rank: every rank draws the whole global batch
  std::normal_distribution<float> normal;
  const auto random = [&](Eigen::Index r, Eigen::Index c) {
    return Eigen::MatrixXf(Eigen::MatrixXf::NullaryExpr(r, c, [&] { return normal(gen); }));
  };
  const Eigen::MatrixXf truth = random(out, in);
  const Eigen::MatrixXf initial = random(out, in);

  linear_model replica(comm.rank() == 0 ? initial : Eigen::MatrixXf::Constant(out, in, 100.0f));
  auto params = replica.params();
  cohort::distributed_optimizer opt{momentum_sgd(replica), comm, params};
  BOOST_TEST((replica.w.array() == initial.array()).all()); // rank 0's, everywhere

  linear_model serial(initial);
  momentum_sgd serial_opt(serial);
  for (Eigen::Index step = 0; step < steps; ++step) {
    const Eigen::MatrixXf x = random(in, per_rank * n);
    const Eigen::MatrixXf y = truth * x;
    gradient(replica, x, y, per_rank * comm.rank(), per_rank);
    opt.step();
    gradient(serial, x, y, 0, per_rank * n);
    serial_opt.step();
  }
  const float scale = serial.w.cwiseAbs().maxCoeff();
  BOOST_TEST((replica.w - serial.w).cwiseAbs().maxCoeff() <= 1e-5f * scale);
  BOOST_TEST((replica.b - serial.b).cwiseAbs().maxCoeff() <= 1e-5f * scale);
  // It learns.
  BOOST_TEST((serial.w - truth).norm() < 0.5f * (initial - truth).norm());
  // The replicas are bit-identical.
  Eigen::MatrixXf root_w = replica.w;
  comm.broadcast(root_w, 0);
  BOOST_TEST((root_w.array() == replica.w.array()).all());
}
