// SPDX-License-Identifier: Apache-2.0
#pragma once

// LibTorch as a trainer whose gradients cohort reduces (issue 12): `at::Tensor` as a tensor
// (torch/tensor.hpp), a module's parameters and buffers as parameter sets (torch/module.hpp),
// an optimizer's state broadcast by parameter name (torch/optimizer_state.hpp), the intra-op
// threads a rank should run (torch/threads.hpp), and
// `cohort::torch::distributed_optimizer` (torch/distributed_optimizer.hpp): DDP for C++, with
// backward hooks for overlap; each rank's share of a dataset for LibTorch's data loader
// (torch/distributed_sampler.hpp), evaluation over such a loader (torch/evaluate.hpp), and
// seeds per rank (torch/random.hpp). With <cohort/cohort.hpp> (the strategies, the
// communicator), so that a LibTorch trainer includes this one header. Opt-in: not included by
// <cohort/cohort.hpp>; link the `cohort::torch` CMake target. Written against the API that
// LibTorch 1.13 and 2.x share; nothing of c10d or ProcessGroup (internal, and changed between
// versions).

#include <cohort/adapters/torch/batch_norm.hpp>
#include <cohort/adapters/torch/distributed_optimizer.hpp>
#include <cohort/adapters/torch/distributed_sampler.hpp>
#include <cohort/adapters/torch/evaluate.hpp>
#include <cohort/adapters/torch/functions.hpp>
#include <cohort/adapters/torch/module.hpp>
#include <cohort/adapters/torch/multi_node_sequential.hpp>
#include <cohort/adapters/torch/optimizer_state.hpp>
#include <cohort/adapters/torch/random.hpp>
#include <cohort/adapters/torch/sharded_optimizer.hpp>
#include <cohort/adapters/torch/tensor.hpp>
#include <cohort/adapters/torch/tensor_batches.hpp>
#include <cohort/adapters/torch/threads.hpp>
#include <cohort/cohort.hpp>
