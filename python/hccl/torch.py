"""A ``torch.distributed`` backend that runs compiled plans: ``import hccl.torch`` registers it.

    import torch.distributed as dist, hccl.torch
    dist.init_process_group("hccl_aot")          # under torchrun; HCCL_PLAN=job.plan.ron picks the plan

The name is ``hccl_aot`` (ahead-of-time compiled hccl): ``"hccl"`` is Huawei's (``torch_npu``).
It runs on CPU tensors. A blocking call runs to the end on the calling thread with the GIL
released (a few microseconds of overhead), after any call still queued. An asynchronous one
(``async_op=True``, and what DistributedDataParallel's gradient buckets and FSDP's gathers
issue) of all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast, reduce,
all_to_all_single and their coalesced forms is queued to the communicator's own thread and
returns at once: its work's ``wait()`` blocks until it has run, and its ``get_future()``
completes then, so computation overlaps the communication. The call holds its tensors until
it has run. That thread needs a core of its own to overlap anything: where this host's CPUs
are fewer than twice its ranks, asynchronous calls run at once instead and return a
completed work (``HCCL_TORCH_ASYNC``: ``auto``, the default; ``1`` always queues, ``0``
never). The forms that take lists of tensors (all_gather, reduce_scatter, all_to_all)
run to the end before they return. It implements all_reduce, all_gather and all_gather_into_tensor,
reduce_scatter and reduce_scatter_tensor, broadcast, reduce, all_to_all and
all_to_all_single (uneven splits through AllToAllv), barrier and the coalesced variants
DistributedDataParallel uses. Point-to-point (send, recv) and gather/scatter raise an error
that says what to use instead: compiled plans hold collectives only.

The plan: ``HCCL_PLAN`` (a plan file), else :func:`set_plan` before the process group is made,
else the executor's built-in plans. Ranks meet at ``MASTER_ADDR`` on a port rank 0 picks and
shares through the process group's store.
"""

from __future__ import annotations

import queue
import threading
import weakref
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work as _C10dWork
from torch.futures import Future

from .comm import CommError, Communicator

__all__ = ["BACKEND", "HcclProcessGroup", "set_plan"]

#: The name to give ``torch.distributed.init_process_group``.
BACKEND = "hccl_aot"

_plan: Any = None


def set_plan(plan: Any) -> None:
    """The plan process groups made from now on run: an :class:`hccl.Plan`, a plan file's
    path, or ``"host"``: compiled at start for this machine's cores and the group's size
    (rank 0 compiles, in well under a second, and hands the plan to the other ranks through
    the process group's store, so every rank runs the same plan even though the memory
    bandwidth it measures differs from run to run; all ranks on this one host).
    ``HCCL_PLAN`` still overrides it."""
    global _plan
    _plan = plan


_SUM = dist.ReduceOp.SUM
_OPS = {
    _SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.AVG: "avg",
}


def _op(opts: Any, call: str) -> str:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    for k, v in _OPS.items():
        if op == k:
            return v
    raise RuntimeError(f"{BACKEND}: {call} with {op} is not supported (SUM, PRODUCT, MIN, MAX, AVG)")


_DTYPES = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int8: "int8", torch.uint8: "uint8",
    torch.int32: "int32", torch.int64: "int64",
}


def _counts(send: List[int], recv: List[int]) -> Any:
    """AllToAllv's counts and packed displacements."""

    def packed(c: List[int]) -> List[int]:
        out, acc = [], 0
        for n in c:
            out.append(acc)
            acc += n
        return out

    return (send, packed(send), recv, packed(recv))


def _unsupported(call: str, instead: str) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{BACKEND}: {call} is not supported: compiled plans hold collectives only; {instead}"
        )

    method.__name__ = call
    return method


class _Work(_C10dWork):
    """A completed call: every call of this backend runs to the end before it returns, and
    raises there if it fails, so its work only carries the result. The future DDP's hooks
    chain on is made when asked for (a completed ``Future`` costs about a microsecond, which
    a plain ``all_reduce`` should not pay). Made by :func:`_done`, without an ``__init__`` of
    its own: the base class's constructor is the cheap part."""

    _result: Any

    def wait(self, timeout: Any = None) -> bool:
        return True

    def get_future(self) -> Future:
        fut: Future = Future()
        fut.set_result(self._result)
        return fut

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self) -> Any:
        return self._result


