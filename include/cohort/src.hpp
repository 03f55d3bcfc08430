// SPDX-License-Identifier: Apache-2.0
#pragma once

//! The definitions of cohort's non-template engine (and the engine's view of each shipped host
//! strategy, communicator/impl/shipped_strategies.ipp), for a program that compiles them once:
//! define COHORT_SEPARATE_COMPILATION in every translation unit of the program, and include this
//! header in exactly one of them (see config.hpp).

#if !defined(COHORT_SEPARATE_COMPILATION)
#error "cohort/src.hpp is for COHORT_SEPARATE_COMPILATION; without it the headers define it all"
#endif

#include <cohort/algorithm/impl/ring.ipp>
#include <cohort/algorithm/impl/window_allreduce.ipp>
#include <cohort/communicator/engine/impl/agreement.ipp>
#include <cohort/communicator/engine/impl/argument_checks.ipp>
#include <cohort/communicator/engine/impl/bucket_plan.ipp>
#include <cohort/communicator/engine/impl/bucketed_reduction.ipp>
#include <cohort/communicator/engine/impl/checks.ipp>
#include <cohort/communicator/engine/impl/control_channel.ipp>
#include <cohort/communicator/engine/impl/grad_sync.ipp>
#include <cohort/communicator/engine/impl/grad_sync_queue.ipp>
#include <cohort/communicator/engine/impl/grad_sync_step.ipp>
#include <cohort/communicator/engine/impl/gradient_agreement.ipp>
#include <cohort/communicator/engine/impl/liveness.ipp>
#include <cohort/communicator/engine/impl/parameter_broadcast.ipp>
#include <cohort/communicator/engine/impl/readiness.ipp>
#include <cohort/communicator/engine/impl/signature.ipp>
#include <cohort/communicator/engine/impl/slots.ipp>
#include <cohort/communicator/impl/communicator_base.ipp>
#include <cohort/communicator/impl/grad_sync_base.ipp>
#include <cohort/communicator/impl/shipped_strategies.ipp>
#include <cohort/communicator/impl/topology.ipp>
#include <cohort/detail/impl/watchdog.ipp>
#include <cohort/impl/error.ipp>
#include <cohort/kernels/impl/host.ipp>
#include <cohort/reducer/detail/impl/powersgd_state.ipp>
#include <cohort/trace/impl/ticks.ipp>
#include <cohort/training/detail/impl/gradient_copies.ipp>
#include <cohort/training/detail/impl/parameter_gather.ipp>
#include <cohort/training/impl/scatter_dataset.ipp>
#include <cohort/transport/impl/mpi_datatype.ipp>
#include <cohort/transport/impl/mpi_error.ipp>
