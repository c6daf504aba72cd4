"""Collectives from Python: one rank of a job, replaying a compiled plan.

    import numpy as np, hccl
    comm = hccl.Communicator.from_env(plan="job.plan.ron")   # RANK/WORLD_SIZE/MASTER_ADDR/PORT
    x = np.ones(1 << 20, dtype=np.float32)
    comm.all_reduce(x)                     # in place; comm.all_reduce(x, out=y) out of place
    work = comm.all_gather(x, out=big, async_op=True); ...; work.wait()

Arrays are NumPy arrays, PyTorch CPU tensors, or any writable buffer (``bytearray``,
``array.array``, ``memoryview``): they are read and written where they are, never copied, and
must be contiguous. The GIL is released while a call runs. A blocking call runs on the calling thread; with
``async_op=True`` it is queued to the communicator's own thread and returns at once (calls run
in the order they were made); the arrays of a call must not be touched until its ``wait()``. The ``HCCL_*``
variables (timeout, checks, checksums, traces) work as for a Rust program.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _hccl
from ._hccl import CommError
from ._hccl import array_info as _array_info

__all__ = ["Communicator", "Work", "CommError"]

# Element types by the names NumPy, PyTorch and the buffer protocol give them.
_TYPES = {
    "float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32",
    "int64": "int64", "uint64": "uint64", "int": "int32", "long": "int64",
}
_SIZES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1,
          "int32": 4, "uint32": 4, "int64": 8, "uint64": 8}
# struct-module format characters of the buffer protocol (native sizes on 64-bit Linux).
_FORMATS = {"f": "float32", "d": "float64", "e": "float16", "b": "int8", "B": "uint8",
            "c": "uint8", "i": "int32", "I": "uint32", "l": "int64", "L": "uint64",
            "q": "int64", "Q": "uint64", "h": None, "H": None}
_OPS = ("sum", "prod", "min", "max", "avg")
# Whether a type has NumPy's C-level array interface (`_Array` asks once per type).
_HAS_STRUCT: Dict[type, bool] = {}
# The byte-order mark of `__array_interface__`'s typestr that is not this machine's.
_FOREIGN_ORDER = ">" if sys.byteorder == "little" else "<"


class _Array:
    """What a call needs of an array: address, length in elements, element type."""

    __slots__ = ("obj", "ptr", "len", "dtype", "keep")

    def __init__(self, obj: Any, what: str, writable: bool) -> None:
        self.obj = obj
        self.keep: Any = obj
        # NumPy's common case in one native call; anything else (or wrong) below. Types
        # without NumPy's C-level interface (PyTorch tensors, buffers) skip the probe.
        kind = type(obj)
        native = _HAS_STRUCT.get(kind)
        if native is None:
            native = _HAS_STRUCT[kind] = hasattr(kind, "__array_struct__")
        if native:
            info = _array_info(obj, writable)
            if info is not None:
                self.ptr, self.len, self.dtype = info
                return
        mod = kind.__module__.split(".")[0]
        if mod == "torch":
            if obj.device.type != "cpu":
                raise CommError(f"{what}: a tensor on {obj.device}: this communicator runs on CPU memory")
            if not obj.is_contiguous():
                raise CommError(f"{what}: the tensor is not contiguous (call .contiguous() first)")
            name = str(obj.dtype).replace("torch.", "")
            self.dtype = _dtype(name, what)
            self.ptr, self.len = obj.data_ptr(), obj.numel()
        elif hasattr(obj, "__array_interface__"):
            ai = obj.__array_interface__
            flags = getattr(obj, "flags", None)
            if flags is not None and not flags["C_CONTIGUOUS"]:
                raise CommError(f"{what}: the array is not contiguous (numpy.ascontiguousarray first)")
            if writable and ai["data"][1]:
                raise CommError(f"{what}: the array is read-only")
            if ai["typestr"][:1] == _FOREIGN_ORDER:
                raise CommError(f"{what}: the array's byte order is not this machine's "
                                "(x.astype(x.dtype.newbyteorder('=')) first)")
            self.dtype = _dtype(getattr(obj, "dtype", None) and obj.dtype.name or "", what)
            self.ptr, self.len = ai["data"][0], int(obj.size)
        else:
            try:
                mv = memoryview(obj)
            except TypeError:
                raise TypeError(
                    f"{what}: expected a NumPy array, a PyTorch CPU tensor or a buffer, got {type(obj).__name__}"
                ) from None
            if not mv.c_contiguous:
                raise CommError(f"{what}: the buffer is not contiguous")
            if mv.readonly:
                raise CommError(f"{what}: read-only buffers are not supported here (pass a NumPy array)")
            fmt = mv.format.lstrip("@=")
            name = _FORMATS.get(fmt)
            if name is None:
                raise CommError(f"{what}: unsupported element format {mv.format!r}")
            import ctypes

            self.len = mv.nbytes // mv.itemsize
            self.dtype = name
            self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(mv)) if mv.nbytes else 0
            self.keep = mv
        if self.ptr % _SIZES[self.dtype]:
            raise CommError(f"{what}: the data is not aligned to its element size "
                            "(numpy.ascontiguousarray(x) makes an aligned copy)")

    @property
    def nbytes(self) -> int:
        return self.len * _SIZES[self.dtype]


def _dtype(name: str, what: str) -> str:
    t = _TYPES.get(name)
    if t is None:
        raise CommError(
            f"{what}: element type {name or '?'} is not supported (float32, float64, float16, "
            "bfloat16, int8, uint8, int32, uint32, int64, uint64)"
        )
    return t


class Work:
    """A call in flight (``async_op=True``): ``wait()`` blocks until it is done (the GIL
    released) and raises :class:`CommError` if it failed; ``is_completed()`` asks."""

    __slots__ = ("_handle", "_keep", "result")

    def __init__(self, handle: Any, keep: Tuple[Any, ...], result: Any) -> None:
        self._handle = handle
        self._keep = keep
        #: What the blocking call would have returned (the output array).
        self.result = result

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits up to ``timeout`` seconds (forever by default); ``True`` once done."""
        done = self._handle.wait(timeout)
        if done:
            self._keep = ()
        return done

    def is_completed(self) -> bool:
        return self._handle.done()


