"""FlashAttention-3's Hopper forward kernels next to twill's, read off their sm_90 SASS (CPU; a benchmark script
behind docs/experiments/fa3-sass.md, not part of the library).

The question it answers: what does each kernel's compute warpgroup issue per main-loop iteration? For each case
(bf16; head dimension 128 non-causal and causal, 64 non-causal) it

* takes FA3's kernel out of the wheel (``fa3_fwd/_C.abi3.so``; ``cuobjdump -xelf all``): the
  ``flash::FlashAttnFwdSm90`` instance FA3 launches for the case (cluster 2x1x1 at D = 128 non-causal, 1x1x1
  otherwise: :func:`fa3_cluster`), bf16, that head dimension (for Q·K and for V) and no
  optional feature (not local, no softcap, varlen, paged KV, append-KV, Qv, PackGQA, Split or column-major V);
  its template arguments give the tile (kBlockM x kBlockN), stages, MmaPV_is_RS and IntraWGOverlap;
* generates twill's kernel for the same case (``twill.ops.flash.kernel_path``, into a temporary cache) and
  compiles it for sm_90 with Triton's ptxas (``twill.codegen.gluon.aot.compile_sm90``);
* disassembles both (``nvdisasm -c``), cuts out each compute warpgroup's main loop (the innermost loops that
  end in a conditional backward branch and hold a wgmma, the loops ``benchmarks/loop_instructions.py``
  counts; twill has one per compute partition, FA3's warpgroups share one) and the producer's loop (innermost,
  conditional, with TMA loads and no wgmma), and counts their instructions by class.

Two counts per loop: ``static`` (every instruction between the loop's label and its backward branch) and
``unmasked`` (without the blocks an in-loop forward branch skips when they hold a key mask: twill masks keys
past seq_k under ``if kv_start + BLOCK_N > seq_k``, FA3 peels masked iterations out of its loop). The table
shows the classes of each kernel's steady loop: the mask-free one, the longest of twill's partitions. Registers, stack and local memory come from
``cuobjdump -res-usage``; ``setmaxnreg`` values from the whole kernel's ``USETMAXREG``. Writes a JSON file and
prints a markdown table. Needs the wheel, Triton 3.6 with Gluon (its ``cuobjdump``/``nvdisasm``) and
``c++filt``; exits 2 with one error line when one is missing.

    python benchmarks/fa3_sass.py [--wheel .peers/fa3_fwd-0.0.3-cp39-abi3-manylinux_2_24_x86_64.whl]
        [--out benchmarks/results/fa3_sass.json] [--cases d128,d128-causal,d64]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

WHEEL = os.path.join(ROOT, ".peers", "fa3_fwd-0.0.3-cp39-abi3-manylinux_2_24_x86_64.whl")
OUT = os.path.join(ROOT, "benchmarks", "results", "fa3_sass.json")

#: name -> (head dim, causal)
CASES = {"d128": (128, False), "d128-causal": (128, True), "d64": (64, False)}
#: The thread-block cluster of the instance FA3 launches for a case: two CTAs sharing each K/V tile by TMA
#: multicast for a 16-bit non-causal forward at head dim >= 128, one CTA otherwise. Seen in the name of the kernel
#: Nsight Compute profiled for B = 4, H = 32, S = 8192, D = 128 non-causal (benchmarks/attention_ncu.py,
#: docs/experiments/fa3-gap.md); the wheel holds both instances of that case.
def fa3_cluster(head_dim: int, causal: bool) -> list[int]:
    return [2, 1, 1] if head_dim >= 128 and not causal else [1, 1, 1]

#: CollectiveMainloopFwdSm90's boolean template parameters, in order (FA3's hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp).
MAINLOOP_FLAGS = ("Is_causal", "Is_local", "Has_softcap", "Varlen", "PagedKVNonTMA", "AppendKV", "HasQv",
                  "MmaPV_is_RS", "IntraWGOverlap", "PackGQA", "Split", "V_colmajor")
#: flags that must be off in the plain kernel an MHA call without options runs
OFF_FLAGS = ("Is_local", "Has_softcap", "Varlen", "PagedKVNonTMA", "AppendKV", "HasQv", "PackGQA", "Split",
             "V_colmajor")

_MAINLOOP = re.compile(
    r"flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<(\d+), cute::tuple<cute::C<(\d+)>, cute::C<(\d+)>, "
    r"cute::C<(\d+)> >, cute::tuple<cute::C<(\d+)>, cute::C<(\d+)>, cute::C<(\d+)> >, (\d+), cutlass::(\w+), float, "
    r"cutlass::arch::Sm90, ((?:(?:true|false)(?:, )?){12})>")

#: instruction classes counted, by regular expression on the opcode (first match wins; the rest is "other")
CLASSES = (
    ("HGMMA", r"HGMMA\."),
    ("WARPGROUP.ARRIVE", r"WARPGROUP\.ARRIVE"),
    ("WARPGROUP.DEPBAR", r"WARPGROUP\.DEPBAR"),
    ("MUFU.EX2", r"MUFU\.EX2"),
    ("MUFU other", r"MUFU\."),
    ("FFMA", r"FFMA"),
    ("FMUL", r"FMUL"),
    ("FADD", r"FADD"),
    ("FMNMX", r"FMNMX"),
    ("FSEL", r"FSEL"),
    ("FSETP", r"FSETP"),
    ("F2FP/F2F", r"F2FP|F2F\."),
    ("SHFL", r"SHFL"),
    ("BAR", r"BAR\."),
    ("SYNCS try_wait", r"SYNCS\.PHASECHK"),
    ("SYNCS arrive", r"SYNCS\.ARRIVE"),
    ("UTMALDG", r"UTMALDG"),
    ("BRA", r"BRA$"),
    ("NOP", r"NOP$"),
    ("LDL/STL", r"LDL|STL"),
    ("STSM/fence", r"STSM|FENCE|MEMBAR"),
    ("uniform int", r"U[A-Z0-9]+"),
    ("int/move/pred", r"I[A-Z0-9]+|VIADD|LEA|LOP3|SHF|SEL|MOV|PRMT|PLOP3|S2R|S2UR|R2UR|LDC|ISETP"),
)
_CLASS_RES = tuple((name, re.compile(pattern)) for name, pattern in CLASSES)
_PRED = re.compile(r"^@!?U?P\w+\s+")


class Missing(Exception):
    """A wheel, tool or kernel this script needs is absent."""


# --------------------------------------------------------------------------------------------- pure logic

def opcode(inst: str) -> str:
    """``inst``'s opcode without its predicate (``@!P0 BRA `(.L_x_3)`` -> ``BRA``)."""
    return _PRED.sub("", inst).split()[0]


