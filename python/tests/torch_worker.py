"""One rank of the torch.distributed tests (test_torch.py starts them with torchrun).

MODE=collectives: every collective, dtype and op through torch.distributed on "hccl_aot",
checked element by element against references every rank computes for every other; with
PLAN, on that plan (hccl.torch.set_plan).
MODE=ddp: an MLP trained with DistributedDataParallel for STEPS steps on BACKEND; each rank
writes, per step, the loss and a hash of its parameters to OUT/rank<r>.txt.
MODE=bad: CASE names a bad input; prints the error.
"""

import hashlib
import os
import sys

import torch
import torch.distributed as dist

import hccl.torch  # noqa: F401  (registers the backend)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64]
OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def data(rank, n, dtype, salt):
    g = torch.Generator().manual_seed(1000 * rank + salt)
    lo = 0 if dtype == torch.uint8 else -2
    return torch.randint(lo, 3, (n,), generator=g).to(dtype)


def ref(ins, op):
    s = torch.stack([i.to(torch.float64) for i in ins])
    r = {"sum": s.sum(0), "prod": s.prod(0), "min": s.min(0).values, "max": s.max(0).values}[op]
    return r.to(ins[0].dtype)


def check(got, want, what):
    if not torch.equal(got, want):
        raise AssertionError(f"{what}: {got[:8].tolist()} != {want[:8].tolist()}")


