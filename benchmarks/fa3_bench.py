"""FlashAttention-3 beside ``twill.ops.attention`` and cuDNN SDPA in one process on one GPU (issue 33; a
benchmark script, not part of the library).

* ``fwd`` (GPU): the forward cases of :data:`FWD_CASES` (D = 128 non-causal / causal / causal with 8 K/V
  heads, D = 64 and D = 256 non-causal / causal), B = 4, H·D = 4096, bf16 (FA3's forward wheel builds no
  fp16 kernels). Contenders: ``twill`` (``twill.ops.attention``, no gradient), ``fa3`` (``fa3-fwd`` 0.0.3,
  ``fa3_fwd_interface.flash_attn_func``) and ``cudnn`` (``F.scaled_dot_product_attention`` on its cuDNN
  backend).
* ``bwd`` (GPU): the backward at D = 128, H = 16, B·S = 16k (S = 2k / 4k / 8k), fp16 and bf16, causal and not.
  ``twill`` and ``cudnn``: the forward runs once, then each call is ``torch.autograd.grad(out, (q, k, v),
  dout, retain_graph=True)``, so only the backward is timed. ``fa3``: FA3's Hopper backward through
  ``flash-attn3-jax`` 0.2.3 (``flash_attn3_jax.flash._flash_mha_bwd`` jitted on the outputs of its own
  ``_flash_mha_fwd``), causal only: that binding's non-causal backward returns wrong gradients, so the
  non-causal rows hold twill and cuDNN, and docs/performance.md gives FA3's published H100 figures
  (:data:`FA3_BWD_PUBLISHED`) as context. Backward FLOPs are 2.5 × the forward's (two GEMMs forward, five
  backward).
* ``preflight`` (CPU, before the GPU call): emits every kernel both steps need from the shipped schedules
  with the solver made unimportable (the GPU machine has no OR-Tools): a configuration that would be solved
  there fails here instead.
* ``table FILE`` (CPU): the markdown table of a result file, as the issue and docs/performance.md show it.

FLOPs: forward 4·B·H·S²·D, halved when causal (FlashAttention's count). Every contender first passes an fp32
check on fresh random data of ragged lengths (:data:`FWD_RAGGED`, :data:`BWD_RAGGED`): relative Frobenius
error, worst over the shapes, recorded per contender (``relerr``); above :data:`RELERR_OK`, or NaN, the
contender is not timed and its cell holds the reason (a shape it refuses is kept in the case's ``checks``
and does not count, unless it refuses them all). The ops allocate their outputs, so the output memory is
poisoned through the caching allocator: a block of all-ones bytes (a NaN in fp16, bf16 and fp32) a little
larger than the outputs is allocated and freed right before the call, after ``torch.cuda.empty_cache()``, and
the allocator hands it back; each check records whether every output landed inside it (``poisoned``), since
the allocator gives no promise. JAX's outputs cannot be poisoned (its own allocator); a NaN in them still
fails the check. Timing: ``ROUNDS`` interleaved rounds (``benchmarks._common.event_times``: CUDA events around
a sample of back-to-back calls per contender per round), medians, each contender's ``[min, max]`` TFLOP/s
over the rounds (``spread``), and the median SM clock (``ClockSampler``, nvidia-smi) over each row's rounds
(``clock_ghz``). JAX calls finish on the host only at ``block_until_ready``: a JAX sample issues its
``BWD_CALLS`` calls and waits once for the last (calls on one stream finish in order), so its time holds one
host round trip per sample (tens of µs over ``BWD_CALLS`` calls of milliseconds each), as
``gluon_bench.py`` times JAX.

Layouts. FA3 takes ``[B, S, H, D]``; ``twill.ops.attention`` takes ``[B, H, S, D]``. The ``fwd`` step asks,
per case, whether the op takes the ``transpose(1, 2)`` views of FA3's tensors without copying them (peak
memory of a call on the views against a call on contiguous copies): if so, ``twill_layout`` is ``"strided"``
and twill and cuDNN read FA3's very tensors through those views; if the op refuses them or copies them,
``"contiguous"``: twill and cuDNN read contiguous ``[B, H, S, D]`` tensors and FA3 its own contiguous
``[B, S, H, D]`` copies of the same values. With grouped K/V heads, twill and FA3 take the 8 K/V heads as
they are; cuDNN takes ``enable_gqa=True`` where this torch and cuDNN accept it, else K/V expanded to the
query heads (``cudnn_gqa`` says which). The ``bwd`` step gives twill and cuDNN contiguous ``[B, H, S, D]``
leaves and JAX the same values as ``[B, S, H, D]`` arrays.

Rows (``$OUT/fa3_h200.json``, ``$OUT/fa3_bwd_h200.json``, rewritten atomically after every row, so a run
stopped by ``timeout`` keeps what it measured; the clocks are filled in at the end)::

    {"D", "S", "causal", "kv_heads", "dtype", "twill_tflops", "fa3_tflops", "cudnn_tflops", "ratio",
     "spread", "relerr", "clock_ghz", "twill_layout", ...}

``ratio`` = ``twill_tflops / fa3_tflops`` (None when either did not run); a contender that fails (import
error, refused shape, failed check) holds an error string in its ``*_tflops`` cell, never stops the run.

The GPU call (one device call, ``carry: [".peers"]``, ``timeout_s: 600``). Once, on the CPU machine::

    bash ../shared/tools/peers.sh fetch .peers both    # fa3-fwd 28 MB + flash-attn3-jax 23 MB + einops
    cp ../shared/tools/peers.sh .peers/                # ../shared does not travel to the GPU machine
    grep -qx '/.peers/' .git/info/exclude || echo /.peers/ >> .git/info/exclude
    PYTHONPATH=. .venv/bin/python benchmarks/fa3_bench.py preflight

then the command::

    bash .peers/peers.sh install .peers; export PYTHONPATH=/tmp/peers:$PWD PYTHONUNBUFFERED=1;
    timeout -k 20 320 python3 benchmarks/fa3_bench.py fwd --out $OUT;
    timeout -k 20 220 python3 benchmarks/fa3_bench.py bwd --out $OUT

Estimated time (H200; not yet measured): ``fwd`` 3–5 min (7 forward kernels of the op compiled, 2 shape
specialisations each, ~10 s apiece; checks ~20 s; timing ~1 min: 28 rows × 3 contenders × 7 rounds × 10
calls, 0.3–30 ms a call), ``bwd`` 2–4 min (4 forward and 4 backward kernels of the op compiled; JAX
compiles 2 dtypes × 3 shapes; timing ~30 s). ``--cases``, ``--seqs`` (and ``--dtypes`` for ``bwd``) split a
run over several calls, e.g. ``fwd --cases d128,d128_causal,d128_causal_kv8`` and ``fwd --cases
d64,d64_causal,d256,d256_causal --out $OUT/rest`` (the file name is fixed; give each part its own folder).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

#: Batch and H·D of the forward (FA3's own benchmark shape); the grouped case's K/V heads.
BATCH, HIDDEN, KV_HEADS = 4, 4096, 8
#: Sequence lengths of the forward.
SEQS = (2048, 4096, 8192, 16384)
#: The backward: B·S tokens, heads and head dim (the issue's shape), sequence lengths and dtypes.
BWD_TOKENS, BWD_HEADS, BWD_HEAD_DIM = 16384, 16, 128
BWD_SEQS = (2048, 4096, 8192)
BWD_DTYPES = ("fp16", "bf16")
#: Interleaved rounds; calls per sample (forward), and per sample of the backward (JAX: one wait each).
ROUNDS, CALLS, BWD_CALLS = 7, 10, 20
#: (B, S) of the fp32 checks: key and query tails (no length a multiple of 16, so each kernel compiles one
#: more specialisation for them, not three), outputs above 1 MiB (the caching allocator's large pool, where
#: the poisoned block lives). Forward at the case's H; backward at :data:`BWD_HEADS`.
FWD_RAGGED = ((2, 77), (2, 1000), (2, 3000))
BWD_RAGGED = ((4, 77), (2, 1000))
#: Largest relative error a contender may show in the fp32 checks (16-bit inputs and outputs).
RELERR_OK = 2e-2
#: Bytes of the poisoned block beyond the outputs' (room for what an op allocates before them).
POISON_SLACK = 8 << 20
#: XLA's share of GPU memory in the ``bwd`` step (torch takes the rest).
XLA_MEM_FRACTION = "0.3"
#: FA3's published backward (H100), the context of the non-causal rows (docs/performance.md, not the rows).
FA3_BWD_PUBLISHED = ("FA3 paper (Shah et al. 2024), H100 SXM, fp16, non-causal, D = 128: 542 / 559 / 561 "
                     "TFLOP/s at S = 4k / 8k / 16k")
#: Cell of FA3 in a non-causal backward row.
FA3_NO_NONCAUSAL_BWD = "not run: flash-attn3-jax 0.2.3's non-causal backward returns wrong gradients"
#: Contenders, in the order of the rows and the table.
CONTENDERS = ("twill", "fa3", "cudnn")
#: Where the tensors live (the CPU test of the steps' plumbing moves them).
DEVICE = "cuda"
#: File names of the results.
FWD_FILE, BWD_FILE = "fa3_h200.json", "fa3_bwd_h200.json"


@dataclass(frozen=True)
class Case:
    """One attention configuration: head dim, causal mask, K/V heads (0: as many as the query heads)."""

    head_dim: int
    causal: bool
    kv_heads: int = 0

    @property
    def name(self) -> str:
        """``d128``, ``d128_causal``, ``d128_causal_kv8``: what ``--cases`` takes."""
        return f"d{self.head_dim}{'_causal' if self.causal else ''}{f'_kv{self.kv_heads}' if self.kv_heads else ''}"

    def heads(self) -> int:
        """Query heads of the forward (H·D = :data:`HIDDEN`)."""
        return HIDDEN // self.head_dim

    def label(self) -> str:
        """``D=128 causal, 8 K/V heads``: the row label of the markdown table."""
        mask = "causal" if self.causal else "non-causal"
        return f"D={self.head_dim} {mask}" + (f", {self.kv_heads} K/V heads" if self.kv_heads else "")


#: The forward cases of the issue's table, in its order.
FWD_CASES = (Case(128, False), Case(128, True), Case(128, True, KV_HEADS), Case(64, False), Case(64, True),
             Case(256, False), Case(256, True))
#: The backward cases: FA3's binding runs head dim 128 only.
BWD_CASES = (Case(BWD_HEAD_DIM, True), Case(BWD_HEAD_DIM, False))


class Stopped(BaseException):
    """SIGTERM (``timeout``) arrived: the run stops, writes what it measured and exits (a BaseException, so
    that no ``except Exception`` of a contender's call swallows it)."""


# -- pure logic (CPU-tested in benchmarks/test_fa3_bench.py) ---------------------------------------------
def forward_flops(B: int, H: int, S: int, D: int, causal: bool) -> float:
    """Two GEMMs of 2·S²·D per head; causal attention counts half (FlashAttention's count)."""
    return 4 * B * H * S * S * D * (0.5 if causal else 1.0)


def backward_flops(B: int, H: int, S: int, D: int, causal: bool) -> float:
    """2.5 × the forward's: five GEMMs of 2·S²·D per head against the forward's two."""
    return 2.5 * forward_flops(B, H, S, D, causal)


def bwd_batch(S: int) -> int:
    """Batch of the backward at sequence length ``S`` (B·S = :data:`BWD_TOKENS`)."""
    return BWD_TOKENS // S


def ratio(twill: Any, fa3: Any) -> float | None:
    """``twill / fa3`` when both are numbers (TFLOP/s), else None (a contender did not run)."""
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in (twill, fa3))
    return twill / fa3 if numbers else None


