"""Ablations of the op's attention forward, to find where its gap to FlashAttention-3 comes from (CPU step of a
benchmark behind docs/experiments/fa3-gap.md; not part of the library).

Each ablation is the op's emitted forward module (``twill.ops.flash.kernel_path``) with one synchronisation
mechanism changed by a text edit that keeps the kernel correct on any shape, so ``fa3_bench.py fwd --variants``
checks it against fp32 like every contender and times it in the same interleaved rounds as the op and FA3:

* ``named``: the tensor-core turns between compute warpgroups pass through hardware named barriers
  (``bar.sync`` on the warpgroup's own barrier, ``bar.arrive`` on the next one's, 256 threads each, as FA3's
  warpgroups take turns) instead of an mbarrier wait and a one-thread mbarrier arrive, which Triton's
  shared-memory barrier analysis fences with a warpgroup ``bar.sync`` each;
* ``fence``: the scheduling fence before the wait for ``O += P V`` is an empty branch in inline PTX instead of
  an mbarrier wait that passes at once (one warpgroup ``bar.sync`` fewer per iteration);
* ``named_fence``: both;
* ``noturn``: no tensor-core turns at all (each warpgroup issues as soon as its operands are ready).

``--count`` compiles each module for sm_90 and prints, per compute loop, its instructions and its barriers
(warpgroup ``BAR.SYNC``, named ``BAR.SYNC``/``BAR.ARV``, mbarrier ``SYNCS``).

    python benchmarks/fa3_ablate.py DIR [--cases d128,d128_causal,...] [--ablations named,noturn] [--count]
    python benchmarks/fa3_bench.py fwd --cases d128,d128_causal,... --variants DIR     # on the GPU machine

An ablation whose text a case's module does not have (the non-persistent D = 64 kernel has no fence) is
skipped with one line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: case name (fa3_bench.py's) -> (head dim, causal, K/V heads)
CASES = {"d128": (128, False, 0), "d128_causal": (128, True, 0), "d128_causal_kv8": (128, True, 8),
         "d64": (64, False, 0), "d64_causal": (64, True, 0), "d256": (256, False, 0), "d256_causal": (256, True, 0)}
#: First hardware named barrier the ablations use (Triton's warp specialization takes the low ids).
NAMED_BASE = 12

HELPERS = '''
@gluon.jit
def _one_per_thread():
    """One int32 per thread of the calling partition: the operand that makes inline PTX run once per thread."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    return gl.full([32 * gl.num_warps()], 0, gl.int32, layout)

@gluon.jit
def _ptx(asm: gl.constexpr):
    gl.inline_asm_elementwise(asm + " mov.u32 $0, $1;", "=r,r", [_one_per_thread()], gl.int32, False, 1)

@gluon.jit
def named_sync(i: gl.constexpr):
    """Wait on named barrier NAMED_BASE + i until the previous warpgroup arrives (256 threads)."""
{sync}

@gluon.jit
def named_arrive(i: gl.constexpr):
    """Arrive on named barrier NAMED_BASE + i without waiting (128 of its 256 threads)."""
{arrive}

@gluon.jit
def sched_fence():
    """A branch ptxas does not move instructions across; passes at once."""
    _ptx("{{ .reg .pred p; setp.ne.u32 p, $1, 0; @p bra.uni TWILL_FENCE; TWILL_FENCE: }}")
