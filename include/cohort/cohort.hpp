// SPDX-License-Identifier: Apache-2.0
#pragma once

//! Everything cohort offers for host code: include this in the trainer. GPU parts are in
//! <cohort/cuda.hpp>, for translation units compiled by nvcc.

#include <cohort/communicator/any_communicator.hpp>
#include <cohort/communicator/basic_communicator.hpp>
#include <cohort/communicator/concepts.hpp>
#include <cohort/communicator/dummy.hpp>
#include <cohort/communicator/flat.hpp>
#include <cohort/communicator/grad_sync_base.hpp>
#include <cohort/communicator/grad_sync_request.hpp>
#include <cohort/communicator/hierarchical.hpp>
#include <cohort/communicator/links.hpp>
#include <cohort/communicator/naive.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/communicator/shared_memory.hpp>
#include <cohort/communicator/topology.hpp>
#include <cohort/communicator/two_dimensional.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/kernels/functors.hpp>
#include <cohort/kernels/host.hpp>
#include <cohort/memory/shared_arena.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/compressed.hpp>
#include <cohort/reducer/hook.hpp>
#include <cohort/reducer/mean.hpp>
#include <cohort/reducer/powersgd.hpp>
#include <cohort/reducer/powersgd_options.hpp>
#include <cohort/reducer/sum.hpp>
#include <cohort/tensor/bfloat16.hpp>
#include <cohort/tensor/concepts.hpp>
#include <cohort/tensor/device_span.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/float16.hpp>
#include <cohort/tensor/location.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/std.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/tensor/traits.hpp>
#include <cohort/training/distributed_optimizer.hpp>
#include <cohort/training/distributed_optimizer_options.hpp>
#include <cohort/training/early_stopping.hpp>
#include <cohort/training/evaluator.hpp>
#include <cohort/training/multi_node_iterator.hpp>
#include <cohort/training/scatter_dataset.hpp>
#include <cohort/training/shard_plan.hpp>
#include <cohort/training/sharded_optimizer.hpp>
#include <cohort/transport/mpi.hpp>
#include <cohort/version.hpp>
