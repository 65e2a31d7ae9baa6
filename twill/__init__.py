"""Twill: optimal joint software pipelining and warp specialization for tensor-core GPUs.

Data flows one way: ``integrations`` (Triton, TileLang kernels) -> ``ir`` (loop graph) -> ``machine`` (costs,
units, limits) -> ``solve`` (normalize, modulo, joint) -> ``schedule`` (result, verifier, pipelined program) ->
``codegen``.
Solver modules import OR-Tools lazily, so code generation works on machines without it.
"""

from twill.errors import (FormatError, GraphError, InfeasibleScheduleError, MachineError, TwillError,
                          UnsupportedFeatureError, VerificationError)
from twill.ir import Edge, GraphBuilder, LoopGraph, Op, load_graph, save_graph
from twill.machine import Machine, get_machine
from twill.schedule import Schedule, WarpGroup

__version__ = "0.1.0"


def from_triton(fn, *, signature: str, constexprs=(), num_warps: int = 4, num_stages: int | None = None,
                arch: str = "h100", loop: int | str | None = None) -> LoopGraph:
    """Loop graph of a ``@triton.jit`` kernel's loop (``loop``: index or ``"line:N"``; needed when several
    loops hold dots, else the one that does), compiled on this CPU for ``arch`` (``h100``/``h200`` -> sm_90, ``b200`` ->
    sm_100). Needs ``triton==3.6.0``; see ``docs/triton.md``. :func:`loops_from_triton` gives every loop's."""
    from twill.integrations.triton import graph_from_function

    return graph_from_function(fn, signature=signature, constexprs=constexprs, num_warps=num_warps,
                               num_stages=num_stages, machine=arch, loop=loop)


def loops_from_triton(fn, *, signature: str, constexprs=(), num_warps: int = 4, num_stages: int | None = None,
                      arch: str = "h100") -> list[LoopGraph]:
    """The loop graph of every innermost loop of a ``@triton.jit`` kernel that holds a dot, in program order
    (each graph's ``loop_index`` attribute is the ``loop`` that :func:`from_triton` takes for it); the one
    innermost loop when none holds a dot. Same arguments as :func:`from_triton`."""
    from twill.integrations.triton import graphs_from_function

    return graphs_from_function(fn, signature=signature, constexprs=constexprs, num_warps=num_warps,
                                num_stages=num_stages, machine=arch)

__all__ = ["Edge", "FormatError", "GraphBuilder", "GraphError", "InfeasibleScheduleError", "LoopGraph",
           "Machine", "MachineError", "Op", "Schedule", "TwillError", "UnsupportedFeatureError",
           "VerificationError", "WarpGroup", "from_triton", "get_machine", "load_graph", "loops_from_triton",
           "save_graph", "__version__"]
