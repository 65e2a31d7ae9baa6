"""Roles of the ops of an attention-backward loop, named from what they compute.

A backward loop has two tensor-core ops that read no other one: the score GEMM ``qk`` (its result reaches
an ``exp``) and the gradient GEMM ``dp`` (``dP = dO V^T``; it reaches no ``exp``). The op that combines both
(``dS = P * (dP - D)``) is ``ds``. The GEMMs reading them: ``dv`` (``dV += P^T dO``: reads ``exp``, not
``dp``), and among those reading ``ds`` the accumulator ``dk`` when the loop also computes ``dv`` (a loop
over query blocks: K and V resident), else ``dq`` (a loop over key blocks, as in the dQ pass). Streaming
loads are named by the GEMM operand they feed: ``load_q``/``load_do`` when the loop runs over queries,
``load_k``/``load_v`` when it runs over keys; the row statistics are ``load_lse`` (read by ``exp``) and
``load_delta`` (read by ``ds``).
"""

from __future__ import annotations

from typing import AbstractSet, Mapping

LOADS = ("tma_load", "load")


def descendants(edges: AbstractSet[tuple[int, int, int]]) -> dict[int, set[int]]:
    """Distance-0 descendants of every node."""
    succ: dict[int, set[int]] = {}
    for (s, d, dist) in edges:
        if dist == 0:
            succ.setdefault(s, set()).add(d)
    memo: dict[int, set[int]] = {}

    def walk(n: int) -> set[int]:
        if n not in memo:
            memo[n] = set()
            out: set[int] = set()
            for m in succ.get(n, ()):
                out |= {m} | walk(m)
            memo[n] = out
        return memo[n]

    for n in list(succ):
        walk(n)
    return memo


def backward_roles(kinds: Mapping[int, str], shapes: Mapping[int, int],
                   edges: AbstractSet[tuple[int, int, int]],
                   anc: Mapping[int, set[int]]) -> dict[int, str] | None:
    """Role per node of an attention-backward loop, or ``None`` when the loop is not one. ``kinds`` are the
    node kinds, ``shapes`` the rank of each node's tile (1 for row vectors)."""
    desc = descendants(edges)
    mmas = sorted(i for i, k in kinds.items() if k == "mma")
    first = [i for i in mmas if not any(kinds[a] == "mma" for a in anc.get(i, ()))]
    reaches_exp = {i for i in first if any(kinds[d] == "exp2" for d in desc.get(i, ()))}
    qk, dp = [i for i in first if i in reaches_exp], [i for i in first if i not in reaches_exp]
    if len(qk) != 1 or len(dp) != 1:
        return None
    q, g = qk[0], dp[0]
    exps = [i for i in desc.get(q, ()) if kinds[i] == "exp2" and shapes.get(i, 2) > 1]
    both = [i for i, k in kinds.items()
            if k == "alu" and g in anc.get(i, ()) and any(e in anc.get(i, ()) for e in exps)]
    ds = [i for i in both if not any(b in anc.get(i, ()) for b in both)]
    if not exps or len(ds) != 1:
        return None
    roles = {q: "qk", g: "dp", ds[0]: "ds"}
    roles.update({e: "exp" for e in exps})
    dv = [i for i in mmas if i not in first and g not in anc.get(i, ()) and any(e in anc.get(i, ()) for e in exps)]
    roles.update({i: "dv" for i in dv})
    for i in mmas:
        if i not in roles and ds[0] in anc.get(i, ()):
            roles[i] = "dk" if dv and (i, i, 1) in edges else "dq"
    over_queries = bool(dv)
    for i, k in kinds.items():
        if k not in LOADS or i in roles:
            continue
        below = desc.get(i, set())
        if q in below and shapes.get(i, 2) > 1:
            roles[i] = "load_q" if over_queries else "load_k"
        elif g in below and shapes.get(i, 2) > 1:
            roles[i] = "load_do" if over_queries else "load_v"
        elif any(e in below for e in exps):
            roles[i] = "load_lse"
        elif ds[0] in below:
            roles[i] = "load_delta"
    return roles
