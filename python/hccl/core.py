"""Topologies, compiled plans and their tables: everything ``hcclc`` does, from Python.

The native module (``hccl._hccl``) does the work with the GIL released; this module gives it
documented classes. Structured results (rows, summaries, reports) are decoded from the same
JSON that ``hcclc --json`` prints, so both front ends say the same thing.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from . import _hccl
from ._hccl import CompileError, PlanError, TopologyError, VerifyError

PathLike = Union[str, "os.PathLike[str]"]
Sizes = Union[None, int, str, Iterable[Union[int, str]]]

__all__ = [
    "Topology",
    "Plan",
    "Row",
    "Table",
    "Trace",
    "compile",
    "topology",
    "sizes",
    "trace_svg",
]


def _write_atomic(path: PathLike, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file and a rename: a failure leaves
    whatever was there before, never half a file."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def sizes(spec: Sizes = None) -> List[int]:
    """Message sizes in bytes from the forms the command line takes.

    ``None`` gives the default 1 KiB to 4 GiB; ``"1K..1G"`` every power of two in the range;
    ``"16M"`` or ``4096`` one size; a list of ints or strings those sizes (sorted, deduplicated).
    ``K``, ``M``, ``G`` are powers of 1024.
    """
    if spec is None:
        return _hccl.geometric_sizes(1 << 10, 4 << 30)
    if isinstance(spec, bool):
        raise TypeError("sizes: expected an int, a string such as '1K..1G', or a list of them")
    if isinstance(spec, int):
        if spec < 1:
            raise CompileError(f"bad size {spec}: sizes are at least 1 byte")
        return [spec]
    if isinstance(spec, str):
        if ".." in spec:
            lo, hi = spec.split("..", 1)
            return _hccl.geometric_sizes(_hccl.parse_bytes(lo), _hccl.parse_bytes(hi))
        one = _hccl.parse_bytes(spec)
        if one < 1:
            raise CompileError(f"bad size {spec!r}: sizes are at least 1 byte")
        return [one]
    try:
        items = list(spec)
    except TypeError:
        raise TypeError(
            f"sizes: expected an int, a string such as '1K..1G', or a list of them, got {type(spec).__name__}"
        ) from None
    out: List[int] = []
    for item in items:
        out.extend(sizes(item))
    if not out:
        raise CompileError("no message sizes given")
    return sorted(set(out))


# `sizes` under another name, for functions whose parameter of that name hides it.
_sizes = sizes


def _names(value: Union[None, str, Iterable[str]], what: str) -> Optional[List[str]]:
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    try:
        out = [str(v) for v in value]
    except TypeError:
        raise TypeError(f"{what}: expected a string or a list of strings") from None
    return out


class Topology:
    """A machine: devices, hosts, NICs, switches and the links between them.

    Load one with :meth:`load` (a RON file or a shipped machine's name), generate one
    (:meth:`ring`, :meth:`torus`, :meth:`cluster`, :meth:`host`) or :meth:`detect` this
    machine. In a notebook it shows as its picture.
    """

    __slots__ = ("_native", "notes", "_summary", "_rank_links")

    def __init__(self, native: "_hccl.Topology", notes: Sequence[str] = ()) -> None:
        if not isinstance(native, _hccl.Topology):
            raise TypeError("use Topology.load(), a generator or hccl.topology() to make a Topology")
        self._native = native
        #: What :meth:`detect` found and assumed, one line per fact (empty otherwise).
        self.notes: List[str] = list(notes)
        self._summary: Optional[Dict[str, Any]] = None
        self._rank_links: Optional[List[Dict[str, Any]]] = None

    # ----- making one -----
    @classmethod
    def load(cls, spec: PathLike) -> "Topology":
        """A topology file (RON) or a shipped machine by name (``"dgx1-v100"``)."""
        if not isinstance(spec, (str, os.PathLike)):
            raise TypeError(f"Topology.load: expected a path or a name, got {type(spec).__name__}")
        return cls(_hccl.Topology.load(os.fspath(spec)))

    @classmethod
    def from_ron(cls, text: str, origin: str = "<string>") -> "Topology":
        """A topology from RON text; ``origin`` names it in error messages."""
        return cls(_hccl.Topology.from_ron(text, origin))

    @classmethod
    def shipped(cls, name: str) -> "Topology":
        """A shipped machine by name (see :meth:`shipped_names`)."""
        if name not in _hccl.Topology.shipped_names():
            raise TopologyError(
                f"unknown shipped topology {name!r} (shipped: {', '.join(_hccl.Topology.shipped_names())})"
            )
        return cls(_hccl.Topology.load(name))

    @staticmethod
    def shipped_names() -> List[str]:
        """Names of the machines shipped with hccl."""
        return list(_hccl.Topology.shipped_names())

    @classmethod
    def ring(cls, ranks: int, bw: float, latency: float) -> "Topology":
        """``ranks`` devices in a ring of links of ``bw`` GB/s and ``latency`` µs."""
        return cls(_hccl.Topology.ring(ranks, bw, latency))

    @classmethod
    def torus(cls, dims: Sequence[int], bw: float, latency: float) -> "Topology":
        """A 1-3 dimensional torus, e.g. ``dims=(4, 4)``."""
        return cls(_hccl.Topology.torus(list(dims), bw, latency))

    @classmethod
    def cluster(cls, nodes: int, box: Union["Topology", PathLike]) -> "Topology":
        """``nodes`` copies of ``box`` (a topology with NICs, or its name) joined by a switch."""
        return cls(_hccl.Topology.cluster(nodes, topology(box)._native))

    @classmethod
    def host(
        cls,
        ranks: int,
        mem_bw: Optional[float] = None,
        nic_bw: Optional[float] = None,
        nic_latency: Optional[float] = None,
    ) -> "Topology":
        """``ranks`` CPU ranks on this machine; memory bandwidth measured unless ``mem_bw``
        (GB/s per rank) is given; with ``nic_bw`` a NIC, making it a box for :meth:`cluster`."""
        return cls(_hccl.Topology.host(ranks, mem_bw, nic_bw, nic_latency))

    @classmethod
    def detect(
        cls, sysfs: PathLike = "/sys", name: Optional[str] = None, mem_bw: Optional[float] = None
    ) -> "Topology":
        """This machine: CPUs, NUMA nodes and NICs from sysfs, GPUs and NVLink from
        ``nvidia-smi``. What was found and assumed is in :attr:`notes`."""
        native, notes = _hccl.Topology.detect(os.fspath(sysfs), name, mem_bw)
        return cls(native, notes)

    # ----- looking at it -----
    @property
    def name(self) -> str:
        return self._native.name

    @property
    def description(self) -> str:
        return self._native.description

    @property
    def hash(self) -> str:
        """Hash of the canonical spec (what plans record as ``topology_hash``)."""
        return self._native.hash

    @property
    def nranks(self) -> int:
        return self._native.nranks

    @property
    def calibration(self) -> Dict[str, Any]:
        """Which calibration predictions for this topology use (``hcclc compile --json``'s
        ``calibration``): ``kind`` ``own`` (measured for it; ``source`` says where and when),
        ``built-in`` (the development machine's default) or ``none`` (the model's nominal
        figures); ``how_to_calibrate`` for the last two. Tables print it as their last line."""
        return json.loads(self._native.calibration)

    @property
    def nhosts(self) -> int:
        return self._native.nhosts

    @property
    def summary(self) -> Dict[str, Any]:
        """``hcclc topo show --json``: hosts, devices, NICs, switches, links, per-rank
        injection bandwidth, the rank-to-rank bandwidth matrix, bisection, hop diameter."""
        if self._summary is None:
            self._summary = json.loads(self._native.summary_json())
        return self._summary

    @property
    def hosts(self) -> List[Dict[str, Any]]:
        """Per host: its id and ranks."""
        return self.summary["hosts"]

    @property
    def devices(self) -> Dict[str, int]:
        """Device count per ``"Kind model"`` label."""
        return self.summary["devices"]

    @property
    def links(self) -> List[Dict[str, Any]]:
        """Link groups: kind, bandwidth (GB/s per direction), latency (µs), count."""
        return self.summary["links"]

    @property
    def bandwidth_matrix(self) -> List[List[float]]:
        """Max-flow bandwidth (GB/s) from each rank to each other rank."""
        return self.summary["bw_matrix"]

    @property
    def injection_bw(self) -> List[float]:
        """Per rank, the bandwidth (GB/s) of the links leaving it."""
        return self.summary["injection_bw"]

    @property
    def rank_links(self) -> List[Dict[str, Any]]:
        """Direct links between ranks (no switch or NIC on the way), one per direction ``a →
        b``: ``kind`` (``"NvLink"``, ``"Pcie"``, …), ``bw`` (GB/s, all parallel links),
        ``latency`` (µs), ``count``. Listed up to 4096 ranks."""
        if self._rank_links is None:
            self._rank_links = json.loads(self._native.rank_links_json())
        return self._rank_links

    def neighbors(self, rank: int) -> List[int]:
        """The ranks ``rank`` has a direct link to."""
        return sorted({l["b"] for l in self.rank_links if l["a"] == rank})

    def svg(self) -> str:
        """The machine as an SVG picture (``hcclc topo show --svg``)."""
        return self._native.svg()

    def _repr_svg_(self) -> str:
        return self.svg()

    def dot(self) -> str:
        """The machine as a Graphviz graph."""
        return self._native.dot()

    def to_ron(self) -> str:
        """The topology as RON, as :meth:`load` reads it."""
        return self._native.to_ron()

    def save(self, path: PathLike) -> None:
        """Writes :meth:`to_ron` to ``path`` atomically."""
        _write_atomic(path, self.to_ron())

    def __repr__(self) -> str:
        return repr(self._native)


def topology(spec: Union[Topology, PathLike]) -> Topology:
    """A :class:`Topology` as given, or loaded from a RON path or a shipped machine's name."""
    if isinstance(spec, Topology):
        return spec
    return Topology.load(spec)


@dataclass(frozen=True)
class Row:
    """One size of a table: what runs there, how fast, against NCCL's choice and the bound.

    Times are microseconds, bandwidths GB/s (1e9 bytes/s), sizes bytes in the nccl-tests
    convention; ``speedup`` is NCCL's time over ours (> 1: faster than NCCL's choice),
    ``bound_ratio`` ours over the lower bound (>= 1).
    """

    collective: str
    bytes: int
    algorithm: str
    channels: int
    chunks: int
    protocol: str
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    baseline_algorithm: Optional[str]
    baseline_protocol: Optional[str]
    baseline_us: Optional[float]
    baseline_source: Optional[str]
    speedup: Optional[float]
    bound_us: float
    bound_ratio: float
    synthesis: Optional[Dict[str, Any]] = None

    @classmethod
    def _from_json(cls, d: Dict[str, Any]) -> "Row":
        d = dict(d)
        d["time_us"] = d.pop("predicted_us")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class Table(List[Row]):
    """Rows, printable as ``hcclc``'s table, convertible to a DataFrame."""

    def __init__(self, rows: Iterable[Row] = (), text: Optional[str] = None) -> None:
        super().__init__(rows)
        self._text = text

    def to_pandas(self) -> Any:
        """The rows as a ``pandas.DataFrame`` (needs pandas: ``pip install hccl[pandas]``)."""
        try:
            import pandas  # type: ignore[import-not-found]
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("Table.to_pandas() needs pandas: pip install pandas") from e
        return pandas.DataFrame([asdict(r) for r in self])

    def to_dicts(self) -> List[Dict[str, Any]]:
        """The rows as plain dictionaries (JSON-ready)."""
        return [asdict(r) for r in self]

    def __str__(self) -> str:
        if self._text is not None:
            return self._text
        head = f"{'collective':<14}{'size':>8} {'algorithm':<22}{'proto':<7}{'time_us':>11}{'busbw':>9}{'nccl_us':>11}{'speedup':>9}{'/bound':>8}"
        lines = [head]
        for r in self:
            lines.append(
                f"{r.collective:<14}{_human(r.bytes):>8} {r.algorithm:<22}{r.protocol:<7}{r.time_us:>11.2f}"
                f"{r.busbw_gbps:>9.2f}{_opt(r.baseline_us):>11}{_opt(r.speedup, 'x'):>9}{r.bound_ratio:>8.2f}"
            )
        return "\n".join(lines) + "\n"


def _human(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _opt(x: Optional[float], suffix: str = "") -> str:
    return "-" if x is None else f"{x:.2f}{suffix}"


def _rows(text: str) -> List[Row]:
    return [Row._from_json(d) for d in json.loads(text)]


@dataclass(frozen=True)
class Trace:
    """The predicted timeline of one call (:meth:`Plan.trace`).

    ``json`` is a Chrome trace-event document (open it in Perfetto or chrome://tracing), ``svg``
    the same timeline as a picture, ``summary`` what it shows (collective, algorithm,
    protocol, bytes, predicted_us, steps, segments, links).
    """

    json: str
    summary: Dict[str, Any]
    svg: str

    def save(self, path: PathLike) -> None:
        """Writes the trace-event JSON to ``path`` atomically."""
        _write_atomic(path, self.json)

    def save_svg(self, path: PathLike) -> None:
        _write_atomic(path, self.svg)

    def _repr_svg_(self) -> str:
        return self.svg


def trace_svg(path: PathLike, title: Optional[str] = None) -> str:
    """A trace file as an SVG picture (``hcclc trace show``): a predicted one
    (:meth:`Plan.trace`) or one a job measured (``HCCL_TRACE=DIR``, joined by
    ``hcclc trace merge``); a row per stream of each rank, a bar per step."""
    path = os.fspath(path)
    return _hccl.trace_svg(path, title if title is not None else Path(path).name)


class Plan:
    """Verified schedules and the message sizes each serves: what ``hcclc compile`` writes and
    a training job loads. Compile one with :func:`compile`, :meth:`load` a file, or import
    an MSCCL algorithm with :meth:`from_msccl_xml`."""

    __slots__ = ("_native", "rows", "skipped", "warnings", "_path")

    def __init__(
        self,
        native: "_hccl.Plan",
        rows: Optional[Table] = None,
        skipped: Sequence[str] = (),
        warnings: Sequence[str] = (),
        path: Optional[str] = None,
    ) -> None:
        if not isinstance(native, _hccl.Plan):
            raise TypeError("use hccl.compile(), Plan.load() or Plan.from_msccl_xml() to make a Plan")
        self._native = native
        #: The compile's table (for a plan from :func:`compile`), else ``None``.
        self.rows: Optional[Table] = rows
        #: Collectives a compile left out, each with why.
        self.skipped: List[str] = list(skipped)
        #: What the MSCCL importer warned about (for :meth:`from_msccl_xml`).
        self.warnings: List[str] = list(warnings)
        self._path = path

    @classmethod
    def load(cls, path: PathLike) -> "Plan":
        """A plan file (RON), or an MSCCL algorithm by its ``.xml`` extension."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"Plan.load: expected a path, got {type(path).__name__}")
        return cls(_hccl.Plan.load(os.fspath(path)), path=os.fspath(path))

    @classmethod
    def from_ron(cls, text: str, origin: str = "<string>") -> "Plan":
        """A plan from its RON text; ``origin`` names it in error messages."""
        return cls(_hccl.Plan.from_ron(text, origin))

    @classmethod
    def builtin(cls, world_size: int) -> "Plan":
        """The executor's built-in plans for ``world_size`` ranks: what a
        :class:`hccl.Communicator` runs when given no plan (hand-written rings, chains and
        all-pairs schedules that know nothing of the machine)."""
        if isinstance(world_size, bool) or not isinstance(world_size, int):
            raise TypeError("world_size: expected an int")
        return cls(_hccl.Plan.builtin(world_size))

    @classmethod
    def from_msccl_xml(cls, source: Union[str, "os.PathLike[str]"]) -> "Plan":
        """An MSCCL algorithm (what msccl-tools writes), from a path or from XML text."""
        if isinstance(source, os.PathLike) or (
            isinstance(source, str) and not source.lstrip().startswith("<")
        ):
            path = os.fspath(source)
            try:
                text = Path(path).read_text(encoding="utf-8")
            except OSError as e:
                raise PlanError(f"{path}: cannot read MSCCL algorithm: {e.strerror or e}") from None
            except UnicodeDecodeError as e:
                raise PlanError(f"{path}: not a text file (invalid UTF-8 at byte {e.start})") from None
            native, warnings = _hccl.Plan.from_msccl_xml(text, path)
            return cls(native, warnings=warnings, path=path)
        if not isinstance(source, str):
            raise TypeError("Plan.from_msccl_xml: expected a path or XML text")
        native, warnings = _hccl.Plan.from_msccl_xml(source, "<string>")
        return cls(native, warnings=warnings)

    def save(self, path: PathLike) -> None:
        """Writes the plan file atomically (nothing half-written if it fails)."""
        self._native.save(os.fspath(path))

    def to_ron(self) -> str:
        """The plan file's text (RON), as :meth:`save` writes it."""
        return self._native.to_ron()

    @property
    def hash(self) -> str:
        """Hash of the plan's content: equal plans, equal hashes (what ``hcclc`` prints)."""
        return self._native.hash

    @property
    def topology(self) -> str:
        """The name of the topology the plan was compiled for."""
        return self._native.topology

    @property
    def topology_hash(self) -> str:
        return self._native.topology_hash

    @property
    def entries(self) -> List[Dict[str, Any]]:
        """Per entry: collective, root, min_bytes, max_bytes, algorithm, protocol, nranks,
        chunks, channels, steps, in_place and the schedule's hash."""
        return json.loads(self._native.entries_json())

    def __len__(self) -> int:
        return len(self._native)

    def verify(self) -> List[Dict[str, Any]]:
        """Proves every entry implements its collective and cannot deadlock. Returns each
        entry's report (streams, steps, messages, depth, …); raises :class:`VerifyError`
        naming the entry, rank, stream and step otherwise (``.errors`` lists them)."""
        ok, text = self._native.verify()
        data = json.loads(text)
        if ok:
            return data
        lines = []
        for failed in data:
            for e in failed["errors"]:
                lines.append(f"entry {failed['entry']} ({failed['collective']} {failed['algorithm']}): {e['text']}")
        err = VerifyError("\n".join(lines[:20]) + (f"\n… {len(lines) - 20} more" if len(lines) > 20 else ""))
        err.errors = data  # type: ignore[attr-defined]
        raise err

    def _topo(self, topo: Union[None, Topology, PathLike]) -> Topology:
        if topo is not None:
            return topology(topo)
        if self.topology in Topology.shipped_names():
            return Topology.shipped(self.topology)
        raise PlanError(
            f"the plan's topology {self.topology!r} is not a shipped machine: pass topo="
        )

    def explain(self, topo: Union[None, Topology, PathLike] = None, sizes: Sizes = None) -> Table:
        """``hcclc explain``: per collective and size, the entry that runs, its predicted time
        and bandwidth, NCCL's choice and the lower bound. ``topo`` defaults to the plan's
        own (when it is a shipped machine)."""
        t = self._topo(topo)
        rows, text = self._native.explain(t._native, _sizes(sizes), self._path or "<plan>")
        return Table(_rows(rows), text=text)

    def plot(self, topo: Union[None, Topology, PathLike] = None, sizes: Sizes = None) -> str:
        """The explained rows as an SVG chart of bus bandwidth against size."""
        t = self._topo(topo)
        return self._native.plot(t._native, _sizes(sizes), Path(self._path or "plan").name)

    def trace(
        self,
        size: Union[int, str],
        topo: Union[None, Topology, PathLike] = None,
        collective: Optional[str] = None,
        links: int = 8,
        path: Optional[PathLike] = None,
    ) -> Trace:
        """The predicted timeline of one call of ``size`` bytes (``hcclc explain --trace``);
        written to ``path`` when given. ``collective`` picks one when the plan has several."""
        t = self._topo(topo)
        (nbytes,) = _sizes(size)
        text, summary, svg = self._native.trace(
            t._native, nbytes, collective, links, self._path or "<plan>"
        )
        trace = Trace(text, json.loads(summary), svg)
        if path is not None:
            trace.save(path)
        return trace

    def to_msccl_xml(self, entry: int = 0, path: Optional[PathLike] = None) -> str:
        """Entry ``entry`` as MSCCL XML (``hcclc export --to msccl-xml``); written to ``path``
        when given. Limits of MSCCL's runtime the file exceeds are printed as warnings."""
        xml, warnings = self._native.to_msccl_xml(entry)
        for w in warnings:
            print(f"hccl: warning: {w}", file=sys.stderr)
        if path is not None:
            _write_atomic(path, xml)
        return xml

    def __repr__(self) -> str:
        return repr(self._native)


def _progress_bar() -> Callable[[str, int, int, int, int], None]:
    # Candidates costed over those generated, summed over the collectives reported so far
    # (small machines compile them side by side, so reports of several interleave).
    state = {"last": ""}
    seen: Dict[str, Tuple[int, int]] = {}

    def show(collective: str, done: int, total: int, cdone: int, ctotal: int) -> None:
        seen[collective] = (done, total)
        done = sum(d for d, _ in seen.values())
        total = sum(t for _, t in seen.values())
        width = 30
        filled = width * done // total if total else width
        line = f"\r{collective:>14} [{'=' * filled}{' ' * (width - filled)}] {done}/{total} {cdone}/{ctotal} collectives done"
        if line != state["last"]:
            sys.stderr.write(line)
            sys.stderr.flush()
            state["last"] = line

    return show


def compile(
    topo: Union[Topology, PathLike],
    collectives: Union[None, str, Iterable[str]] = None,
    sizes: Sizes = None,
    algo: Union[None, str, Iterable[str]] = None,
    proto: Union[None, str, Iterable[str]] = None,
    synth: str = "auto",
    candidates: Iterable[Any] = (),
    sim_budget: Optional[int] = None,
    progress: Union[None, bool, Callable[[str, int, int, int, int], None]] = None,
    cache: bool = True,
) -> Plan:
    """Compiles ``topo`` as ``hcclc compile`` does and returns the verified :class:`Plan`
    (its table in ``plan.rows``).

    ``collectives``: names (default all six); ``sizes``: ``"1K..1G"``, one size or a list
    (default 1K..4G); ``algo``: only these algorithm names may win; ``proto``: protocols (LL,
    LL128, Simple); ``synth``: ``"off"``, ``"auto"`` or ``"full"``; ``candidates``: extra
    algorithms that compete (:class:`hccl.Algorithm` objects, plans, or MSCCL XML / plan
    paths); ``sim_budget``: steps simulated per candidate; ``progress``: ``True`` for a bar on
    stderr, or a callable ``(collective, done, total, collectives_done, collectives_total)``;
    ``cache``: read and write the caches in ``$HCCL_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/hccl``, else ``~/.cache/hccl``, as ``hcclc compile`` does unless
    ``--no-cache``: the synthesis cache (solver results kept between compiles) and the plan
    cache (a compile of the same topology with the same arguments by the same build reads
    its plan back, without searching or calling ``progress``); the plan is the same either
    way.

    The GIL is released while the search runs; Ctrl-C stops it (``KeyboardInterrupt``).
    """
    t = topology(topo)
    natives = []
    for c in candidates:
        if isinstance(c, Plan):
            natives.append(c._native)
        elif isinstance(c, (str, os.PathLike)):
            natives.append(Plan.load(c)._native)
        elif hasattr(c, "to_plan"):
            natives.append(c.to_plan()._native)
        else:
            raise TypeError(
                f"candidates: expected hccl.Algorithm, hccl.Plan or a path, got {type(c).__name__}"
            )
    if sim_budget is not None and (not isinstance(sim_budget, int) or sim_budget < 1):
        raise CompileError(f"sim_budget must be a positive int, got {sim_budget!r}")
    callback: Optional[Callable[[str, int, int, int, int], None]]
    if progress is True:
        callback = _progress_bar()
    elif progress in (None, False):
        callback = None
    elif callable(progress):
        callback = progress
    else:
        raise TypeError("progress: expected None, True or a callable")
    try:
        native, rows, text, skipped = _hccl.compile(
            t._native,
            _names(collectives, "collectives"),
            _sizes(sizes),
            _names(algo, "algo"),
            _names(proto, "proto"),
            synth,
            natives,
            sim_budget,
            callback,
            bool(cache),
        )
    finally:
        if progress is True:
            sys.stderr.write("\r" + " " * 80 + "\r")
            sys.stderr.flush()
    return Plan(native, rows=Table(_rows(rows), text=text), skipped=skipped)
