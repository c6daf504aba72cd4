"""hccl.Communicator across real processes (one per rank, as torchrun would start them)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hccl

np = pytest.importorskip("numpy")
HERE = Path(__file__).resolve().parent


def launch(world, script, env=None, timeout=240, hosts=1):
    port = hccl.Communicator.free_port()
    procs = []
    for r in range(world):
        e = dict(os.environ)
        e.update(RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 HCCL_TIMEOUT=e.get("HCCL_TIMEOUT", "30"))
        if hosts > 1:
            e["HCCL_HOST_ID"] = f"emulated-host-{r * hosts // world}"
        e.update(env or {})
        procs.append(subprocess.Popen([sys.executable, str(script)], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out, err))
    return outs


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_collective_dtype_and_op(world):
    outs = launch(world, HERE / "comm_worker.py")
    for r, (rc, out, err) in enumerate(outs):
        assert rc == 0, f"rank {r} exited {rc}:\n{out}\n{err[-3000:]}"
        assert f"rank {r}: ok" in out


def test_across_emulated_hosts():
    outs = launch(4, HERE / "comm_worker.py", hosts=2)
    for r, (rc, out, err) in enumerate(outs):
        assert rc == 0, f"rank {r} exited {rc}:\n{out}\n{err[-3000:]}"


def test_with_a_compiled_plan(tmp_path):
    plan = hccl.compile(hccl.Topology.host(3, mem_bw=5.0), sizes="1K..1M")
    path = tmp_path / "host3.plan.ron"
    plan.save(path)
    outs = launch(3, HERE / "comm_worker.py", env={"TEST_PLAN": str(path)})
    for r, (rc, out, err) in enumerate(outs):
        assert rc == 0, f"rank {r} exited {rc}:\n{out}\n{err[-3000:]}"
    assert len({out.split("ok (")[1] for _, out, _ in outs}) == 1, outs


BAD = r"""
import os, sys, numpy as np, hccl
comm = hccl.Communicator.from_env()
r = comm.rank
case = os.environ["CASE"]
try:
    if case == "noncontiguous":
        comm.all_reduce(np.zeros((4, 4), np.float32)[:, 1])
    elif case == "dtype":
        comm.all_reduce(np.zeros(4, np.complex64))
    elif case == "mismatch":
        comm.all_reduce(np.zeros(100 + r, np.float32))
    elif case == "finalize":
        # A failed communicator cannot make its report: finalize says so (it used to
        # return None as if all were well).
        try:
            comm.all_reduce(np.zeros(100 + r, np.float32))
        except hccl.CommError:
            pass
        comm.finalize()
    elif case == "readonly":
        a = np.zeros(4, np.float32); a.flags.writeable = False; comm.all_reduce(a)
    elif case == "op":
        comm.all_reduce(np.zeros(4, np.float32), op="xor")
    elif case == "type":
        comm.all_reduce("not an array")
    elif case == "killed":
        comm.all_reduce(np.zeros(8, np.float32))
        if r == 1:
            os._exit(7)
        for _ in range(50):
            comm.all_reduce(np.zeros(1 << 16, np.float32))
    print("no error")
except (hccl.CommError, TypeError) as e:
    print(f"{type(e).__name__}: {e}")
sys.exit(0)
"""


@pytest.mark.parametrize(
    "case, expect",
    [
        ("noncontiguous", "not contiguous"),
        ("dtype", "not supported"),
        ("readonly", "read-only"),
        ("op", "unsupported reduction"),
        ("type", "expected a NumPy array"),
        ("mismatch", "CommError"),
        ("finalize", "CommError: cannot finalize (no straggler report)"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, case, expect):
    script = tmp_path / "bad.py"
    script.write_text(BAD)
    # The default call checks catch the mismatch (every message carries its sender's call).
    env = {"CASE": case, "HCCL_TIMEOUT": "10"}
    outs = launch(2, script, env=env, timeout=120)
    for r, (rc, out, err) in enumerate(outs):
        assert rc == 0, f"rank {r}: {err[-2000:]}"
        assert expect in out, f"rank {r}: {out}"


def test_a_killed_rank_is_named_by_the_survivors(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(BAD)
    outs = launch(3, script, env={"CASE": "killed", "HCCL_TIMEOUT": "5"}, timeout=120)
    assert outs[1][0] == 7
    for r in (0, 2):
        rc, out, err = outs[r]
        assert rc == 0 and "CommError" in out and "rank 1" in out, (out, err[-2000:])
