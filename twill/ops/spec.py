"""What a kernel of ``twill.ops.attention`` is (:class:`KernelSpec`: the built-in loop and its options), which
of its graph's attributes the solver sees (:func:`solve_key`) and how its loop is solved (:func:`solve`).
:mod:`twill.ops.flash` (the op's kernels and their cache) and :mod:`twill.ops.shipped` (the schedules the
package ships) both build on it."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import asdict, dataclass
from typing import Any

from twill.kernels.flash_bwd import FAMILY as BACKWARD
from twill.kernels.flash_fwd import FAMILY as FORWARD

#: Head dimensions of the forward kernel, and of the backward kernel.
FORWARD_HEAD_DIMS = (64, 128, 256)
BACKWARD_HEAD_DIMS = (64, 128, 256)
#: Machine model the kernels are solved on: the H200's (the H100 has the same SM; the solver's H200
#: schedules are the ones `benchmarks/flash_bwd_check.py` checks on the GPU, and the Gluon backward emits
#: every one of them, while some H100 head-dim-64 schedules need two register copies it does not emit).
MACHINE = "h200"
#: Torch dtype name -> the kernels' dtype option, for the forward and the backward.
DTYPES = {"float16": "fp16", "bfloat16": "bf16"}
#: The fp8 dtypes: forward only (no backward, as FA3 has none), output bf16 or fp16, optional descale factors.
FP8_DTYPES = {"float8_e4m3fn": "fp8e4m3"}
#: Every dtype of the forward kernel.
FORWARD_DTYPES = {**DTYPES, **FP8_DTYPES}


@dataclass(frozen=True)
class KernelSpec:
    """One generated kernel: the built-in loop (the :data:`FORWARD` or :data:`BACKWARD` family) and its options.

    ``kv_heads`` is 0 when K/V have as many heads as Q, else the K/V head count (grouped-query attention).
    ``varlen``: the forward over variable-length packed sequences (``twill.ops.attention_varlen``; one CTA per
    query block, 16-bit only), a code-generator attribute: it shares the shipped schedule of its loop.
    """

    kernel: str
    head_dim: int
    dtype: str
    causal: bool
    kv_heads: int
    varlen: bool = False

    def kernel_options(self) -> dict[str, Any]:
        """Options of :func:`twill.kernels.build_kernel`: the loop shape the kernel is generated for."""
        options: dict[str, Any] = {"head_dim": self.head_dim, "dtype": self.dtype, "causal": self.causal,
                                   "kv_heads": self.kv_heads, **({"varlen": True} if self.varlen else {})}
        if self.kernel == FORWARD.name:
            options.update(subtiles=self.subtiles(), block_n=self.block_n())
            if self.fp8():
                options.update(v_transpose="prepass")     # the one V^T the Gluon generator emits
        else:
            options.update(block_m=self.block_m())
        return options

    def block_m(self) -> int:
        """Query rows per iteration of the backward: 128 at D = 64 (FA3's tile, which the calibrated model and
        the GPU both rank above 64 rows; docs/performance.md, "The 128-row tile from the solver"), 64 at
        D = 128 (FA3's; 128 rows overflow shared memory) and at D = 256 (FA3's, against 64 keys: the graph's
        default key block there)."""
        return 128 if self.head_dim == 64 else 64

    def block_n(self) -> int:
        """Keys per iteration of the forward: 128, but 64 for 16-bit operands at D = 256, where two 128-key K/V
        stages do not fit in shared memory beside Q. fp8 at D = 256 takes 128 (FA3's fp8 tile): its stages
        are half the bytes, and the 64-key kernel rescaled O twice as often, which its profile showed as
        twice FA3's FMULs (docs/experiments/fa3-gap.md, "fp8 at D = 64 and D = 256")."""
        return 64 if self.head_dim == 256 and not self.fp8() else 128

    def fp8(self) -> bool:
        """An fp8 (:data:`FP8_DTYPES`) forward."""
        return self.dtype in FP8_DTYPES.values()

    def subtiles(self) -> int:
        """Compute warp groups of the forward, each on 64 query rows: three at D = 64 without a causal mask
        (FA3's D = 64 tile, the tuner's pick there), else two: the causal forward runs persistent
        (:meth:`persistent`), and a persistent three-group causal kernel runs slower than a two-group one, its
        mask code lengthening the steady loop (docs/experiments/three-groups.md, "P converted once P V
        retired"). The fp8 forward at D = 64 has two: ptxas spills the three-group kernel (about 1 KB)."""
        if self.kernel == FORWARD.name and self.head_dim == 64 and not self.fp8():
            return 2 if self.causal else 3
        return 2

    def streaming_depth(self) -> int | None:
        """Ring depth of the streaming loads: 3 for the two-group forward at D <= 128 (the depth that ran best,
        docs/performance.md), 2 with three groups and at D = 256; the backward keeps its kernel's default."""
        if self.kernel != FORWARD.name:
            return None
        return 2 if self.head_dim == 256 or self.subtiles() == 3 else 3

    def cross_warp(self) -> bool:
        """:attr:`SolveOptions.cross_warp <twill.solve.options.SolveOptions.cross_warp>` of the solve: False for
        the forward, whose Gluon generator keeps each sub-tile's register values (S, P, O and the row
        statistics) in its one warp group and emits no staging of them through shared memory; with crossings
        allowed, the solver may place an op of one sub-tile in another's group at the same II (it did for the
        fp8 two-group kernel at D = 64). True for the backward (its search's own setting)."""
        return self.kernel != FORWARD.name

    def extra_copies(self) -> int:
        """:attr:`SolveOptions.extra_copies <twill.solve.options.SolveOptions.extra_copies>` of the solve: 1 for
        the forward, where at D = 256 the one-copy schedule issues ``S`` and ``P V`` in one stage and the second
        copy lets the solver issue ``S`` a stage ahead at the same II, so the softmax overlaps the P V
        (docs/performance.md, "The op's D = 256 forward"); at D = 64 and 128 the solver's answer is the same
        either way. 0 for the backward."""
        return 1 if self.kernel == FORWARD.name else 0

    def persistent(self) -> bool:
        """The causal forward runs persistent (one CTA per SM claiming query blocks, heaviest first): a causal
        query block has half the key tiles on average, so its pipeline fill and drain weigh twice as much, and
        a persistent CTA loads the next block's Q and K/V while its compute partitions finish the current one
        (docs/performance.md, "Persistent attention forward"). So does the 16-bit non-causal forward at
        D = 128: measured beside FA3 in one run, the persistent kernel of the same schedule was 4-7% faster at
        S = 4k and 8k (docs/performance.md, "FlashAttention-3, same run"); at D = 64 and 256 it was level, and
        those keep one CTA per block. fp8 keeps the causal rule (its non-causal D = 128 persistent kernel
        spills, 88 bytes), but not at D = 256, whose persistent causal kernel of 128-key blocks
        (:meth:`block_n`) spills 40 bytes; tests/ops/test_ops.py compiles each and checks ptxas's report."""
        if self.kernel != FORWARD.name or self.varlen:   # varlen: one CTA per block
            return False
        if self.fp8():
            return self.causal and self.head_dim != 256
        return self.causal or self.head_dim == 128

    def file_name(self, version: str) -> str:
        """Cache file name: readable options and a digest of the spec and Twill's sources."""
        digest = hashlib.sha256(f"{sorted(asdict(self).items())}|{version}".encode()).hexdigest()[:16]
        mask = "causal" if self.causal else "full"
        group = f"_kv{self.kv_heads}" if self.kv_heads else ""
        varlen = "_varlen" if self.varlen else ""
        return f"{self.kernel.replace('-', '_')}_d{self.head_dim}_{self.dtype}_{mask}{group}{varlen}_{digest}.py"


#: Graph attributes only the code generator reads (the masked tiles of a causal kernel, the K/V head groups
#: and the sequences of a varlen kernel lie outside the scheduled loop): kernels whose graphs differ only in
#: these share one solve.
CODEGEN_ONLY_ATTRS = frozenset({"causal", "kv_heads", "varlen"})


def solve_key(spec: KernelSpec, graph: Any) -> str:
    """What the solver sees of ``spec``'s ``graph`` (its ops, edges and the attributes other than
    :data:`CODEGEN_ONLY_ATTRS`) and the solve's options (the streaming depth, the extra copies and, when they
    may not, that values do not cross warp groups), as one string."""
    import json

    from twill.ir.io import graph_to_dict

    doc = graph_to_dict(graph)
    doc["attrs"] = {k: v for k, v in doc.get("attrs", {}).items() if k not in CODEGEN_ONLY_ATTRS}
    key = {"graph": doc, "streaming_depth": spec.streaming_depth(), "extra_copies": spec.extra_copies()}
    if not spec.cross_warp():
        key["cross_warp"] = False
    return json.dumps(key, sort_keys=True, default=str)


def _report(message: str) -> None:
    """Progress of the ptxas-checked backward search, on stderr."""
    if message.startswith("registers:"):
        print(f"twill.ops: {message}", file=sys.stderr)


def solve(spec: KernelSpec, graph: Any, machine: Any) -> Any:
    """The verified schedule of ``graph``: the forward as the solver finds it; the backward from the
    ptxas-checked search (:func:`twill.tune.registers.schedule_without_spills`), whose kernel compiles without
    spilling registers (at D = 64 the model's own register count refuses FA3's 128-row tile)."""
    from twill.solve import schedule
    from twill.solve.options import SolveOptions

    # twill.ops.attention has no solver options
    options = SolveOptions(streaming_depth=spec.streaming_depth(), extra_copies=spec.extra_copies(),
                           cross_warp=spec.cross_warp(), progress=_report, flags=())
    if spec.kernel == FORWARD.name:
        return schedule(graph, machine, options)
    from twill.tune.registers import schedule_without_spills

    return schedule_without_spills(graph, machine, options)