'''


def _dispatch(op: str, n: int) -> str:
    """``if i == 0: _ptx("bar.<op> 12, 256;") elif ...`` for ``n`` warpgroups (constexpr strings only)."""
    lines = []
    for i in range(n):
        kw = "if" if i == 0 else "elif"
        lines.append(f"    {kw} i == {i}:\n        _ptx(\"bar.{op} {NAMED_BASE + i}, 256;\")")
    return "\n".join(lines)


def edit(text: str, old: str, new: str, what: str = "", count: int = -1) -> str:
    """``text`` with ``old`` replaced by ``new`` (the first ``count`` times, all by default); ValueError naming
    ``what`` (or the text) when ``old`` is not there: the generator no longer emits what the edit expects."""
    if old not in text:
        raise ValueError(f"the module has no {what or repr(old.strip()[:60])} to edit")
    return text.replace(old, new, count)


TURN_WAIT = re.compile(r"( *)mbarrier\.wait\(turn_bars\.index\(SUB\), [^\n]*\n")
TURN_ARRIVE = re.compile(r"( *)mbarrier\.arrive\(turn_bars\.index\(\(SUB \+ (\d+)\) % NUM_COMPUTE\)\)[^\n]*\n")
FIRST_TURN = re.compile(r"mbarrier\.arrive\(turn_bars\.index\((\d+)\)\)")
FENCE = re.compile(r"( *)mbarrier\.wait\(q_bar, (?:t & 1|0)\)\n(\s*o, p_op = warpgroup_mma_wait\(0)")
FIRST_Q = re.compile(r"^    mbarrier\.wait\(q_bar, 0\)", re.M)


def _turns(text: str, named: bool) -> str:
    if not TURN_WAIT.search(text) or not TURN_ARRIVE.search(text):
        raise ValueError("the module has no tensor-core turn wait/arrive to edit")
    n = int(re.search(r"NUM_COMPUTE\s*=\s*gl\.constexpr\((\d+)\)", text).group(1))
    if not named:
        return TURN_ARRIVE.sub("", TURN_WAIT.sub("", text))
    first = int(FIRST_TURN.search(text).group(1))
    step = int(TURN_ARRIVE.search(text).group(2))
    text = TURN_WAIT.sub(lambda m: f"{m.group(1)}named_sync(SUB)  # turn: the previous warpgroup issued\n", text)
    text = TURN_ARRIVE.sub(lambda m: f"{m.group(1)}named_arrive((SUB + {step}) % NUM_COMPUTE)  # pass the tensor "
                                     f"core on\n", text)
    opener = (first - step) % n      # the warpgroup before the first turn's holder opens its barrier once
    if not FIRST_Q.search(text):
        raise ValueError("the module has no first Q wait to edit")
    return FIRST_Q.sub(f"    if SUB == {opener}:\n        named_arrive({first})  # SUB {first} takes the first turn\n"
                       f"    mbarrier.wait(q_bar, 0)", text, count=1)


def _fence(text: str) -> str:
    if not FENCE.search(text):
        raise ValueError("the module has no q_bar fence before the wait for O += P V to edit")
    return FENCE.sub(lambda m: f"{m.group(1)}sched_fence()\n{m.group(2)}", text)


ABLATIONS: dict[str, Callable[[str], str]] = {
    "named": lambda t: _turns(t, True),
    "fence": _fence,
    "named_fence": lambda t: _fence(_turns(t, True)),
    "noturn": lambda t: _turns(t, False),
}


def ablate(text: str, name: str) -> str:
    """Module text ``text`` with ablation ``name`` applied (and the helpers it calls)."""
    n = int(re.search(r"NUM_COMPUTE\s*=\s*gl\.constexpr\((\d+)\)", text).group(1))
    helpers = HELPERS.replace("{sync}", _dispatch("sync", n)).replace("{arrive}", _dispatch("arrive", n))
    helpers = helpers.replace("{{", "{").replace("}}", "}")
    out = ABLATIONS[name](text)
    return edit(out, "\n@gluon.jit\ndef compute_partition", helpers + "\n@gluon.jit\ndef compute_partition",
                "compute_partition", 1)


def generate(folder: str, cases: list[str], ablations: list[str]) -> list[dict]:
    from twill.ops.flash import kernel_path
    from twill.ops.spec import KernelSpec

    os.makedirs(folder, exist_ok=True)
    rows = []
    for case in cases:
        head_dim, causal, kv_heads = CASES[case]
        src = open(kernel_path(KernelSpec("flash-fwd", head_dim, "bf16", causal, kv_heads))).read()
        for name in ablations:
            try:
                text = ablate(src, name)
            except ValueError as exc:       # e.g. a kernel without the fence: nothing to ablate there
                print(f"{case} {name}: skipped: {exc}")
                continue
            file = f"ablate_{case}_{name}.py"
            with open(os.path.join(folder, file), "w") as fh:
                fh.write(text)
            rows.append({"name": f"{case}_{name}", "file": file, "kernel": "flash-fwd",
                         "options": {"head_dim": head_dim, "dtype": "bf16", "causal": causal, "kv_heads": kv_heads},
                         "ablation": name, "sha256": hashlib.sha256(text.encode()).hexdigest()})
    with open(os.path.join(folder, "manifest.json"), "w") as fh:
        json.dump(rows, fh, indent=2)
    return rows


def count(folder: str, rows: list[dict]) -> None:
    from twill.codegen.gluon import aot, load_emitted

    for row in rows:
        compiled = aot.compile_sm90(load_emitted(os.path.join(folder, row["file"])))
        loops = [lp for lp in aot.sass_loops(aot.sass(compiled)) if any("HGMMA" in x for x in lp)]
        shortest = min(map(len, loops))
        for loop in loops:
            if len(loop) > 1.3 * shortest:      # a loop around the compute loops (persistent blocks)
                continue
            local = sum(bool(re.search(r"BAR\.SYNC\S* 0x[0-3], 0x80", x)) for x in loop)
            named = sum(bool(re.search(r"BAR\.(SYNC|ARV)\S* 0x(?:[c-f]|1[0-5])", x)) for x in loop)
            syncs = sum("SYNCS" in x for x in loop)
            print(f"{row['name']:28s} {len(loop):4d} instructions  warpgroup BAR.SYNC {local}  named {named}  "
                  f"mbarrier {syncs}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/fa3_ablate.py", description=__doc__.splitlines()[0])
    p.add_argument("folder", metavar="DIR")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--ablations", default=",".join(ABLATIONS), help=f"comma-separated, of {', '.join(ABLATIONS)}")
    p.add_argument("--count", action="store_true", help="compile each module for sm_90 and count its barriers")
    args = p.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    ablations = [a for a in args.ablations.split(",") if a]
    bad = [c for c in cases if c not in CASES]
    if bad:
        p.error(f"--cases: unknown case {bad[0]!r}")
    bad = [a for a in ablations if a not in ABLATIONS]
    if bad:
        p.error(f"--ablations: unknown ablation {bad[0]!r}")
    try:
        rows = generate(args.folder, cases, ablations)
    except OSError as exc:
        print(f"fa3_ablate: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(rows)} ablation modules and manifest.json to {args.folder}")
    if args.count:
        count(args.folder, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
