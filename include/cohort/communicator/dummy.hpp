// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/basic_communicator.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/reducer/concepts.hpp>

#include <boost/mpi/communicator.hpp>

#include <cstddef>
#include <span>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Does everything `flat` does to gradients (collect, check, pack, scale, unpack) except the
//! reduction itself (the agreement check, if on, still costs its one small all-reduce): what is
//! left of a step's cost without the network. Gradients come out scaled as the reducer says but not
//! summed, so training with it is not data-parallel training. Every other collective (tensors,
//! objects, parameter broadcast) does communicate, so data scattering and metrics still work.
class dummy : public basic_communicator<dummy> {
public:
  static constexpr std::string_view name = "dummy";

  using basic_communicator<dummy>::basic_communicator;

private:
  friend strategy_access;

  void exchange(tensor_view, reduce_op) {}
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
