"""A ``torch.distributed`` backend that runs compiled plans: ``import hccl.torch`` registers it.

    import torch.distributed as dist, hccl.torch
    dist.init_process_group("hccl_aot")          # under torchrun; HCCL_PLAN=job.plan.ron picks the plan

The name is ``hccl_aot`` (ahead-of-time compiled hccl): ``"hccl"`` is Huawei's (``torch_npu``).
It runs on CPU tensors. It implements all_reduce, all_gather and all_gather_into_tensor,
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
    """The plan (an :class:`hccl.Plan` or a plan file's path) process groups made from now on
    run; ``HCCL_PLAN`` still overrides it."""
    global _plan
    _plan = plan


_OPS = {
    dist.ReduceOp.SUM: "sum",
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


def _unsupported(call: str, instead: str) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{BACKEND}: {call} is not supported: compiled plans hold collectives only; {instead}"
        )

    method.__name__ = call
    return method


class _Work(_C10dWork):
    """A call in flight: ``wait()`` raises what the call raised (c10d's own future-backed work
    would return ``True`` and drop it), ``get_future()`` is what DDP's hooks chain on."""

    def __init__(self, fut: Future, result: Any) -> None:
        super().__init__()
        self._fut = fut
        self._result = result

    def wait(self, timeout: Any = None) -> bool:
        self._fut.wait()
        return True

    def get_future(self) -> Future:
        return self._fut

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        if not self._fut.done():
            return False
        try:
            self._fut.wait()
            return True
        except Exception:
            return False

    def result(self) -> Any:
        return self._result


class _Completer:
    """Completes each call's future once the communicator has finished it, in order, on a
    thread of its own (so DDP's hooks see asynchronous work)."""

    def __init__(self) -> None:
        self._q: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._t = threading.Thread(target=self._run, name="hccl-aot-completer", daemon=True)
        self._t.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            works, fut, result, after = item
            try:
                for w in works:
                    w.wait()
                if after is not None:
                    after()
                fut.set_result(result)
            except BaseException as e:  # the future carries it to whoever waits
                fut.set_exception(RuntimeError(f"{BACKEND}: {e}") if not isinstance(e, CommError) else e)

    def submit(self, works: List[Any], result: Any, after: Optional[Callable[[], None]] = None) -> Any:
        fut: Future = Future()
        self._q.put((works, fut, result, after))
        return _Work(fut, result)

    def close(self) -> None:
        self._q.put(None)


class HcclProcessGroup(dist.ProcessGroup):
    """The process group ``init_process_group("hccl_aot")`` makes (see the module docs)."""

    def __init__(self, store: Any, rank: int, world_size: int, timeout: Any) -> None:
        super().__init__(rank, world_size)
        import os

        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        if rank == 0:
            store.set("hccl_aot_addr", f"{host}:{Communicator.free_port()}")
        addr = store.get("hccl_aot_addr").decode()
        self._comm = Communicator.connect(rank, world_size, addr, plan=_plan)
        self._done = _Completer()
        self._world = world_size

    # ----- helpers -----
    def _tensor(self, t: Any, call: str) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{BACKEND}: {call} expects tensors, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise RuntimeError(f"{BACKEND}: {call}: tensor on {t.device}; this backend runs on CPU")
        if not t.is_contiguous():
            raise RuntimeError(f"{BACKEND}: {call}: the tensor is not contiguous (call .contiguous())")
        if t.dtype == torch.bool or t.is_complex():
            raise RuntimeError(f"{BACKEND}: {call}: element type {t.dtype} is not supported")
        return t

    def _one(self, tensors: List[Any], call: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise RuntimeError(f"{BACKEND}: {call} takes one tensor per process, got {len(tensors)}")
        return self._tensor(tensors[0], call)

    def _wrap(self, fn: Callable[[], Any], call: str) -> Any:
        try:
            return fn()
        except CommError as e:
            raise RuntimeError(f"{BACKEND}: {call}: {e}") from e

    # ----- collectives -----
    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        t = self._one(tensors, "all_reduce")
        op = _op(opts, "all_reduce")
        w = self._wrap(lambda: self._comm.all_reduce(t, op=op, async_op=True), "all_reduce")
        return self._done.submit([w], tensors)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        op = _op(opts, "all_reduce_coalesced")
        ws = [self._wrap(lambda t=t: self._comm.all_reduce(self._tensor(t, "all_reduce_coalesced"), op=op, async_op=True),
                         "all_reduce_coalesced") for t in tensors]
        return self._done.submit(ws, tensors)

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None) -> Any:
        t = self._one(input_tensors, "all_gather")
        outs = output_tensors[0]
        if len(outs) != self._world or any(o.numel() != t.numel() or o.dtype != t.dtype for o in outs):
            raise RuntimeError(
                f"{BACKEND}: all_gather needs {self._world} outputs of {t.numel()} {t.dtype} elements each "
                "(uneven sizes: gather them as one tensor with padding, or use all_to_all_single)"
            )
        flat = torch.empty(self._world * t.numel(), dtype=t.dtype)
        w = self._wrap(lambda: self._comm.all_gather(t, flat, async_op=True), "all_gather")

        def scatter_out() -> None:
            for i, o in enumerate(outs):
                o.copy_(flat[i * t.numel():(i + 1) * t.numel()].view_as(o))

        return self._done.submit([w], output_tensors, scatter_out)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        o, i = self._tensor(output, "all_gather_into_tensor"), self._tensor(input, "all_gather_into_tensor")
        w = self._wrap(lambda: self._comm.all_gather(i, o, async_op=True), "all_gather_into_tensor")
        return self._done.submit([w], [output])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> Any:
        ws = [self._wrap(lambda o=o, i=i: self._comm.all_gather(self._tensor(i, "all_gather_into_tensor"),
                                                                self._tensor(o, "all_gather_into_tensor"), async_op=True),
                         "all_gather_into_tensor") for o, i in zip(outputs, inputs)]
        return self._done.submit(ws, outputs)

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any = None) -> Any:
        works = [self.allgather([outs], [i], opts) for outs, i in zip(output_lists, inputs)]
        for w in works[:-1]:
            w.wait()
        return works[-1] if works else self._done.submit([], output_lists)

    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any = None) -> Any:
        out = self._one(output_tensors, "reduce_scatter")
        ins = input_lists[0]
        if len(ins) != self._world or any(i.numel() != out.numel() or i.dtype != out.dtype for i in ins):
            raise RuntimeError(f"{BACKEND}: reduce_scatter needs {self._world} inputs shaped like the output")
        flat = torch.cat([i.reshape(-1) for i in ins])
        op = _op(opts, "reduce_scatter")
        w = self._wrap(lambda: self._comm.reduce_scatter(flat, out, op=op, async_op=True), "reduce_scatter")
        return self._done.submit([w], output_tensors)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        o, i = self._tensor(output, "reduce_scatter_tensor"), self._tensor(input, "reduce_scatter_tensor")
        op = _op(opts, "reduce_scatter_tensor")
        w = self._wrap(lambda: self._comm.reduce_scatter(i, o, op=op, async_op=True), "reduce_scatter_tensor")
        return self._done.submit([w], [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> Any:
        op = _op(opts, "reduce_scatter_tensor")
        ws = [self._wrap(lambda o=o, i=i: self._comm.reduce_scatter(self._tensor(i, "reduce_scatter_tensor"),
                                                                    self._tensor(o, "reduce_scatter_tensor"), op=op, async_op=True),
                         "reduce_scatter_tensor") for o, i in zip(outputs, inputs)]
        return self._done.submit(ws, outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        t = self._one(tensors, "broadcast")
        root = int(getattr(opts, "rootRank", 0))
        w = self._wrap(lambda: self._comm.broadcast(t, root=root, async_op=True), "broadcast")
        return self._done.submit([w], tensors)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        t = self._one(tensors, "reduce")
        root = int(getattr(opts, "rootRank", 0))
        op = _op(opts, "reduce")
        w = self._wrap(lambda: self._comm.reduce(t, root=root, op=op, async_op=True), "reduce")
        return self._done.submit([w], tensors)

    def alltoall(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> Any:
        if len(outputs) != self._world or len(inputs) != self._world:
            raise RuntimeError(f"{BACKEND}: all_to_all needs {self._world} inputs and outputs")
        dtype = inputs[0].dtype
        send = torch.cat([self._tensor(i, "all_to_all").reshape(-1) for i in inputs])
        recv = torch.empty(sum(o.numel() for o in outputs), dtype=dtype)
        sc, rc = [i.numel() for i in inputs], [o.numel() for o in outputs]
        if len(set(sc)) == 1 and sc == rc:
            w = self._wrap(lambda: self._comm.all_to_all(send, recv, async_op=True), "all_to_all")
        else:
            w = self._wrap(lambda: self._comm.all_to_all_v(send, sc, recv, rc, async_op=True), "all_to_all")

        def scatter_out() -> None:
            off = 0
            for o in outputs:
                o.copy_(recv[off:off + o.numel()].view_as(o))
                off += o.numel()

        return self._done.submit([w], outputs, scatter_out)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Optional[List[int]] = None,
                          input_split_sizes: Optional[List[int]] = None, opts: Any = None) -> Any:
        o, i = self._tensor(output, "all_to_all_single"), self._tensor(input, "all_to_all_single")
        if not output_split_sizes and not input_split_sizes:
            w = self._wrap(lambda: self._comm.all_to_all(i, o, async_op=True), "all_to_all_single")
        else:
            row_in = i[0].numel() if i.dim() > 0 and i.shape[0] else 1
            row_out = o[0].numel() if o.dim() > 0 and o.shape[0] else 1
            w_ = self._world
            isz = list(input_split_sizes) if input_split_sizes else [i.shape[0] // w_] * w_
            osz = list(output_split_sizes) if output_split_sizes else [o.shape[0] // w_] * w_
            sc, rc = [s * row_in for s in isz], [s * row_out for s in osz]
            w = self._wrap(lambda: self._comm.all_to_all_v(i, sc, o, rc, async_op=True), "all_to_all_single")
        return self._done.submit([w], [output])

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> Any:
        t = torch.zeros(1, dtype=torch.int32)
        w = self._wrap(lambda: self._comm.all_reduce(t, async_op=True), "barrier")
        return self._done.submit([w], [t])

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
