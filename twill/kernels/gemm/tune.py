"""The GEMM's cost hooks for the tuner (:mod:`twill.tune.space`, :mod:`twill.tune.predict`): its problem, its
default sweep, the shared memory of its persistent form and which CTAs of a wave read the same A and B tiles."""

from __future__ import annotations

import math
from typing import Any

from twill.ir.graph import LoopGraph

#: The problem the GEMM is tuned for (:data:`twill.tune.predict.PROBLEMS`).
PROBLEM = "gemm"

#: Default sweep on Hopper (:func:`twill.tune.space.default_axes`).
DEFAULT_AXES: dict[str, tuple[Any, ...]] = {
    "block_m": (64, 128, 256), "block_n": (64, 128, 256), "block_k": (64, 128), "warps": (4, 8),
    "streaming_depth": (2, 3, 4, 5), "persistent": (False, True)}


def gemm_tile(tile: int, num_m: int, num_n: int) -> tuple[int, int]:
    """(row, column) of GEMM output tile ``tile`` in the generated kernels' grouped order: ``GROUP_M`` rows
    of tiles at a time, down the rows first (``tile_offsets`` in twill/kernels/gemm/gluon.py)."""
    from twill.kernels.gemm.gluon import GROUP_M

    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows = min(num_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % rows, (tile % per_group) // rows


def shared_readers(graph: LoopGraph, shape: Any, wave: int, tiles: int) -> dict[str, float]:
    """Role -> CTAs of a wave of ``wave`` that read each of its tiles at the same loop step: an A tile is read
    by the CTAs on its row of output tiles, a B tile by those on its column (grouped order, :func:`gemm_tile`)."""
    attrs = graph.attrs
    num_m, num_n = math.ceil(shape["M"] / attrs["block_m"]), math.ceil(shape["N"] / attrs["block_n"])
    coords = [gemm_tile(t, num_m, num_n) for t in range(wave)]
    return {"load_a": wave / len({m for m, _ in coords}), "load_b": wave / len({n for _, n in coords})}


def persistent_staging(graph: LoopGraph) -> int:
    """Shared memory a persistent GEMM's C staging buffer takes at least, live with the rings: the
    ``block_m × block_n`` fp16/bf16 tile over the most column slices the generator stores it in
    (docs/codegen.md, "Persistent GEMM")."""
    from twill.kernels.gemm.plan import EPILOGUE_SPLITS

    return int(graph.attrs["block_m"]) * int(graph.attrs["block_n"]) * 2 // max(EPILOGUE_SPLITS)