def collectives():
    if os.environ.get("PLAN"):
        hccl.torch.set_plan(os.environ["PLAN"])
    dist.init_process_group("hccl_aot")
    r, w = dist.get_rank(), dist.get_world_size()
    salt = 0
    for dtype in DTYPES:
        for n in (1, 13, 1031):
            salt += 1
            for name, op in OPS.items():
                salt += 1
                ins = [data(k, n, dtype, salt) for k in range(w)]
                x = ins[r].clone()
                dist.all_reduce(x, op=op)
                check(x, ref(ins, name), f"all_reduce {dtype} {name} n={n}")
                big = [data(k, n * w, dtype, salt + 5) for k in range(w)]
                o = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(o, big[r], op=op)
                check(o, ref(big, name)[r * n:(r + 1) * n], f"reduce_scatter_tensor {dtype} {name}")
                lst = [t.clone() for t in big[r].chunk(w)]
                dist.reduce_scatter(o, lst, op=op)
                check(o, ref(big, name)[r * n:(r + 1) * n], f"reduce_scatter {dtype} {name}")
                x = ins[r].clone()
                dist.reduce(x, dst=w - 1, op=op)
                if r == w - 1:
                    check(x, ref(ins, name), f"reduce {dtype} {name}")
            ins = [data(k, n, dtype, salt) for k in range(w)]
            out = torch.empty(n * w, dtype=dtype)
            dist.all_gather_into_tensor(out, ins[r])
            check(out, torch.cat(ins), f"all_gather_into_tensor {dtype}")
            lst = [torch.empty(n, dtype=dtype) for _ in range(w)]
            dist.all_gather(lst, ins[r])
            check(torch.cat(lst), torch.cat(ins), f"all_gather {dtype}")
            x = ins[r].clone()
            dist.broadcast(x, src=w // 2)
            check(x, ins[w // 2], f"broadcast {dtype}")
            blocks = [data(k, n * w, dtype, salt + 9) for k in range(w)]
            out = torch.empty(n * w, dtype=dtype)
            dist.all_to_all_single(out, blocks[r])
            check(out, torch.cat([blocks[k][r * n:(r + 1) * n] for k in range(w)]), f"all_to_all_single {dtype}")
    # Uneven all_to_all_single: rank s sends s + p + 1 rows of 3 to rank p.
    ins_split = [r + p + 1 for p in range(w)]
    outs_split = [s + r + 1 for s in range(w)]
    x = torch.arange(sum(ins_split) * 3, dtype=torch.float32).reshape(-1, 3) + 1000 * r
    out = torch.empty(sum(outs_split), 3)
    dist.all_to_all_single(out, x, output_split_sizes=outs_split, input_split_sizes=ins_split)
    want = []
    for s in range(w):
        xs = torch.arange(sum(s + p + 1 for p in range(w)) * 3, dtype=torch.float32).reshape(-1, 3) + 1000 * s
        off = sum(s + p + 1 for p in range(r))
        want.append(xs[off:off + s + r + 1])
    check(out, torch.cat(want), "uneven all_to_all_single")
    # all_to_all with a list, and AVG.
    outs = [torch.empty(2) for _ in range(w)]
    dist.all_to_all(outs, [torch.full((2,), float(10 * r + p)) for p in range(w)])
    check(torch.cat(outs), torch.cat([torch.full((2,), float(10 * s + r)) for s in range(w)]), "all_to_all")
    x = torch.full((7,), float(r))
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    check(x, torch.full((7,), sum(range(w)) / w), "all_reduce avg")
    # Asynchronous and coalesced.
    ts = [torch.full((1000,), float(r + k)) for k in range(3)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for k, (t, wk) in enumerate(zip(ts, works)):
        wk.wait()
        check(t, torch.full((1000,), float(sum(q + k for q in range(w)))), f"async {k}")
        # The future of an asynchronous call carries its tensors, as DDP's hooks read them.
        assert wk.get_future().value()[0] is t, f"rank {r}: async {k}: the future's value is not the tensor"
    # Asynchronous calls really are, when queued: with the last rank late, the others' calls
    # return at once and are not done until it has called; their futures complete then, with the
    # tensors; every single-tensor collective queues the same way, in call order.
    import time

    big = torch.full((1 << 16,), float(r))
    gathered = torch.empty(w * 4)
    scattered = torch.empty(3)
    bcast = torch.full((5,), float(r))
    if r == w - 1:
        time.sleep(0.5)
    t0 = time.perf_counter()
    wk = dist.all_reduce(big, async_op=True)
    fut = wk.get_future()
    wg = dist.all_gather_into_tensor(gathered, torch.full((4,), float(r)), async_op=True)
    wr = dist.reduce_scatter_tensor(scattered, torch.arange(3 * w, dtype=torch.float32) + r, async_op=True)
    wb = dist.broadcast(bcast, src=0, async_op=True)
    issued = time.perf_counter() - t0
    queued = dist.group.WORLD._queue  # HCCL_TORCH_ASYNC (test_collectives sets 1)
    if r != w - 1 and queued:
        assert issued < 0.25, f"rank {r}: asynchronous calls took {issued:.3f} s to return"
        assert not wk.is_completed(), f"rank {r}: an all_reduce completed before its last rank called"
    if not queued:
        assert wk.is_completed(), f"rank {r}: run at once, yet not complete"
    assert fut.wait()[0] is big
    for x in (wk, wg, wr, wb):
        x.wait()
        assert x.is_completed() and x.is_success()
    check(big, torch.full((1 << 16,), float(sum(range(w)))), "async all_reduce, late rank")
    check(gathered, torch.cat([torch.full((4,), float(s)) for s in range(w)]), "async all_gather_into_tensor")
    check(scattered, (torch.arange(3 * w, dtype=torch.float32) * w + sum(range(w)))[3 * r:3 * r + 3],
          "async reduce_scatter_tensor")
    check(bcast, torch.zeros(5), "async broadcast")
    # A work dropped unwaited, and its tensor with it: the queued call holds the tensor until
    # it has run, and the next blocking call runs after it.
    dist.all_reduce(torch.ones(1 << 18), async_op=True)
    z = torch.ones(3)
    dist.all_reduce(z)
    check(z, torch.full((3,), float(w)), "blocking after a dropped asynchronous call")
    # Blocking calls return no work (c10d takes it as synced); a blocking call on the
    # general path (not SUM, several dtypes) too.
    assert dist.all_reduce(torch.ones(3)) is None, "a blocking all_reduce returned a work"
    y = torch.full((5,), float(r), dtype=torch.float64)
    assert dist.all_reduce(y, op=dist.ReduceOp.MAX) is None
    check(y, torch.full((5,), float(w - 1), dtype=torch.float64), "blocking all_reduce max")
    dist.barrier()
    print(f"rank {r}: ok (plan {dist.group.WORLD.communicator.plan_hash})")
    dist.destroy_process_group()


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64),
                                       torch.nn.GELU(), torch.nn.Linear(64, 4))

    def forward(self, x):
        return self.net(x)


def ddp():
    backend = os.environ["BACKEND"]
    steps = int(os.environ.get("STEPS", "20"))
    dist.init_process_group(backend)
    r = dist.get_rank()
    torch.manual_seed(0)
    model = MLP()
    ddp_model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + r)
    lines = []
    for step in range(steps):
        x = torch.randn(16, 32, generator=g)
        y = torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp_model(x), y)
        loss.backward()
        opt.step()
        # The global loss (mean over ranks), through the backend under test.
        l = loss.detach().clone()
        dist.all_reduce(l)
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        digest = hashlib.sha256(params.numpy().tobytes()).hexdigest()[:16]
        lines.append(f"{step} {l.item() / dist.get_world_size():.10e} {digest}")
    with open(os.path.join(os.environ["OUT"], f"rank{r}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()


def fsdp():
    """FSDP2 (fully_shard) on CPU: every layer sharded, STEPS steps, the mean loss per step."""
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group(os.environ["BACKEND"])
    r = dist.get_rank()
    torch.manual_seed(0)
    model = MLP()
    for layer in model.net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + r)
    lines = []
    for step in range(int(os.environ.get("STEPS", "5"))):
        x = torch.randn(16, 32, generator=g)
        y = torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        l = loss.detach().clone()
        dist.all_reduce(l)
        lines.append(f"{step} {l.item() / dist.get_world_size():.10e} -")
    with open(os.path.join(os.environ["OUT"], f"rank{r}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()


def bad():
    # CASE: one bad input, or several separated by commas, tried in turn in one job (one
    # launch of PyTorch instead of one per case); each prints "CASE: Error: message".
    dist.init_process_group("hccl_aot")
    r = dist.get_rank()
    for case in os.environ["CASE"].split(","):
        try:
            if case == "noncontiguous":
                dist.all_reduce(torch.zeros(4, 4).t())
            elif case == "dtype":
                dist.all_reduce(torch.zeros(4, dtype=torch.uint16))
            elif case == "bool":
                dist.all_reduce(torch.zeros(4, dtype=torch.bool))
            elif case == "mismatch":
                dist.all_reduce(torch.zeros(100 + r))
            elif case == "send":
                dist.send(torch.zeros(1), dst=1 - r)
            elif case == "killed":
                dist.all_reduce(torch.zeros(8))
                if r == 1:
                    os._exit(7)
                for _ in range(50):
                    dist.all_reduce(torch.zeros(1 << 16))
            else:
                raise SystemExit(f"unknown CASE {case!r}")
            print(f"{case}: no error")
        except Exception as e:
            print(f"{case}: {type(e).__name__}: {e}")
        sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    {"collectives": collectives, "ddp": ddp, "fsdp": fsdp, "bad": bad}[os.environ.get("MODE", "collectives")]()
