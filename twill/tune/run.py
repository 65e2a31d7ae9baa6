"""A ``twill tune`` run: what the command line asks for (:class:`TuneRequest`) -> the search space and its jobs
(:func:`plan_sweep`), the sweep, the ranking and the GPU measurements (:func:`tune`), and what the run writes:
the ``twill-tune/1`` document, the report and the winner's Gluon source (:class:`TuneOutcome`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from twill.errors import TwillError
from twill.targets import python_target


@dataclass(frozen=True)
class TuneRequest:
    """The target and the options of a tune run.

    Attributes:
        target: a built-in kernel, a ``twill-graph/1`` file or a Triton kernel ``path.py:fn``.
        time_limit: seconds per candidate.
        axes: the search axes given for a built-in kernel or a graph (``block_m``, ``reg_limit``, ...: values).
        shape: the problem size as given (``M,N,K`` or ``B,H,S,D``), ``None`` for the default.
        causal: a causal attention problem.
        check_spills: compile each candidate and discard those whose kernel spills.
        measure: time the best ``measure`` candidates on the GPU (``None``: no measurement).
        extra_copies: copies beyond Algorithm 1's that each solve may try.
        signature, constexprs, triton_axes: a Triton target's ``--signature``, its ``NAME=V1,V2`` constexpr
            sweeps, and the ``num_warps``/``num_stages`` values given.
        loop: a Triton target's ``--loop`` (index or ``line:N``): the loop tuned when several hold dots.
    """

    target: str
    time_limit: float
    axes: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    shape: str | None = None
    causal: bool = False
    check_spills: bool = False
    measure: int | None = None
    extra_copies: int = 0
    signature: str | None = None
    constexprs: tuple[str, ...] = ()
    triton_axes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    loop: str | None = None


def triton_constexprs(items: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """``NAME=V1,V2`` items as ``{NAME: (V1, V2)}`` (values parsed as the Triton frontend does)."""
    from twill.integrations.triton.compile import parse_constexpr_value

    out: dict[str, tuple[Any, ...]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise TwillError(f"bad --constexpr {item!r}: expected NAME=V1,V2,...")
        out[name.strip()] = tuple(parse_constexpr_value(v.strip()) for v in values.split(",") if v.strip())
    return out


def plan_sweep(request: TuneRequest, machine: Any) -> tuple[Any, list[Any], Any]:
    """``(space, jobs, shape)`` of the target; the shape is ``None`` for a Triton kernel without a shape
    (its problem is known only once its graph is extracted)."""
    from twill.ir.io import graph_to_dict
    from twill.kernels import families
    from twill.tune.predict import PROBLEMS, default_shape, hooks, kernel_problem, parse_shape
    from twill.tune.space import graph_space, kernel_space, triton_space
    from twill.tune.sweep import Job

    match = python_target(request.target)
    hopper = machine.capability // 10 == 9
    if request.check_spills and not match and not hopper:
        raise TwillError(f"--check-spills compiles Gluon kernels for sm_90 only, not {machine.arch}")
    check = bool(request.check_spills or (request.measure and hopper))
    common = {"machine": machine, "time_limit": request.time_limit, "check_spills": check}
    kernel_axes = dict(request.axes)
    if match:
        if kernel_axes:
            raise TwillError(f"--{next(iter(kernel_axes)).replace('_', '-')} applies to built-in kernels and "
                             f"graphs; use --constexpr NAME=V1,V2 for a Triton target")
        if request.extra_copies:
            raise TwillError("--extra-copies applies to built-in kernels and graphs (a Triton kernel's search "
                             "is Triton's own modulo schedule)")
        if not os.path.isfile(match.path):
            raise TwillError(f"cannot read Triton source {match.path!r}: no such file")
        if not request.signature:
            raise TwillError("a Triton target needs --signature listing every non-constexpr argument")
        space = triton_space(triton_constexprs(request.constexprs), dict(request.triton_axes))
        from twill.files import read_text_file

        info = {"path": os.path.abspath(match.path), "fn": match.fn, "signature": request.signature,
                "source": read_text_file(match.path, "Triton source")}
        if request.loop is not None:
            info["loop"] = request.loop
        jobs = [Job(candidate=c, triton=info, **common) for c in space.candidates]
        shape = None
        if request.shape:
            sizes = len(request.shape.split(","))
            shape = parse_shape(request.shape, next((p for p, names in PROBLEMS.items() if len(names) == sizes),
                                                    list(PROBLEMS)[-1]))
        return space, jobs, shape
    if request.constexprs or request.signature or request.triton_axes or request.loop is not None:
        raise TwillError("--signature, --constexpr, --num-warps, --num-stages and --loop apply to Triton targets "
                         "only")
    if request.causal and not getattr(hooks(request.target), "CAUSAL", False):
        causal = [f.name for f in families() if getattr(f.hooks(), "CAUSAL", False)]
        raise TwillError(f"--causal applies to {', '.join(causal)}, not {request.target!r}")
    if request.target.endswith(".json") or os.path.sep in request.target:
        from twill.ir.io import load_graph
        from twill.tune.predict import problem_of

        graph = load_graph(request.target)
        problem = problem_of(graph)
        space = graph_space(kernel_axes)
        shape = parse_shape(request.shape, problem) if request.shape else default_shape(
            problem, graph.attrs.get("head_dim"))
        jobs = [Job(candidate=c, graph=graph_to_dict(graph), extra_copies=request.extra_copies, **common)
                for c in space.candidates]
        return space, jobs, shape
    from twill.kernels import build_kernel, kernel_options

    kernel_options(request.target)                  # unknown kernel: one clear error
    problem = kernel_problem(request.target)
    if problem is None:
        raise TwillError(f"kernel {request.target!r} has no problem shape to tune for "
                         f"(tunable: {', '.join(f.name for f in families() if f.tuned)})")
    if problem == "attention":
        given = kernel_axes.get("head_dim")
        if given is not None and len(given) != 1:
            raise TwillError("--head-dim takes one value (the shape's D)")
        shape = parse_shape(request.shape, problem) if request.shape else default_shape(problem,
                                                                                         (given or (None,))[0])
        if given is not None and given[0] != shape["D"]:
            raise TwillError(f"--head-dim {given[0]} does not match the shape's D={shape['D']}")
        kernel_axes["head_dim"] = (shape["D"],)
        if request.causal:
            kernel_axes["causal"] = (True,)     # part of the problem, not a choice: one value
    else:
        shape = parse_shape(request.shape, problem) if request.shape else default_shape(problem)
    space = kernel_space(request.target, machine, kernel_axes, check_spills=common["check_spills"])
    jobs = [Job(candidate=c, graph=graph_to_dict(build_kernel(request.target, machine, **dict(c.options))),
                extra_copies=request.extra_copies, **common) for c in space.candidates]
    return space, jobs, shape


def shape_from_records(records: Sequence[Mapping[str, Any]]) -> Any:
    """The default shape of a Triton kernel's problem, read from its first solved graph."""
    from twill.ir.io import graph_from_dict
    from twill.tune.predict import default_shape, problem_of

    for record in records:
        if record["status"] == "ok":
            graph = graph_from_dict(record["schedule"]["loop_graph"])
            return default_shape(problem_of(graph), graph.attrs.get("head_dim"))
    raise TwillError("no candidate was scheduled; nothing to rank (see the reasons with --json)")