class Communicator:
    """One rank of a job that runs collectives from a compiled plan.

    Make one with :meth:`from_env` (under torchrun, mpirun or srun) or :meth:`connect`
    (explicit rank, world size and rank 0's address). ``plan`` is a :class:`hccl.Plan`, a plan
    file's path, or ``None`` for the built-in plans; ``HCCL_PLAN`` overrides it.
    """

    def __init__(self, native: Any) -> None:
        if not isinstance(native, _hccl.Communicator):
            raise TypeError("use Communicator.from_env() or Communicator.connect()")
        self._native = native

    @staticmethod
    def _plan(plan: Any) -> Tuple[Any, Optional[str]]:
        from .core import Plan

        if plan is None:
            return None, None
        if isinstance(plan, Plan):
            return plan._native, None
        if isinstance(plan, (str, os.PathLike)):
            return None, os.fspath(plan)
        raise TypeError(f"plan: expected hccl.Plan, a path or None, got {type(plan).__name__}")

    @classmethod
    def from_env(cls, plan: Any = None) -> "Communicator":
        """Joins the job the launcher's variables describe (``RANK``/``WORLD_SIZE`` or
        ``OMPI_COMM_WORLD_*``, ``PMI_*``, ``SLURM_*``; ``MASTER_ADDR``, ``MASTER_PORT``)."""
        native, path = cls._plan(plan)
        return cls(_hccl.Communicator.from_env(native, path))

    @classmethod
    def connect(
        cls,
        rank: int,
        world_size: int,
        addr: str,
        plan: Any = None,
        token: str = "",
        host: Optional[str] = None,
    ) -> "Communicator":
        """Joins as ``rank`` of ``world_size``, meeting at rank 0's ``addr`` (``"host:port"``).
        ``host`` names this rank's host (ranks of one host share memory; default
        ``HCCL_HOST_ID``, else this machine)."""
        native, path = cls._plan(plan)
        return cls(_hccl.Communicator.connect(rank, world_size, addr, native, path, token, host))

    @staticmethod
    def free_port() -> int:
        """A free loopback port for a job this machine starts itself."""
        return _hccl.Communicator.free_port()

    @property
    def rank(self) -> int:
        return self._native.rank

    @property
    def world_size(self) -> int:
        return self._native.world_size

    @property
    def plan_hash(self) -> str:
        """The hash of the plan every rank runs (checked equal at start)."""
        return self._native.plan_hash

    # ----- collectives -----
    def _call(self, collective: str, x: Any, out: Any, op: str, root: int, async_op: bool,
              in_per_out: Optional[int] = None, out_per_in: Optional[int] = None, counts: Any = None) -> Any:
        # in_per_out / out_per_in: the input must have that many times the output's elements,
        # or the output that many times the input's.
        if op not in _OPS:
            raise CommError(f"unsupported reduction {op!r} ({', '.join(_OPS)})")
        src = _Array(x, "input", writable=out is None)
        if out is None:
            dst, inp = src, None
        else:
            dst = _Array(out, "output", writable=True)
            inp = src
            if dst.dtype != src.dtype:
                raise CommError(f"output is {dst.dtype} but input is {src.dtype}")
            if dst.ptr == src.ptr and dst.len == src.len:
                inp = None  # the same memory: in place
        if out_per_in is not None and dst.len != src.len * out_per_in:
            raise CommError(f"output has {dst.len} elements, {collective} needs {src.len * out_per_in}")
        if in_per_out is not None and src.len != dst.len * in_per_out:
            raise CommError(f"input has {src.len} elements, {collective} needs {dst.len * in_per_out}")
        args = (collective, op, dst.dtype, dst.ptr, dst.len,
                None if inp is None else inp.ptr, 0 if inp is None else inp.len, root, counts)
        if async_op:
            # The queued call holds the arrays' owners until it has run (`keep`): a Work
            # dropped unwaited cannot free memory the call still writes.
            keep = (src.keep, dst.keep)
            return Work(self._native.call(True, *args, keep=keep), keep, dst.obj)
        # Blocking: runs on this thread (the GIL released), after any queued call.
        self._native.call(False, *args)
        return dst.obj

    def all_reduce(self, x: Any, out: Any = None, op: str = "sum", async_op: bool = False) -> Any:
        """Every rank gets ``op`` over all ranks' ``x`` (in ``x``, or ``out``)."""
        return self._call("allreduce", x, out, op, 0, async_op, out_per_in=1)

    def all_gather(self, x: Any, out: Any, async_op: bool = False) -> Any:
        """``out`` (``world_size`` times ``x``'s length) gets every rank's ``x`` in rank order.
        ``x`` may be this rank's block of ``out`` (in place)."""
        return self._call("allgather", x, out, "sum", 0, async_op, out_per_in=self.world_size)

    def reduce_scatter(self, x: Any, out: Any, op: str = "sum", async_op: bool = False) -> Any:
        """``x`` holds ``world_size`` blocks; rank r's ``out`` gets ``op`` over block r."""
        return self._call("reducescatter", x, out, op, 0, async_op, in_per_out=self.world_size)

    def broadcast(self, x: Any, root: int = 0, out: Any = None, async_op: bool = False) -> Any:
        """Every rank gets ``root``'s ``x``."""
        return self._call("broadcast", x, out, "sum", root, async_op)

    def reduce(self, x: Any, root: int = 0, out: Any = None, op: str = "sum", async_op: bool = False) -> Any:
        """``root`` gets ``op`` over all ranks' ``x``."""
        return self._call("reduce", x, out, op, root, async_op)

    def all_to_all(self, x: Any, out: Any = None, async_op: bool = False) -> Any:
        """Block b of this rank's ``x`` goes to block r (this rank) of rank b's output."""
        return self._call("alltoall", x, out, "sum", 0, async_op)

    def all_to_all_v(self, x: Any, send_counts: Sequence[int], out: Any, recv_counts: Sequence[int],
                     send_displs: Optional[Sequence[int]] = None, recv_displs: Optional[Sequence[int]] = None,
                     async_op: bool = False) -> Any:
        """``send_counts[p]`` elements of ``x`` go to rank ``p``, which receives
        ``recv_counts[r]`` from this rank r (MPI_Alltoallv; displacements default to the
        packed layout). Counts that disagree between two ranks raise on both."""
        w = self.world_size
        for name, v in (("send_counts", send_counts), ("recv_counts", recv_counts)):
            if len(v) != w or any(int(c) < 0 for c in v):
                raise CommError(f"{name}: expected {w} non-negative counts, got {list(v)}")

        def packed(c: Sequence[int]) -> List[int]:
            out, acc = [], 0
            for n in c:
                out.append(acc)
                acc += int(n)
            return out

        sd = list(map(int, send_displs)) if send_displs is not None else packed(send_counts)
        rd = list(map(int, recv_displs)) if recv_displs is not None else packed(recv_counts)
        counts = (list(map(int, send_counts)), sd, list(map(int, recv_counts)), rd)
        if out is None:
            raise CommError("all_to_all_v needs an output array")
        return self._call("alltoallv", x, out, "sum", 0, async_op, counts=counts)

    def barrier(self) -> None:
        """Returns once every rank has called it."""
        import array

        self.all_reduce(array.array("i", [0]))

    # ----- the job -----
    def straggler_report(self) -> Dict[str, Any]:
        """Who held everyone up (collective: every rank calls it after the same calls)."""
        return json.loads(self._native.straggler_report())

    def finalize(self) -> Optional[Dict[str, Any]]:
        """Ends the communicator after its queued calls; returns its straggler report.

        Collective: every rank calls it. Raises ``CommError`` when the communicator failed
        in an earlier call or the report cannot be made (a failed rank); returns ``None``
        only when it was already finalized."""
        report = self._native.finalize()
        return None if report is None else json.loads(report)

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.finalize()

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, world_size={self.world_size}, plan={self.plan_hash[:12]})"
