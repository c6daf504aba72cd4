"""A chunk-level language for writing collective algorithms.

An :class:`Algorithm` is a list of ops on chunks, recorded in the order you write them::

    a = Algorithm("allgather", ranks=4)
    for r in range(4):
        c = a.chunk(r, Buffer.input, 0).copy(r, Buffer.output, r)    # own block, local copy
        for hop in range(3):
            c = c.copy((r + hop + 1) % 4, Buffer.output, r)           # around the ring
    a.verify()                      # proves it; an error names the line above that is wrong
    a.cost("dgx1-v100", "1K..1G")   # predicted time, busbw, bound and NCCL ratios per size

The semantics are the IR's, with nothing hidden (``ARCHITECTURE.md``, "The IR"):

- The collective buffer is cut into ``chunks`` chunks; each rank has an input, an output and a
  scratch buffer of chunks (MSCCL's conventions: AllGather's input is ``chunks / ranks``
  chunks, ReduceScatter's output likewise; ``in_place`` aliases them as NCCL does).
- :meth:`Ref.copy` between ranks is a send on the source and a receive on the destination over
  the connection ``(src, dst, ch)``, a FIFO; on one rank it is a local copy.
  :meth:`Ref.reduce` is a send and a receive-reduce-copy (``dst ← dst ⊕ src``).
- Each rank runs its ops in the order written: write them step-major (every rank's first
  step, then the second, …) and pipeline by cutting blocks into more chunks.
- Streams (MSCCL's thread blocks) are assigned per connection direction, as the IR requires,
  with the dependencies that the reads and writes imply; a receive that is forwarded
  unchanged becomes one receive-copy-send (``fusion=False`` turns that off). The low-level
  ops (:meth:`Algorithm.send`, :meth:`Algorithm.recv`, :meth:`Algorithm.recv_reduce_copy`, …)
  write one side of a transfer each, exactly as the IR has them. :meth:`Algorithm.programs`
  shows what was built.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _hccl
from ._hccl import AlgorithmError, VerifyError
from .core import Plan, Sizes, Table, Topology, _rows, _sizes, _write_atomic, topology

__all__ = ["Algorithm", "Buffer", "Ref"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall")


class Buffer:
    """The three buffers of a rank (strings ``"input"``, ``"output"``, ``"scratch"`` work too)."""

    input = "input"
    output = "output"
    scratch = "scratch"


def _buffer(b: Any) -> str:
    if b in ("input", "output", "scratch"):
        return b
    raise _fail(f"unknown buffer {b!r}: use Buffer.input, Buffer.output or Buffer.scratch")


def _fail(message: str) -> AlgorithmError:
    """An AlgorithmError at the author's line that called into the language."""
    filename, lineno = _caller()
    err = AlgorithmError(f"{filename}:{lineno}: {message}{_source(filename, lineno)}")
    err.filename, err.lineno = filename, lineno  # type: ignore[attr-defined]
    return err


