"""One job of scripts/bench-torch.sh: collectives or a DDP step through torch.distributed on
BACKEND, printed as JSON lines by rank 0 (nccl-tests columns: size, time, algbw, busbw)."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import hccl.torch  # noqa: F401

SIZES = [s for s in [8 << (2 * k) for k in range(13)] + [256 << 20]   # 8 B .. 128 MiB by 4, and 256 MiB
         if int(os.environ.get("MINB", 0)) <= s <= int(os.environ.get("MAXB", 1 << 40))]


def agreed(count):
    """The largest of the ranks' counts: every rank must make the same number of calls."""
    t = torch.tensor([int(count)], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def timed(fn, nbytes):
    """Seconds per call: warm up for ~50 ms (at least 5 calls: the executor's waits adapt
    over the first calls), then time enough calls for ~0.25 s (at least 3, at most 20,000),
    every rank running the same counts."""
    for _ in range(5):
        fn()
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    for _ in range(agreed(min(20_000, 0.05 / one))):
        fn()
    dist.barrier()
    k = agreed(10 if one < 1e-3 else 1)
    t0 = time.perf_counter()
    for _ in range(k):
        fn()
    one = max((time.perf_counter() - t0) / k, 1e-7)
    iters = agreed(min(20_000, max(3, 0.25 / one)))
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def collectives():
    r, w = dist.get_rank(), dist.get_world_size()
    for coll in os.environ.get("COLLS", "all_reduce,all_gather_into_tensor,reduce_scatter_tensor").split(","):
        for size in SIZES:
            n = max(1, size // 4)
            if coll == "all_reduce":
                x = torch.ones(n)
                fn, factor = (lambda: dist.all_reduce(x)), 2 * (w - 1) / w
            elif coll == "all_gather_into_tensor":
                n = max(1, n // w)
                x, out = torch.ones(n), torch.empty(n * w)
                fn, factor = (lambda: dist.all_gather_into_tensor(out, x)), (w - 1) / w
                size = n * w * 4
            else:
                n = max(1, n // w)
                x, out = torch.ones(n * w), torch.empty(n)
                fn, factor = (lambda: dist.reduce_scatter_tensor(out, x)), (w - 1) / w
                size = n * w * 4
            t = timed(fn, size)
            if r == 0:
                algbw = size / t / 1e9
                print(json.dumps({"coll": coll, "bytes": size, "us": t * 1e6, "algbw": algbw, "busbw": algbw * factor}), flush=True)


def ddp():
    torch.manual_seed(0)
    width = 2560
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])  # 26.2M parameters
    params = sum(p.numel() for p in model.parameters())
    ddp_model = torch.nn.parallel.DistributedDataParallel(model)
    if os.environ.get("DDP_NO_COMM"):
        # The step without communication: every bucket comes back as it is, at once.
        def no_comm(state, bucket):
            done = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

        ddp_model.register_comm_hook(None, no_comm)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=1e-3)
    x = torch.randn(8, width)
    times = []
    for step in range(13):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        ddp_model(x).square().mean().backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    times = sorted(times[3:])
    if dist.get_rank() == 0:
        print(json.dumps({"coll": "ddp_step", "params": params, "ms": 1e3 * times[len(times) // 2]}), flush=True)


if __name__ == "__main__":
    dist.init_process_group(os.environ["BACKEND"])
    {"collectives": collectives, "ddp": ddp}[os.environ.get("MODE", "collectives")]()
    if os.environ["BACKEND"] == "gloo":
        # Gloo sometimes aborts in its teardown on this machine ("terminate called without an
        # active exception", a joinable thread destroyed): the figures are printed, so leave
        # without running its destructors once every rank is done.
        dist.barrier()
        sys.stdout.flush()
        os._exit(0)
    dist.destroy_process_group()
