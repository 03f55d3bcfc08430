// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Options shared by every communicator strategy.
struct communicator_options {
  //! Simulates nodes of this many consecutive ranks instead of asking MPI which ranks share
  //! memory (`MPI_COMM_TYPE_SHARED`): 0 asks MPI. When 0, the environment variable
  //! `COHORT_RANKS_PER_NODE` is read instead, so that a test can run "2 nodes x 2 ranks" on one
  //! machine without recompiling.
  int simulated_ranks_per_node = 0;

  //! Before each collective, check that every rank passes the same counts, sizes and dtypes, and
  //! throw `mismatch_error` on every rank if not (cost: one 64-byte rendezvous per call; an
  //! overlapped allreduce_grad has one per bucket too, on cohort's thread, and one at wait). When
  //! off, a mismatch is undefined behaviour of MPI: a hang, an MPI error or wrong numbers.
  bool check_agreement = true;

  //! The size of a gradient bucket: the host strategies pack small gradients into buckets of at
  //! most this many bytes (of the reducer's wire dtype) and reduce each bucket with one
  //! collective, so that many small tensors cost a few latencies instead of one each. 4 MiB keeps
  //! the packing in cache and the messages where MPI's all-reduce is fast on the figures of
  //! bench/grad_sync (PyTorch DDP's default is 25 MiB, for networks of higher latency). 0 puts
  //! every gradient in a bucket of its own (as `naive` does). The GPU strategies use the same
  //! buckets, packed on the device.
  std::size_t bucket_bytes = std::size_t{4} << 20;

  //! The limit of the first bucket of each dtype (the gradients that become ready first): smaller,
  //! so that with overlap the first reduction starts early in backward, as DDP's 1 MiB first
  //! bucket does. Capped at `bucket_bytes`.
  std::size_t first_bucket_bytes = std::size_t{1} << 20;

  //! A gradient of at least this many bytes, already of the wire dtype, is reduced in place in a
  //! bucket of its own, not copied: fusing saves one all-reduce latency per tensor but costs two
  //! passes over the tensor's memory, and past this size the copies cost more than the latency
  //! saved. 64 KiB is the break-even measured on shared memory here (bench/allreduce,
  //! docs/performance.md); on a network with a higher latency, a larger value fuses more. The GPU
  //! strategies pack every gradient that fits a bucket: a device copy costs less than a
  //! collective's latency.
  std::size_t fusion_threshold_bytes = std::size_t{64} << 10;

  //! The largest piece one MPI all-reduce is given: a larger bucket or tensor is reduced in
  //! segments of this size, one after the other, so that each stays in cache. Past a few MiB Open
  //! MPI's all-reduce works through a temporary buffer as large as the message: on the figures of
  //! bench/allreduce one 32 MiB call costs 4x what 32 calls of 1 MiB do, and 1 MiB costs what one
  //! call does from 1 to 4 MiB. 0 hands MPI every message whole. Also the pieces of the
  //! two-level strategies' reduce, broadcast and all-reduce over MPI links, and of the tensor
  //! `iallreduce`. At least `min_segment_bytes` (a smaller one is refused when the communicator is
  //! made: a 100 MB tensor in 16-byte pieces would be millions of calls).
  std::size_t segment_bytes = std::size_t{1} << 20;
  static constexpr std::size_t min_segment_bytes = 4096;

  //! How long any MPI operation cohort runs may wait for the other ranks before the job is ended
  //! (one line on stderr naming the operation, its number, the bytes, the time waited and the
  //! ranks, with their hosts, that had not arrived; then the job ends): the agreement,
  //! reductions, broadcasts, object collectives, barrier, point-to-point calls, and the MPI steps
  //! of NCCL's set-up. 0 waits for ever. Unset, the environment variable `COHORT_TIMEOUT`
  //! (seconds: `30`, `2.5`) is read instead, so that an operator sets it per job without
  //! recompiling; neither set, `default_timeout` (10 minutes, as PyTorch's NCCL watchdog). Size it
  //! above the longest time one rank may legitimately run ahead of another (an evaluation on
  //! rank 0 alone, a checkpoint), since the others wait for it in their next collective.
  //! docs/failure.md says what happens when it fires.
  std::optional<std::chrono::milliseconds> timeout{};
  static constexpr std::chrono::milliseconds default_timeout = std::chrono::minutes(10);

  //! How long a wait lasts before cohort says so without ending the job, as Horovod's stall
  //! check does: one line on stderr of each waiting rank naming the operation and the ranks
  //! (with their hosts) that have not arrived, or, inside a transfer that every rank began, that
  //! the transfer itself is stalled; repeated after 2, 4, 8... times as long, until the wait ends
  //! or the timeout ends the job. 0 never warns. Unset, the environment variable
  //! `COHORT_STALL_WARNING` (seconds) is read instead; neither set, `default_stall_warning`
  //! (60 s).
  std::optional<std::chrono::milliseconds> stall_warning{};
  static constexpr std::chrono::milliseconds default_stall_warning = std::chrono::seconds(60);

  //! A directory where each rank writes a trace of its gradient reductions,
  //! `cohort-trace-rank<r>.json` (Chrome trace format: chrome://tracing, ui.perfetto.dev;
  //! tools/merge_traces.py joins the ranks' files): per step and per bucket the wait for the
  //! gradients, pack, reduce, unpack and the agreements, with bytes and strategy. Empty reads the
  //! environment variable COHORT_TRACE instead; neither set, nothing is recorded (one branch per
  //! span). Each rank's own: not compared across ranks.
  std::string trace_directory{};
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
