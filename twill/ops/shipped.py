"""The schedules ``twill.ops.attention`` ships: one verified schedule per distinct solve, as package data.

Every configuration the op supports (:func:`configurations`) builds a loop graph; the configurations whose
graphs differ only in :data:`~twill.ops.spec.CODEGEN_ONLY_ATTRS` (the mask, the K/V head count) share one
solve (:func:`solve_digest`: the SHA-256 of :func:`~twill.ops.spec.solve_key`), and each solve has one file
in :data:`SCHEDULE_DIR`, ``<kernel>_d<D>_<dtype>_<digest[:16]>.json``: a self-contained ``twill-schedule/1``
document (:func:`twill.schedule.document.schedule_document`) with a ``shipped`` object beside it:

* ``solve_key``: the digest the file was solved for. A graph built today whose digest has no file (Twill's
  kernel builder or machine model changed since the files were written) has no shipped schedule.
* ``configurations``: the configurations that share it (readable; the digest decides).
* ``ptxas`` (backward only): for each mask and K/V grouping (:data:`CHECKED_KV_HEADS`), the SHA-256 of the
  module emitted from the schedule, the Triton version whose ptxas compiled it and ptxas's report, which
  showed no spill and no serialized wgmma when the file was written.

:func:`load` reads a configuration's file through the verification gate
(:func:`twill.schedule.verify.admit`) with the configuration's code-generator attributes;
:func:`check_backward` accepts a backward module only when a ``ptxas`` entry covers exactly its text and the
installed Triton, else compiles it and asks ptxas now. Neither imports the solver. :func:`regenerate`
(``twill ops regenerate``) solves every file again.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable

from twill.errors import TwillError
from twill.ops.spec import (BACKWARD, BACKWARD_HEAD_DIMS, CODEGEN_ONLY_ATTRS, DTYPES, FORWARD, FORWARD_DTYPES,
                            FORWARD_HEAD_DIMS, MACHINE, KernelSpec, solve_key)

#: The package folder of the shipped schedule files.
SCHEDULE_DIR = Path(__file__).resolve().parent / "schedules"
#: Key of the shipped record in a schedule file.
SHIPPED = "shipped"
#: K/V head counts a backward's kernels are compiled with when the files are written: as many K/V heads as
#: query heads (0), and grouped (2; another count changes the ``KV_HEADS`` constant of the module, whose new
#: text :func:`check_backward` compiles before use).
CHECKED_KV_HEADS = (0, 2)


class ShippedScheduleError(TwillError):
    """A configuration's shipped schedule cannot be used: no file for its graph, an unreadable file, a schedule
    the verifier refuses, or a backward module ptxas spills; the message says which."""


def configurations(kernels: Iterable[str] = (FORWARD.name, BACKWARD.name)) -> list[KernelSpec]:
    """Every configuration of ``kernels`` the op supports, with the K/V head counts of
    :data:`CHECKED_KV_HEADS` (the count is a code-generator attribute: every other count shares their
    schedules)."""
    dims = {FORWARD.name: FORWARD_HEAD_DIMS, BACKWARD.name: BACKWARD_HEAD_DIMS}
    dtypes = {FORWARD.name: FORWARD_DTYPES, BACKWARD.name: DTYPES}     # fp8: forward only
    return [KernelSpec(kernel, d, dtype, causal, kv)
            for kernel in kernels for d in dims[kernel] for dtype in dtypes[kernel].values()
            for causal in (False, True) for kv in CHECKED_KV_HEADS]


def spec_graph(spec: KernelSpec) -> Any:
    """The loop graph of ``spec`` on the op's machine model."""
    from twill.kernels import build_kernel
    from twill.machine.models import get_machine

    return build_kernel(spec.kernel, get_machine(MACHINE), **spec.kernel_options())


