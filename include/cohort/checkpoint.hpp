// SPDX-License-Identifier: Apache-2.0
#pragma once

// Checkpoint and resume (target cohort::checkpoint: needs xxHash's header, see
// checkpoint/checksum.hpp). Not in <cohort/cohort.hpp>: a trainer that saves nothing needs no
// xxHash.

#include <cohort/checkpoint/bucket_orders.hpp>
#include <cohort/checkpoint/checkpointer.hpp>
#include <cohort/checkpoint/powersgd.hpp>
#include <cohort/checkpoint/sharded.hpp>
#include <cohort/checkpoint/state.hpp>
