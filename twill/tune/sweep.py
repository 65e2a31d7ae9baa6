"""Solve every candidate of a space in parallel, with an on-disk cache and a progress bar.

Each candidate becomes a :class:`Job` (plain data, so it pickles to a process or a Ray worker); :func:`run_job`
solves it (``twill.solve.schedule``, or :func:`twill.integrations.triton.inject.solve_for_triton` for a Triton kernel;
both verify the schedule) and returns a JSON-able record. Failures are records too (``status`` ``infeasible``,
``spills`` or ``error`` with a one-line ``reason``): a sweep never stops on one candidate.

The cache holds one JSON file per job under ``$XDG_CACHE_HOME/twill/tune/`` (default ``~/.cache/twill/tune``),
named by the SHA-256 of the twill version, the job's graph (its ``twill-graph/1`` JSON; for a Triton kernel the
source file's text, signature, constexprs, warps and stages, from which the graph is extracted), the machine
model's fields and the solve options. Only outcomes of the solver are cached, never unexpected exceptions.
The shape is not part of the key: predictions are computed from the cached schedules. A record read back is
verified, not trusted (:func:`record_problem`): one that does not parse, is not of the shape :func:`run_job`
writes, or holds a schedule that does not verify against the job's graph and machine, is a miss.

Candidates that differ only in a code-generator axis (``persistent``) have the same graph and solve: the sweep
solves the first of them and hands its schedule to the others (:attr:`Job.schedule`), which only ask the
generator for their own kernel (and, with ``check_spills``, compile it).

With ``check_spills`` a built-in kernel on Hopper is solved by the ptxas-checked search
(:func:`twill.tune.registers.schedule_without_spills`): a schedule whose kernel spills is excluded and the
search goes on, so a candidate is ``spills`` only when every schedule the search found spilled, and one the
model's register count refuses (FA3's 128-row backward tile at head dim 64) can still be ranked.
"""

from __future__ import annotations

import functools

import contextlib
import copyreg
import hashlib
import json
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, TextIO

from twill.errors import (InfeasibleScheduleError, SolverUnavailableError, SpillsError, TwillError,
                          UnsupportedFeatureError)
from twill.files import read_file_bytes, stop_signals_blocked, user_cache_dir
from twill.machine.models import Machine
from twill.tune.space import Candidate
from twill.tune.spills import gluon_spills, ptxas_rejection

#: The solve options ``twill tune`` has flags for (option -> flag; :attr:`SolveOptions.flags`): the advice of a
#: candidate that found no schedule names only these.
TUNE_FLAGS = (("time_limit", "--time-limit"), ("reg_limit", "--reg-limit"), ("streaming_depth", "--streaming-depth"),
              ("extra_copies", "--extra-copies"))

#: Statuses of a job record. ``ok``: a verified schedule; ``infeasible``: the solver proved there is none or
#: found none in the time limit; ``spills``: the compiled kernel spills registers; ``error``: anything else.
STATUSES = ("ok", "infeasible", "cannot_emit", "spills", "error")