def solve_digest(spec: KernelSpec, graph: Any) -> str:
    """The SHA-256 of what the solver sees of ``spec``'s ``graph`` (:func:`~twill.ops.spec.solve_key`)."""
    return hashlib.sha256(solve_key(spec, graph).encode()).hexdigest()


def schedule_path(spec: KernelSpec, digest: str, folder: Path | None = None) -> Path:
    """The file in ``folder`` (default :data:`SCHEDULE_DIR`) of the schedule solved for ``digest`` (``spec``'s
    kernel, head dimension and dtype make the name readable)."""
    return (folder or SCHEDULE_DIR) / f"{spec.kernel.replace('-', '_')}_d{spec.head_dim}_{spec.dtype}_{digest[:16]}.json"


def with_attrs(schedule: Any, graph: Any) -> Any:
    """``schedule`` (of the solved, normalized loop) with ``graph``'s code-generator attributes
    (:data:`~twill.ops.spec.CODEGEN_ONLY_ATTRS`) in place of its own."""
    attrs = {k: v for k, v in schedule.graph.attrs.items() if k not in CODEGEN_ONLY_ATTRS}
    attrs.update((k, v) for k, v in graph.attrs.items() if k in CODEGEN_ONLY_ATTRS)
    return replace(schedule, graph=replace(schedule.graph, attrs=attrs))


def load(spec: KernelSpec, graph: Any, folder: Path | None = None) -> tuple[Any, dict[str, Any]]:
    """The shipped schedule of ``spec`` (whose loop graph is ``graph``; from ``folder``, default
    :data:`SCHEDULE_DIR`) with ``spec``'s code-generator
    attributes, admitted by the verifier on the op's machine model, and the file's ``shipped`` record.
    Raises :class:`ShippedScheduleError` saying why there is none."""
    from twill.files import read_json_file
    from twill.ir.io import graph_from_dict
    from twill.machine.models import get_machine
    from twill.schedule.result import Schedule
    from twill.schedule.verify import admit

    folder = folder or SCHEDULE_DIR
    digest = solve_digest(spec, graph)
    path = schedule_path(spec, digest, folder)
    if not path.is_file():
        raise ShippedScheduleError(f"no shipped schedule for this loop ({path.name} is not in {folder}: the "
                                   f"kernel's graph or the machine model changed since 'twill ops regenerate')")
    try:
        data = read_json_file(path, "schedule")
        record = data.get(SHIPPED) if isinstance(data, dict) else None
        if not isinstance(record, dict) or record.get("solve_key") != digest:
            raise ShippedScheduleError(f"its '{SHIPPED}' record is not for this loop's digest {digest[:16]}")
        schedule = Schedule.from_dict(data, graph_from_dict(data["loop_graph"]))
        return admit(with_attrs(schedule, graph), get_machine(MACHINE)), record
    except (TwillError, KeyError) as exc:
        raise ShippedScheduleError(f"{path.name}: {exc}") from None


