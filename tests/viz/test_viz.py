"""Pictures and the HTML report (twill.viz): every built-in kernel draws, files are valid, colours agree."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest
from solved import solved_kernel

from twill.errors import TwillError, UnsupportedFeatureError
from twill.ir import GraphBuilder
from twill.kernels import build_kernel, family, list_kernels
from twill.machine import B200, H100, Machine
from twill.schedule.result import Schedule, WarpGroup
from twill.solve import schedule as solve
from twill.solve.options import SolveOptions
from twill.viz import PICTURES, save_all, save_timeline, write_report
from twill.viz.graphlayout import dot_layout, layered_layout, layers, parse_dot_plain
from twill.viz.layout import (live_copies, live_interval, phases, pressure, reservation_table, run_ahead_starts,
                              timeline)
from twill.viz.palette import (NEUTRAL, op_colors, role_color, text_color, unit_color, warp_group_colors)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FILL = re.compile(r"fill:\s*(#[0-9a-fA-F]{6})")


# -- fixtures ------------------------------------------------------------------------------------------
def paper_schedule() -> Schedule:
    """The paper's running example at II = 2 (S hoisted one stage), on one compute warp group."""
    graph = build_kernel("paper-example", H100)
    return Schedule(graph=graph, arch="h100", solver="manual", status="optimal", ii=2, ii_lower_bound=2,
                    starts={"S": 0, "P": 2, "O": 3}, assignment={"S": 0, "P": 0, "O": 0},
                    warps=(WarpGroup(0, "compute", 4, 240, ("S", "P", "O")),))


def with_warps(schedule: Schedule) -> Schedule:
    """A hand-built warp assignment over a solved modulo schedule, shaped like the paper's strategies:
    variable-latency ops on a load warp, sub-tile 0 / 1 ops on two compute groups, single-subtile ops on
    the first compute group. Only for pictures: it is not checked against the warp constraints."""
    graph = schedule.graph
    groups: dict[str, list[str]] = {"load": [], "a": [], "b": []}
    for op in graph.ops:
        if op.variable_latency:
            groups["load"].append(op.name)
        elif op.attrs.get("subtile") == 1:
            groups["b"].append(op.name)
        else:
            groups["a"].append(op.name)
    specs = [("load", 1, 24, groups["load"]), ("compute", 4, 240, groups["a"]), ("compute", 4, 240, groups["b"])]
    warps = tuple(WarpGroup(i, role, n, regs, tuple(ops))
                  for i, (role, n, regs, ops) in enumerate(s for s in specs if s[3]))
    assignment = {name: wg.id for wg in warps for name in wg.ops}
    return replace(schedule, assignment=assignment, warps=warps)


#: Kernels whose joint (warp-specialized) schedule solves in a few seconds; the others are drawn with the
#: hand-built assignment of :func:`with_warps` over their modulo schedule.
QUICK_JOINT = {("paper-example", "h100"), ("paper-example", "b200"), ("gemm", "h100"), ("gemm", "b200"),
               ("flash-fwd", "h100"), ("flash-fwd", "b200"), ("flash-bwd", "h100")}


#: Drawings that take more than a few seconds on a 2-core machine (solve and draw 16-24 ops over several
#: copies); the quick subset keeps the other kernels, which exercise the same pictures.
SLOW_DRAWINGS = {("flash-fwd", "b200"), ("flash-bwd", "h100"), ("flash-bwd", "b200")}


def builtin_cases() -> list:
    cases = []
    for entry in list_kernels():
        options = {"subtiles": 2} if entry.name == "flash-fwd" else {}
        for machine in (H100, B200):
            slow = (entry.name, machine.name) in SLOW_DRAWINGS
            cases.append(pytest.param(entry.name, machine, options, id=f"{entry.name}-{machine.name}",
                                      marks=[pytest.mark.slow] if slow else []))
    return cases


def solved(name: str, machine: Machine, options: dict, *, ws: bool = False) -> Schedule:
    """The solver's schedule (shared with the other test files, :mod:`solved`): modulo only, or joint with
    ``ws``."""
    try:
        family(name).module("graph")
    except ModuleNotFoundError:
        pytest.skip(f"kernel module of {name!r} is not in this checkout yet")
    return solved_kernel(name, machine.name, options, ws=ws)