def instruction_class(inst: str) -> str:
    """The :data:`CLASSES` name of one SASS instruction, or ``"other"``."""
    op = opcode(inst)
    for name, pattern in _CLASS_RES:
        if pattern.match(op):
            return name
    return "other"


def hgmma_shape(inst: str) -> str:
    """``64x176x16 SS`` / ``64x128x16 RS``: a wgmma's shape and where A comes from (RS: registers)."""
    shape = re.search(r"HGMMA\.(\d+x\d+x\d+)", inst).group(1)
    operands = _PRED.sub("", inst).split(None, 1)[1].split(",")
    source = "RS" if re.fullmatch(r"\s*R\d+", operands[1]) else "SS"
    return f"{shape} {source}"


def barrier(inst: str) -> str:
    """A named barrier as ``SYNC id=R9 threads=256`` (``BAR.SYNC.DEFER_BLOCKING R9, 0x100``)."""
    op, args = _PRED.sub("", inst).split(None, 1)
    kind = op.split(".")[1]
    parts = [p.strip() for p in args.split(",")]
    ident = str(int(parts[0], 16)) if parts[0].startswith("0x") else parts[0]
    threads = int(parts[1], 16) if len(parts) > 1 else "all"
    return f"{kind} id={ident} threads={threads}"


def loop_summary(loop: list[str]) -> dict[str, Any]:
    """Counts by class of a loop's instructions, the wgmma shapes, named barriers and distinct mbarriers
    waited on."""
    classes = collections.Counter(instruction_class(i) for i in loop)
    waits = {re.search(r"\[[^\]]*\]", i).group(0) for i in loop if "SYNCS.PHASECHK" in i}
    return {"instructions": len(loop),
            "classes": dict(sorted(classes.items(), key=lambda kv: (-kv[1], kv[0]))),
            "hgmma": dict(collections.Counter(hgmma_shape(i) for i in loop if "HGMMA." in i)),
            "barriers": dict(collections.Counter(barrier(i) for i in loop if opcode(i).startswith("BAR."))),
            "mbarriers_waited": len(waits)}


