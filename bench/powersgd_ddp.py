# SPDX-License-Identifier: Apache-2.0
"""The PyTorch DDP side of bench/powersgd.cpp: ResNet-50's 161 parameter tensors (their exact
shapes; torchvision is not needed) under DistributedDataParallel (gloo), without a hook, with
fp16_compress_hook and with powerSGD_hook at ranks 1, 2 and 4 (start_powerSGD_iter 2,
min_compression_rate 2, error feedback and warm start: PyTorch's defaults but the start; in one bucket: see run_row). The
forward is sum(p * x_p) over the tensors, so backward writes each gradient (x_p, this rank's
random values) and DDP reduces it as it would a real model's.

    mpirun -np 4 python3 powersgd_ddp.py --from-mpi   # (MASTER_ADDR set: across hosts)
    python3 powersgd_ddp.py --ranks 2                 # spawns its own ranks

Per row, rank 0 prints "ddp-psgd ROW MS_PER_STEP SYNC_MS VALUES_SENT VALUES_BEFORE": the median
step (zero_grad, forward, backward with DDP's reduction inside it), the step minus the same step
under no_sync() (backward alone), and PyTorch's own count of the values sent per step
(compression_stats; the uncompressed rows: every value).
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd


def resnet50_shapes():
    shapes = []

    def conv(cin, cout, k):
        shapes.append((cout, cin, k, k))

    def norm(c):
        shapes.append((c,))
        shapes.append((c,))

    conv(3, 64, 7)
    norm(64)
    cin = 64
    for layer, blocks in enumerate([3, 4, 6, 3]):
        width = 64 << layer
        for b in range(blocks):
            conv(cin, width, 1)
            norm(width)
            conv(width, width, 3)
            norm(width)
            conv(width, width * 4, 1)
            norm(width * 4)
            if b == 0:
                conv(cin, width * 4, 1)
                norm(width * 4)
            cin = width * 4
    shapes.append((1000, 2048))
    shapes.append((1000,))
    return shapes


class Gradients(nn.Module):
    def __init__(self):
        super().__init__()
        self.weights = nn.ParameterList([nn.Parameter(torch.zeros(s)) for s in resnet50_shapes()])

    def forward(self, xs):
        return sum((p * x).sum() for p, x in zip(self.weights, xs))


first_bucket = dist._DEFAULT_FIRST_BUCKET_BYTES


def run_row(row, rank, args):
    torch.manual_seed(1)
    # PowerSGD in one bucket: over gloo, torch 1.13's hook with several buckets crashes (gloo's
    # "op.preamble.length <= op.nbytes"): each bucket's Q all-reduce is chained from its P
    # all-reduce's callback, so the ranks can issue the collectives of two buckets in different
    # orders. (cohort issues a step's exchanges in one order on every rank, from one thread.)
    # (DDP's first bucket has a limit of its own, 1 MiB: raised too, as distributed.py says one
    # may.)
    one_bucket = row.startswith("powersgd")
    bucket_mb = args.psgd_bucket_mb if one_bucket else args.bucket_mb
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(bucket_mb * 2**20) if one_bucket else first_bucket
    model = nn.parallel.DistributedDataParallel(Gradients(), bucket_cap_mb=bucket_mb)
    state = None
    if row == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif row.startswith("powersgd"):
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=int(row[8:]),
                                   start_powerSGD_iter=args.start, min_compression_rate=2)
        model.register_comm_hook(state, psgd.powerSGD_hook)
    torch.manual_seed(100 + rank)
    xs = [torch.randn(p.shape) * 1e-3 for p in model.module.weights]

    def step():
        model.zero_grad(set_to_none=False)
        model(xs).backward()

    def alone():
        with model.no_sync():
            step()

    for _ in range(args.warmup):
        step()
    if state is not None:
        state.total_numel_before_compression = 0
        state.total_numel_after_compression = 0
    times, local = [], []
    for _ in range(args.iters):
        for sample, run in ((times, step), (local, alone)):
            dist.barrier()
            start = time.perf_counter()
            run()
            dist.barrier()
            sample.append((time.perf_counter() - start) * 1000)
    total = sum(p.numel() for p in model.module.weights)
    if state is not None:
        sent = state.total_numel_after_compression / args.iters
        before = state.total_numel_before_compression / args.iters
    else:
        sent = before = total
    step_ms, alone_ms = statistics.median(times), statistics.median(local)
    return f"ddp-psgd {row} {step_ms:.2f} {step_ms - alone_ms:.2f} {sent:.0f} {before:.0f}"


def worker(rank, args, port, out):
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    for row in args.rows.split(","):
        line = run_row(row, rank, args)
        if rank == 0:
            out(line)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=25)
    parser.add_argument("--psgd-bucket-mb", type=float, default=256)
    parser.add_argument("--start", type=int, default=2)
    parser.add_argument("--rows", default="mean,fp16,powersgd1,powersgd2,powersgd4")
    parser.add_argument("--port", type=int, default=29581)
    parser.add_argument("--from-mpi", action="store_true")
    args = parser.parse_args()
    if args.from_mpi:
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        args.ranks = int(os.environ["OMPI_COMM_WORLD_SIZE"])
        worker(rank, args, args.port, lambda line: print(line, flush=True))
        return
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, args, args.port, print))
             for r in range(args.ranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"ddp rank exited with {p.exitcode}")


if __name__ == "__main__":
    main()