@dataclass(frozen=True)
class TuneOutcome:
    """A finished tune run: the space, the ranked results and the GPU measurements (``triton_measured``: a
    Triton target's comparison with ``@triton.autotune``, else ``None``)."""

    target: str
    machine: Any
    space: Any
    jobs: int
    cached: int
    shape: Any
    results: list[Any]
    measured: list[dict[str, Any]]
    triton_measured: dict[str, Any] | None

    def document(self) -> dict[str, Any]:
        """The ``twill-tune/1`` JSON of the run."""
        from twill.tune.rank import sweep_document

        doc = sweep_document(self.target, self.machine, self.shape, self.space, self.results, self.measured)
        if self.triton_measured is not None:
            doc["autotune_comparison"] = self.triton_measured["comparison"]
        return doc

    def report(self, top: int) -> str:
        """The ranking's first ``top`` rows under a header line (and, on a machine without calibration, the
        line saying its numbers are uncalibrated), then the measurements."""
        from twill.tune.rank import format_ranking, uncalibrated_note

        note = uncalibrated_note(self.machine)
        text = (f"tune {self.target} on {self.machine.name}, shape {self.shape.text()}: {self.jobs} candidates "
                f"({self.cached} cached)\n" + (f"{note}\n" if note else "")
                + format_ranking(self.results, top, len(self.space.rejected), not note))
        if self.triton_measured is not None:
            from twill.tune.measure_triton import format_triton_measured

            text += "\n\n" + format_triton_measured(self.triton_measured)
        elif self.measured:
            from twill.tune.measure import format_measured

            text += "\n\n" + format_measured(self.measured)
        return text

    def winner_source(self) -> str:
        """The best-ranked schedule as a Gluon kernel's source."""
        from twill.codegen.gluon import emit_gluon

        best = next((r for r in self.results if r.prediction is not None), None)
        if best is None:
            raise TwillError("no candidate was scheduled; nothing to emit")
        return emit_gluon(best.schedule, bool(best.candidate.persistent))