@dataclass(frozen=True)
class Job:
    """One candidate to solve, as plain data.

    Attributes:
        candidate: the point of the space.
        machine: the machine model.
        time_limit: wall-clock seconds for this candidate's solve.
        resolution: cost-normalization budget U.
        graph: the candidate's loop graph as ``twill-graph/1`` (built-in kernels and graph files).
        triton: for a Triton kernel, ``{"path", "fn", "signature", "source"}`` (``source``: the file's text,
            for the cache key only) and ``"loop"`` when ``--loop`` picked one.
        check_spills: compile the kernel (Triton injection, or the emitted Gluon kernel) on the CPU and
            read ptxas's spill report; a built-in Hopper kernel is solved by the ptxas-checked search.
        schedule: the solved schedule (``twill-schedule/1``) of a job that differs from this one only in a
            code-generator axis: this job emits its kernel from it instead of solving again (not part of the
            cache key: the solve is the same).
        extra_copies: :attr:`SolveOptions.extra_copies <twill.solve.options.SolveOptions.extra_copies>` of the
            solve (built-in kernels and graph files).
    """

    candidate: Candidate
    machine: Machine
    time_limit: float
    resolution: int = 300
    graph: Mapping[str, Any] | None = None
    triton: Mapping[str, str] | None = None
    check_spills: bool = False
    schedule: Mapping[str, Any] | None = None
    extra_copies: int = 0

    def key(self, version: str) -> str:
        """The cache key (module docstring)."""
        payload = {"version": version, "graph": self.graph, "machine": plain_data(self.machine),
                   "options": {"time_limit": self.time_limit, "resolution": self.resolution,
                               "check_spills": self.check_spills, "extra_copies": self.extra_copies,
                               **self.candidate.settings()},
                   "triton": self.triton}
        text = json.dumps(payload, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def solve_key(self, version: str) -> str:
        """The key of this job's solve: :meth:`key` without the code-generator axes."""
        return replace(self, candidate=replace(self.candidate, persistent=None)).key(version)

    def solve_options(self) -> Any:
        """The :class:`~twill.solve.options.SolveOptions` of this job's solve (one CP-SAT worker: the sweep runs
        jobs in parallel); options out of their ranges are a one-line :class:`TwillError`."""
        from twill.solve.options import SolveOptions

        return SolveOptions(time_limit=self.time_limit, resolution=self.resolution,
                            reg_limit=self.candidate.reg_limit, streaming_depth=self.candidate.streaming_depth,
                            workers=1, extra_copies=self.extra_copies, flags=TUNE_FLAGS)


def plain_data(value: Any) -> Any:
    """``value`` with dataclasses and mappings turned into dicts, recursively (the machine model in the cache
    key, whatever its fields hold)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    return value


def _mappingproxy(items: dict[Any, Any]) -> MappingProxyType:
    return MappingProxyType(items)


# Frozen dataclasses of the IR and the machine model hold MappingProxyType fields, which pickle cannot send
# to a worker process by default; they travel as dicts and come back as read-only views.
copyreg.pickle(MappingProxyType, lambda m: (_mappingproxy, (dict(m),)))


@functools.lru_cache(maxsize=1)
def twill_version() -> str:
    """The installed twill version and a digest of its source files and of the schedules ``twill.ops`` ships
    (part of the cache keys, so that a changed solver, cost model, emitter or shipped schedule never answers
    from an older cache)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("twill-gpu")
    except PackageNotFoundError:
        release = "unknown"
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for path in sorted([*root.rglob("*.py"), *root.glob("ops/schedules/*.json")]):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return f"{release}+{digest.hexdigest()[:16]}"


# -- solving one job (runs in a worker process or a Ray task) ---------------------------------------------
def run_job(job: Job) -> dict[str, Any]:
    """Solve ``job``; a record with ``status``, ``reason`` and, when solved, the schedule (never raises)."""
    started = time.perf_counter()
    try:
        job.solve_options()
    except TwillError as exc:   # not cached: options no solve takes are the caller's mistake, not an outcome
        return {"status": "error", "reason": str(exc), "cacheable": False, "seconds": 0.0}
    try:
        record = _solve_job(job)
    except SolverUnavailableError as exc:   # not cached: installing the solver changes the answer
        record = {"status": "error", "reason": str(exc), "cacheable": False}
    except TwillError as exc:
        status = ("spills" if isinstance(exc, SpillsError) else "infeasible"
                  if isinstance(exc, InfeasibleScheduleError) else "error")
        record = {"status": status, "reason": str(exc), "cacheable": True}
    except Exception as exc:  # noqa: BLE001 - one failed candidate must not stop the sweep
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        record = {"status": "error", "reason": f"{type(exc).__name__}: {first}", "cacheable": False}
    record["seconds"] = round(time.perf_counter() - started, 3)
    return record


def _solve_job(job: Job) -> dict[str, Any]:
    from twill.schedule.document import schedule_document

    machine = job.machine
    cand = job.candidate
    options = job.solve_options()
    fallback, own = None, None
    if job.triton is not None:
        schedule, own, spills = _solve_triton(job, machine, options)
        unlaunchable = _shared_overflow(schedule, machine)
        if unlaunchable:
            return {"status": "cannot_emit", "reason": unlaunchable, "cacheable": True, "ii": schedule.ii,
                    "solve_status": schedule.status, "schedule": schedule_document(schedule), "spills": spills}
    else:
        from twill.ir.io import graph_from_dict
        from twill.schedule.result import Schedule
        from twill.solve import schedule as solve

        persistent = bool(cand.persistent)
        if job.schedule is not None:    # solved by a job that differs only in a code-generator axis
            schedule = Schedule.from_dict(dict(job.schedule), graph_from_dict(dict(job.schedule["loop_graph"])))
        else:
            graph = graph_from_dict(dict(job.graph or {}))
            searched = job.check_spills and _gluon_kernel(graph, machine)

            def solve_one(opts: Any) -> Any:
                """The solver's schedule; with ``check_spills``, the ptxas-checked search's
                (:mod:`twill.tune.registers`), which searches on while the compiled kernel spills."""
                if not searched:
                    return solve(graph, machine, opts)
                from twill.tune.registers import schedule_without_spills

                try:
                    return schedule_without_spills(graph, machine, opts, persistent=persistent)
                except UnsupportedFeatureError:   # the generator refuses the graph: ``cannot_emit`` below
                    return solve(graph, machine, opts)

            try:
                schedule = solve_one(options)
                fallback = _gluon_refusal(schedule, machine, persistent) if options.extra_copies else None
            except InfeasibleScheduleError as exc:
                if not options.extra_copies:
                    raise
                fallback = str(exc)
            if fallback:
                # the extra copies' schedule is one the generator cannot build, or their search ran out of
                # time: Algorithm 1's copies, as without them
                schedule = solve_one(replace(options, extra_copies=0))
        unemittable = _gluon_refusal(schedule, machine, persistent)
        if unemittable:
            return {"status": "cannot_emit", "reason": unemittable, "cacheable": True, "ii": schedule.ii,
                    "solve_status": schedule.status, "schedule": schedule_document(schedule), "spills": None}
        if "registers" in schedule.stats and job.schedule is None:   # the search compiled it already
            spills = dict(schedule.stats["registers"]["steps"][-1]["ptxas"])
        else:
            spills = gluon_spills(schedule, machine, persistent) if job.check_spills else None
    record: dict[str, Any] = {"status": "ok", "reason": None, "cacheable": True, "ii": schedule.ii,
                              "solve_status": schedule.status, "schedule": schedule_document(schedule),
                              "spills": spills}
    if fallback:
        record["extra_copies_dropped"] = fallback
    if job.triton is not None:     # None: Triton's order has no schedule, Twill's is injected
        record["triton_order"] = schedule_document(own) if own is not None else None
    rejected = ptxas_rejection(spills)
    if rejected:
        record.update(status="spills", reason=rejected)
    return record


def _solve_triton(job: Job, machine: Machine, options: Any) -> tuple[Any, Any, dict[str, int] | None]:
    """The window schedule of a Triton configuration and the schedule of Triton's own order under the same
    constraints (:func:`twill.integrations.triton.inject.triton_order`; None if that order has none), which the ranking
    weighs Twill's against. With ``check_spills`` the kernel is compiled with Twill's schedule injected, its
    ptxas report returned and its registers and shared memory kept in both schedules' ``stats["compiled"]``
    (what the prediction counts for CTAs per SM, :func:`twill.tune.predict.ctas_per_sm`)."""
    from twill.integrations.triton.inject import inject, solve_for_triton, triton_order
    from twill.integrations.triton import kernel_spec, lower_function
    from twill.integrations.triton.compile import load_kernel

    info, cand = job.triton or {}, job.candidate
    fn = load_kernel(info["path"], info["fn"]).fn
    spec = kernel_spec(fn, signature=info["signature"], constexprs=dict(cand.options),
                       num_warps=cand.num_warps or 4, num_stages=cand.num_stages, machine=machine)
    lowered, text = lower_function(spec, machine, loop=info.get("loop"))
    options = replace(options, ws=False)
    schedule = solve_for_triton(lowered.graph, machine, spec.capability, options)
    try:
        own: Any = solve_for_triton(triton_order(lowered, text), machine, spec.capability, options)
    except TwillError:   # Triton's order has no schedule under the window constraint: Twill's is the one
        own = None
    if not job.check_spills:
        return schedule, own, None
    from twill.tune.spills import ptxas_report

    kernel = inject(spec, schedule, machine).kernel
    report = ptxas_report(kernel.asm["ptx"], spec.capability)
    compiled = {"registers": report["registers"], "shared_bytes": int(kernel.metadata.shared)}
    schedule = replace(schedule, stats={**schedule.stats, "compiled": compiled})
    own = own and replace(own, stats={**own.stats, "compiled": compiled})
    return schedule, own, report


def _shared_overflow(schedule: Any, machine: Machine) -> str | None:
    """Why a compiled Triton kernel cannot launch: it asks for more shared memory than a block may have (Triton
    compiles it and refuses it at launch), or None."""
    shared = int((schedule.stats.get("compiled") or {}).get("shared_bytes") or 0)
    if shared > machine.smem_per_block:
        return (f"the compiled kernel needs {shared} bytes of shared memory, more than the {machine.smem_per_block} "
                f"a block may have on {machine.name}")
    return None


def _gluon_kernel(graph: Any, machine: Machine) -> bool:
    """Whether ``graph`` is a built-in kernel the Hopper Gluon generator emits, so that the ptxas-checked search
    can compile its schedules."""
    return machine.capability // 10 == 9 and "kernel" in graph.attrs


def _gluon_refusal(schedule: Any, machine: Machine, persistent: bool) -> str | None:
    """Why the Gluon backend cannot emit a built-in kernel's schedule on Hopper (its plan refuses it, e.g. an
    op placed in another warp group than its sub-tile's wgmma, or a persistent GEMM whose rings and C staging
    tile overflow shared memory), or None. A tuned candidate must be a kernel that can be built; elsewhere
    (Blackwell, graph files) there is no emitter to ask."""
    from twill.errors import UnsupportedFeatureError

    if machine.capability // 10 != 9 or not schedule.warps or "kernel" not in schedule.graph.attrs:
        return None
    from twill.codegen.gluon import gluon_plan

    try:
        gluon_plan(schedule, persistent)
    except UnsupportedFeatureError as exc:
        return str(exc)
    return None


# -- cache ---------------------------------------------------------------------------------------------
def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/twill/tune`` (default ``~/.cache/twill/tune``)."""
    return user_cache_dir("tune")


def cache_read(directory: Path, key: str, job: Job) -> dict[str, Any] | None:
    """The cached record of ``key`` when it is a record of ``job`` (:func:`record_problem`), else None: a
    missing, unreadable or unparsable file, or a record that is malformed or does not verify, is a miss (the
    job is solved again and its file overwritten)."""
    try:
        data = json.loads(read_file_bytes(directory / f"{key}.json", "tune cache"))
    except (TwillError, OSError, ValueError, RecursionError):   # ValueError: not UTF-8 text, or not JSON
        return None
    return data if record_problem(data, job) is None else None


#: Keys a cached record may have (:func:`run_job`'s record less ``key`` and ``cached``).
RECORD_KEYS = frozenset({"status", "reason", "cacheable", "seconds", "ii", "solve_status", "schedule", "spills",
                         "extra_copies_dropped", "triton_order"})


def record_problem(record: Any, job: Job) -> str | None:
    """Why ``record`` (read from the cache) is not a record :func:`run_job` could have returned for ``job``, or
    None. Its shape and types are checked (a status of :data:`STATUSES`, a reason that is a string unless
    ``ok``, ...) and every schedule it holds is rebuilt and verified against ``job``'s graph and machine
    (:func:`schedule_problem`); a record whose ``ii`` or ``solve_status`` is not its schedule's is refused."""
    if not isinstance(record, dict):
        return "not a JSON object"
    unknown = sorted(set(record) - RECORD_KEYS, key=str)
    if unknown:
        return f"unknown key {unknown[0]!r}"
    status, reason = record.get("status"), record.get("reason")
    if status not in STATUSES:
        return f"unknown status {status!r}"
    if record.get("cacheable") is not True:
        return "not a cacheable record"
    if (reason is not None) if status == "ok" else not isinstance(reason, str):
        return f"reason {reason!r} does not fit status {status!r}"
    seconds = record.get("seconds", 0.0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
        return f"seconds {seconds!r} is not a duration"
    spills = record.get("spills")
    if spills is not None and not (isinstance(spills, dict) and all(isinstance(k, str) for k in spills)):
        return "spills is not a ptxas report"
    if not isinstance(record.get("extra_copies_dropped", ""), str):
        return "extra_copies_dropped is not a reason"
    if "schedule" not in record:
        if status == "ok" or {"ii", "solve_status", "triton_order"} & set(record):
            return "a solved record without its schedule"
        return None
    if "triton_order" in record and job.triton is None:
        return "Triton's own schedule in the record of a job that is not a Triton kernel"
    problem = schedule_problem(record["schedule"], job)
    if problem is None and record.get("triton_order") is not None:
        problem = schedule_problem(record["triton_order"], job)
    if problem is not None:
        return problem
    doc = record["schedule"]
    if record.get("ii") != doc["ii"] or record.get("solve_status") != doc["status"]:
        return (f"the record says II {record.get('ii')!r} ({record.get('solve_status')!r}), its schedule "
                f"II {doc['ii']} ({doc['status']})")
    return None


def schedule_problem(doc: Any, job: Job) -> str | None:
    """Why ``doc`` (a ``twill-schedule/1`` object with its ``loop_graph``, from a cached record) is not a valid
    schedule of ``job``, or None. It must load, its graph must pass validation and the schedule the verifier
    (:func:`twill.schedule.verify.violations`, warp specialization included) on ``job``'s machine with
    ``job``'s register limit and streaming depth, and its graph must be ``job``'s: for a built-in kernel or a
    graph file, ``job.graph`` normalized by the schedule's own record
    (:func:`twill.solve.provenance.derivation_problem`; the ptxas-checked search's reserved registers may
    differ, as its ``stats["registers"]`` says); for a Triton kernel, whose graph is extracted in the solve,
    a graph of the candidate's constexprs, ``num_warps`` and ``num_stages``, and no warp assignment."""
    from twill.ir.io import graph_from_dict
    from twill.ir.validate import validate_graph
    from twill.schedule.result import Schedule
    from twill.schedule.verify import violations

    cand, machine = job.candidate, job.machine
    try:
        options = job.solve_options()
        if not isinstance(doc, dict) or not isinstance(doc.get("loop_graph"), dict):
            return "a schedule without its loop_graph"
        schedule = Schedule.from_dict(doc, graph_from_dict(doc["loop_graph"]))
        validate_graph(schedule.graph, machine.units)
        found = violations(schedule, machine, options)
        raw = None if job.graph is None else graph_from_dict(dict(job.graph))
    except Exception as exc:  # noqa: BLE001 - a record that cannot be rebuilt is a miss, whatever it holds
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return f"the schedule does not load: {type(exc).__name__}: {first}"
    if found:
        return found[0]
    if schedule.arch != machine.name:
        return f"a schedule for {schedule.arch!r}, not {machine.name!r}"
    if raw is None:
        attrs = schedule.graph.attrs
        want = {k.lower(): v for k, v in cand.options if isinstance(v, (int, float, bool, str))}
        want.update(num_warps=cand.num_warps or 4, **({"num_stages": cand.num_stages} if cand.num_stages else {}))
        wrong = next((k for k, v in want.items() if attrs.get(k) != v), None)
        if wrong is not None:
            return f"a schedule of another configuration ({wrong} {attrs.get(wrong)!r}, not {want[wrong]!r})"
        return "a warp-specialized schedule of a Triton kernel" if schedule.assignment else None
    from twill.solve.provenance import derivation_problem
    from twill.tune.registers import FLOOR

    if schedule.streaming_depth != options.for_graph(raw).streaming_depth:
        return f"a schedule at streaming depth {schedule.streaming_depth}, not {options.for_graph(raw).streaming_depth}"
    registers = schedule.stats.get("registers")
    reserved = schedule.graph.attrs.get("reserved_regs")
    searched = (isinstance(registers, dict) and registers.get("reserved_regs") == reserved
                and isinstance(reserved, int) and not isinstance(reserved, bool) and reserved >= FLOOR)
    problem = derivation_problem(schedule, raw, allowed_attrs=("reserved_regs",) if searched else ())
    return None if problem is None else f"not a schedule of this job's graph: {problem}"


def cache_write(directory: Path, key: str, record: Mapping[str, Any]) -> None:
    """Store ``record`` atomically; a cache that cannot be written is skipped silently (it is only a cache)."""
    from twill.files import write_json_atomic

    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_json_atomic(directory / f"{key}.json", dict(record))
    except OSError:
        return


# -- progress --------------------------------------------------------------------------------------------
@dataclass
class Progress:
    """A progress bar on ``stream``: redrawn in place (``\\r``) on a terminal, else one line per candidate
    when ``lines`` is set, else silent."""

    total: int
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    lines: bool = False
    done: int = 0
    cached: int = 0
    failed: int = 0

    def update(self, label: str, record: Mapping[str, Any], cached: bool) -> None:
        """Count one finished candidate and redraw (or print its line)."""
        self.done += 1
        self.cached += cached
        self.failed += record["status"] != "ok"
        tty = self.stream.isatty()
        if tty:
            width = 30
            fill = width * self.done // max(1, self.total)
            end = "\n" if self.done == self.total else ""
            self.stream.write(f"\rtwill: tune [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} "
                              f"({self.cached} cached, {self.failed} failed){end}")
        elif self.lines:
            how = "cached" if cached else f"{record.get('seconds', 0):.1f} s"
            self.stream.write(f"twill: tune {self.done}/{self.total} {label}: {record['status']} ({how})\n")
        self.stream.flush()


# -- the sweep -------------------------------------------------------------------------------------------
def run_sweep(jobs: Iterable[Job], *, workers: int = 2, ray_address: str | None = None, use_cache: bool = True,
              progress: Progress | None = None) -> list[dict[str, Any]]:
    """Solve ``jobs`` (cache first, then a process pool of ``workers``, or Ray at ``ray_address``); the records
    in job order, each with ``key`` and ``cached`` added. Of the uncached jobs that share a solve
    (:meth:`Job.solve_key`) the first is solved; the others then start from its schedule, or take its record
    when it has none (the solver proved there is none, or failed)."""
    jobs = list(jobs)
    version = twill_version()
    keys = [job.key(version) for job in jobs]
    directory = cache_dir()
    records: list[dict[str, Any] | None] = [None] * len(jobs)

    def finish(i: int, record: dict[str, Any], cached: bool) -> None:
        if not cached and use_cache and record.get("cacheable"):
            cache_write(directory, keys[i], record)
        records[i] = {**record, "key": keys[i], "cached": cached}
        if progress is not None:
            progress.update(jobs[i].candidate.label(), record, cached)

    leaders: dict[str, int] = {}
    followers: list[int] = []
    for i in range(len(jobs)):
        hit = cache_read(directory, keys[i], jobs[i]) if use_cache else None
        if hit is not None:
            finish(i, hit, True)
        elif jobs[i].schedule is None and leaders.setdefault(jobs[i].solve_key(version), i) != i:
            followers.append(i)
    runner = _run_ray if ray_address else _run_pool

    def run(todo: list[int]) -> None:
        if todo:
            runner([jobs[i] for i in todo], lambda j, rec: finish(todo[j], rec, False),
                   workers=workers, address=ray_address)

    run(list(leaders.values()))
    emit_only = []
    for i in followers:
        lead = records[leaders[jobs[i].solve_key(version)]] or {}
        if lead.get("schedule") is not None:
            jobs[i] = replace(jobs[i], schedule=lead["schedule"])
            emit_only.append(i)
        else:                       # no schedule to emit from: the same solve's outcome
            finish(i, {k: v for k, v in lead.items() if k not in ("key", "cached")}, False)
    run(emit_only)
    return [r for r in records if r is not None]


def _crashed(exc: BaseException) -> dict[str, Any]:
    """The record of a job whose worker died before returning one (not cached)."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return {"status": "error", "reason": f"worker failed: {type(exc).__name__}: {first}", "cacheable": False,
            "seconds": 0.0}


def _worker_signals() -> None:
    """Signals in a worker process: Ctrl-C (sent to the whole process group) is ignored, the parent decides
    (:func:`_run_pool`); SIGTERM, by which the parent ends a worker, ends it at once (whatever handler the worker
    was started with). The worker started with both blocked
    (:func:`~twill.files.stop_signals_blocked`); they are unblocked once handled so."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


#: Modules the forkserver imports once, before it forks any worker, so that a worker does not import the
#: solver again for every pool (a module that is not installed is skipped).
WORKER_PRELOAD = ["twill.tune.sweep", "twill.solve", "twill.schedule.document", "twill.ir.io",
                  "ortools.sat.python.cp_model"]
#: Added to :data:`WORKER_PRELOAD` for a sweep of Triton candidates, which compile the kernel in every job.
TRITON_PRELOAD = ["triton", "twill.integrations.triton.inject"]


def _pool_context(triton: bool = False) -> Any:
    """The start method of the worker processes: ``forkserver`` where the platform has it, else ``spawn``. A
    worker forked from this process would copy its threads' state: with JAX loaded (as in a test run, or a
    program that tunes from Python beside JAX) a fork may deadlock, and JAX warns on every fork. A forkserver
    forks the workers from a fresh single-threaded process, started once per process (inside
    :func:`~twill.files.stop_signals_blocked`, so it and its workers start with the stop signals blocked) with
    :data:`WORKER_PRELOAD` imported, and :data:`TRITON_PRELOAD` for a sweep of Triton candidates (``triton``)."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(WORKER_PRELOAD + (TRITON_PRELOAD if triton else []))
    return context


def _run_pool(jobs: list[Job], done: Callable[[int, dict[str, Any]], None], *, workers: int,
              address: str | None) -> None:
    """Run ``jobs`` in a pool of ``workers`` processes, calling ``done`` with each record as it comes. An
    exception in this process while they run (Ctrl-C's ``KeyboardInterrupt``, SIGTERM's
    :class:`~twill.cli.Terminated`) cancels the queued jobs and terminates the workers before it is raised
    again: the unfinished jobs leave no record (nor cache entry)."""
    context = _pool_context(triton=any(job.triton is not None for job in jobs))
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_worker_signals, mp_context=context)
    try:
        with stop_signals_blocked():       # the workers start in the first submit
            futures = {pool.submit(run_job, job): i for i, job in enumerate(jobs)}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                try:
                    record = fut.result()
                except Exception as exc:  # noqa: BLE001 - a worker that died (BrokenProcessPool) fails one job
                    record = _crashed(exc)
                done(futures[fut], record)
    except BaseException:
        _stop_pool(pool)
        raise
    pool.shutdown()


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel the queued jobs of ``pool`` and terminate its worker processes now (``shutdown`` alone would
    wait for the running jobs)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())   # no public handle before 3.14
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=1.0)


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """A one-line error now when ``host:port`` (or ``ray://host:port``) does not accept a TCP connection:
    Ray itself keeps retrying for minutes. Other addresses (``auto``) are left to Ray."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return
    except OSError as exc:
        raise TwillError(f"cannot reach the Ray cluster at {address!r}: {exc.strerror or exc}") from None


def _run_ray(jobs: list[Job], done: Callable[[int, dict[str, Any]], None], *, workers: int,
             address: str | None) -> None:
    """The same :func:`run_job` as a Ray remote task on the cluster at ``address``; the local ``twill``
    package is shipped with the job (``runtime_env`` ``py_modules``)."""
    try:
        import ray
    except ImportError:
        raise TwillError("--ray needs Ray: pip install 'twill-gpu[ray]'") from None
    import twill

    _check_reachable(address or "")
    package = os.path.dirname(os.path.abspath(twill.__file__))
    try:
        ray.init(address=address, runtime_env={"py_modules": [package]}, logging_level="ERROR",
                 log_to_driver=False, ignore_reinit_error=True)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise TwillError(f"cannot connect to the Ray cluster at {address!r}: {first}") from None
    pending: list[Any] = []
    try:
        task = ray.remote(num_cpus=1)(run_job)
        refs = {task.remote(job): i for i, job in enumerate(jobs)}
        pending = list(refs)
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for ref in finished:
                try:
                    record = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a crashed or lost Ray task fails one job
                    record = _crashed(exc)
                done(refs[ref], record)
    except BaseException:       # Ctrl-C or SIGTERM: the unfinished tasks are cancelled, not left running
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise
    finally:
        ray.shutdown()
