# SPDX-License-Identifier: Apache-2.0
"""The PyTorch DDP side of bench/torch_gan.sh: the same GAN loop, models, optimizers, data and
timing as bench/torch_gan.cpp, each model under torch.nn.parallel.DistributedDataParallel (gloo).

    python3 torch_gan_ddp.py --ranks 2 --mode unguarded|guarded

unguarded: the loop as DCGAN writes it (DDP reduces the discriminator's gradients at the end of
each of its backward passes, the generator's included); guarded: the discriminator's first
backward and the generator's backward inside the discriminator's no_sync(). Prints one line:
"ddp-MODE RANKS MS_PER_ITERATION", the median repetition on rank 0.
"""
import argparse
import contextlib
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def generator():
    return nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 784), nn.Tanh())


def discriminator():
    return nn.Sequential(nn.Linear(784, 1024), nn.LeakyReLU(), nn.Linear(1024, 1024),
                         nn.LeakyReLU(), nn.Linear(1024, 1), nn.Sigmoid())


def worker(rank, args, port, results):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(1)
    g = nn.parallel.DistributedDataParallel(generator())
    d = nn.parallel.DistributedDataParallel(discriminator())
    g_opt = torch.optim.Adam(g.parameters(), lr=2e-4)
    d_opt = torch.optim.Adam(d.parameters(), lr=2e-4)
    torch.manual_seed(100 + rank)
    real = torch.rand(args.batch, 784) * 2 - 1
    ones = torch.ones(args.batch, 1)
    zeros = torch.zeros(args.batch, 1)
    guarded = args.mode == "guarded"
    quiet = d.no_sync if guarded else contextlib.nullcontext

    def iteration():
        d.zero_grad()
        with quiet():
            F.binary_cross_entropy(d(real), ones).backward()
        fake = g(torch.randn(args.batch, 64))
        F.binary_cross_entropy(d(fake.detach()), zeros).backward()
        d_opt.step()
        g.zero_grad()
        with quiet():
            F.binary_cross_entropy(d(fake), ones).backward()
        g_opt.step()

    for _ in range(args.warmup):
        iteration()
    per_iteration = []
    for _ in range(args.reps):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iterations):
            iteration()
        dist.barrier()
        per_iteration.append((time.perf_counter() - start) * 1000 / args.iterations)
    if rank == 0:
        results.put(statistics.median(per_iteration))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--mode", choices=["guarded", "unguarded"], default="unguarded")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--port", type=int, default=29572)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, args.port, results))
             for r in range(args.ranks)]
    for p in procs:
        p.start()
    ms = results.get(timeout=600)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"ddp rank exited with {p.exitcode}")
    print(f"ddp-{args.mode} {args.ranks} {ms:.3f}", flush=True)


if __name__ == "__main__":
    main()
