# SPDX-License-Identifier: Apache-2.0
"""The PyTorch DDP side of bench/torch_mlp.sh: the same MLP, optimizer, data and timing as
bench/torch_mlp.cpp, under torch.nn.parallel.DistributedDataParallel with the gloo backend.

    python3 torch_mlp_ddp.py --ranks 2 [--steps 20 --reps 5 --warmup 10 --batch 128]

Starts its ranks itself (torch.multiprocessing, one intra-op thread each) and prints one line:
"ddp RANKS MS_PER_STEP", the median repetition's time per step on rank 0. With --from-mpi it is
one rank of a job that mpirun started (rank and size from Open MPI's environment, the rendezvous
at MASTER_ADDR): across hosts (bench/multihost.sh).
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def mlp():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


def worker(rank, args, port, results):
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(1)
    if args.powersgd > 0:
        # One bucket (DDP's first one is 1 MiB on its own): over gloo, torch 1.13's PowerSGD with
        # several buckets crashes (see bench/powersgd_ddp.py).
        dist._DEFAULT_FIRST_BUCKET_BYTES = 25 * 2**20
    model = nn.parallel.DistributedDataParallel(mlp())
    state = None
    if args.powersgd > 0:
        # DDP's own PowerSGD, as cohort's rows use it: rank R, compressed from step 2, error
        # feedback and warm start (the defaults), min_compression_rate 2.
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd,
                                   start_powerSGD_iter=2, min_compression_rate=2)
        model.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(100 + rank)
    x = torch.rand(args.batch, 784)
    y = torch.randint(10, (args.batch,))

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
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
    if rank == 0:
        if state is not None:
            # What PyTorch itself counts (elements before and after compression, per step, the
            # compressed steps only), in float32 bytes.
            before, after = (state.total_numel_before_compression,
                             state.total_numel_after_compression)
            steps = max(1, state.iter - state.start_powerSGD_iter)
            print(f"ddp-wire {args.ranks} {4 * after / steps:.0f} (of {4 * before / steps:.0f})",
                  flush=True)
        results.put(statistics.median(per_step))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--port", type=int, default=29571)
    parser.add_argument("--from-mpi", action="store_true")
    parser.add_argument("--powersgd", type=int, default=0,
                        help="register DDP's powerSGD_hook at this rank (0: none)")
    args = parser.parse_args()
    if args.from_mpi:
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        args.ranks = int(os.environ["OMPI_COMM_WORLD_SIZE"])

        class Printer:
            def put(self, ms):
                print(f"ddp {args.ranks} {ms:.3f}", flush=True)

        worker(rank, args, args.port, Printer())
        return
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
    print(f"ddp {args.ranks} {ms:.3f}", flush=True)


if __name__ == "__main__":
    main()
