"""The torch.distributed backend ``hccl_aot`` in real processes started by torchrun."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install ./python[torch])")

import hccl  # noqa: E402

HERE = Path(__file__).resolve().parent


def torchrun(n, env, timeout=300):
    port = hccl.Communicator.free_port()
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", HCCL_TIMEOUT=os.environ.get("HCCL_TIMEOUT", "30"))
    e.update(env)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}",
           f"--master-port={port}", "--tee=3", str(HERE / "torch_worker.py")]
    return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_collectives(n):
    # Queued asynchronous calls whatever the CPU count (the worker checks they return early).
    r = torchrun(n, {"MODE": "collectives", "HCCL_TORCH_ASYNC": "1"})
    assert r.returncode == 0, ranks_output(r)
    for k in range(n):
        assert f"rank {k}: ok" in r.stdout


def test_collectives_on_a_plan_compiled_for_this_host():
    # Rank 0 compiles and shares the plan: the memory bandwidth each rank would measure
    # differs, and ranks with different plans refuse to start.
    r = torchrun(3, {"MODE": "collectives", "PLAN": "host"})
    assert r.returncode == 0, ranks_output(r)
    plans = {line.split("(plan ")[1] for line in r.stdout.splitlines() if ": ok (plan " in line}
    assert len(plans) == 1, r.stdout[-2000:]


def test_across_emulated_hosts():
    # torchrun gives every rank the same environment; HCCL_HOST_ID=rank-parity via a wrapper
    # is not possible, so emulate 2 hosts with the communicator test's launcher instead.
    pytest.importorskip("numpy")
    from test_comm import launch

    outs = launch(4, HERE / "comm_worker.py", hosts=2)
    assert all(rc == 0 for rc, _, _ in outs), outs


def ranks_output(r):
    """The lines the ranks printed themselves (torchrun prefixes them), then the agent's tail."""
    own = [l for l in (r.stdout + r.stderr).splitlines() if l.startswith("[default") and l.partition(":")[2].strip()]
    return "\n".join(own[-60:]) + "\n--- torchrun:\n" + r.stderr[-1500:]


# Gloo, the reference, sometimes aborts at teardown on a loaded 2-core machine with
# "terminate called without an active exception" (a joinable std::thread destroyed at exit),
# after its ranks have written their results; torchrun then kills the others, which may not
# have. Only the reference run is excused: its results are taken when every rank wrote all
# its steps, else it runs again (it aborted in all of three tries once in CI).
GLOO_TEARDOWN = "terminate called without an active exception"


def train(tmp_path, n, backend, env):
    for attempt in range(3):
        out = tmp_path / f"{backend}{attempt}"
        out.mkdir()
        r = torchrun(n, {**env, "BACKEND": backend, "OUT": str(out)})
        if r.returncode == 0:
            return read(out)
        if backend != "gloo" or GLOO_TEARDOWN not in r.stdout + r.stderr:
            break
        rows = read(out)
        steps = int(env["STEPS"])
        if len(rows) == n and all(len(lines) == steps for lines in rows.values()):
            return rows
    raise AssertionError(f"{backend} on {n} ranks failed (rc {r.returncode}):\n{ranks_output(r)}")


def read(out):
    rows = {}
    for f in sorted(Path(out).glob("rank*.txt")):
        rows[f.name] = [line.split() for line in f.read_text().splitlines()]
    return rows


# The losses of the two backends differ only in the order of the floating-point sums of
# the gradient AllReduce (Gloo and the compiled plan add the ranks' float32 gradients in
# different orders): a relative difference of a few float32 ulps per step, which momentum
# SGD carries over 20 steps. 1e-4 relative is two orders of magnitude above what was seen.
LOSS_RTOL = 1e-4


