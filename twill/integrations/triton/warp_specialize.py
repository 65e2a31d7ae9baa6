"""Write a warp-specialized schedule into a user's Triton kernel through Triton 3.6's own Hopper pass (sm_90).

Triton 3.6 warp-specializes a loop on sm_90 in ``NVGPUWarpSpecialization`` (Meta's automatic warp
specialization, ``add_hopper_warpspec``), which runs before the pipeliner. It partitions ops by their
``async_task_id`` attribute: task 0 is the producer (the ``default`` region of ``ttg.warp_specialize``), task
``k >= 1`` the consumer region ``partition{k-1}``. When the module already carries ``async_task_id``
attributes, the pass propagates them instead of choosing its own (docs/experiments/triton-warp-specialization.md
has the experiments). So the schedule's warp groups become Triton partitions by writing those attributes on
the loop's statements before the pass:

* the warp group that holds the loop's loads becomes task 0 (the producer);
* the one other warp group (the MMA group of a GEMM) becomes task 1, and so do the stores after the loop that
  write its result (the pass needs the epilogue's task to be given: without it Triton aborts);
* the ``ttg.local_alloc`` that receives a TMA load takes its consumer's task: the pass turns that edge into a
  ring of buffers with barriers. Other folded statements (index arithmetic) get no task: the pass propagates
  one to them, and a task written on the index arithmetic of the loads made it fail (``'arith.divui' op
  operand #0 must be signless-integer-like``, the ring counter built on the accumulator);
* the loop gets ``tt.warp_specialize``.

What stock Triton then decides, and Twill does not: every partition is one 4-warp group (the pass runs only
at ``num_warps = 4``), so the schedule's 1-warp load group runs on 4 warps; the rings are ``num_stages``
deep; the consumer's registers are the pass's ``requestedRegisters`` (232); and the pass sets
``tt.num_stages = 0`` on the loop, so no software pipelining runs inside a partition (each wgmma is waited
for before its buffers are released).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from twill.errors import TwillError, UnsupportedFeatureError
from twill.integrations.triton.compile import KernelSpec, compile_with_edit
from twill.integrations.triton.lower import LoweredLoop
from twill.integrations.triton.mlir import ForLoop, add_attribute
from twill.machine.models import Machine
from twill.schedule.result import Schedule
from twill.schedule.stages import LOAD_KINDS

#: The only ``num_warps`` at which Triton 3.6's Hopper warp specialization partitions a loop.
HOPPER_WS_WARPS = 4
#: The producer's ``async_task_id`` (the ``default`` region); the consumer is task 1 (``partition0``).
PRODUCER_TASK, CONSUMER_TASK = 0, 1
#: Ops after the loop that write its result out; they run in the consumer partition.
STORE_OPS = ("tt.store", "tt.descriptor_store", "tt.descriptor_reduce", "tt.atomic_rmw", "tt.atomic_cas")
_OP = re.compile(r"^\s*(?:%[\w#:]+(?:\s*,\s*%[\w#:]+)*\s*=\s*)?\"?([a-z_]+\.[\w.]+)")


@dataclass(frozen=True)
class PartitionPlan:
    """The partitions to write: ``tasks`` (body statement index -> ``async_task_id``) and, per task, the warp
    group of the schedule it comes from."""

    tasks: Mapping[int, int]
    groups: Mapping[int, int]


@dataclass(frozen=True)
class Partition:
    """One region of the compiled kernel's ``ttg.warp_specialize``: its name (``default``, ``partition0``),
    warps, and what it runs (``tma_load``: TMA copies into shared memory, ``mma``: wgmma)."""

    region: str
    num_warps: int
    runs: tuple[str, ...]


@dataclass(frozen=True)
class WarpSpecializedKernel:
    """A kernel compiled with a schedule's warp groups as Triton partitions.

    Attributes:
        kernel: Triton's ``CompiledKernel``.
        plan: the partitions that were written.
        annotated_ttgir: the TTGIR that entered Hopper's warp specialization, with the ``async_task_id``s.
        partitions: the regions of the final TTGIR (:func:`partitions_of`).
        requested_registers: the consumer regions' ``requestedRegisters``.
        setmaxnreg: the distinct ``setmaxnreg`` instructions of the PTX, ``("inc" | "dec", registers)``.
    """

    kernel: Any
    plan: PartitionPlan
    annotated_ttgir: str
    partitions: tuple[Partition, ...]
    requested_registers: tuple[int, ...]
    setmaxnreg: tuple[tuple[str, int], ...]

    def summary(self, schedule: Schedule) -> dict[str, Any]:
        """The JSON summary ``twill inject --ws`` prints: II, the partitions with the warp groups they come
        from, shared memory."""
        from twill.integrations.triton.inject import ii_cycles

        regions = {p.region: p for p in self.partitions}
        rows = []
        for task, group_id in sorted(self.plan.groups.items()):
            group = schedule.warps[group_id]
            region = regions.get("default" if task == PRODUCER_TASK else f"partition{task - 1}")
            row: dict[str, Any] = {"region": region.region if region else None, "async_task_id": task,
                                   "warp_group": group.id, "role": group.role, "ops": list(group.ops),
                                   "schedule_num_warps": group.num_warps, "schedule_regs": group.regs,
                                   "num_warps": region.num_warps if region else None,
                                   "runs": list(region.runs) if region else []}
            if task != PRODUCER_TASK and task - 1 < len(self.requested_registers):
                row["requested_registers"] = self.requested_registers[task - 1]
            rows.append(row)
        return {"kernel": self.kernel.name, "arch": schedule.arch, "loop": schedule.graph.attrs.get("loop_source"),
                "ii": schedule.ii, "ii_cycles": ii_cycles(schedule, schedule.ii), "status": schedule.status,
                "warp_specialized": True, "num_warps": int(self.kernel.metadata.num_warps),
                "shared_memory_bytes": int(self.kernel.metadata.shared), "partitions": rows,
                "setmaxnreg": [f"{kind} {regs}" for kind, regs in self.setmaxnreg]}


# -- the plan ----------------------------------------------------------------------------------------------
def plan_partitions(lowered: LoweredLoop, schedule: Schedule) -> PartitionPlan:
    """Tasks of the loop's statements from the schedule's warp groups: the group of the loads is the producer,
    the one other group the consumer. :class:`UnsupportedFeatureError` for an assignment Triton 3.6's Hopper
    pass cannot take (no warp groups, loads sharing a group with other ops, more than one compute group)."""
    graph = schedule.graph
    if not schedule.assignment:
        raise UnsupportedFeatureError("the schedule has no warp groups: solve with warp specialization (without "
                                      "--no-ws) to inject partitions")
    names = {op.name for op in lowered.graph.ops}
    if names != {op.name for op in graph.ops}:
        raise TwillError("the schedule's ops are not those of this kernel's loop: "
                         f"{', '.join(sorted(names ^ {op.name for op in graph.ops}))}")
    loads = {op.name for op in graph.ops if op.kind in LOAD_KINDS}
    load_groups = sorted({schedule.assignment[n] for n in loads})
    others = sorted({schedule.assignment[op.name] for op in graph.ops if op.name not in loads})
    shared = sorted(set(load_groups) & set(others))
    if len(load_groups) != 1 or shared:
        raise UnsupportedFeatureError(
            "Triton 3.6's Hopper warp specialization takes one producer partition holding the loads; this "
            f"schedule puts the loads on warp groups {load_groups}"
            + (f", sharing group {shared[0]} with other ops" if shared else ""))
    if len(others) != 1:
        groups = ", ".join(f"{g} ({schedule.warps[g].role})" for g in others)
        raise UnsupportedFeatureError(
            f"the schedule has {len(others)} compute warp groups ({groups}); Triton 3.6's Hopper warp "
            f"specialization writes one consumer partition (its several consumers split the rows of one "
            f"computation, not its ops): emit Gluon for this schedule")
    task_of_group = {load_groups[0]: PRODUCER_TASK, others[0]: CONSUMER_TASK}
    task_of_op = {name: task_of_group[group] for name, group in schedule.assignment.items()}
    tasks: dict[int, int] = {}
    for st in lowered.loop.body:
        owner = lowered.owner.get(st.index)
        if owner is not None:
            tasks[st.index] = task_of_op[owner]
            continue
        into = {task_of_op[name] for name, distance in lowered.folded_into.get(st.index, ()) if distance == 0}
        if st.op == "ttg.local_alloc" and len(into) == 1:
            tasks[st.index] = into.pop()
    return PartitionPlan(tasks=tasks, groups={task: group for group, task in task_of_group.items()})


def _task_attr(task: int) -> str:
    return f"async_task_id = array<i32: {task}>"


def annotate_partitions(text: str, loop: ForLoop, plan: PartitionPlan) -> str:
    """The module text with the plan's ``async_task_id`` on the loop's statements and on the stores after the
    loop (the consumer's), and ``tt.warp_specialize`` on the loop."""
    lines = text.splitlines()
    for st in loop.body:
        if st.index in plan.tasks:
            lines[st.last_line] = add_attribute(lines[st.last_line], _task_attr(plan.tasks[st.index]))
    if "tt.warp_specialize" not in lines[loop.close_line]:
        lines[loop.close_line] = add_attribute(lines[loop.close_line], "tt.warp_specialize")
    for k in range(loop.close_line + 1, len(lines)):
        op = _OP.match(lines[k])
        if op and op.group(1) == "tt.return":
            break
        if op and op.group(1) in STORE_OPS:
            lines[k] = add_attribute(lines[k], _task_attr(CONSUMER_TASK))
    return "\n".join(lines) + "\n"


# -- the compiled kernel -----------------------------------------------------------------------------------
_REGION = re.compile(r"^\s*(default)\s*\{|^\s*(partition\d+)\(.*\)\s*num_warps\((\d+)\)\s*\{")
_RUNS = (("tma_load", "ttng.async_tma_copy_global_to_local"), ("mma", "ttng.warp_group_dot "),
         ("tma_store", "ttng.async_tma_copy_local_to_global"))


def partitions_of(ttgir: str, num_warps: int) -> tuple[Partition, ...]:
    """The regions of the first ``ttg.warp_specialize`` of a final TTGIR and what each runs; the ``default``
    region has the kernel's ``num_warps``. Empty when the kernel is not warp-specialized."""
    lines = ttgir.splitlines()
    start = next((k for k, line in enumerate(lines) if "ttg.warp_specialize(" in line), None)
    if start is None:
        return ()
    out: list[Partition] = []
    region, warps, runs = None, 0, []
    indent = len(lines[start]) - len(lines[start].lstrip())
    for line in lines[start + 1:]:
        m = _REGION.match(line)
        if m and len(line) - len(line.lstrip()) == indent:
            if region is not None:
                out.append(Partition(region, warps, tuple(runs)))
            region = m.group(1) or m.group(2)
            warps = num_warps if m.group(1) else int(m.group(3))
            runs = []
            continue
        if line.strip() == "}" and len(line) - len(line.lstrip()) < indent:
            break
        for kind, needle in _RUNS:
            if needle in line and kind not in runs:
                runs.append(kind)
    if region is not None:
        out.append(Partition(region, warps, tuple(runs)))
    return tuple(out)


def setmaxnreg_of(ptx: str) -> tuple[tuple[str, int], ...]:
    """The distinct ``setmaxnreg.{inc,dec}`` instructions of a PTX text, in order of first appearance."""
    found = ((m.group(1), int(m.group(2)))
             for m in re.finditer(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx))
    return tuple(dict.fromkeys(found))


def check_spec(spec: KernelSpec) -> None:
    """:class:`UnsupportedFeatureError` unless Triton 3.6's Hopper warp specialization can partition ``spec``:
    sm_90 and ``num_warps = 4``."""
    if spec.capability // 10 != 9:
        raise UnsupportedFeatureError(f"twill inject --ws writes Triton 3.6's Hopper warp specialization "
                                      f"(sm_90), not sm_{spec.capability}")
    if spec.num_warps != HOPPER_WS_WARPS:
        raise UnsupportedFeatureError(
            f"Triton 3.6's Hopper warp specialization partitions a loop only at num_warps={HOPPER_WS_WARPS} "
            f"(each partition is one 4-warp group); this kernel compiles with num_warps={spec.num_warps}: "
            f"pass --num-warps {HOPPER_WS_WARPS}")


def compile_warp_specialized(spec: KernelSpec, schedule: Schedule, machine: Machine, *,
                             loop: int | str | None = None, workdir: str | None = None) -> WarpSpecializedKernel:
    """Compile ``spec`` with ``schedule``'s warp groups written as Triton partitions onto loop ``loop`` (default:
    the loop the schedule was solved for) and Triton's own software pipelining otherwise."""
    from twill.integrations.triton import lower_ttgir

    check_spec(spec)
    if loop is None:
        loop = schedule.graph.attrs.get("loop_index")
    plans: list[PartitionPlan] = []
    seen: list[str] = []

    def edit(text: str) -> str:
        lowered = lower_ttgir(text, machine, name=schedule.graph.name, loop=loop)
        plan = plan_partitions(lowered, schedule)
        plans.append(plan)
        seen.append(annotate_partitions(text, lowered.loop, plan))
        return seen[-1]

    kernel, _ = compile_with_edit(spec, edit, workdir=workdir, at_warpspec=True)
    ttgir = kernel.asm["ttgir"]
    parts = partitions_of(ttgir, spec.num_warps)
    if not parts:
        raise TwillError(f"Triton 3.6 compiled kernel {spec.name!r} without warp specialization although its "
                         f"loop carries the partitions (NVGPUWarpSpecialization declined it: an scf.if with an "
                         f"else region in the kernel, or a loop it cannot partition)")
    requested = re.search(r"requestedRegisters = array<i32: ([\d, ]+)>", ttgir)
    regs = tuple(int(v) for v in requested.group(1).split(",")) if requested else ()
    return WarpSpecializedKernel(kernel=kernel, plan=plans[0], annotated_ttgir=seen[0], partitions=parts,
                                 requested_registers=regs, setmaxnreg=setmaxnreg_of(kernel.asm["ptx"]))


def write_ws_outputs(result: WarpSpecializedKernel, schedule: Schedule, directory: str | Path) -> dict[str, Any]:
    """Write ``<kernel>.ttgir`` (final), ``<kernel>.partitioned.ttgir`` (the TTGIR with the partitions, as it
    entered Hopper's warp specialization), ``<kernel>.ptx``, ``<kernel>.cubin``, ``schedule.json`` and
    ``summary.json`` into ``directory``, all or none; returns the summary."""
    from twill.integrations.triton.inject import write_kernel_files
    from twill.schedule.document import schedule_document

    name = result.kernel.name
    files: dict[str, bytes] = {f"{name}.ttgir": result.kernel.asm["ttgir"].encode(),
                               f"{name}.partitioned.ttgir": result.annotated_ttgir.encode(),
                               f"{name}.ptx": result.kernel.asm["ptx"].encode(),
                               f"{name}.cubin": bytes(result.kernel.asm["cubin"]),
                               "schedule.json": (json.dumps(schedule_document(schedule), indent=2) + "\n").encode()}
    return write_kernel_files(directory, files, result.summary(schedule))


def inject_ws_triton(target: str, machine: Machine, directory: str, *, options, signature: str | None = None,
                     constexprs: Sequence[str] = (), num_warps: int | None = None, num_stages: int | None = None,
                     config: int | None = None, loop: int | str | None = None) -> dict[str, Any]:
    """``twill inject --ws`` of Triton kernel ``target`` (``path.py:fn``): solve loop ``loop`` with warp
    specialization (``options`` with ``ws`` on), compile it with the warp groups as Triton partitions
    (:func:`compile_warp_specialized`) and write the files of :func:`write_ws_outputs`."""
    from dataclasses import replace

    from twill.integrations.triton import lower_function_loops, spec_from_target
    from twill.solve import schedule as solve
    from twill.targets import python_target

    match = python_target(target)
    if not match:
        raise TwillError(f"twill inject needs a Triton kernel target path.py:fn, got {target!r}")
    spec = spec_from_target(match.path, match.fn, signature=signature, constexprs=list(constexprs),
                            num_warps=num_warps, num_stages=num_stages, machine=machine, config=config)
    check_spec(spec)                            # before solving
    loops, _ = lower_function_loops(spec, machine, loop=loop)
    if len(loops) != 1:
        raise TwillError(f"twill inject --ws writes one loop; {spec.name!r} has {len(loops)} loops with dots "
                         f"(loops {', '.join(str(i) for i, _ in loops)}): pick one with --loop N")
    (index, lowered), = loops
    schedule = solve(lowered.graph, machine, replace(options, ws=True))
    result = compile_warp_specialized(spec, schedule, machine, loop=index)
    return write_ws_outputs(result, schedule, directory)
