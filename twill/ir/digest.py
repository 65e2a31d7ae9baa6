"""The digest of a loop graph: what a schedule records of the graph it was solved for (``graph_digest`` in
``twill-schedule/1``), so that a schedule is never applied to another configuration of the kernel.

The digest covers the graph's name, units, every op (kind, cycles and resource table, latency, registers,
warps, footprint, spill cost; not the op's free-form ``attrs``), every edge (delay, distance, blocking) and
the graph's attributes, which for a Triton kernel hold its ``tl.constexpr`` values, ``num_warps`` and
``num_stages``. Where the loop sits in its source file (:data:`LOCATION_ATTRS`) is left out: moving the loop
in its file does not change the loop.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Mapping

from twill.ir.graph import LoopGraph

#: Graph attributes that say where the loop is written, not what it is: not part of the digest.
LOCATION_ATTRS = frozenset({"loop_index", "loop_line", "loop_source"})
#: Graph attributes of a Triton kernel's compiled configuration besides its constexprs.
CONFIG_ATTRS = ("num_warps", "num_stages")


def graph_digest(graph: LoopGraph) -> str:
    """The SHA-256 (64 hex digits) of ``graph`` as the module docstring says."""
    from twill.ir.io import graph_to_dict

    doc = graph_to_dict(graph)
    payload = {"name": doc["name"], "units": doc.get("units"),
               "ops": [{k: v for k, v in op.items() if k != "attrs"} for op in doc["ops"]],
               "edges": doc["edges"],
               "attrs": {k: v for k, v in doc.get("attrs", {}).items() if k not in LOCATION_ATTRS}}
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def configuration(attrs: Mapping[str, Any], constexprs: Iterable[str]) -> dict[str, Any]:
    """The compiled configuration recorded in a Triton kernel graph's ``attrs``: the value of each of
    ``constexprs`` (the frontend stores them under the lower-case name; None when absent), then ``num_warps``
    and ``num_stages``."""
    out = {name: attrs.get(name.lower()) for name in constexprs}
    out.update((k, attrs.get(k)) for k in CONFIG_ATTRS)
    return out


def configuration_text(config: Mapping[str, Any]) -> str:
    """``BLOCK_M=64 BLOCK_N=64 num_warps=4`` (settings that are None left out)."""
    return " ".join(f"{k}={v}" for k, v in config.items() if v is not None) or "no recorded configuration"
