"""One job of scripts/bench-torch.sh: hccl_aot and Gloo side by side in the same processes,
printed as JSON lines by rank 0 (nccl-tests columns: size, time, algbw, busbw).

The default process group is hccl_aot and a second group over the same ranks is Gloo, so
both backends are timed within seconds of each other, alternating, on the same machine state
(this VM has spells of tens of seconds in which hccl's shared-memory copies run 1.5-4x
slower; timed in separate launches, a spell that covers one backend's launch and not the
other's decides the ratio).

MODE=collectives: per collective and size, one timing of each backend, the order alternating
from size to size and from job to job (ORDER); with BENCH_HCCL_PERF (an hccl-perf binary),
each all_reduce size also through hccl-perf on the same plan (HCCL_PLAN), right after.

MODE=ddp: ROUNDS rounds of the DDP step on four copies of one model (same seed): over Gloo,
over hccl_aot, with a communication hook that hands every bucket back at once (no
communication: the floor no backend can beat), and with one that copies each bucket twice
in memory first (no communication, the memory traffic of a two-rank all_reduce), the order
rotating from round to round."""

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


def groups():
    """The two backends' groups over all ranks: hccl_aot (the default group) and Gloo."""
    if dist.get_backend() != "hccl_aot":
        raise SystemExit("torch_job.py runs with BACKEND=hccl_aot (Gloo is its second group)")
    return {"hccl_aot": None, "gloo": dist.new_group(backend="gloo")}


def collectives():
    r, w = dist.get_rank(), dist.get_world_size()
    pgs = groups()
    names = ["gloo", "hccl_aot"]
    turn = int(os.environ.get("ORDER", 0))
    for coll in os.environ.get("COLLS", "all_reduce,all_gather_into_tensor,reduce_scatter_tensor").split(","):
        for size in SIZES:
            n = max(1, size // 4)
            if coll == "all_reduce":
                x = torch.ones(n)
                call, factor = (lambda g: dist.all_reduce(x, group=g)), 2 * (w - 1) / w
                size = n * 4
            elif coll == "all_gather_into_tensor":
                n = max(1, n // w)
                x, out = torch.ones(n), torch.empty(n * w)
                call, factor = (lambda g: dist.all_gather_into_tensor(out, x, group=g)), (w - 1) / w
                size = n * w * 4
            else:
                n = max(1, n // w)
                x, out = torch.ones(n * w), torch.empty(n)
                call, factor = (lambda g: dist.reduce_scatter_tensor(out, x, group=g)), (w - 1) / w
                size = n * w * 4
            turn += 1
            for b in names[turn % 2:] + names[:turn % 2]:
                g = pgs[b]
                t = timed(lambda: call(g), size)
                if r == 0:
                    algbw = size / t / 1e9
                    print(json.dumps({"backend": b, "coll": coll, "bytes": size, "us": t * 1e6,
                                      "algbw": algbw, "busbw": algbw * factor}), flush=True)
            if coll == "all_reduce" and os.environ.get("BENCH_HCCL_PERF"):
                perf_beside(size, turn)


def perf_beside(size, turn):
    """hccl-perf's all_reduce of `size` bytes on the same plan, in place, timed like the torch
    side, run by rank 0 right after this job timed the size, while every rank of the job
    waits in a blocking read of the job's store (idle, not polling)."""
    import subprocess

    store = dist.distributed_c10d._get_default_store()
    key = f"hccl-perf-{turn}-{size}"
    if dist.get_rank() == 0:
        # Without this job's launcher variables, which would make hccl-perf one rank of it.
        launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")
        env = {k: v for k, v in os.environ.items() if k not in launcher and not k.startswith("TORCHELASTIC_")}
        out = subprocess.run([os.environ["BENCH_HCCL_PERF"], "--backend", "process", "-g", str(dist.get_world_size()),
                              "-b", str(size), "-e", str(size), "--plan", os.environ["HCCL_PLAN"], "--in-place",
                              "-w", "20", "-T", "0.25", "--json"], capture_output=True, text=True, env=env)
        store.set(key, "done")
        if out.returncode:
            raise SystemExit(f"hccl-perf failed: {out.stderr[-2000:]}")
        doc = json.loads(out.stdout)
        for row in doc["rows"] if isinstance(doc, dict) else doc:
            print(json.dumps({"backend": "hccl-perf", "coll": "all_reduce", "bytes": int(row["bytes"]),
                              "us": float(row["time_us"])}), flush=True)
    else:
        store.wait([key])


def ddp():
    width = 2560
    pgs = groups()

    def no_comm(state, bucket):
        # The step without communication: every bucket comes back as it is, at once.
        done = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    def copy_twice(state, bucket):
        # No communication, but each bucket read and written twice in memory: about the
        # memory traffic an all_reduce of two ranks adds to the step on one host.
        buf = bucket.buffer()
        buf.copy_(buf.clone())
        done = torch.futures.Future()
        done.set_result(buf)
        return done

    def make(group, hook):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])  # 26.2M parameters
        wrapped = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        if hook:
            wrapped.register_comm_hook(None, hook)
        return wrapped, torch.optim.SGD(wrapped.parameters(), lr=1e-3)

    models = {"gloo": make(pgs["gloo"], None), "hccl_aot": make(pgs["hccl_aot"], None),
              "none": make(pgs["gloo"], no_comm), "copy": make(pgs["gloo"], copy_twice)}
    params = sum(p.numel() for p in models["none"][0].parameters())
    x = torch.randn(8, width)
    names = list(models)
    # A first round untimed: the first steps of each copy fault in its gradients and buckets
    # (measured: every backend's first round 1.2-1.5x slower than the rounds after it).
    for rnd in range(-1, int(os.environ.get("ROUNDS", 3))):
        for b in names[rnd % len(names):] + names[:rnd % len(names)]:
            model, opt = models[b]
            times = []
            for step in range(13 if rnd >= 0 else 5):
                dist.barrier()
                t0 = time.perf_counter()
                opt.zero_grad()
                model(x).square().mean().backward()
                opt.step()
                times.append(time.perf_counter() - t0)
            # A step of the job ends when its slowest rank's does: each step's time is the
            # largest over the ranks. (Without communication the ranks do not wait for each
            # other, and their times differ: 143 to 197 ms across the 4 ranks of one run.)
            slowest = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times = sorted(slowest.tolist()[3:])
            if rnd >= 0 and dist.get_rank() == 0:
                print(json.dumps({"coll": "ddp_step", "backend": b, "round": rnd, "params": params,
                                  "ms": 1e3 * times[len(times) // 2]}), flush=True)


if __name__ == "__main__":
    dist.init_process_group(os.environ.get("BACKEND", "hccl_aot"))
    {"collectives": collectives, "ddp": ddp}[os.environ.get("MODE", "collectives")]()
    # Gloo (every job has a Gloo group) sometimes aborts in its teardown on this machine
    # ("terminate called without an active exception", a joinable thread destroyed): the
    # figures are printed, so leave without running its destructors once every rank is done.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)
