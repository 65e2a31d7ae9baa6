"""The GEMM's kernel plan: the generic vocabulary of :mod:`twill.codegen.plan` plus the GEMM's decisions.

* **Partitions.** One compute partition (the group of the ``mma`` and its ``mma_wait``) and the producer.
* **Rings.** ``a`` and ``b``, released by the ``mma_wait`` (the asynchronous MMA reads its operands until it
  is waited for); rings of equal depth share one barrier pair (``ab``).
* **Stages.** ``mma_lag = stage(mma_wait) - stage(mma)`` MMA groups stay in flight.
* **Persistence** (a code-generator choice, ``persistent``): the schedule is the steady state of one output
  tile's K loop either way; a persistent kernel launches at most one CTA per SM and walks its tiles in the same
  grouped order, with one ring running over (tile, k). The rings and the C staging buffer are then live
  together and must fit the machine's shared memory per block; when the whole tile does not, it is staged in
  two column halves (``epilogue_split`` 2), and when that does not fit either, refused.

Both are the plan's :class:`GemmDecisions`.
"""

from __future__ import annotations

from dataclasses import dataclass

from twill.codegen.plan import (KernelPlan, Ring, check_roles, check_schedule, make_partitions, make_plan,
                                ops_with_role, retire_wait, ring_depth, ring_waits, shared_barriers, unsupported)
from twill.errors import UnsupportedFeatureError
from twill.kernels.gemm import FAMILY, ROLES
from twill.machine.models import get_machine
from twill.schedule.result import Schedule


@dataclass(frozen=True)
class GemmDecisions:
    """The GEMM's own decisions (:attr:`KernelPlan.decisions <twill.codegen.plan.KernelPlan.decisions>`).

    Attributes:
        mma_lag: wgmma groups left in flight, ``stage(mma_wait) - stage(mma)``.
        epilogue_split: persistent kernel: column slices the C tile is stored in through one staging buffer of
            ``block_n / epilogue_split`` columns (1, or 2 when rings + the whole tile overflow shared memory).
    """

    mma_lag: int
    epilogue_split: int = 1


def plan(schedule: Schedule, backend: str, persistent: bool = False) -> KernelPlan:
    """Plan of the GEMM kernel (``persistent``: one CTA per SM walking output tiles); see the module docstring
    for each decision."""
    check_schedule(schedule, backend)
    graph = schedule.graph
    check_roles(graph, ROLES, backend)
    mmas, waits = ops_with_role(graph, "mma"), ops_with_role(graph, "mma_wait")
    if len(mmas) != 1 or len(waits) != 1:
        raise unsupported(backend, "a sub-tiled GEMM (several mma ops) is")
    mma, wait = mmas[0], waits[0]
    lag = schedule.stage(wait) - schedule.stage(mma)
    if lag < 0:
        raise UnsupportedFeatureError(f"cannot generate: mma_wait scheduled a stage before its mma ({lag})")
    if schedule.assignment[wait] != schedule.assignment[mma]:
        raise unsupported(backend, "mma_wait in another warp group than its mma")
    parts = make_partitions(schedule, [mma], {mma: 0}, backend)
    rings = []
    for load_role, name in (("load_a", "a"), ("load_b", "b")):
        (load,) = ops_with_role(graph, load_role)
        depth, why = ring_depth(schedule, load, wait)
        if depth < lag + 1:
            raise UnsupportedFeatureError(f"cannot generate: ring {name} depth {depth} < wgmma wait lag + 1")
        rings.append(Ring(name, load, (mma,), wait, depth, why, name))
    rings, barriers = shared_barriers(rings, 1)
    attrs = graph.op(mma).attrs
    tile = {"block_m": int(graph.attrs.get("block_m", attrs.get("m", 128))),
            "block_n": int(graph.attrs.get("block_n", attrs.get("n", 128))),
            "block_k": int(graph.attrs.get("block_k", attrs.get("k", 64)))}
    if tile["block_m"] != 64 * (parts[0].num_warps // 4) and tile["block_m"] % (16 * parts[0].num_warps):
        raise UnsupportedFeatureError(f"cannot generate: block_m {tile['block_m']} not divisible over "
                                      f"{parts[0].num_warps} wgmma warps")
    split = _epilogue_split(schedule, tile, rings, backend) if persistent else 1
    all_waits = ring_waits(graph, rings) + [retire_wait(graph, mma)]
    return make_plan(schedule, FAMILY.name, backend, tile=tile, partitions=parts, rings=tuple(rings),
                     barriers=barriers, waits=tuple(all_waits), persistent=persistent,
                     decisions=GemmDecisions(mma_lag=lag, epilogue_split=split))


#: Column slices a persistent GEMM may store its C tile in, tried in order (the first that fits is used).
EPILOGUE_SPLITS = (1, 2)


def persistent_smem(tile: dict[str, int], depths: list[int], split: int) -> int:
    """Shared-memory bytes of a persistent GEMM: the A and B rings (``depths``) and the C staging buffer of
    ``block_n / split`` columns, live together (the compute partition stores tile t while the producer fills
    the rings for tile t + 1), plus the ready/empty barriers (8 bytes each)."""
    esize = 2  # fp16 / bf16 bytes
    bm, bn, bk = tile["block_m"], tile["block_n"], tile["block_k"]
    rings = depths[0] * bm * bk * esize + depths[1] * bk * bn * esize
    return rings + bm * (bn // split) * esize + 2 * 8 * max(depths)


def _epilogue_split(schedule: Schedule, tile: dict[str, int], rings: list[Ring], backend: str) -> int:
    """The first of :data:`EPILOGUE_SPLITS` whose staging buffer fits beside the rings in the machine's shared
    memory per block; a one-line refusal when none does."""
    capacity = get_machine(schedule.arch).smem_per_block
    depths = [r.depth for r in rings]
    for split in EPILOGUE_SPLITS:
        need = persistent_smem(tile, depths, split)
        if need <= capacity:
            return split
    raise UnsupportedFeatureError(
        f"cannot generate: a persistent GEMM keeps its A/B rings and a C staging buffer (at least 1/"
        f"{EPILOGUE_SPLITS[-1]} of the tile) in shared memory together, {need} bytes, more than the {capacity} "
        f"of {schedule.arch} (tile {tile['block_m']}x{tile['block_n']}x{tile['block_k']}, ring depths "
        f"{'/'.join(map(str, depths))}; {backend} backend); use a smaller --streaming-depth or tile, or the "
        f"non-persistent kernel")