def build_row(case: Case, S: int, dtype: str, flops: float, ms: dict[str, Any], spread_ms: dict[str, list[float]],
              relerr: dict[str, Any]) -> dict[str, Any]:
    """One result row: for each contender of :data:`CONTENDERS`, TFLOP/s from its median ms in ``ms`` (or the
    error string ``ms`` holds for it, or ``"not run"``), its ``[min, max]`` TFLOP/s over the rounds from
    ``spread_ms`` (a slow round is the low end), its worst check error; ``ratio`` twill / FA3; ``clock_ghz``
    None until the run's clock readings are attached."""
    row: dict[str, Any] = {"D": case.head_dim, "S": S, "causal": case.causal, "kv_heads": case.kv_heads,
                           "dtype": dtype}
    spread: dict[str, list[float]] = {}
    for name in CONTENDERS:
        value = ms.get(name, "not run")
        if isinstance(value, (int, float)) and value > 0:
            row[f"{name}_tflops"] = flops / value / 1e9
            if name in spread_ms:
                lo, hi = spread_ms[name]
                spread[name] = [flops / hi / 1e9, flops / lo / 1e9]
        else:
            row[f"{name}_tflops"] = str(value)
    row["ratio"] = ratio(row["twill_tflops"], row["fa3_tflops"])
    row["spread"] = spread
    row["relerr"] = {name: relerr.get(name) for name in CONTENDERS}
    row["clock_ghz"] = None
    return row


