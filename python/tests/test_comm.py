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


# ----- how a call reads an array: NumPy's array interface in one native call -----
def _fast_cases():
    out = [np.arange(7, dtype=t) for t in
           ("float16", "float32", "float64", "int8", "uint8", "int32", "uint32", "int64", "uint64")]
    out += [np.zeros((3, 5), np.float32), np.zeros((2, 0), np.float64), np.array(2.5, np.float32),
            np.zeros((4, 6), np.int32)[1:3], np.zeros((3, 4), order="F")[:, 1:2]]
    return out


@pytest.mark.parametrize("a", _fast_cases(), ids=lambda a: f"{a.dtype}{a.shape}")
def test_array_info_reads_an_array_as_numpy_does(a):
    from hccl import _hccl

    assert _hccl.array_info(a, True) == (a.ctypes.data, a.size, a.dtype.name)


def _readonly():
    a = np.zeros(4, np.float32)
    a.flags.writeable = False
    return a


def _misaligned():
    return np.frombuffer(bytearray(24), np.uint8)[1:17].view(np.float32)


@pytest.mark.parametrize(
    "make, error",
    [
        (lambda: np.zeros((4, 4), np.float32)[:, 1], "not contiguous"),
        (lambda: np.zeros((3, 4), np.float32, order="F"), "not contiguous"),
        (_readonly, "read-only"),
        (lambda: np.zeros(4, ">f4" if sys.byteorder == "little" else "<f4"), "byte order"),
        (_misaligned, "not aligned"),
        (lambda: np.zeros(4, np.complex64), "not supported"),
        (lambda: np.zeros(4, np.bool_), "not supported"),
        (lambda: np.zeros(4, np.int16), "not supported"),
    ],
    ids=["strided", "fortran", "readonly", "byteswapped", "misaligned", "complex", "bool", "int16"],
)
def test_arrays_the_native_reading_declines_get_a_clear_error(make, error):
    from hccl import _hccl
    from hccl.comm import _Array

    a = make()
    assert _hccl.array_info(a, True) is None
    with pytest.raises(hccl.CommError, match=error):
        _Array(a, "input", True)


def test_a_read_only_array_is_read_natively_as_an_input():
    from hccl import _hccl

    a = _readonly()
    assert _hccl.array_info(a, False) == (a.ctypes.data, 4, "float32")


def test_objects_without_numpys_interface_are_left_to_the_general_path():
    from hccl import _hccl

    for obj in (bytearray(8), memoryview(bytearray(8)), "text", None, 3, object()):
        assert _hccl.array_info(obj, False) is None