def split_functions(text: str) -> dict[str, str]:
    """``nvdisasm -c`` output of a cubin -> {mangled function name: its SASS}."""
    functions: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        header = re.match(r"^\.text\.(\S+):", line)
        if header:
            current = functions.setdefault(header.group(1), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in functions.items()}


def is_mask(inst: str) -> bool:
    """A key mask's select (``FSEL R26, R26, -INF , !P3``)."""
    return opcode(inst) == "FSEL" and "-INF" in inst


def unmasked_path(text: str, loop: list[str]) -> list[str]:
    """``loop`` (one of :func:`twill.codegen.gluon.aot.sass_loops`'s for ``text``) without the blocks that an
    in-loop conditional forward branch jumps over when they hold a key mask (:func:`is_mask`): the path of an
    iteration that needs no mask (twill branches around its key-bound mask; other skipped blocks, such as an
    mbarrier's second test or the elected thread's TMA issue, stay counted)."""
    from twill.codegen.gluon.aot import sass_instructions

    insts = [(labels, inst) for _, labels, inst in sass_instructions(text)]
    end = next(k for k in range(len(loop) - 1, len(insts))
               if insts[k][1] == loop[-1] and insts[k - len(loop) + 1][1] == loop[0])
    window = insts[end - len(loop) + 1:end + 1]
    skipped: set[int] = set()
    for k, (_, inst) in enumerate(window):
        target = re.search(r"^@!?U?P\w+\s+BRA `\(\.(L_x_\d+)\)", inst)
        if target:
            land = next((m for m in range(k + 1, len(window)) if target.group(1) in window[m][0]), None)
            if land is not None and any(is_mask(i) for _, i in window[k + 1:land]):
                skipped.update(range(k + 1, land))
    return [inst for k, (_, inst) in enumerate(window) if k not in skipped]


def innermost(loops: list[list[str]]) -> list[list[str]]:
    """The loops that hold no other of ``loops``' backward branches (a persistent kernel's tile loop holds its
    main loop). Pass loops of one kind: a spin loop's branch may also be in a main loop, as its exit."""
    return [loop for loop in loops
            if not any(other is not loop and len(other) < len(loop) and other[-1] in loop for other in loops)]


def main_and_producer_loops(text: str) -> tuple[list[list[str]], list[list[str]]]:
    """(compute main loops, producer loops) of a kernel's SASS: innermost loops ending in a conditional
    backward branch that hold a wgmma (the criterion of ``benchmarks/loop_instructions.main_loops``), and those
    that hold TMA loads and no wgmma."""
    from twill.codegen.gluon.aot import sass_loops

    conditional = [loop for loop in sass_loops(text) if _PRED.match(loop[-1]) and opcode(loop[-1]) == "BRA"]
    compute = [loop for loop in conditional if any("HGMMA." in i for i in loop)]
    producer = [loop for loop in conditional if any("UTMALDG" in i for i in loop) and loop not in compute]
    return innermost(compute), innermost(producer)


