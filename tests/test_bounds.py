"""ResMII, RecMII and the length lower bound."""

from __future__ import annotations

from twill.ir import GraphBuilder
from twill.kernels import build_kernel
from twill.machine import H100
from twill.solve.bounds import asap_starts, length_lower_bound, rec_mii, res_mii


def test_paper_example_bounds():
    g = build_kernel("paper-example", H100)
    assert res_mii(g, dict(g.units)) == 2          # S and O share the tensor core
    assert rec_mii(g) == 1                         # O -> O, d=1, δ=1


def test_res_mii_rounds_up_by_capacity():
    b = GraphBuilder("res", units={"alu": 2, "tc": 1})
    b.op("a", uses={"alu": 1}, cycles=3)
    b.op("b", uses={"alu": 1}, cycles=2)
    b.op("c", uses={"tc": 1}, cycles=2)
    g = b.build()
    assert res_mii(g, dict(g.units)) == 3          # ⌈5/2⌉ = 3 > 2


def test_rec_mii_is_max_over_cycles_of_ceiling_ratio():
    b = GraphBuilder("rec", units={"u": 1})
    for n in "abcd":
        b.op(n, uses={}, cycles=1)
    b.edge("a", "b", delay=3)
    b.edge("b", "a", delay=4, distance=2)          # ⌈7/2⌉ = 4
    b.edge("c", "d", delay=5)
    b.edge("d", "c", delay=0, distance=3)          # ⌈5/3⌉ = 2
    assert rec_mii(b.build()) == 4


def test_rec_mii_without_recurrence_is_one():
    b = GraphBuilder("dag", units={"u": 1})
    b.op("a", uses={"u": 1}, cycles=1)
    b.op("b", uses={"u": 1}, cycles=1)
    b.edge("a", "b", delay=9)
    assert rec_mii(b.build()) == 1


def test_asap_and_length_bound():
    g = build_kernel("paper-example", H100)
    assert asap_starts(g, 2) == {"S": 0, "P": 1, "O": 2}
    assert length_lower_bound(g, 2) == 3
    b = GraphBuilder("tight", units={"u": 1})
    b.op("x", uses={}, cycles=1)
    b.edge("x", "x", delay=5, distance=1)
    assert asap_starts(b.build(), 4) is None       # below RecMII = 5