def layout_decision(refusal: str | None, extra_bytes: int, input_bytes: int) -> tuple[str, str]:
    """``("strided", why)`` when the op took ``[B, S, H, D]`` views without copying them, else
    ``("contiguous", why)``: it refused them (``refusal``, its message), or a call on the views held at least
    half of q's bytes (``input_bytes``) more at its peak than a call on contiguous tensors (``extra_bytes``)."""
    if refusal is not None:
        return "contiguous", f"refuses [B, S, H, D] views: {refusal[:200]}"
    if extra_bytes >= input_bytes // 2:
        return "contiguous", (f"copies [B, S, H, D] views: {extra_bytes} bytes more at peak than with contiguous "
                              f"inputs (q is {input_bytes} bytes)")
    return "strided", "takes the [B, S, H, D] views of FA3's tensors without a copy"


def poisoned_spans(spans: list[tuple[int, int]], outputs: list[tuple[int, int]]) -> list[bool]:
    """For each output ``(address, bytes)``, whether it lies inside one of the poisoned ``(address, bytes)``
    ``spans``."""
    return [any(start <= addr and addr + size <= start + length for start, length in spans)
            for addr, size in outputs]


def worst(errors: list[Any]) -> Any:
    """The worst of a contender's check errors: NaN if any is NaN (a non-finite output), else the largest.
    A shape the contender refused (an error string) does not count, unless it refused every shape: then the
    first such string; None when there is no check."""
    numbers = [float(e) for e in errors if isinstance(e, (int, float)) and not isinstance(e, bool)]
    if not numbers:
        return next((e for e in errors if isinstance(e, str)), None)
    if any(x != x for x in numbers):
        return float("nan")
    return max(numbers)


def check_failure(err: Any) -> str | None:
    """Why a contender with worst check error ``err`` is not timed, or None when it passed."""
    if isinstance(err, str):
        return f"check failed: {err}"
    if err is None:
        return "check failed: no check ran"
    if err != err or err > RELERR_OK:
        return f"check failed: relative error {err:.2e} against fp32 (limit {RELERR_OK:.0e})"
    return None


def _cell(value: Any, fmt: str = "{:.0f}") -> str:
    return fmt.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def table(doc: dict[str, Any]) -> str:
    """A short text table of a result: one line per row, TFLOP/s of each contender, ratio, checks, clock."""
    versions = doc.get("versions", {})
    lines = [f"{doc.get('step', '?')}: {versions.get('gpu', '?')} | torch {versions.get('torch', '?')} | "
             f"fa3-fwd {versions.get('fa3-fwd', '-')} | flash-attn3-jax {versions.get('flash-attn3-jax', '-')}"]
    for info in doc.get("cases", []):
        notes = [f"{k} {info[k]}" for k in ("twill_layout", "cudnn_gqa") if info.get(k)]
        if info.get("error"):
            notes.append(f"ERROR {info['error'][:150]}")
        if notes:
            lines.append(f"{info['case']}: " + "; ".join(notes))
    for r in doc.get("rows", []):
        name = Case(r["D"], r["causal"], r["kv_heads"]).name
        cells = "  ".join(f"{n} {_cell(r[f'{n}_tflops']):>4s}" for n in CONTENDERS)
        errs = " ".join(f"{_cell(r['relerr'].get(n), '{:.0e}')}" for n in CONTENDERS)
        lines.append(f"{name:16s} {r['dtype']} S={r['S']:>5d}  {cells}  twill/fa3 {_cell(r['ratio'], '{:.2f}'):>4s}"
                     f"  err {errs}  {_cell(r['clock_ghz'], '{:.2f}')} GHz")
        for n in CONTENDERS:
            if isinstance(r[f"{n}_tflops"], str) and r[f"{n}_tflops"] != "not run":
                lines.append(f"    {n}: {r[f'{n}_tflops'][:200]}")
    if doc.get("stopped"):
        lines.append(f"STOPPED: {doc['stopped']}")
    return "\n".join(lines)