def _done(result: Any, opts: Any = None) -> Optional[_Work]:
    """The work a call returns: none for a blocking call (``asyncOp`` false, what
    ``torch.distributed``'s functions pass without ``async_op=True``; they take a missing work
    as "already synced"), saving the work and C++ calling back into Python to wait on it."""
    if opts is not None and not opts.asyncOp:
        return None
    work = _Work()
    work._result = result
    return work


def _queue_async(local_ranks: int) -> bool:
    """Whether asynchronous calls are queued to the communicator's thread: ``HCCL_TORCH_ASYNC``
    ``1`` or ``0``, else (``auto``) when the CPUs this process may use are at least twice
    the ranks on this host. Where they are fewer, the thread would take its time from the
    ranks' own computation (measured with DistributedDataParallel on 4 ranks over 2 cores:
    steps about 10% slower queued than run at once)."""
    import os

    mode = os.environ.get("HCCL_TORCH_ASYNC", "auto").strip().lower() or "auto"
    if mode not in ("auto", "0", "1"):
        raise ValueError(f"HCCL_TORCH_ASYNC={mode!r}: expected auto, 1 or 0")
    if mode != "auto":
        return mode == "1"
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return cpus >= 2 * max(1, local_ranks)


class _Pending(_C10dWork):
    """A queued call (``asyncOp``): runs on the communicator's thread in the order the calls
    were made. ``wait()`` blocks until it has run (the GIL released) and raises if it failed;
    its future (made when asked for) completes then, from the process group's completion
    thread. Made by :meth:`HcclProcessGroup._pending`."""

    _handle: Any
    _result: Any
    _call: str
    _pg: "HcclProcessGroup"
    _fut: Optional[Future]

    def wait(self, timeout: Any = None) -> bool:
        seconds = getattr(timeout, "total_seconds", lambda: 0.0)()
        try:
            done = self._handle.wait(seconds if seconds > 0 else None)
        except CommError as e:
            raise RuntimeError(f"{BACKEND}: {self._call}: {e}") from None
        if not done:
            raise RuntimeError(f"{BACKEND}: {self._call}: not done within {seconds:g} s")
        return True

    def get_future(self) -> Future:
        if self._fut is None:
            self._fut = Future()
            self._pg._complete_later(self)
        return self._fut

    def is_completed(self) -> bool:
        return bool(self._handle.done())

    def is_success(self) -> bool:
        if not self._handle.done():
            return False
        try:
            return bool(self._handle.wait(0.0))
        except CommError:
            return False

    def result(self) -> Any:
        return self._result


class _Completer:
    """The completion thread of a process group: sets the future of each queued call once it
    has run, in call order (the calls run in that order too).

    Not a daemon: a daemon thread still inside ``set_result`` (C++) when the interpreter
    finalizes is ended mid-call, and the process aborts ("terminate called without an
    active exception", seen with DDP). It stops when the process group goes away or when
    the interpreter begins to exit (``threading``'s exit hooks run before it joins its
    threads): queued calls still not done then get an error rather than hold the exit."""

    def __init__(self, rank: int) -> None:
        self.works: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self.stopping = False
        threading.Thread(target=self._run, name=f"hccl-aot-futures-rank{rank}").start()
        register = getattr(threading, "_register_atexit", None)
        if register is not None:
            try:
                register(self.stop)
            except RuntimeError:  # the interpreter is exiting already
                self.stop()

    def stop(self) -> None:
        if not self.stopping:
            self.stopping = True
            self.works.put(None)

    def _run(self) -> None:
        while True:
            work = self.works.get()
            if work is None:
                return
            try:
                while not work._handle.wait(0.05):
                    if self.stopping:
                        raise CommError("not done when the process group stopped")
            except CommError as e:
                work._fut.set_exception(RuntimeError(f"{BACKEND}: {work._call}: {e}"))
            else:
                work._fut.set_result(work._result)