def svg_fills(path_or_text: Path | str) -> set[str]:
    text = path_or_text.read_text() if isinstance(path_or_text, Path) else path_or_text
    return {c.lower() for c in FILL.findall(text)}


def check_picture(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000, path
    if path.suffix == ".svg":
        root = ET.fromstring(data)
        assert root.tag.endswith("svg")
    else:
        from matplotlib.image import imread

        assert data.startswith(PNG_SIGNATURE)
        pixels = imread(str(path))
        assert pixels.shape[0] > 100 and pixels.shape[1] > 100


# -- import hygiene ------------------------------------------------------------------------------------
def test_import_does_not_load_matplotlib_or_solvers():
    code = ("import sys, twill.viz; "
            "bad = [m for m in ('matplotlib', 'ortools') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- palette -------------------------------------------------------------------------------------------
def test_warp_group_colours_follow_roles_and_rank():
    warps = (WarpGroup(0, "load", 1, 24, ()), WarpGroup(1, "compute", 4, 240, ()),
             WarpGroup(2, "compute", 4, 240, ()), WarpGroup(3, "mma", 1, 24, ()),
             WarpGroup(4, "correction", 4, 88, ()), WarpGroup(5, "softmax", 4, 176, ()))
    colors = warp_group_colors(warps)
    assert colors[0] == role_color("load") == "#2ca02c"
    assert colors[1] == role_color("compute", 0) != colors[2] == role_color("compute", 1)
    assert colors[5] == role_color("softmax", 2)          # softmax shares the compute family
    assert colors[3] == role_color("mma") and colors[4] == role_color("correction")
    assert len(set(colors.values())) == len(warps)


def test_op_colours_come_from_the_warp_group_or_the_unit():
    sched = paper_schedule()
    assert set(op_colors(sched).values()) == {warp_group_colors(sched.warps)[0]}
    plain = replace(sched, assignment={}, warps=())
    colors = op_colors(plain)
    assert colors["S"] == colors["O"] == unit_color("TC") == unit_color("tc")
    assert colors["P"] == unit_color("exp") == unit_color("mufu")
    assert unit_color("some_new_unit") == unit_color("some_new_unit")
    b = GraphBuilder("idle")
    b.op("wait", cycles=1)
    graph = b.build()
    idle = Schedule(graph=graph, arch="h100", solver="manual", status="optimal", ii=1, ii_lower_bound=1,
                    starts={"wait": 0})
    assert op_colors(idle)["wait"] == NEUTRAL


def test_text_colour_contrasts_with_background():
    assert text_color("#ffffff") == "black" and text_color("#1f77b4") == "white"


# -- geometry ------------------------------------------------------------------------------------------
def test_live_copies_matches_brute_force():
    for ii in (1, 2, 5):
        for start in range(-3, 8):
            for end in range(start + 1, start + 14):
                for residue in range(ii):
                    brute = sum(1 for k in range(-20, 20) if start <= residue + k * ii < end)
                    assert live_copies(start, end, residue, ii) == brute


def test_joint_paper_example_report(tmp_path):
    graph = build_kernel("paper-example", H100)
    sched = solve(graph, H100, SolveOptions(time_limit=30))
    assert sched.warps and sched.ii == 2
    page = write_report(sched, H100, tmp_path / "p.html", text_report="t", pipelined="p").read_text()
    for wg in sched.warps:
        assert warp_group_colors(sched.warps)[wg.id] in page.lower()


def test_paper_example_geometry():
    sched = paper_schedule()
    ph = phases(sched, 4)
    assert (ph.steady_start, ph.epilogue_start, ph.end) == (2, 8, 10)
    tl = timeline(sched, H100, 4)
    assert [lane.key for lane in tl.lanes] == ["wg0", "unit:TC", "unit:EXP"]
    tc = sorted((b.start, b.label) for b in tl.bars if b.lane == "unit:TC")
    assert tc[:4] == [(0, "S[0]"), (2, "S[1]"), (3, "O[0]"), (4, "S[2]")]
    table = reservation_table(sched, H100)
    assert sorted((c.unit, c.start, c.op, c.stage) for c in table.cells) == [
        ("EXP", 0, "P", 1), ("TC", 0, "S", 0), ("TC", 1, "O", 1)]
    assert live_interval(sched, "O") == (3, 5)            # O -> O carried: live one II
    regs = pressure(sched, H100)
    assert regs[0].limit == 240


def test_reservation_table_rows_never_overlap():
    sched = solved("flash-fwd", H100, {"subtiles": 2})
    table = reservation_table(sched, H100)
    for unit, rows in table.units:
        assert rows == 1                                   # capacity-1 units, valid schedule
        cells = sorted((c.start, c.end) for c in table.cells if c.unit == unit)
        assert all(a[1] <= b[0] for a, b in zip(cells, cells[1:]))
        assert all(0 <= s < e <= table.ii for s, e in cells)
    used = sum(c.end - c.start for c in table.cells if c.unit == "tc")
    assert used == sum(op.usage("tc") for op in sched.graph.ops)


def test_streaming_loads_run_ahead_within_their_buffers():
    sched = with_warps(solved("flash-fwd", H100, {"subtiles": 2}))
    iterations = 5
    ahead = run_ahead_starts(sched, iterations)
    graph, ii, depth = sched.graph, sched.ii, sched.streaming_depth
    loads = [n for n in graph.op_names if graph.is_streaming(n)]
    assert loads and set(ahead) == {(n, k) for n in loads for k in range(iterations)}
    for (name, k), t in ahead.items():
        assert t <= sched.starts[name] + k * ii            # never later than its modulo residue
        for e in graph.out_edges(name):                    # buffer of iteration k - D released
            assert t >= sched.starts[e.dst] + graph.op(e.dst).cycles + (k - depth + e.distance) * ii
    tl = timeline(sched, H100, iterations)
    load_bars = [b for b in tl.bars if b.lane == "wg0"]
    assert {(b.op, b.iteration): b.start for b in load_bars} == ahead


# -- graph layout --------------------------------------------------------------------------------------
def test_layered_layout_routes_long_edges():
    graph = build_kernel("flash-fwd", B200, subtiles=2)
    layout = layered_layout(graph)
    assert set(layout.positions) == set(graph.op_names)
    assert len(set(layout.positions.values())) == len(graph.ops)
    lvl = layers(graph)
    for index, e in enumerate(graph.edges):
        if e.distance == 0 and e.src != e.dst:
            assert lvl[e.dst] > lvl[e.src]
        span = abs(lvl[e.dst] - lvl[e.src])
        assert len(layout.via.get(index, ())) == (span - 1 if span > 1 and e.src != e.dst else 0)


def test_dot_plain_output_is_parsed():
    graph = build_kernel("paper-example", H100)
    plain = "\n".join(["graph 1 3.4 2.9",
                       "node S 1.7 2.6 1.3 0.5 S solid box black lightgrey",
                       "node P 1.7 1.5 1.3 0.5 P solid box black lightgrey",
                       "node O 1.7 0.4 1.3 0.5 O solid box black lightgrey",
                       "edge S P 4 1.7 2.35 1.7 2.1 1.7 2.0 1.7 1.75 solid black",
                       "edge P O 4 1.7 1.25 1.7 1.0 1.7 0.9 1.7 0.65 solid black", "stop"])
    layout = parse_dot_plain(plain, graph)
    assert layout is not None and layout.engine == "dot"
    assert layout.positions["S"] == pytest.approx((1.0, 2.6 / 1.1))
    assert sorted(layout.bezier) == [0, 1] and len(layout.bezier[0]) == 4
    assert parse_dot_plain("node S 1 1 1 1\nstop", graph) is None


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz dot is not installed")
def test_dot_layout_when_graphviz_is_installed():
    graph = build_kernel("flash-fwd", B200, subtiles=2)
    layout = dot_layout(graph)
    assert layout is not None and layout.engine == "dot"
    assert set(layout.positions) == set(graph.op_names)
    routed = {i for i, e in enumerate(graph.edges) if e.src != e.dst}
    assert set(layout.bezier) == routed
    assert all((len(points) - 1) % 3 == 0 for points in layout.bezier.values())   # cubic Bézier pieces


# -- files ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,machine,options", builtin_cases())
def test_every_builtin_kernel_draws(tmp_path, name, machine, options):
    plain = solved(name, machine, options)
    quick = (name, machine.name) in QUICK_JOINT
    joint = solved(name, machine, options, ws=True) if quick else with_warps(plain)
    assert joint.warps
    for variant, s in (("plain", plain), ("ws", joint)):
        paths = save_all(s, machine, tmp_path / variant, fmt="svg")
        assert [p.name for p in paths] == [f"{pic}.svg" for pic in PICTURES]
        for path in paths:
            check_picture(path)
        longest = max(s.graph.ops, key=lambda op: op.cycles).name
        assert f"{longest}[1]" in paths[0].read_text()                  # bars read op[iteration]
    check_picture(save_timeline(joint, machine, tmp_path / "timeline.png"))


def test_colours_agree_between_pictures(tmp_path):
    sched = solved("flash-fwd", H100, {"subtiles": 2}, ws=True)
    assert len(sched.warps) >= 2
    paths = dict(zip(PICTURES, save_all(sched, H100, tmp_path, fmt="svg")))
    group_colors = set(warp_group_colors(sched.warps).values())
    assert len(group_colors) == len(sched.warps)
    for picture in ("timeline", "mrt", "graph"):
        fills = svg_fills(paths[picture])
        assert group_colors <= fills, picture
    register_holders = {warp_group_colors(sched.warps)[wg.id] for wg in sched.warps
                        if any(sched.graph.op(n).regs for n in wg.ops)}
    assert register_holders and register_holders <= svg_fills(paths["pressure"])
    for series in pressure(sched, H100):
        assert set(series.colors.values()) <= group_colors


def test_unknown_suffix_is_a_one_line_error(tmp_path):
    with pytest.raises(UnsupportedFeatureError, match="unknown format '.jpg'"):
        save_timeline(paper_schedule(), H100, tmp_path / "t.jpg")
    assert list(tmp_path.iterdir()) == []


def test_unwritable_paths_are_one_line_errors(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(TwillError, match=r"cannot write '.*missing/t.png': No such file or directory"):
        save_timeline(paper_schedule(), H100, tmp_path / "missing" / "t.png")
    with pytest.raises(TwillError, match="cannot create directory"):
        save_all(paper_schedule(), H100, blocker / "pictures")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_report_is_self_contained_and_names_every_op(tmp_path):
    sched = with_warps(solved("flash-fwd", B200, {"subtiles": 2}))
    path = write_report(sched, B200, tmp_path / "r.html", text_report="TEXT <REPORT>", pipelined="PIPE & CO")
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count("<svg") == len(PICTURES)
    for op in sched.graph.op_names:
        assert op in page
    assert "TEXT &lt;REPORT&gt;" in page and "PIPE &amp; CO" in page
    assert f"ResMII (resources)</td><td>{sched.stats['res_mii']}" in page
    assert not re.search(r'(src|href)="(https?:|file:|/)', page)          # nothing fetched from outside
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))                                       # SVG ids namespaced
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]              # no temporary files left


# -- twill report ----------------------------------------------------------------------------------------
def test_cli_report_writes_the_page(tmp_path, capsys):
    from twill.cli import main

    out = tmp_path / "paper.html"
    assert main(["report", "paper-example", "--no-ws", "-o", str(out)]) == 0
    page = out.read_text()
    assert all(op in page for op in ("S", "P", "O")) and "pipelined program Q" in page
    assert "wrote" in capsys.readouterr().out


def test_cli_report_reads_a_schedule_file(tmp_path, capsys):
    from twill.cli import main

    doc, out = tmp_path / "s.json", tmp_path / "s.html"
    assert main(["schedule", "paper-example", "--no-ws", "-o", str(doc)]) == 0
    assert main(["report", str(doc), "-o", str(out)]) == 0
    assert "paper-example" in out.read_text()
    capsys.readouterr()


@pytest.mark.parametrize("argv,message", [
    (["report", "paper-example", "--no-ws", "-o", "{tmp}/missing/r.html"], "cannot write"),
    (["report", "no-such-kernel", "-o", "{tmp}/r.html"], "unknown kernel"),
    (["report", "paper-example"], "-o/--output"),
])
def test_cli_report_errors_are_one_line(tmp_path, capsys, argv, message):
    from twill.cli import main

    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
