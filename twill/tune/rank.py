"""Rank solved candidates by predicted time; the ranking table and the ``twill-tune/1`` sweep document."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from twill.errors import TwillError
from twill.machine.models import Machine
from twill.quote import printable
from twill.schedule.report import _table
from twill.schedule.result import Schedule
from twill.tune.predict import Prediction, Shape, predict, problem_of
from twill.tune.space import Candidate, Space

#: Format tag of the sweep JSON written by ``twill tune --json``.
TUNE_FORMAT = "twill-tune/1"


@dataclass(frozen=True)
class Result:
    """One candidate after the sweep: its record (:func:`twill.tune.sweep.run_job`), and for a solved one the
    schedule and the prediction.

    ``injected`` (Triton targets only, else None): whether Twill's schedule is injected into the kernel, or
    Triton's own is kept because the model predicts Twill's less than
    :data:`~twill.integrations.triton.inject.INJECT_MIN_GAIN` faster; the prediction is then that of Triton's order."""

    candidate: Candidate
    record: Mapping[str, Any]
    schedule: Schedule | None = None
    prediction: Prediction | None = None
    tflops: float | None = None
    injected: bool | None = None

    @property
    def status(self) -> str:
        """The record's status (``ok``, ``infeasible``, ``cannot_emit``, ``spills``, ``error``)."""
        return str(self.record["status"])

    def to_dict(self) -> dict[str, Any]:
        """One entry of the sweep document's ``results``."""
        out: dict[str, Any] = {"settings": self.candidate.settings(), "status": self.status,
                               "reason": self.record.get("reason"), "cached": self.record.get("cached", False),
                               "solve_seconds": self.record.get("seconds")}
        if self.record.get("spills") is not None:
            out["spills"] = self.record["spills"]
        if self.record.get("extra_copies_dropped"):
            out["extra_copies_dropped"] = self.record["extra_copies_dropped"]
        if self.schedule is not None:
            out.update(ii=self.schedule.ii, solve_status=self.schedule.status,
                       stages=self.schedule.num_stages,
                       warps=[{"num_warps": g.num_warps, "regs": g.regs} for g in self.schedule.warps])
        if self.prediction is not None:
            out.update(prediction=self.prediction.to_dict(), tflops=round(self.tflops or 0.0, 2))
        if self.injected is not None:
            out["injected"] = self.injected
        return out


def _schedule_of(record: Mapping[str, Any], key: str = "schedule") -> Schedule:
    """The schedule stored in a solved record under ``key`` (``twill-schedule/1`` with its ``loop_graph``)."""
    from twill.ir.io import graph_from_dict

    doc = record[key]
    return Schedule.from_dict(doc, graph_from_dict(doc["loop_graph"]))


def rank(candidates: Sequence[Candidate], records: Sequence[Mapping[str, Any]], shape: Shape,
         machine: Machine) -> list[Result]:
    """Results of a sweep: solved candidates by predicted time (fastest first; ties go to fewer, larger
    tiles, which reuse each loaded operand more), then the failed ones. A
    schedule whose problem does not match ``shape`` is an ``error`` with the reason."""
    solved: list[Result] = []
    failed: list[Result] = []
    for cand, record in zip(candidates, records):
        if record["status"] != "ok":
            failed.append(Result(cand, record))
            continue
        schedule = _schedule_of(record)
        try:
            if problem_of(schedule.graph) != shape.problem:
                raise TwillError(f"the kernel is a {problem_of(schedule.graph)} loop, the shape a {shape.problem}")
            pred = predict(schedule, shape, machine, persistent=bool(cand.persistent))
            injected = None
            if "triton_order" in record:       # a Triton target: Twill's schedule, or Triton's own kept
                injected = True
                if record["triton_order"] is not None:
                    from twill.integrations.triton.inject import INJECT_MIN_GAIN

                    own = predict(_schedule_of(record, "triton_order"), shape, machine)
                    injected = pred.seconds < own.seconds * (1 - INJECT_MIN_GAIN)
                    pred = pred if injected else own
        except TwillError as exc:
            failed.append(Result(cand, {**record, "status": "error", "reason": str(exc)}, schedule))
            continue
        solved.append(Result(cand, record, schedule, pred, shape.flops_of(schedule.graph) / pred.seconds / 1e12,
                             injected))
    solved.sort(key=lambda r: (r.prediction.seconds, r.prediction.tiles, r.candidate.label())
                if r.prediction else (0.0, 0, ""))
    return solved + failed


#: Settings that leave a candidate's tiling alone (ring depth, register budget, the persistent form of the same
#: kernel): candidates differing only in these get the same prediction or one within a few percent, well inside
#: its error, so :func:`measure_picks` spends measurements on other tilings first.
TILING_NEUTRAL = ("streaming_depth", "reg_limit", "num_stages", "persistent")