class HcclProcessGroup(dist.ProcessGroup):
    """The process group ``init_process_group("hccl_aot")`` makes (see the module docs)."""

    def __init__(self, store: Any, rank: int, world_size: int, timeout: Any) -> None:
        super().__init__(rank, world_size)
        import os

        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        if rank == 0:
            store.set("hccl_aot_addr", f"{host}:{Communicator.free_port()}")
        addr = store.get("hccl_aot_addr").decode()
        plan = _plan
        if isinstance(plan, str) and plan == "host":
            from .core import Plan, Topology, compile

            if rank == 0:
                store.set("hccl_aot_plan", compile(Topology.host(world_size)).to_ron())
            plan = Plan.from_ron(store.get("hccl_aot_plan").decode())
        self._comm = Communicator.connect(rank, world_size, addr, plan=plan)
        self._native = self._comm._native
        self._world = world_size
        # Completes the futures of queued calls (see `_Completer`), made on first use.
        self._completer: Optional[_Completer] = None
        self._queue = _queue_async(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))

    # ----- helpers -----
    def _tensor(self, t: Any, call: str) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{BACKEND}: {call} expects tensors, got {type(t).__name__}")
        if not t.is_cpu:
            raise RuntimeError(f"{BACKEND}: {call}: tensor on {t.device}; this backend runs on CPU")
        if not t.is_contiguous():
            raise RuntimeError(f"{BACKEND}: {call}: the tensor is not contiguous (call .contiguous())")
        return t

    def _dtype(self, t: torch.Tensor, call: str) -> str:
        name = _DTYPES.get(t.dtype)
        if name is None:
            raise RuntimeError(
                f"{BACKEND}: {call}: element type {t.dtype} is not supported (float32, float64, "
                "float16, bfloat16, int8, uint8, int32, int64)"
            )
        return name

    def _one(self, tensors: List[Any], call: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise RuntimeError(f"{BACKEND}: {call} takes one tensor per process, got {len(tensors)}")
        return self._tensor(tensors[0], call)

    def _run(self, call: str, coll: str, out: torch.Tensor, inp: Optional[torch.Tensor] = None,
             op: str = "sum", root: int = 0, counts: Any = None, queued: bool = False) -> Any:
        """Runs one collective to the end on this thread (the GIL released); or, ``queued``,
        queues it to the communicator's thread, holding its tensors until it has run, and
        returns its handle."""
        dtype = self._dtype(out, call)
        if inp is not None:
            if inp.dtype != out.dtype:
                raise RuntimeError(f"{BACKEND}: {call}: input is {inp.dtype}, output {out.dtype}")
            if inp.data_ptr() == out.data_ptr() and inp.numel() == out.numel():
                inp = None
        try:
            return self._native.call(queued, coll, op, dtype, out.data_ptr(), out.numel(),
                                     None if inp is None else inp.data_ptr(), 0 if inp is None else inp.numel(),
                                     root, counts, keep=(out, inp) if queued else None)
        except CommError as e:
            raise RuntimeError(f"{BACKEND}: {call}: {e}") from None

    def _pending(self, handle: Any, result: Any, call: str) -> _Pending:
        work = _Pending()
        work._handle, work._result, work._call, work._pg, work._fut = handle, result, call, self, None
        return work

    def _complete_later(self, work: _Pending) -> None:
        """Completes ``work``'s future once the call has run: now if it has, else from the
        completion thread (started on first use)."""
        fut = work._fut
        if work._handle.done():
            try:
                work._handle.wait()
            except CommError as e:
                fut.set_exception(RuntimeError(f"{BACKEND}: {work._call}: {e}"))
            else:
                fut.set_result(work._result)
            return
        if self._completer is None:
            self._completer = _Completer(self.rank())
            weakref.finalize(self, self._completer.stop)
        self._completer.works.put(work)

    def _async(self, opts: Any) -> bool:
        """Whether this call is queued (see :func:`_queue_async`)."""
        return self._queue and opts is not None and bool(opts.asyncOp)

    # ----- collectives -----
    # Each runs to the end before it returns (the work it returns, if any, is complete): a blocking
    # call on this thread costs a few microseconds, and the order of calls is the order the
    # ranks make them, as the compiled plans require.
    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        # The per-call path of every training step: the checks of `_one`, `_tensor`, `_dtype`
        # and `_op` inlined for the common case (one contiguous CPU tensor of a supported
        # dtype, SUM), each attribute read once; anything else takes the general path, which
        # raises the precise error. A blocking call gets no work back (see `_done`).
        if opts is not None and len(tensors) == 1:
            t = tensors[0]
            if isinstance(t, torch.Tensor) and t.is_cpu and t.is_contiguous():
                dtype = _DTYPES.get(t.dtype)
                op = opts.reduceOp
                if dtype is not None and op == _SUM:
                    if opts.asyncOp and self._queue:
                        return self._pending(self._run("all_reduce", "allreduce", t, queued=True),
                                             tensors, "all_reduce")
                    try:
                        self._native.call(False, "allreduce", "sum", dtype, t.data_ptr(), t.numel(),
                                          None, 0, 0, None)
                    except CommError as e:
                        raise RuntimeError(f"{BACKEND}: all_reduce: {e}") from None
                    return _done(tensors, opts)
        t = self._one(tensors, "all_reduce")
        queued = self._async(opts)
        handle = self._run("all_reduce", "allreduce", t, op=_op(opts, "all_reduce"), queued=queued)
        return self._pending(handle, tensors, "all_reduce") if queued else _done(tensors, opts)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        # Queued calls run in order: the last one's end is the end of them all.
        op = _op(opts, "all_reduce_coalesced")
        queued, handle = self._async(opts), None
        for t in tensors:
            handle = self._run("all_reduce_coalesced", "allreduce",
                               self._tensor(t, "all_reduce_coalesced"), op=op, queued=queued)
        if handle is not None:
            return self._pending(handle, tensors, "all_reduce_coalesced")
        return _done(tensors, opts)

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None) -> Any:
        t = self._one(input_tensors, "all_gather")
        outs = output_tensors[0]
        if len(outs) != self._world or any(o.numel() != t.numel() or o.dtype != t.dtype for o in outs):
            raise RuntimeError(
                f"{BACKEND}: all_gather needs {self._world} outputs of {t.numel()} {t.dtype} elements each "
                "(uneven sizes: gather them as one tensor with padding, or use all_to_all_single)"
            )
        flat = torch.empty(self._world * t.numel(), dtype=t.dtype)
        self._run("all_gather", "allgather", flat, t)
        for i, o in enumerate(outs):
            o.copy_(flat[i * t.numel():(i + 1) * t.numel()].view_as(o))
        return _done(output_tensors, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        o, i = self._tensor(output, "all_gather_into_tensor"), self._tensor(input, "all_gather_into_tensor")
        if o.numel() != i.numel() * self._world:
            raise RuntimeError(f"{BACKEND}: all_gather_into_tensor: output has {o.numel()} elements, "
                               f"needs {self._world} x {i.numel()}")
        queued = self._async(opts)
        handle = self._run("all_gather_into_tensor", "allgather", o, i, queued=queued)
        return self._pending(handle, [output], "all_gather_into_tensor") if queued else _done([output], opts)

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> Any:
        work = None
        for o, i in zip(outputs, inputs):
            work = self.all_gather_single(o, i, opts)
        if isinstance(work, _Pending):
            work._result, work._call = outputs, "all_gather_into_tensor_coalesced"
            return work
        return _done(outputs, opts)

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any = None) -> Any:
        for outs, i in zip(output_lists, inputs):
            self.allgather([outs], [i], opts)
        return _done(output_lists, opts)

    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any = None) -> Any:
        out = self._one(output_tensors, "reduce_scatter")
        ins = input_lists[0]
        if len(ins) != self._world or any(i.numel() != out.numel() or i.dtype != out.dtype for i in ins):
            raise RuntimeError(f"{BACKEND}: reduce_scatter needs {self._world} inputs shaped like the output")
        flat = torch.cat([i.reshape(-1) for i in ins])
        self._run("reduce_scatter", "reducescatter", out, flat, op=_op(opts, "reduce_scatter"))
        return _done(output_tensors, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        o, i = self._tensor(output, "reduce_scatter_tensor"), self._tensor(input, "reduce_scatter_tensor")
        if i.numel() != o.numel() * self._world:
            raise RuntimeError(f"{BACKEND}: reduce_scatter_tensor: input has {i.numel()} elements, "
                               f"needs {self._world} x {o.numel()}")
        queued = self._async(opts)
        handle = self._run("reduce_scatter_tensor", "reducescatter", o, i,
                           op=_op(opts, "reduce_scatter_tensor"), queued=queued)
        return self._pending(handle, [output], "reduce_scatter_tensor") if queued else _done([output], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> Any:
        work = None
        for o, i in zip(outputs, inputs):
            work = self.reduce_scatter_single(o, i, opts)
        if isinstance(work, _Pending):
            work._result, work._call = outputs, "reduce_scatter_tensor_coalesced"
            return work
        return _done(outputs, opts)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        t = self._one(tensors, "broadcast")
        queued = self._async(opts)
        handle = self._run("broadcast", "broadcast", t, root=int(getattr(opts, "rootRank", 0)), queued=queued)
        return self._pending(handle, tensors, "broadcast") if queued else _done(tensors, opts)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        t = self._one(tensors, "reduce")
        queued = self._async(opts)
        handle = self._run("reduce", "reduce", t, op=_op(opts, "reduce"),
                           root=int(getattr(opts, "rootRank", 0)), queued=queued)
        return self._pending(handle, tensors, "reduce") if queued else _done(tensors, opts)

    def alltoall(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> Any:
        if len(outputs) != self._world or len(inputs) != self._world:
            raise RuntimeError(f"{BACKEND}: all_to_all needs {self._world} inputs and outputs")
        send = torch.cat([self._tensor(i, "all_to_all").reshape(-1) for i in inputs])
        recv = torch.empty(sum(o.numel() for o in outputs), dtype=send.dtype)
        sc, rc = [i.numel() for i in inputs], [o.numel() for o in outputs]
        if len(set(sc)) == 1 and sc == rc:
            self._run("all_to_all", "alltoall", recv, send)
        else:
            self._run("all_to_all", "alltoallv", recv, send, counts=_counts(sc, rc))
        off = 0
        for o in outputs:
            o.copy_(recv[off:off + o.numel()].view_as(o))
            off += o.numel()
        return _done(outputs, opts)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Optional[List[int]] = None,
                          input_split_sizes: Optional[List[int]] = None, opts: Any = None) -> Any:
        o, i = self._tensor(output, "all_to_all_single"), self._tensor(input, "all_to_all_single")
        queued = self._async(opts)
        if not output_split_sizes and not input_split_sizes:
            handle = self._run("all_to_all_single", "alltoall", o, i, queued=queued)
        else:
            w = self._world
            row_in = i[0].numel() if i.dim() > 0 and i.shape[0] else 1
            row_out = o[0].numel() if o.dim() > 0 and o.shape[0] else 1
            isz = list(input_split_sizes) if input_split_sizes else [i.shape[0] // w] * w
            osz = list(output_split_sizes) if output_split_sizes else [o.shape[0] // w] * w
            handle = self._run("all_to_all_single", "alltoallv", o, i,
                               counts=_counts([s * row_in for s in isz], [s * row_out for s in osz]),
                               queued=queued)
        return self._pending(handle, [output], "all_to_all_single") if queued else _done([output], opts)

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> Any:
        t = torch.zeros(1, dtype=torch.int32)
        self._run("barrier", "allreduce", t)
        return _done([t], opts)

    send = _unsupported("send", "use all_to_all_single with split sizes, or a Gloo group for point-to-point")
    recv = _unsupported("recv", "use all_to_all_single with split sizes, or a Gloo group for point-to-point")
    recv_anysource = _unsupported("recv", "use a Gloo group for point-to-point")
    gather = _unsupported("gather", "use all_gather (every rank gets the result)")
    scatter = _unsupported("scatter", "use broadcast, or all_to_all_single")

    def getBackendName(self) -> str:
        return BACKEND

    # c10d names a group through its C++ backend, which a process group written in Python
    # does not have: keep the name here (DeviceMesh, FSDP2 and DTensor look it up).
    def _set_group_name(self, name: str) -> None:
        self._group_name = name
        try:
            super()._set_group_name(name)
        except Exception:
            pass

    @property
    def group_name(self) -> str:
        name = getattr(self, "_group_name", None)
        if name is None:
            return dist.distributed_c10d._world.pg_names[self]
        return name

    def size(self) -> int:
        return self._world

    @property
    def communicator(self) -> Communicator:
        """The :class:`hccl.Communicator` underneath (straggler report, plan hash)."""
        return self._comm

    def __repr__(self) -> str:
        return f"HcclProcessGroup(rank={self.rank()}, world_size={self._world})"


def _create(store: Any, rank: int, world_size: int, timeout: Any) -> HcclProcessGroup:
    return HcclProcessGroup(store, rank, world_size, timeout)


if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