def triton_version() -> str | None:
    """The installed Triton's version (its ptxas decides spills), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton")
    except PackageNotFoundError:
        return None


def source_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def ptxas_check(schedule: Any, spec: KernelSpec, source: str) -> dict[str, Any]:
    """The ``ptxas`` entry of ``spec``'s backward module ``source`` (emitted from ``schedule``): compiled for
    sm_90 now (:func:`twill.tune.spills.gluon_spills`), with the report, the verdict (None: clean) and what
    it covers."""
    from twill.machine.models import get_machine
    from twill.tune.spills import gluon_spills, ptxas_rejection

    report = gluon_spills(schedule, get_machine(MACHINE), spec.persistent())
    return {"causal": spec.causal, "kv_heads": spec.kv_heads, "module_sha256": source_digest(source),
            "triton": triton_version(), "report": report, "rejection": ptxas_rejection(report)}


def check_backward(schedule: Any, spec: KernelSpec, source: str, record: dict[str, Any]) -> None:
    """Accept the backward module ``source`` of a shipped ``schedule``: when a ``ptxas`` entry of ``record``
    covers exactly this text and the installed Triton, as it was when the file was written; otherwise after
    compiling it here (needs Triton). Raises :class:`ShippedScheduleError` when ptxas spills it."""
    digest, triton = source_digest(source), triton_version()
    for entry in record.get("ptxas") or ():
        if isinstance(entry, dict) and entry.get("module_sha256") == digest and entry.get("triton") == triton:
            if entry.get("rejection") is None:
                return
    entry = ptxas_check(schedule, spec, source)
    if entry["rejection"] is not None:
        raise ShippedScheduleError(f"the shipped {spec.kernel} schedule's kernel is refused: {entry['rejection']}")


def regenerate(folder: Path | None = None, kernels: Iterable[str] = (FORWARD.name, BACKWARD.name),
               progress: Callable[[str], None] | None = None) -> list[Path]:
    """Solve every distinct loop of ``kernels``' configurations (the forward as the solver finds it, the
    backward by the ptxas-checked search, :func:`twill.ops.spec.solve`), compile each backward for every mask
    and :data:`CHECKED_KV_HEADS` grouping, and write one file per solve into ``folder`` (default
    :data:`SCHEDULE_DIR`), all or nothing
    (:func:`twill.files.output_group`); the files of ``kernels`` there that no solve wrote are removed.
    Raises :class:`TwillError` when a backward variant spills (the search's schedule is clean for the first
    configuration only)."""
    from twill.codegen.gluon import emit_gluon
    from twill.files import defer_output, make_output_dir, output_group, write_json_atomic
    from twill.machine.models import get_machine
    from twill.ops.spec import solve
    from twill.schedule.document import schedule_document
    from twill.schedule.verify import verify

    folder = folder or SCHEDULE_DIR
    report = progress or (lambda message: None)
    kernels = tuple(kernels)
    machine = get_machine(MACHINE)
    groups: dict[str, list[tuple[KernelSpec, Any]]] = {}
    for spec in configurations(kernels):
        graph = spec_graph(spec)
        groups.setdefault(solve_digest(spec, graph), []).append((spec, graph))
    documents: dict[Path, dict[str, Any]] = {}
    for digest, members in groups.items():
        first, graph = members[0]
        report(f"{first.kernel} D={first.head_dim} {first.dtype}: solving ({len(members)} configurations share "
               f"the loop {digest[:16]})")
        solved = solve(first, graph, machine)
        record: dict[str, Any] = {"solve_key": digest, "configurations": [
            {"kernel": s.kernel, "head_dim": s.head_dim, "dtype": s.dtype, "causal": s.causal, "kv_heads": s.kv_heads}
            for s, _ in members]}
        if first.kernel == BACKWARD.name:
            record["ptxas"] = []
            for spec, member_graph in members:
                variant = with_attrs(solved, member_graph)
                verify(variant, machine)
                entry = ptxas_check(variant, spec, emit_gluon(variant, persistent=spec.persistent()))
                if entry["rejection"] is not None:
                    raise TwillError(f"{spec.kernel} D={spec.head_dim} {spec.dtype} causal={spec.causal} "
                                     f"kv_heads={spec.kv_heads}: the schedule solved for causal={first.causal} "
                                     f"kv_heads={first.kv_heads} is refused: {entry['rejection']}")
                record["ptxas"].append(entry)
            report(f"{first.kernel} D={first.head_dim} {first.dtype}: ptxas compiles its {len(members)} "
                   f"kernels without spills")
        documents[schedule_path(first, digest, folder)] = {**schedule_document(solved), SHIPPED: record}
    prefixes = tuple(f"{kernel.replace('-', '_')}_d" for kernel in kernels)
    with output_group():
        make_output_dir(folder)
        for path, doc in documents.items():
            write_json_atomic(path, doc)
        for stale in sorted(folder.glob("*.json")):
            if stale.name.startswith(prefixes) and stale not in documents:
                defer_output(stale.unlink)
    return sorted(documents)

