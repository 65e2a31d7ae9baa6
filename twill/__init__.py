"""Twill: optimal joint software pipelining and warp specialization for tensor-core GPUs.

Data flows one way: ``frontends`` -> ``ir`` (loop graph) -> ``machine`` (costs, units, limits) ->
``solve`` (normalize, modulo, joint) -> ``schedule`` (result, verifier, pipelined program) -> ``codegen``.
Solver modules import OR-Tools lazily, so code generation works on machines without it.
"""

from twill.errors import (FormatError, GraphError, InfeasibleScheduleError, MachineError, TwillError,
                          UnsupportedFeatureError, VerificationError)
from twill.ir import Edge, GraphBuilder, LoopGraph, Op, load_graph, save_graph
from twill.machine import Machine, get_machine
from twill.schedule import Schedule, WarpGroup

__version__ = "0.1.0"

__all__ = ["Edge", "FormatError", "GraphBuilder", "GraphError", "InfeasibleScheduleError", "LoopGraph",
           "Machine", "MachineError", "Op", "Schedule", "TwillError", "UnsupportedFeatureError",
           "VerificationError", "WarpGroup", "get_machine", "load_graph", "save_graph", "__version__"]