def tune(request: TuneRequest, machine: Any, *, triton_kernel: Any = None, workers: int = 2,
         ray_address: str | None = None, use_cache: bool = True, progress_lines: bool = False) -> TuneOutcome:
    """Plan the space, run the sweep (``workers`` processes, or Ray at ``ray_address``; the disk cache unless
    ``use_cache`` is off; one progress line per candidate with ``progress_lines``), rank, and time the best
    ``request.measure`` candidates on the GPU (a Triton target's through ``triton_kernel``, its
    :func:`~twill.tune.measure_triton.measured_triton_kernel`)."""
    from twill.tune.rank import rank
    from twill.tune.sweep import Progress, run_sweep

    space, jobs, shape = plan_sweep(request, machine)
    if not jobs:
        raise TwillError(f"every candidate was filtered out before solving ({len(space.rejected)}; "
                         f"first: {space.rejected[0][1] if space.rejected else 'none'})")
    for job in jobs:        # options no solver can take: one line now, rather than a cached error per candidate
        job.solve_options()
    progress = Progress(total=len(jobs), lines=progress_lines)
    records = run_sweep(jobs, workers=workers, ray_address=ray_address, use_cache=use_cache, progress=progress)
    shape = shape or shape_from_records(records)
    results = rank(space.candidates, records, shape, machine)
    if request.measure and not any(r.prediction is not None for r in results):
        first = next((r.record.get("reason") for r in results if r.record.get("reason")), None)
        raise TwillError("no candidate was scheduled, nothing to measure" + (f": {first}" if first else ""))
    measured: list[dict[str, Any]] = []
    triton_measured: dict[str, Any] | None = None
    if request.measure and triton_kernel is not None:
        from twill.tune.measure_triton import measure_triton

        triton_measured = measure_triton(triton_kernel, results, shape, request.measure, machine)
        measured = triton_measured["rows"]
    elif request.measure:
        from twill.tune.measure import measure_candidates

        measured = measure_candidates(results, shape, request.measure)
    return TuneOutcome(target=request.target, machine=machine, space=space, jobs=len(jobs),
                       cached=progress.cached, shape=shape, results=results, measured=measured,
                       triton_measured=triton_measured)
