// SPDX-License-Identifier: Apache-2.0
#pragma once

//! Everything cohort offers, with the NCCL strategies `pure_nccl` and `single_node`: for
//! translation units compiled by nvcc that link NCCL (CMake target cohort::nccl).

#if !defined(__CUDACC__)
#error                                                                                             \
    "<cohort/nccl.hpp> is for translation units compiled by nvcc; in host code include <cohort/cohort.hpp> (and <cohort/transport/nccl.hpp> for the NCCL bindings)"
#endif

#include <cohort/communicator/gpu/any_communicator.hpp>
#include <cohort/communicator/gpu/pure_nccl.hpp>
#include <cohort/communicator/gpu/single_node.hpp>
#include <cohort/communicator/gpu/two_level.hpp>
#include <cohort/cuda.hpp>
#include <cohort/transport/nccl.hpp>