# DDP's gradient buckets are asynchronous calls: queued (overlapping the backward pass) and
# run at once, both checked.
@pytest.mark.parametrize("n, queued", [(2, "1"), (4, "0")])
def test_ddp_matches_gloo(tmp_path, n, queued):
    env = {"MODE": "ddp", "STEPS": "20", "HCCL_TORCH_ASYNC": queued}
    results = {b: train(tmp_path, n, b, env) for b in ("gloo", "hccl_aot")}
    ours = results["hccl_aot"]
    assert len(ours) == n
    steps = list(zip(*ours.values()))
    assert len(steps) == 20
    for rows in steps:
        # Every rank holds identical parameters after every step.
        assert len({row[2] for row in rows}) == 1, rows
    gloo = results["gloo"]["rank0.txt"]
    for a, b in zip(ours["rank0.txt"], gloo):
        assert float(a[1]) == pytest.approx(float(b[1]), rel=LOSS_RTOL), (a, b)


def test_fsdp2_matches_gloo(tmp_path):
    losses = {}
    for backend in ("gloo", "hccl_aot"):
        rows = train(tmp_path, 2, backend, {"MODE": "fsdp", "STEPS": "5", "HCCL_TORCH_ASYNC": "1"})
        losses[backend] = [float(row[1]) for row in rows["rank0.txt"]]
    assert len(losses["hccl_aot"]) == 5
    assert losses["hccl_aot"] == pytest.approx(losses["gloo"], rel=LOSS_RTOL)


BAD_INPUTS = [
    ("noncontiguous", "not contiguous"),
    ("dtype", "not supported"),
    ("bool", "not supported"),
    ("send", "send is not supported"),
    # Last: the ranks disagree on the call, which may leave the group unusable.
    ("mismatch", "but rank"),
]


@pytest.fixture(scope="module")
def bad_input_job():
    # Every case in one job, one after the other: each is refused before any data moves,
    # and a launch of PyTorch on 2 processes costs about 4 s.
    env = {"MODE": "bad", "CASE": ",".join(case for case, _ in BAD_INPUTS), "HCCL_TIMEOUT": "10"}
    return torchrun(2, env, timeout=120)


@pytest.mark.parametrize("case, expect", BAD_INPUTS)
def test_bad_input(bad_input_job, case, expect):
    r = bad_input_job
    lines = [l for l in r.stdout.splitlines() if re.search(rf"\b{case}: ", l)]
    # Both ranks raise, each with the message.
    assert len(lines) == 2 and all(expect in l for l in lines), r.stdout[-2000:] + r.stderr[-2000:]


def test_a_killed_rank_is_named():
    r = torchrun(3, {"MODE": "bad", "CASE": "killed", "HCCL_TIMEOUT": "5"}, timeout=180)
    lines = [l for l in r.stdout.splitlines() if "RuntimeError" in l or "CommError" in l]
    assert len(lines) >= 2 and all("rank 1" in l for l in lines), r.stdout[-3000:]


def test_the_readme_training_example():
    # The README's torchrun command: python/examples/train_ddp.py trains with DDP on
    # hccl_aot; the loss falls and every rank ends with identical parameters.
    example = HERE.parent / "examples" / "train_ddp.py"
    port = hccl.Communicator.free_port()
    e = dict(os.environ, OMP_NUM_THREADS="1", HCCL_TIMEOUT=os.environ.get("HCCL_TIMEOUT", "30"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={port}",
           str(example), "--steps", "30"]
    r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    losses = [float(line.split("loss")[1]) for line in r.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0], r.stdout
    assert "hccl_aot: 2 ranks, 30 steps" in r.stdout and "identical on every rank: True" in r.stdout, r.stdout


def test_asynchronous_calls_are_queued_where_a_core_is_free(monkeypatch):
    from hccl.torch import _queue_async

    monkeypatch.delenv("HCCL_TORCH_ASYNC", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert _queue_async(4) and not _queue_async(5)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert not _queue_async(2) and _queue_async(1)
    monkeypatch.setenv("HCCL_TORCH_ASYNC", "1")
    assert _queue_async(2)
    monkeypatch.setenv("HCCL_TORCH_ASYNC", "0")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert not _queue_async(2)
    monkeypatch.setenv("HCCL_TORCH_ASYNC", "sometimes")
    with pytest.raises(ValueError, match="HCCL_TORCH_ASYNC"):
        _queue_async(2)