def setmaxnreg(text: str) -> list[str]:
    """Distinct ``USETMAXREG`` instructions of a kernel (``DEALLOC 24``, ``TRYALLOC 240``)."""
    found = re.findall(r"USETMAXREG\.(\w+)\.CTAPOOL (?:U?P\d+, )?(0x[0-9a-f]+|\d+)", text)
    return sorted({f"{kind} {int(value, 0)}" for kind, value in found})


def parse_fa3_name(demangled: str) -> dict[str, Any] | None:
    """FA3 forward kernel facts from its demangled name; None for other kernels."""
    m = _MAINLOOP.search(demangled)
    if not m:
        return None
    stages, c0, c1, c2, bm, bn, d, dv, dtype, flags = m.groups()
    flags = dict(zip(MAINLOOP_FLAGS, (f == "true" for f in flags.split(", "))))
    scheduler = re.search(r"flash::(\w+TileScheduler)", demangled)
    return {"stages": int(stages), "cluster": [int(c0), int(c1), int(c2)], "block_m": int(bm), "block_n": int(bn),
            "head_dim": int(d), "head_dim_v": int(dv), "dtype": dtype, "flags": flags,
            "scheduler": scheduler.group(1) if scheduler else None}


def plain(facts: dict[str, Any], head_dim: int, causal: bool) -> bool:
    """Whether ``facts`` (:func:`parse_fa3_name`) is the plain bf16 MHA kernel of this case."""
    return (facts["dtype"] == "bfloat16_t" and facts["cluster"] == fa3_cluster(head_dim, causal)
            and facts["head_dim"] == head_dim
            and facts["head_dim_v"] == head_dim and facts["flags"]["Is_causal"] == causal
            and not any(facts["flags"][f] for f in OFF_FLAGS))


# --------------------------------------------------------------------------------------------- tools

def tool(name: str) -> str:
    """Path of ``cuobjdump`` / ``nvdisasm`` next to Triton's ptxas, or ``c++filt`` on PATH."""
    if name == "c++filt":
        path = shutil.which(name)
    else:
        try:
            from triton.backends.nvidia.compiler import get_ptxas
        except ImportError as exc:
            raise Missing(f"Triton is needed for {name} ({exc})") from None
        path = os.path.join(os.path.dirname(get_ptxas(90).path), name)
    if not path or not os.path.exists(path):
        raise Missing(f"no {name} (looked for {path or name})")
    return path


