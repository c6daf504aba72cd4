"""Train a small model with DistributedDataParallel on the ``hccl_aot`` backend.

    pip install "./python[torch]"
    torchrun --nproc-per-node 2 python/examples/train_ddp.py                  # built-in plans
    HCCL_PLAN=host2.plan.ron torchrun --nproc-per-node 2 python/examples/train_ddp.py
    torchrun --nproc-per-node 2 python/examples/train_ddp.py --backend gloo   # the same run on Gloo

Each rank trains on its own shard of a synthetic regression task (a fixed random teacher
network, so the loss has somewhere to go); DDP averages the gradients with the backend's
AllReduce. Rank 0 prints the loss every few steps and, at the end, checks that every rank
holds the same parameters. ``--plan host`` compiles a plan for this machine's cores at start.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import hccl.torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default=hccl.torch.BACKEND, help="hccl_aot (default) or gloo")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    ap.add_argument("--plan", help="'host': compile a plan for this machine at start (hccl_aot only)")
    a = ap.parse_args()
    if a.plan:
        hccl.torch.set_plan(a.plan)
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial model on every rank (DDP also broadcasts it)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, a.width), torch.nn.GELU(),
        torch.nn.Linear(a.width, a.width), torch.nn.GELU(),
        torch.nn.Linear(a.width, 4),
    )
    teacher = torch.nn.Linear(32, 4)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard

    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        x = torch.randn(a.batch, 32, generator=data)
        with torch.no_grad():
            y = teacher(x)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        # The loss averaged over ranks, through the same backend.
        avg = loss.detach().clone()
        dist.all_reduce(avg, op=dist.ReduceOp.AVG)
        if rank == 0 and (step == 1 or step % 10 == 0 or step == a.steps):
            print(f"step {step:4d}  loss {avg.item():.5f}", flush=True)
    elapsed = time.perf_counter() - t0

    # Every rank must hold the same parameters: compare each with rank 0's.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    same = torch.tensor([int(torch.equal(flat, ref))], dtype=torch.int32)
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    if rank == 0:
        print(f"{a.backend}: {world} ranks, {a.steps} steps in {elapsed:.2f} s; "
              f"parameters identical on every rank: {bool(same.item())}", flush=True)
    ok = bool(same.item())
    if a.backend == "gloo":
        # Gloo sometimes aborts in its teardown on small machines after the work is done.
        dist.barrier()
        os._exit(0 if ok else 1)
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
