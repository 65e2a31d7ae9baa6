"""Loop-graph IR: ops with resource reservation tables, dependence edges, builder, JSON format."""

from twill.ir.builder import GraphBuilder, rrt_from_uses
from twill.ir.graph import Edge, LoopGraph, Op
from twill.ir.io import GRAPH_FORMAT, graph_from_dict, graph_to_dict, load_graph, save_graph
from twill.ir.validate import effective_units, validate_graph, zero_distance_cycle

__all__ = ["Edge", "GRAPH_FORMAT", "GraphBuilder", "LoopGraph", "Op", "effective_units", "graph_from_dict",
           "graph_to_dict", "load_graph", "rrt_from_uses", "save_graph", "validate_graph", "zero_distance_cycle"]
