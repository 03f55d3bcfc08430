// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>

#include <stdexcept>
#include <string>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Base of every exception cohort throws. The message always says which operation failed and,
//! where a communicator is involved, on which rank.
class error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

//! A tensor, a parameter or an argument that cannot be used as given (wrong size, wrong dtype,
//! memory in the wrong place, a root outside the communicator...).
class invalid_argument : public error {
public:
  using error::error;
};

//! The ranks disagree about a collective: different counts, sizes or dtypes. Thrown on every rank
//! taking part, so that none of them is left waiting.
class mismatch_error : public error {
public:
  using error::error;
};

//! A collective that did not finish within its time limit. The communicator it ran on has been
//! aborted: the ranks still waiting on it are released with an error too, instead of hanging.
class timeout_error : public error {
public:
  using error::error;
};

//! An error reported by an engine (MPI, NCCL, CUDA), with the engine's own message.
class engine_error : public error {
public:
  engine_error(std::string engine, std::string operation, int rank, int code,
               const std::string& message)
      : error(describe(engine, operation, rank, code, message))
      , engine_(std::move(engine))
      , operation_(std::move(operation))
      , rank_(rank)
      , code_(code) {}

  const std::string& engine() const noexcept { return engine_; }
  const std::string& operation() const noexcept { return operation_; }
  int rank() const noexcept { return rank_; }
  int code() const noexcept { return code_; }

private:
  static std::string describe(const std::string& engine, const std::string& operation, int rank,
                              int code, const std::string& message);

  std::string engine_;
  std::string operation_;
  int rank_;
  int code_;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/impl/error.ipp>
#endif
