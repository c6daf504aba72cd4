"""hccl: collective-communication schedules compiled ahead of time for the machine you
describe, proven correct, and a chunk-level language to write new algorithms.

Everything ``hcclc`` does, from Python::

    import hccl
    plan = hccl.compile("dgx1-v100", collectives="allreduce", sizes="1K..1G")
    print(plan.rows)                      # algorithm, time, busbw, NCCL's choice, bound per size
    plan.save("dgx1.plan.ron")

and :class:`Algorithm` (``hccl.lang``) to write, verify and cost a new one. Errors are
:class:`Error` subclasses whose messages say where (file, line and field; or rank, stream and
step; or the line of your algorithm).
"""

from ._hccl import (
    AlgorithmError,
    CommError,
    CompileError,
    Error,
    PlanError,
    TopologyError,
    VerifyError,
    __version__,
)
from .comm import Communicator, Work
from .core import Plan, Row, Table, Topology, Trace, compile, sizes, topology, trace_svg
from .lang import Algorithm, Buffer, Ref

__all__ = [
    "Algorithm",
    "AlgorithmError",
    "Buffer",
    "CommError",
    "Communicator",
    "CompileError",
    "Error",
    "Plan",
    "PlanError",
    "Ref",
    "Row",
    "Table",
    "Topology",
    "TopologyError",
    "Trace",
    "VerifyError",
    "Work",
    "__version__",
    "compile",
    "sizes",
    "topology",
    "trace_svg",
]