def markdown(doc: dict[str, Any]) -> str:
    """The issue's table: one line per case (and dtype, in the backward), the sequence lengths and each
    contender's TFLOP/s joined by `` / ``, twill / FA3 last."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in doc.get("rows", []):
        groups.setdefault((r["D"], r["causal"], r["kv_heads"], r["dtype"]), []).append(r)
    backward = doc.get("step") == "bwd"
    lines = ["| case | S | twill | FA3 | cuDNN | twill / FA3 |", "|---|---|---|---|---|---|"]
    for (D, causal, kv, dtype), rows in groups.items():
        rows = sorted(rows, key=lambda r: r["S"])
        label = Case(D, causal, kv).label() + (f", {dtype}" if backward else "")
        seqs = " / ".join(f"{r['S'] // 1024}k" if r["S"] % 1024 == 0 else str(r["S"]) for r in rows)
        cells = [" / ".join(_cell(r[f"{n}_tflops"]) for r in rows) for n in CONTENDERS]
        ratios = " / ".join(_cell(r["ratio"], "{:.2f}") for r in rows)
        lines.append(f"| {label} | {seqs} | " + " | ".join(cells) + f" | {ratios} |")
    return "\n".join(lines)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _choices(text: str, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown) or repr(text)} "
                                         f"(known: {', '.join(known)})")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (module docstring); a bad value exits 2 with one line on stderr."""
    parser = argparse.ArgumentParser(prog="python benchmarks/fa3_bench.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    steps = {"fwd": (FWD_CASES, SEQS, "the forward cases (GPU)"),
             "bwd": (BWD_CASES, BWD_SEQS, "the backward (GPU)")}
    for step, (cases, seqs, text) in steps.items():
        names = tuple(c.name for c in cases)
        p = sub.add_parser(step, help=f"check and time {text}")
        p.add_argument("--out", default=os.environ.get("OUT") or "out", help="folder of the result file")
        p.add_argument("--cases", type=lambda t, n=names: _choices(t, n, "case"), default=names,
                       help=f"comma-separated, of {', '.join(names)} (default all)")
        p.add_argument("--seqs", type=_int_list, default=seqs,
                       help=f"comma-separated sequence lengths (default {','.join(map(str, seqs))})")
        p.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved rounds (default {ROUNDS})")
        if step == "bwd":
            p.add_argument("--dtypes", type=lambda t: _choices(t, BWD_DTYPES, "dtype"), default=BWD_DTYPES,
                           help="comma-separated, of fp16, bf16 (default both)")
    sub.add_parser("preflight", help="emit every kernel of both steps from the shipped schedules, no solver (CPU)")
    t = sub.add_parser("table", help="print the markdown table of a result file (CPU)")
    t.add_argument("results")
    args = parser.parse_args(argv)
    if args.step in steps:
        if args.rounds < 1:
            parser.error(f"--rounds must be at least 1, got {args.rounds}")
        if args.step == "bwd":
            bad = [s for s in args.seqs if BWD_TOKENS % s]
            if bad:
                parser.error(f"--seqs: {bad[0]} does not divide B·S = {BWD_TOKENS}")
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            parser.error(f"--out {args.out!r} is a file, not a folder")
    elif args.step == "table" and not os.path.isfile(args.results):
        parser.error(f"cannot read {args.results!r}: no such file")
    return args


def selected(cases: tuple[Case, ...], names: tuple[str, ...]) -> list[Case]:
    """The cases named in ``names``, in the order of ``cases``."""
    return [c for c in cases if c.name in names]


# -- GPU helpers -------------------------------------------------------------------------------------------
def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip()[:300]}"


