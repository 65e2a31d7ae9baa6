"""Schedule files: a ``twill-schedule/1`` object made self-contained with the loop graph its times refer to
(``twill schedule -o``, ``twill inject``'s ``schedule.json``, the tuner's cache), and read back through the
verification gate."""

from __future__ import annotations

from typing import Any

from twill.errors import FormatError
from twill.machine.models import get_machine
from twill.schedule.result import Schedule


def schedule_document(schedule: Schedule) -> dict[str, Any]:
    """A self-contained ``twill-schedule/1`` object: the schedule plus ``loop_graph``, the graph its times
    refer to (in ``twill-graph/1``)."""
    from twill.ir.io import graph_to_dict

    doc = schedule.to_dict()
    doc["loop_graph"] = graph_to_dict(schedule.graph)
    return doc


def load_schedule_document(path: str) -> Schedule:
    """Read a schedule file written by ``twill schedule -o`` (with its ``loop_graph``) through the
    verification gate (:func:`twill.schedule.verify.admit` on the machine the schedule is for): a schedule
    that violates any constraint of the model is refused with the first violation named. A kernel's file of
    several loops (:func:`load_schedule_documents`) is refused: this reads one loop's schedule."""
    schedules = load_schedule_documents(path)
    if len(schedules) > 1:
        raise FormatError(f"{path}: holds the schedules of {len(schedules)} loops; give one loop's schedule "
                          f"('twill schedule --loop N -o')")
    return schedules[0]


def load_schedule_documents(path: str) -> list[Schedule]:
    """The schedules of a schedule file, each through the verification gate: the one of a ``twill-schedule/1``
    file, or those of a kernel's file ``{"kernel": NAME, "loops": [...]}`` (``twill schedule -o`` and
    ``twill inject`` of a Triton kernel with several loops that hold dots), in its order."""
    from twill.files import read_json_file

    data = read_json_file(path, "schedule")
    if isinstance(data, dict) and "loops" in data:
        loops = data["loops"]
        if not isinstance(loops, list) or not loops:
            raise FormatError(f"{path}: 'loops' must be a non-empty list of schedules")
        return [_admitted(doc, f"{path}: loops[{k}]") for k, doc in enumerate(loops)]
    return [_admitted(data, path)]


def _admitted(data: Any, where: str) -> Schedule:
    """The schedule of one ``twill-schedule/1`` object ``data`` (from ``where``), admitted by the gate."""
    from twill.ir.io import graph_from_dict
    from twill.schedule.verify import admit

    if not isinstance(data, dict) or "loop_graph" not in data:
        raise FormatError(f"{where}: not a schedule file written by 'twill schedule -o' (no 'loop_graph')")
    schedule = Schedule.from_dict(data, graph_from_dict(data["loop_graph"]))
    return admit(schedule, get_machine(schedule.arch))


def is_schedule_file(path: str) -> bool:
    """Whether ``path`` is a JSON file holding a ``twill-schedule/1`` object (not a graph); an unreadable or
    invalid file is not one (whoever reads it as a graph or a target reports it)."""
    from twill.files import read_json_file
    from twill.schedule.result import SCHEDULE_FORMAT

    if not path.endswith(".json"):
        return False
    try:
        data = read_json_file(path, "schedule")
    except FormatError:
        return False
    return isinstance(data, dict) and data.get("format") == SCHEDULE_FORMAT
