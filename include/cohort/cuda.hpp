// SPDX-License-Identifier: Apache-2.0
#pragma once

//! Everything cohort offers, GPU parts included (the NCCL strategies are in <cohort/nccl.hpp>):
//! for translation units compiled by nvcc. A host compiler's translation unit includes
//! <cohort/cohort.hpp> instead.

#if !defined(__CUDACC__)
#error                                                                                             \
    "<cohort/cuda.hpp> is for translation units compiled by nvcc; in host code include <cohort/cohort.hpp> (and <cohort/transport/cuda.hpp> for the CUDA runtime helpers)"
#endif

#include <cohort/cohort.hpp>
#include <cohort/communicator/gpu/cuda_aware_flat.hpp>
#include <cohort/communicator/gpu/host_staged.hpp>
#include <cohort/kernels/batch.hpp>
#include <cohort/kernels/cast.cuh>
#include <cohort/kernels/pack.cuh>
#include <cohort/kernels/reduce.cuh>
#include <cohort/kernels/scale.cuh>
#include <cohort/tensor/device_span.hpp>
#include <cohort/trace/nvtx.hpp>
#include <cohort/transport/cuda.hpp>