def versions() -> dict[str, Any]:
    """GPU, torch, Triton, cuDNN, CUDA, and the versions of JAX and the two FA3 packages where installed."""
    from importlib.metadata import PackageNotFoundError, version

    import torch
    import triton

    out: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "triton": triton.__version__, "cudnn": torch.backends.cudnn.version(),
                           "cuda": torch.version.cuda}
    for package in ("jax", "fa3-fwd", "flash-attn3-jax"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    return out


def poisoned_call(fn: Callable[[], Any], out_bytes: list[int]) -> tuple[Any, list[bool]]:
    """``fn()`` with its outputs most likely in poisoned memory: after ``empty_cache``, one block of all-ones
    bytes (NaN in every float dtype) of the outputs' bytes plus :data:`POISON_SLACK` is allocated and freed,
    so the caching allocator hands it to the call. Returns the result and, per output (a tensor or a tuple of
    them), whether it lies inside that block."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    poison = torch.full((sum(out_bytes) + POISON_SLACK,), 255, dtype=torch.uint8, device=DEVICE)
    span = (poison.data_ptr(), poison.numel())
    del poison
    result = fn()
    torch.cuda.synchronize()
    outputs = result if isinstance(result, (tuple, list)) else (result,)
    return result, poisoned_spans([span], [(t.data_ptr(), t.numel() * t.element_size()) for t in outputs])


def reference(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """fp32 ``softmax(q kᵀ / sqrt(D) [causal]) v`` of ``[B, H, S, D]`` tensors (K/V heads repeated for GQA);
    differentiable, for the backward's reference gradients."""
    import torch

    group = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    s = (q.float() @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        S = q.shape[2]
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _relerr(out: Any, ref: Any) -> float:
    from twill.codegen.gluon.check import relative_error

    return relative_error(out, ref)


def _dtype(name: str) -> Any:
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def _load_twill() -> Any:
    from twill.ops import attention

    return attention


def _load_fa3() -> Any:
    from fa3_fwd_interface import flash_attn_func

    def call(q: Any, k: Any, v: Any, causal: bool) -> Any:
        out = flash_attn_func(q, k, v, causal=causal)
        return out[0] if isinstance(out, tuple) else out     # some versions return (out, lse)
    return call


def _sdpa_cudnn(q: Any, k: Any, v: Any, causal: bool, gqa: bool = False) -> Any:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        if gqa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


class Forward:
    """The forward inputs of one case and size, in FA3's ``[B, S, H, D]`` (``fa3``) and in what twill and
    cuDNN read (``bhsd``: views of them or contiguous copies, by ``layout``), and each contender's call."""

    def __init__(self, case: Case, B: int, S: int, layout: str, cudnn_gqa: str | None):
        import torch

        self.case, self.B, self.S, self.H = case, B, S, case.heads()
        kv = case.kv_heads or self.H
        dtype = torch.bfloat16
        self.fa3 = tuple(torch.randn(B, S, h, case.head_dim, device=DEVICE, dtype=dtype)
                         for h in (self.H, kv, kv))
        views = tuple(t.transpose(1, 2) for t in self.fa3)
        self.bhsd = views if layout == "strided" else tuple(t.contiguous() for t in views)
        q, k, v = self.bhsd
        self.cudnn_kv = (k, v)
        if case.kv_heads and cudnn_gqa != "enable_gqa":
            self.cudnn_kv = tuple(t.repeat_interleave(self.H // kv, dim=1) for t in (k, v))
        self.cudnn_gqa = cudnn_gqa == "enable_gqa"

    def out_bytes(self) -> int:
        return self.B * self.H * self.S * self.case.head_dim * 2

    def calls(self, ops: dict[str, Any]) -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
        """Per contender in ``ops`` (loaded: a callable), its call and how its output becomes ``[B, H, S, D]``."""
        causal, (q, k, v), (kc, vc) = self.case.causal, self.bhsd, self.cudnn_kv
        calls: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {}
        same = lambda o: o  # noqa: E731
        if callable(ops.get("twill")):
            calls["twill"] = (lambda: ops["twill"](q, k, v, causal=causal), same)
        if callable(ops.get("fa3")):
            calls["fa3"] = (lambda: ops["fa3"](*self.fa3, causal), lambda o: o.transpose(1, 2))
        if callable(ops.get("cudnn")):
            calls["cudnn"] = (lambda: ops["cudnn"](q, kc, vc, causal, self.cudnn_gqa), same)
        return calls

    def reference(self) -> Any:
        return reference(*(t.float() for t in self.bhsd), self.case.causal)


def _peak_extra(fn: Callable[[], Any]) -> int:
    """Bytes a call of ``fn`` holds at its peak beyond what was allocated before it."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    del out
    return extra


def detect_layout(twill: Any, case: Case) -> tuple[str, str]:
    """Whether ``twill.ops.attention`` takes ``transpose(1, 2)`` views of ``[B, S, H, D]`` tensors without a
    copy (:func:`layout_decision`), on one ragged shape of ``case``."""
    import torch

    B, S = FWD_RAGGED[1]
    inputs = Forward(case, B, S, "strided", None)
    views = inputs.bhsd
    contiguous = tuple(t.contiguous() for t in views)
    with torch.no_grad():
        twill(*contiguous, causal=case.causal)             # compiles the kernel before any measurement
        try:
            twill(*views, causal=case.causal)
        except Exception as exc:
            return layout_decision(_error(exc), 0, 0)
        extra = (_peak_extra(lambda: twill(*views, causal=case.causal))
                 - _peak_extra(lambda: twill(*contiguous, causal=case.causal)))
    return layout_decision(None, extra, views[0].numel() * views[0].element_size())


def detect_cudnn_gqa(case: Case, layout: str) -> str:
    """``"enable_gqa"`` when cuDNN SDPA takes fewer K/V heads with ``enable_gqa=True`` (and gives the fp32
    reference's output), else ``"expanded K/V"``."""
    import torch

    inputs = Forward(case, *FWD_RAGGED[0], layout, "enable_gqa")
    try:
        with torch.no_grad():
            out = _sdpa_cudnn(*inputs.bhsd, case.causal, gqa=True)
        if _relerr(out, inputs.reference()) <= RELERR_OK:
            return "enable_gqa"
    except Exception:      # RuntimeError (no cuDNN kernel), TypeError (a torch without enable_gqa)
        pass
    return "expanded K/V"


def check_forward(calls_of: Callable[[Forward], dict[str, Any]], case: Case, layout: str,
                  cudnn_gqa: str | None) -> dict[str, list[dict[str, Any]]]:
    """Each contender against fp32 on the :data:`FWD_RAGGED` shapes, outputs poisoned: per contender, one
    ``{"B", "H", "S", "relerr", "poisoned"}`` per shape (``relerr`` an error string when the call failed)."""
    import torch

    checks: dict[str, list[dict[str, Any]]] = {}
    for B, S in FWD_RAGGED:
        inputs = Forward(case, B, S, layout, cudnn_gqa)
        ref = inputs.reference()
        for name, (fn, to_bhsd) in calls_of(inputs).items():
            entry: dict[str, Any] = {"B": B, "H": inputs.H, "S": S}
            try:
                with torch.no_grad():
                    out, poisoned = poisoned_call(fn, [inputs.out_bytes()])
                entry.update(relerr=_relerr(to_bhsd(out), ref), poisoned=poisoned[0])
            except Exception as exc:
                entry["relerr"] = _error(exc)
            checks.setdefault(name, []).append(entry)
        del inputs, ref
    return checks


def time_forward(calls: dict[str, Any], flops: float, rounds: int) -> tuple[dict[str, Any], dict[str, Any],
                                                                            list[float], float | None]:
    """Median ms and ``[min, max]`` of each call in ``calls`` (a call that fails on its first run gets its
    error instead), the rounds' time window, and twill's relative difference from FA3 on these inputs."""
    import torch

    from benchmarks._common import event_times

    ms: dict[str, Any] = {}
    fns: dict[str, Callable[[], Any]] = {}
    outs: dict[str, Any] = {}
    with torch.no_grad():
        for name, (fn, to_bhsd) in calls.items():
            try:
                out = fn()
                torch.cuda.synchronize()
                if not bool(torch.isfinite(out).all()):
                    ms[name] = "non-finite output at this size"
                    continue
                fns[name] = fn
                if name in ("twill", "fa3"):
                    outs[name] = to_bhsd(out)
            except Exception as exc:
                ms[name] = _error(exc)
        agreement = _relerr(outs["twill"], outs["fa3"]) if len(outs) == 2 else None
        outs.clear()
        window = [time.time(), time.time()]
        if fns:
            median, spread, window = event_times(fns, CALLS, rounds)
            ms.update(median)
        else:
            spread = {}
    return ms, spread, window, agreement


def run_forward(args: argparse.Namespace, doc: dict[str, Any], save: Callable[[], None]) -> None:
    """The ``fwd`` step into ``doc`` (``save`` after each row)."""
    import torch

    loaders = {"twill": _load_twill, "fa3": _load_fa3, "cudnn": lambda: _sdpa_cudnn}
    ops: dict[str, Any] = {}
    for name, load in loaders.items():
        try:
            ops[name] = load()
        except Exception as exc:      # a missing package is a row's error string, not the run's end
            ops[name] = f"import failed: {_error(exc)}"
    for case in selected(FWD_CASES, args.cases):
        info: dict[str, Any] = {"case": case.name, "D": case.head_dim, "causal": case.causal,
                                "kv_heads": case.kv_heads, "H": case.heads(), "twill_layout": None,
                                "cudnn_gqa": None}
        doc["cases"].append(info)
        try:
            layout = "contiguous"
            if callable(ops["twill"]):
                try:
                    layout, info["twill_layout_reason"] = detect_layout(ops["twill"], case)
                except Exception as exc:      # the op fails on contiguous inputs too: its checks record why
                    info["twill_layout_reason"] = f"not probed, the op failed: {_error(exc)}"
                info["twill_layout"] = layout
            cudnn_gqa = detect_cudnn_gqa(case, layout) if case.kv_heads else None
            info["cudnn_gqa"] = cudnn_gqa
            checks = check_forward(lambda i: i.calls(ops), case, layout, cudnn_gqa)
            info["checks"] = checks
            relerr = {n: worst([c["relerr"] for c in checks.get(n, [])]) for n in CONTENDERS}
            failed = {n: (ops[n] if not callable(ops[n]) else check_failure(relerr[n])) for n in CONTENDERS}
            save()
            for S in args.seqs:
                inputs = Forward(case, BATCH, S, layout, cudnn_gqa)
                live = {n: ops[n] for n in CONTENDERS if failed[n] is None}
                flops = forward_flops(BATCH, inputs.H, S, case.head_dim, case.causal)
                ms, spread, window, agreement = time_forward(inputs.calls(live), flops, args.rounds)
                ms.update({n: why for n, why in failed.items() if why is not None})
                row = build_row(case, S, "bf16", flops, ms, spread, relerr)
                row.update(B=BATCH, H=inputs.H, twill_layout=layout, twill_vs_fa3=agreement, window=window)
                if cudnn_gqa:
                    row["cudnn_gqa"] = cudnn_gqa
                doc["rows"].append(row)
                save()
                print(json.dumps({k: row[k] for k in ("D", "S", "causal", "kv_heads", "twill_tflops", "fa3_tflops",
                                                      "cudnn_tflops", "ratio")}), flush=True)
                del inputs
                torch.cuda.empty_cache()
        except Exception as exc:
            info["error"] = _error(exc)
            save()


# -- backward -----------------------------------------------------------------------------------------------
def _jax() -> tuple[Any, Any, Any, Any]:
    """jax, jax.numpy and flash-attn3-jax's forward and backward primitives (XLA given
    :data:`XLA_MEM_FRACTION` of the GPU's memory, so that torch keeps the rest)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", XLA_MEM_FRACTION)
    import jax
    import jax.numpy as jnp
    from flash_attn3_jax.flash import _flash_mha_bwd, _flash_mha_fwd

    return jax, jnp, _flash_mha_fwd, _flash_mha_bwd


class Backward:
    """The backward inputs of one size: ``[B, H, S, D]`` leaves for twill and cuDNN, ``dout``; FA3's
    ``[B, S, H, D]`` JAX arrays of the same values on demand."""

    def __init__(self, B: int, S: int, dtype: str, causal: bool):
        import torch

        self.B, self.S, self.dtype, self.causal = B, S, dtype, causal
        shape = (B, BWD_HEADS, S, BWD_HEAD_DIM)
        self.qkv = tuple(torch.randn(shape, device=DEVICE, dtype=_dtype(dtype)).requires_grad_() for _ in range(3))
        self.dout = torch.randn(shape, device=DEVICE, dtype=_dtype(dtype))
        self.scale = BWD_HEAD_DIM ** -0.5

    def grad_bytes(self) -> list[int]:
        return [t.numel() * t.element_size() for t in self.qkv]

    def torch_grad(self, forward: Callable[..., Any]) -> Callable[[], Any]:
        """The forward once (``forward(q, k, v)``), then a function computing the gradients on its graph."""
        import torch

        out = forward(*self.qkv)
        return lambda: torch.autograd.grad(out, self.qkv, self.dout, retain_graph=True)

    def jax_grad(self, jax_mods: tuple[Any, Any, Any, Any]) -> Callable[[], Any]:
        """FA3's forward once (its own ``out`` and ``lse``), then a function computing the gradients."""
        jax, jnp, fwd, bwd = jax_mods
        jdt = {"fp16": jnp.float16, "bf16": jnp.bfloat16}[self.dtype]
        q, k, v, do = (jnp.asarray(t.detach().transpose(1, 2).contiguous().float().cpu().numpy()).astype(jdt)
                       for t in (*self.qkv, self.dout))
        scale, causal = self.scale, self.causal
        out, lse = jax.jit(lambda q, k, v: fwd(q, k, v, scale, causal, (-1, -1)))(q, k, v)
        grad = jax.jit(lambda do, q, k, v, o, lse: bwd(do, q, k, v, o, lse, scale, causal, (-1, -1)))
        return lambda: grad(do, q, k, v, out, lse)

    def reference(self) -> tuple[Any, ...]:
        """The fp32 gradients of the fp32 attention of the same inputs."""
        import torch

        leaves = tuple(t.detach().float().requires_grad_() for t in self.qkv)
        out = reference(*leaves, self.causal)
        return torch.autograd.grad(out, leaves, self.dout.float())


def _to_torch_bhsd(x: Any) -> Any:
    import numpy as np
    import torch

    return torch.from_numpy(np.array(x.astype("float32"))).to(DEVICE).transpose(1, 2)


def _torch_forwards(twill: Any, causal: bool) -> dict[str, Callable[..., Any]]:
    forwards: dict[str, Callable[..., Any]] = {"cudnn": lambda q, k, v: _sdpa_cudnn(q, k, v, causal)}
    if callable(twill):
        forwards = {"twill": lambda q, k, v: twill(q, k, v, causal=causal), **forwards}
    return forwards


def check_backward(twill: Any, jax_mods: Any, case: Case, dtype: str) -> dict[str, list[dict[str, Any]]]:
    """dq, dk, dv of each contender against fp32 autograd on the :data:`BWD_RAGGED` shapes (twill's and
    cuDNN's gradients poisoned): per contender, one ``{"B", "H", "S", "relerr", "dq", "dk", "dv",
    "poisoned"}`` per shape, ``relerr`` the worst of the three."""
    checks: dict[str, list[dict[str, Any]]] = {}
    for B, S in BWD_RAGGED:
        inputs = Backward(B, S, dtype, case.causal)
        refs = inputs.reference()
        contenders: dict[str, Callable[[], Any]] = {}
        for name, forward in _torch_forwards(twill, case.causal).items():
            try:
                grad = inputs.torch_grad(forward)
                contenders[name] = lambda g=grad: poisoned_call(g, inputs.grad_bytes())
            except Exception as exc:
                checks.setdefault(name, []).append({"B": B, "H": BWD_HEADS, "S": S, "relerr": _error(exc)})
        if case.causal and not isinstance(jax_mods, str):
            def fa3_grads() -> Any:
                grads = inputs.jax_grad(jax_mods)()
                return tuple(_to_torch_bhsd(g) for g in grads), None
            contenders["fa3"] = fa3_grads
        for name, call in contenders.items():
            entry: dict[str, Any] = {"B": B, "H": BWD_HEADS, "S": S}
            try:
                grads, poisoned = call()
                errs = {g: _relerr(got, ref) for g, got, ref in zip(("dq", "dk", "dv"), grads, refs)}
                entry.update(errs, relerr=worst(list(errs.values())), poisoned=poisoned)
            except Exception as exc:
                entry["relerr"] = _error(exc)
            checks.setdefault(name, []).append(entry)
        del inputs, refs, contenders
    return checks


def _repeat(fn: Callable[[], Any], n: int) -> Callable[[], None]:
    def calls() -> None:
        for _ in range(n):
            fn()
    return calls


def _jax_repeat(fn: Callable[[], Any], n: int, jax: Any) -> Callable[[], None]:
    """``n`` asynchronous calls, then one wait for the last (calls on one stream finish in order)."""
    def calls() -> None:
        for _ in range(n - 1):
            fn()
        jax.block_until_ready(fn())
    return calls


def run_backward(args: argparse.Namespace, doc: dict[str, Any], save: Callable[[], None]) -> None:
    """The ``bwd`` step into ``doc`` (``save`` after each row)."""
    import torch

    from benchmarks._common import event_times

    try:
        twill: Any = _load_twill()
    except Exception as exc:
        twill = f"import failed: {_error(exc)}"
    try:
        jax_mods: Any = _jax()
    except Exception as exc:
        jax_mods = f"import failed: {_error(exc)}"
    for case in selected(BWD_CASES, args.cases):
        for dtype in args.dtypes:
            info: dict[str, Any] = {"case": case.name, "dtype": dtype, "D": case.head_dim, "causal": case.causal,
                                    "H": BWD_HEADS, "twill_layout": "contiguous"}
            doc["cases"].append(info)
            try:
                checks = check_backward(twill, jax_mods, case, dtype)
                info["checks"] = checks
                relerr = {n: worst([c["relerr"] for c in checks.get(n, [])]) for n in CONTENDERS}
                failed = {n: check_failure(relerr[n]) for n in CONTENDERS}
                if not callable(twill):
                    failed["twill"] = twill
                if not case.causal:
                    failed["fa3"] = FA3_NO_NONCAUSAL_BWD
                elif isinstance(jax_mods, str):
                    failed["fa3"] = jax_mods
                save()
                for S in args.seqs:
                    B = bwd_batch(S)
                    inputs = Backward(B, S, dtype, case.causal)
                    ms: dict[str, Any] = {n: why for n, why in failed.items() if why is not None}
                    fns: dict[str, Callable[[], None]] = {}
                    for name, forward in _torch_forwards(twill, case.causal).items():
                        if failed[name] is None:
                            try:
                                grad = inputs.torch_grad(forward)
                                grad()
                                fns[name] = _repeat(grad, BWD_CALLS)
                            except Exception as exc:
                                ms[name] = _error(exc)
                    if failed["fa3"] is None:
                        try:
                            grad = inputs.jax_grad(jax_mods)
                            jax_mods[0].block_until_ready(grad())        # compiles
                            fns["fa3"] = _jax_repeat(grad, BWD_CALLS, jax_mods[0])
                        except Exception as exc:
                            ms["fa3"] = _error(exc)
                    window = [time.time(), time.time()]
                    spread: dict[str, list[float]] = {}
                    if fns:
                        median, spread_per_sample, window = event_times(fns, 1, args.rounds)
                        ms.update({n: m / BWD_CALLS for n, m in median.items()})
                        spread = {n: [lo / BWD_CALLS, hi / BWD_CALLS] for n, (lo, hi) in spread_per_sample.items()}
                    flops = backward_flops(B, BWD_HEADS, S, case.head_dim, case.causal)
                    row = build_row(case, S, dtype, flops, ms, spread, relerr)
                    row.update(B=B, H=BWD_HEADS, twill_layout="contiguous", window=window)
                    doc["rows"].append(row)
                    save()
                    print(json.dumps({k: row[k] for k in ("D", "S", "causal", "dtype", "twill_tflops", "fa3_tflops",
                                                          "cudnn_tflops", "ratio")}), flush=True)
                    del inputs, fns
                    torch.cuda.empty_cache()
            except Exception as exc:
                info["error"] = _error(exc)
                save()


# -- preflight (CPU) ---------------------------------------------------------------------------------------
def preflight() -> int:
    """Emit every kernel module the ``fwd`` and ``bwd`` steps need (``twill.ops.prepare``) into a scratch
    kernel cache with OR-Tools and yices made unimportable, as on the GPU machine: a configuration without a
    usable shipped schedule fails here. Returns the number of failures."""
    import tempfile

    for blocked in ("ortools", "yices", "yices_api"):
        sys.modules[blocked] = None  # type: ignore[assignment]   # import raises ImportError
    from twill.ops import prepare

    scratch = tempfile.TemporaryDirectory(prefix="fa3_preflight_")
    os.environ["XDG_CACHE_HOME"] = scratch.name
    configs = [(c.head_dim, "bf16", c.causal, c.kv_heads, False) for c in FWD_CASES]
    configs += [(c.head_dim, d, c.causal, 0, True) for c in BWD_CASES for d in BWD_DTYPES]
    failures = 0
    for head_dim, dtype, causal, kv_heads, backward in configs:
        what = f"D={head_dim} {dtype} causal={causal} kv_heads={kv_heads} backward={backward}"
        try:
            prepare(head_dim, dtype, causal=causal, kv_heads=kv_heads, backward=backward)
            print(f"ok    {what}", flush=True)
        except Exception as exc:
            failures += 1
            print(f"FAIL  {what}: {_error(exc)}", flush=True)
    scratch.cleanup()
    return failures


# -- the steps ---------------------------------------------------------------------------------------------
def _stop(signum: int, frame: Any) -> None:
    raise Stopped(f"signal {signum}")


def attach_clocks(doc: dict[str, Any], sampler: Any) -> None:
    """Replace each row's ``window`` (the unix times of its rounds) by ``clock_ghz``, the median SM clock
    ``sampler`` read in it (None where it read none)."""
    for row in doc["rows"]:
        if "window" in row:
            row["clock_ghz"] = sampler.median_ghz(*row.pop("window"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the ``fwd`` or ``bwd`` step; write ``args.out/<file>`` after every row and at the end."""
    from twill.files import write_json_atomic
    from twill.machine.microbench import ClockSampler

    backward = args.step == "bwd"
    doc: dict[str, Any] = {
        "step": args.step, "command": " ".join(["python benchmarks/fa3_bench.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "versions": versions(),
        "rounds": args.rounds, "calls": BWD_CALLS if backward else CALLS, "relerr_limit": RELERR_OK,
        "flops": "2.5 x forward (4 B H S^2 D, half when causal)" if backward else "4 B H S^2 D, half when causal",
        "cases": [], "rows": []}
    if backward:
        doc.update(B_times_S=BWD_TOKENS, H=BWD_HEADS, fa3_published_context=FA3_BWD_PUBLISHED)
    else:
        doc.update(B=BATCH, H_times_D=HIDDEN)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, BWD_FILE if backward else FWD_FILE)

    def save() -> None:
        write_json_atomic(path, doc)

    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        with ClockSampler() as sampler:
            try:
                (run_backward if backward else run_forward)(args, doc, save)
            except Stopped as exc:
                doc["stopped"] = f"{exc} after {len(doc['rows'])} rows"
    finally:
        signal.signal(signal.SIGTERM, previous)
    attach_clocks(doc, sampler)
    save()
    print(table(doc))
    return doc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.step == "table":
        try:
            with open(args.results) as fh:
                doc = json.load(fh)
            text = markdown(doc)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"fa3_bench.py: cannot read {args.results!r} as a result file: {exc}", file=sys.stderr)
            return 2
        print(text)
        return 0
    if args.step == "preflight":
        return 1 if preflight() else 0
    doc = run(args)
    return 1 if doc.get("stopped") else 0


if __name__ == "__main__":
    sys.exit(main())
