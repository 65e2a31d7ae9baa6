"""The solver's speed-ups keep its answers: every built-in kernel gets the same modulo II, final II, L,
lexicographic objectives and warp groups as the search before them (``tests/data/solve_baseline.json``,
solved at commit 1bf2d02 with the default options)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from solved import solved_kernel

BASELINE = json.loads((Path(__file__).parents[1] / "data" / "solve_baseline.json").read_text())["rows"]

#: Rows whose search takes more than a few seconds on a 2-core machine.
SLOW = {("flash-bwd", "b200")}


def cases() -> list:
    out = []
    for row in BASELINE:
        name = "-".join([row["kernel"], *(f"{k}{v}" for k, v in row["options"].items()), row["arch"],
                         *([f"regs{row['reg_limit']}"] if row["reg_limit"] else [])])
        slow = (row["kernel"], row["arch"]) in SLOW
        out.append(pytest.param(row, id=name, marks=[pytest.mark.slow] if slow else []))
    return out


@pytest.mark.parametrize("row", cases())
def test_same_answer_as_before_the_speed_ups(row):
    result = solved_kernel(row["kernel"], row["arch"], row["options"], reg_limit=row["reg_limit"])
    assert (result.stats["modulo_ii"], result.ii, result.length, result.status) == (
        row["modulo_ii"], row["ii"], row["length"], row["status"])
    assert {o["name"]: o["value"] for o in result.stats["objectives"]} == row["objectives"]
    assert [f"{w.role}:{w.num_warps}x{w.regs}" for w in result.warps] == row["groups"]
