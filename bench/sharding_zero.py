# SPDX-License-Identifier: Apache-2.0
"""The PyTorch side of bench/sharding.sh: the same MLP, Adam, data and timing as
bench/sharding.cpp, under DDP (gloo) with torch.optim.Adam ("ddp", unsharded) or with PyTorch's
ZeroRedundancyOptimizer over Adam ("zero", stage 1: the optimizer state sharded).

    python3 sharding_zero.py --mode ddp|zero --ranks 2 [--layers 6 --width 4096 --batch 8
                             --warmup 1 --steps 3 --reps 3]

Starts its ranks itself (torch.multiprocessing, one intra-op thread each) and prints one line
like bench_sharding's: "sharding MODE RANKS MS_PER_STEP STATE GRADS PARAMS RSS HWM", the sizes in
MiB, the largest over the ranks. (ZeroRedundancyOptimizer's local optimizer holds the state of
this rank's parameters: its tensors are what is counted.)
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer


def mlp(args):
    layers = []
    for i in range(args.layers):
        layers.append(nn.Linear(args.width, args.width))
        if i + 1 < args.layers:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return float(line.split()[1]) * 1024
    return 0.0


def tensor_bytes(state):
    return sum(t.numel() * t.element_size() for s in state.values() for t in s.values()
               if torch.is_tensor(t) and t.dim() > 0)


def worker(rank, args, port, results):
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(1)
    model = nn.parallel.DistributedDataParallel(mlp(args))
    if args.mode == "zero":
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                      lr=1e-4)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    torch.manual_seed(100 + rank)
    x = torch.randn(args.batch, args.width)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    per_step = []
    for _ in range(args.reps):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        dist.barrier()
        per_step.append((time.perf_counter() - start) * 1000 / args.steps)
    local = opt.optim if args.mode == "zero" else opt
    params = list(model.parameters())
    mine = torch.tensor([
        float(tensor_bytes(local.state)),
        float(sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)),
        float(sum(p.numel() * p.element_size() for p in params)),
        status("VmRSS:"),
        status("VmHWM:"),
    ], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    if rank == 0:
        mib = [v / 2**20 for v in mine.tolist()]
        results.put(f"sharding {args.mode} {args.ranks} {statistics.median(per_step):.1f} " +
                    " ".join(f"{v:.1f}" for v in mib))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["ddp", "zero"], default="zero")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--port", type=int, default=29573)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, args.port, results))
             for r in range(args.ranks)]
    for p in procs:
        p.start()
    line = results.get(timeout=1800)
    print(line, flush=True)
    # The measurement is over; a rank that lingers in gloo's teardown (seen at 3 ranks on 2
    # cores, spinning in destroy_process_group) is ended rather than waited for.
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.terminate()
            p.join()
        elif p.exitcode != 0:
            raise SystemExit(f"rank exited with {p.exitcode}")


if __name__ == "__main__":
    main()