def _int(x: Any, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{what}: expected an int, got {type(x).__name__}")
    return x


def _caller() -> Tuple[str, int]:
    """The file and line of the author's code that called into this module."""
    f = sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _PACKAGE_DIR:
        f = f.f_back
    if f is None:  # pragma: no cover - always called from user code
        return ("<unknown>", 0)
    return (f.f_code.co_filename, f.f_lineno)


@dataclass(frozen=True)
class Ref:
    """``count`` consecutive chunks of one rank's buffer, from chunk ``index`` on."""

    algorithm: "Algorithm"
    rank: int
    buffer: str
    index: int
    count: int = 1

    def copy(
        self,
        rank: Union[int, "Ref"],
        buffer: Optional[str] = None,
        index: Optional[int] = None,
        ch: int = 0,
    ) -> "Ref":
        """Copies these chunks to ``rank``'s ``buffer`` at ``index`` (default: the same
        buffer and index), or to the chunks ``rank`` refers to when it is a :class:`Ref`.
        Another rank: a send here and a receive there over channel ``ch``. Returns the
        destination."""
        dst = self._dst(rank, buffer, index)
        self.algorithm._record("copy", self.rank, dst.rank, -1, self, dst, ch)
        return dst

    def reduce(self, other: "Ref", ch: int = 0) -> "Ref":
        """``self ← self ⊕ other``: ``other``'s rank sends, this rank receives and reduces (a
        local reduce when both are on one rank). Returns ``self``."""
        if not isinstance(other, Ref):
            raise TypeError(f"reduce: expected a Ref, got {type(other).__name__}")
        if other.count != self.count:
            raise _fail(
                f"reduce: {other.count} chunks into {self.count}: the counts must be equal"
            )
        self.algorithm._record("reduce", other.rank, self.rank, -1, other, self, ch)
        return self

    def split(self, parts: int) -> List["Ref"]:
        """The chunks cut into ``parts`` equal runs."""
        parts = _int(parts, "parts")
        if parts < 1 or self.count % parts:
            raise _fail(f"cannot split {self.count} chunks into {parts} equal parts")
        n = self.count // parts
        return [Ref(self.algorithm, self.rank, self.buffer, self.index + k * n, n) for k in range(parts)]

    def _dst(self, rank: Union[int, "Ref"], buffer: Optional[str], index: Optional[int]) -> "Ref":
        if isinstance(rank, Ref):
            if buffer is not None or index is not None:
                raise TypeError("copy: give a destination Ref or (rank, buffer, index), not both")
            if rank.count != self.count:
                raise _fail(f"copy: {self.count} chunks onto {rank.count}: the counts must be equal")
            return rank
        return Ref(
            self.algorithm,
            _int(rank, "rank"),
            _buffer(self.buffer if buffer is None else buffer),
            self.index if index is None else _int(index, "index"),
            self.count,
        )

    def __repr__(self) -> str:
        span = f"{self.index}" if self.count == 1 else f"{self.index}..{self.index + self.count}"
        return f"Ref(rank {self.rank}, {self.buffer}[{span}])"


@dataclass(frozen=True)
class _Op:
    code: str
    rank: int
    a: int
    b: int
    src: Optional[Ref]
    dst: Optional[Ref]
    ch: int
    where: Tuple[str, int]

    def tuple(self) -> Tuple[str, int, int, int, str, int, str, int, int, int]:
        s, d = self.src, self.dst
        count = (s or d).count if (s or d) else 0
        return (
            self.code,
            self.rank,
            self.a,
            self.b,
            s.buffer if s else "input",
            s.index if s else 0,
            d.buffer if d else "input",
            d.index if d else 0,
            count,
            self.ch,
        )


class Algorithm:
    """A collective algorithm written at the level of chunks (see the module docs).

    ``collective``: ``"allreduce"``, ``"allgather"``, ``"reducescatter"``, ``"broadcast"``,
    ``"reduce"`` or ``"alltoall"``; ``ranks``: how many; ``chunks``: how many chunks the whole
    collective buffer is cut into (default ``ranks``); ``in_place``: written for overlapping
    input and output; ``root``: of Broadcast and Reduce; ``name``: what tables and plans call
    it; ``fusion``: fuse a receive that is forwarded unchanged into one op.
    """

    def __init__(
        self,
        collective: str,
        ranks: int,
        chunks: Optional[int] = None,
        *,
        in_place: bool = False,
        root: int = 0,
        name: Optional[str] = None,
        fusion: bool = True,
    ) -> None:
        if collective not in COLLECTIVES:
            raise _fail(f"unknown collective {collective!r} (known: {', '.join(COLLECTIVES)})")
        self.collective = collective
        self.ranks = _int(ranks, "ranks")
        self.chunks = self.ranks if chunks is None else _int(chunks, "chunks")
        if self.ranks < 1 or self.chunks < 1:
            raise _fail("an algorithm needs at least one rank and one chunk")
        self.in_place = bool(in_place)
        self.root = _int(root, "root")
        self.name = name or f"custom_{collective}"
        self.fusion = bool(fusion)
        self._ops: List[_Op] = []
        self._built: Optional[Any] = None
        #: The file and line that created the algorithm (errors with no step of their own point here).
        self.defined_at = _caller()

    # ----- writing it -----
    def chunk(self, rank: int, buffer: str, index: int, count: int = 1) -> Ref:
        """A :class:`Ref` to ``count`` chunks of ``rank``'s ``buffer`` from ``index`` on."""
        return Ref(self, _int(rank, "rank"), _buffer(buffer), _int(index, "index"), _int(count, "count"))

    def input(self, rank: int, index: int, count: int = 1) -> Ref:
        """``chunk(rank, Buffer.input, index, count)``."""
        return self.chunk(rank, Buffer.input, index, count)

    def output(self, rank: int, index: int, count: int = 1) -> Ref:
        """``chunk(rank, Buffer.output, index, count)``."""
        return self.chunk(rank, Buffer.output, index, count)

    def scratch(self, rank: int, index: int, count: int = 1) -> Ref:
        """Scratch chunks: the buffer grows to whatever the algorithm uses."""
        return self.chunk(rank, Buffer.scratch, index, count)

    def copy(self, src: Ref, dst: Ref, ch: int = 0) -> Ref:
        """``dst ← src`` (see :meth:`Ref.copy`)."""
        return src.copy(dst, ch=ch)

    def reduce(self, src: Ref, dst: Ref, ch: int = 0) -> Ref:
        """``dst ← dst ⊕ src`` (see :meth:`Ref.reduce`)."""
        return dst.reduce(src, ch=ch)

    def fence(self, rank: Optional[int] = None) -> None:
        """Ops written on ``rank`` (every rank when ``None``) after the fence wait for every op
        written there before it: rounds that must not overlap."""
        ranks = range(self.ranks) if rank is None else [_int(rank, "rank")]
        where = _caller()
        for r in ranks:
            self._ops.append(_Op("fence", r, -1, -1, None, None, 0, where))
        self._built = None

    # The IR's ops, one side of a transfer each.
    def send(self, src: Ref, to: int, ch: int = 0) -> None:
        """``src.rank`` sends ``src`` to ``to``."""
        self._record("send", src.rank, to, -1, src, None, ch)

    def recv(self, dst: Ref, frm: int, ch: int = 0) -> None:
        """``dst.rank``: ``dst ← received from frm``."""
        self._record("recv", dst.rank, frm, -1, dst, None, ch)

    def recv_reduce_copy(self, frm: int, src: Ref, dst: Ref, ch: int = 0) -> None:
        """``dst ← received ⊕ src`` (MSCCL ``rrc``)."""
        self._same_rank(src, dst)
        self._record("rrc", dst.rank, frm, -1, src, dst, ch)

    def recv_reduce_send(self, frm: int, to: int, src: Ref, ch: int = 0) -> None:
        """Sends ``received ⊕ src`` to ``to``, storing nothing (MSCCL ``rrs``)."""
        self._record("rrs", src.rank, frm, to, src, None, ch)

    def recv_reduce_copy_send(self, frm: int, to: int, src: Ref, dst: Ref, ch: int = 0) -> None:
        """``dst ← received ⊕ src``, then sends ``dst`` to ``to`` (MSCCL ``rrcs``)."""
        self._same_rank(src, dst)
        self._record("rrcs", dst.rank, frm, to, src, dst, ch)

    def recv_copy_send(self, frm: int, to: int, dst: Ref, ch: int = 0) -> None:
        """``dst ← received``, and forwards it to ``to`` (MSCCL ``rcs``)."""
        self._record("rcs", dst.rank, frm, to, dst, None, ch)

    @staticmethod
    def _same_rank(src: Ref, dst: Ref) -> None:
        if src.rank != dst.rank or src.count != dst.count:
            raise _fail("src and dst must be on one rank with equal counts")

    def _record(self, code: str, rank: int, a: int, b: int, src: Optional[Ref], dst: Optional[Ref], ch: int) -> None:
        for ref in (src, dst):
            if ref is not None and ref.algorithm is not self:
                raise _fail("a Ref of another Algorithm")
        for v, what in ((a, "peer"), (b, "peer"), (ch, "ch")):
            _int(v, what)
        if ch < 0:
            raise _fail(f"channel {ch} is negative")
        self._ops.append(_Op(code, rank, a, b, src, dst, ch, _caller()))
        self._built = None

    # ----- what it is -----
    def _build(self) -> Any:
        if self._built is None:
            if not self._ops:
                raise self._located(AlgorithmError, "no ops written", [])
            try:
                self._built = _hccl.build_algorithm(
                    self.collective,
                    self.root,
                    self.ranks,
                    self.chunks,
                    self.in_place,
                    self.fusion,
                    [op.tuple() for op in self._ops],
                )
            except AlgorithmError as e:
                message = e.args[0] if e.args else str(e)
                op = e.args[1] if len(e.args) > 1 else None
                if isinstance(op, int) and 0 <= op < len(self._ops):
                    raise self._located(AlgorithmError, message, [op]) from None
                raise self._located(AlgorithmError, message, []) from None
        return self._built

    def _located(self, cls: type, message: str, ops: Sequence[int]) -> Exception:
        if ops:
            filename, lineno = self._ops[ops[0]].where
        elif cls is VerifyError:
            # Nothing wrote what is wrong (a chunk never filled): the algorithm as a whole.
            filename, lineno = self.defined_at
            message = f"{self.name}: {message} (no op of this algorithm writes it)"
        else:
            filename, lineno = self.defined_at
            message = f"{self.name}: {message}"
        err = cls(f"{filename}:{lineno}: {message}{_source(filename, lineno)}")
        err.filename, err.lineno = filename, lineno  # type: ignore[attr-defined]
        return err

    def verify(self) -> Dict[str, Any]:
        """Proves the algorithm implements its collective and cannot deadlock, in the
        verifier that checks every compiled plan. Returns its report (streams, steps,
        messages, depth, …); raises :class:`hccl.VerifyError` whose message, ``filename`` and
        ``lineno`` point at the line of your code that made the first wrong step (``errors``
        lists every error, each with its ``where``)."""
        ok, text = self._build().verify()
        data = json.loads(text)
        if ok:
            return data
        for e in data:
            e["where"] = [list(self._ops[i].where) for i in e.get("ops", [])]
        # Report first the error whose op was written earliest: wrong data that correct code
        # forwards later shows up on several ranks, and the earliest op is where it came from.
        # (Errors of whole-schedule problems, with no op, come after those with one.)
        first = min(data, key=lambda e: min(e.get("ops") or [len(self._ops)]))
        more = f"\n({len(data) - 1} more errors in .errors)" if len(data) > 1 else ""
        err = self._located(VerifyError, first["text"] + more, first.get("ops", []))
        err.errors = data  # type: ignore[attr-defined]
        raise err

    def cost(
        self,
        topo: Union[Topology, str, "os.PathLike[str]"],
        sizes: Sizes = "1K..1G",
        proto: Union[None, str, Sequence[str]] = None,
    ) -> Table:
        """Per size: predicted time under the fastest protocol of ``proto`` (default all),
        bus bandwidth, the ratio to the lower bound and to NCCL's choice, in the compiler's own
        simulator. Verify first: the cost of a wrong algorithm means nothing."""
        t = topology(topo)
        protos = [proto] if isinstance(proto, str) else (None if proto is None else list(proto))
        rows, text = self._build().cost(t._native, _sizes(sizes), protos, self.name)
        return Table(_rows(rows), text=text)

    def to_plan(self, proto: str = "Simple", topology_name: str = "") -> Plan:
        """A plan of this algorithm for every size under ``proto`` (what :func:`hccl.compile`
        takes as a candidate; save it, or run it)."""
        return Plan(self._build().to_plan(self.name, proto, topology_name))

    def save(self, path: Union[str, "os.PathLike[str]"], proto: str = "Simple") -> None:
        """Writes :meth:`to_plan` as a plan file."""
        self.to_plan(proto).save(path)

    def to_msccl_xml(self, proto: str = "Simple", path: Optional[Union[str, "os.PathLike[str]"]] = None) -> str:
        """The algorithm as MSCCL XML (what MSCCL's runtime loads); written to ``path`` when
        given."""
        xml = self.to_plan(proto).to_msccl_xml(0)
        if path is not None:
            _write_atomic(path, xml)
        return xml

    def programs(self) -> List[Dict[str, Any]]:
        """What was built, per rank: scratch size and streams, each with its channel and
        steps (op mnemonic, peers, locations, count, dependencies, and ``ops``: indices of the
        ops you wrote that made it, see :meth:`where`)."""
        return json.loads(self._build().programs_json())

    def where(self, op: int) -> Tuple[str, int]:
        """The file and line that wrote op ``op``."""
        return self._ops[op].where

    @property
    def hash(self) -> str:
        """Hash of the built schedule (as plan files record it)."""
        return self._build().hash

    @property
    def steps(self) -> int:
        """Steps of the built schedule over all ranks."""
        return self._build().steps

    def __len__(self) -> int:
        return len(self._ops)

    def __repr__(self) -> str:
        return f"Algorithm({self.name!r}, {self.collective}, ranks={self.ranks}, chunks={self.chunks}, ops={len(self._ops)})"


def _source(filename: str, lineno: int) -> str:
    try:
        import linecache

        line = linecache.getline(filename, lineno).strip()
    except Exception:  # pragma: no cover
        line = ""
    return f"\n    {line}" if line else ""