def run(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def resource_usage(cubin: str) -> dict[str, dict[str, int]]:
    """{mangled function: {REG, STACK, SHARED, LOCAL}} from ``cuobjdump -res-usage``."""
    usage, name = {}, None
    for line in run(tool("cuobjdump"), "-res-usage", cubin).splitlines():
        fn = re.match(r"\s*Function (\S+):", line)
        if fn:
            name = fn.group(1)
        elif name and "REG:" in line:
            usage[name] = {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}
            name = None
    return usage


def demangle(names: list[str]) -> list[str]:
    out = subprocess.run([tool("c++filt")], input="\n".join(names), capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def fa3_kernels(wheel: str, tmp: str, cases: list[str]) -> dict[str, dict[str, Any]]:
    """{case: {name, facts, usage, sass}} of FA3's plain kernel for each case."""
    with zipfile.ZipFile(wheel) as zf:
        zf.extract("fa3_fwd/_C.abi3.so", tmp)
    elf_dir = os.path.join(tmp, "elf")
    os.makedirs(elf_dir)
    subprocess.run([tool("cuobjdump"), "-xelf", "all", os.path.join(tmp, "fa3_fwd", "_C.abi3.so")], cwd=elf_dir,
                   capture_output=True, check=True)
    wanted = {case: CASES[case] for case in cases}
    found: dict[str, list[dict[str, Any]]] = {case: [] for case in cases}
    for cubin in sorted(f for f in os.listdir(elf_dir) if f.endswith(".sm_90.cubin")):
        path = os.path.join(elf_dir, cubin)
        usage = resource_usage(path)
        names = [n for n in usage if "FlashAttnFwdSm90" in n]
        for name, demangled in zip(names, demangle(names)):
            facts = parse_fa3_name(demangled)
            for case, (head_dim, causal) in wanted.items():
                if facts and plain(facts, head_dim, causal):
                    found[case].append({"name": name, "cubin": cubin, "facts": facts, "usage": usage[name]})
    out = {}
    for case, hits in found.items():
        if len(hits) != 1:
            raise Missing(f"{len(hits)} plain FA3 kernels for {case} in {wheel} (expected 1)")
        hit = hits[0]
        functions = split_functions(run(tool("nvdisasm"), "-c", os.path.join(elf_dir, hit["cubin"])))
        out[case] = {**hit, "sass": functions[hit["name"]]}
    return out


def twill_kernel(case: str, tmp: str) -> dict[str, Any]:
    """{name, facts, usage, sass} of twill's kernel for ``case``, generated into a temporary cache."""
    os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")
    from twill.codegen.gluon import aot, load_emitted
    from twill.ops.flash import KernelSpec, kernel_path

    head_dim, causal = CASES[case]
    path = kernel_path(KernelSpec("flash-fwd", head_dim, "bf16", causal, 0))
    module = load_emitted(str(path), f"twill_fa3_sass_{case.replace('-', '_')}")
    compiled = aot.compile_sm90(module)
    cubin = os.path.join(tmp, f"twill_{case}.cubin")
    with open(cubin, "wb") as fh:
        fh.write(compiled.asm["cubin"])
    usage = resource_usage(cubin)
    header = open(path).read().split("\n#\n# decisions")[0]
    tile = re.search(r"block_m=(\d+) sub_m=(\d+) block_n=(\d+)", header)
    return {"name": os.path.basename(str(path)),
            "facts": {"block_m": int(tile.group(1)), "sub_m": int(tile.group(2)), "block_n": int(tile.group(3)),
                      "head_dim": head_dim, "causal": causal, "shared_bytes": int(compiled.metadata.shared),
                      "num_warps": int(compiled.metadata.num_warps),
                      "schedule": re.search(r"# (II = .*)", header).group(1)},
            "usage": next(iter(usage.values())), "sass": aot.sass(compiled)}


def steady_loop(loops: list[dict[str, Any]]) -> int:
    """Index of the loop that sets the pace of mask-free iterations: among the loops whose unmasked path holds
    no key mask (FA3's causal kernel has a separate loop for its masked iterations), the longest (twill's
    compute partitions run side by side; the longest path is the slowest)."""
    free = [k for k, lp in enumerate(loops) if not lp["unmasked"]["classes"].get("FSEL -INF")] or range(len(loops))
    return max(free, key=lambda k: loops[k]["unmasked"]["instructions"])


def describe(kernel: dict[str, Any], block_n: int) -> dict[str, Any]:
    text = kernel["sass"]
    compute, producer = main_and_producer_loops(text)
    loops = []
    for loop in compute:
        path = unmasked_path(text, loop)
        unmasked = loop_summary(path)
        unmasked["classes"]["FSEL -INF"] = sum(is_mask(i) for i in path)
        loops.append({"static": loop_summary(loop), "unmasked": unmasked,
                      "unmasked_per_64x64": round(unmasked["instructions"] * 64 / block_n, 1)})
    return {"name": kernel["name"], "facts": kernel["facts"], "usage": kernel["usage"],
            "setmaxnreg": setmaxnreg(text), "compute_loops": loops, "steady_loop": steady_loop(loops),
            "producer_loops": [loop_summary(p) for p in producer]}


# --------------------------------------------------------------------------------------------- report

TABLE_CLASSES = ("HGMMA", "WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR", "MUFU.EX2", "FFMA", "FMUL", "FADD", "FMNMX",
                 "FSEL", "FSEL -INF", "F2FP/F2F", "SHFL", "BAR", "SYNCS try_wait", "SYNCS arrive", "BRA", "NOP",
                 "STSM/fence", "uniform int", "int/move/pred", "LDL/STL", "other")


def table(result: dict[str, Any]) -> str:
    """One column per kernel; rows: tile, registers, loop sizes, and the classes of its steady loop's unmasked
    path (:func:`steady_loop`)."""
    cols = []
    for case in result["cases"]:
        for who in ("fa3", "twill"):
            k = result["cases"][case][who]
            cols.append((f"{who} {case}", k))
    lines = ["| | " + " | ".join(name for name, _ in cols) + " |", "|---" * (len(cols) + 1) + "|"]

    def row(label, fn):
        lines.append(f"| {label} | " + " | ".join(str(fn(k)) for _, k in cols) + " |")

    row("tile (M x N)", lambda k: f"{k['facts']['block_m']}x{k['facts']['block_n']}")
    row("registers (cuobjdump)", lambda k: k["usage"].get("REG"))
    row("setmaxnreg", lambda k: ", ".join(k["setmaxnreg"]))
    row("compute loops", lambda k: len(k["compute_loops"]))
    def steady(k):
        return k["compute_loops"][k["steady_loop"]]

    row("static / loop", lambda k: "/".join(str(lp["static"]["instructions"]) for lp in k["compute_loops"]))
    row("unmasked path / loop", lambda k: "/".join(str(lp["unmasked"]["instructions"]) for lp in k["compute_loops"]))
    row("steady loop (rows below)", lambda k: k["steady_loop"] + 1)
    row("unmasked per 64x64 scores", lambda k: steady(k)["unmasked_per_64x64"])
    row("wgmma", lambda k: ", ".join(f"{n}x {s}" for s, n in steady(k)["unmasked"]["hgmma"].items()))
    for name in TABLE_CLASSES:
        row(name, lambda k, name=name: steady(k)["unmasked"]["classes"].get(name, 0))
    row("distinct mbarriers waited", lambda k: steady(k)["unmasked"]["mbarriers_waited"])
    row("named barriers", lambda k: "; ".join(f"{n}x {b}" for b, n in steady(k)["unmasked"]["barriers"].items()))
    row("producer loop (TMA loads)", lambda k: ", ".join(
        f"{p['instructions']} ({p['classes'].get('UTMALDG', 0)})" for p in k["producer_loops"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/fa3_sass.py", description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", default=WHEEL, help="the fa3_fwd wheel (default: %(default)s)")
    parser.add_argument("--out", default=OUT, help="where to write the JSON result (default: %(default)s)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    try:
        if not os.path.isfile(args.wheel):
            raise Missing(f"no wheel at {args.wheel}")
        if any(case not in CASES for case in cases):
            raise Missing(f"unknown case in {args.cases} (known: {', '.join(CASES)})")
        for name in ("cuobjdump", "nvdisasm", "c++filt"):
            tool(name)
        with tempfile.TemporaryDirectory() as tmp:
            fa3 = fa3_kernels(args.wheel, tmp, cases)
            result_cases = {}
            for case in cases:
                tw = twill_kernel(case, tmp)
                result_cases[case] = {"fa3": describe(fa3[case], fa3[case]["facts"]["block_n"]),
                                      "twill": describe(tw, tw["facts"]["block_n"])}
                result_cases[case]["fa3"]["cubin"] = fa3[case]["cubin"]
                print(f"{case}: done", flush=True)
    except Missing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import triton

    result = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "triton": triton.__version__,
              "wheel": os.path.basename(args.wheel), "cases": result_cases,
              "command": "python benchmarks/fa3_sass.py"}
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