def tiling(candidate: Candidate) -> tuple[tuple[str, Any], ...]:
    """``candidate``'s settings without :data:`TILING_NEUTRAL` ones: its tiles, sub-tiles and warps."""
    return tuple((k, v) for k, v in candidate.settings().items() if k not in TILING_NEUTRAL)


def measure_picks(results: Sequence[Result], k: int) -> list[tuple[int, Result]]:
    """The ``k`` solved results to measure on the GPU with their predicted ranks (1 = fastest), in rank order:
    the best-ranked of each tiling first, then the rest. The prediction's error (docs/performance.md, "Model
    fidelity") is larger than what separates tilings near the top, and the ring depths and register
    budgets of one tiling often tie, so measuring three depths of one tile would leave a faster tiling
    unmeasured."""
    ranked = list(enumerate((r for r in results if r.prediction is not None), start=1))
    firsts: list[tuple[int, Result]] = []
    seen: set[tuple[tuple[str, Any], ...]] = set()
    for rank_, r in ranked:
        if tiling(r.candidate) not in seen:
            seen.add(tiling(r.candidate))
            firsts.append((rank_, r))
    picked = {rank_ for rank_, _ in firsts}
    return (firsts + [pair for pair in ranked if pair[0] not in picked])[:k]


#: Column headers of the predicted time and rate: on a calibrated machine (``--machine``), and on a built-in
#: machine's datasheet rates, where they are labelled ``uncalibrated`` (they rank, they do not predict).
PREDICTED_COLUMNS = {True: ("predicted us", "TFLOP/s"), False: ("uncalibrated us", "uncalibrated TFLOP/s")}


def uncalibrated_note(machine: Machine) -> str:
    """The line a ranking on ``machine``'s datasheet rates (no calibration) carries; empty when calibrated."""
    if machine.calibration is not None:
        return ""
    return (f"uncalibrated: {machine.name}'s datasheet rates, no --machine file; the times and rates below rank "
            f"the candidates but are not kernel times (they sit near peak; 'twill calibrate' measures a "
            f"machine file for --machine, docs/calibration.md)")


def format_ranking(results: Sequence[Result], top: int, rejected: int = 0, calibrated: bool = True) -> str:
    """The ranking table: the ``top`` best solved candidates, then a count of the others by status (text
    through :func:`twill.quote.printable`: a cached reason cannot send control characters); ``calibrated``
    False labels the time and rate columns ``uncalibrated`` (:data:`PREDICTED_COLUMNS`)."""
    rows = []
    for i, r in enumerate(results[:top]):
        if r.prediction is None or r.schedule is None:
            break
        rows.append([i + 1, r.candidate.label(), r.schedule.ii, f"{r.prediction.breakdown['ii_raw']:.0f}",
                     f"{r.prediction.microseconds:.1f}", f"{r.prediction.breakdown['clock_ghz']:.2f}",
                     f"{r.tflops:.0f}", r.schedule.status])
    time_column, rate_column = PREDICTED_COLUMNS[calibrated]
    header = ["rank", "candidate", "II", "II raw", time_column, "GHz", rate_column, "status"]
    if any(r.injected is not None for r in results[:len(rows)]):
        header.append("schedule")
        for row, r in zip(rows, results):
            row.append({True: "Twill's", False: "Triton's own", None: "-"}[r.injected])
    first = next((r.record.get("reason") for r in results if r.record.get("reason")), None)
    lines = (_table(header, rows) if rows else
             ["  no candidate was scheduled" + (f"; the first reason: {first}" if first else "")])
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    if rejected:
        counts["filtered out"] = rejected
    summary = ", ".join(f"{n} {status}" for status, n in counts.items())
    return "\n".join(printable(line) for line in lines + [f"candidates: {summary}"])


def sweep_document(target: str, machine: Machine, shape: Shape, space: Space, results: Sequence[Result],
                   measured: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The ``twill-tune/1`` JSON of a sweep: target, machine (``calibrated``: false when the predictions use
    the built-in machine's datasheet rates), shape, every candidate (ranked), the candidates filtered out
    before solving, and the GPU measurements when ``--measure`` ran."""
    return {"format": TUNE_FORMAT, "target": target, "arch": machine.name,
            "calibrated": machine.calibration is not None, "shape": shape.as_dict(),
            "problem": shape.problem, "results": [r.to_dict() for r in results],
            "rejected": [{"settings": c.settings(), "reason": why} for c, why in space.rejected],
            "measured": [dict(m) for m in measured]}
