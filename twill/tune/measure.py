"""GPU measurement of the best candidates of a sweep (``twill tune --measure K``); torch and Triton are
imported only when it runs.

For each of the top ``k`` solved candidates: emit the Gluon kernel (:func:`twill.codegen.gluon.emit_gluon`),
check it against torch on ragged shapes with the output poisoned with NaN and fresh random data
(:func:`twill.codegen.gluon.check.check_gemm` / ``check_attention`` / ``check_attention_backward``), then
time it on the tuning shape (an attention backward with the fp32 forward's O and LSE),
device-side, with ``triton.testing.do_bench`` (median). A kernel that fails the check is reported, not
timed. The lead's scripts call :func:`measure_candidates` directly.

A Triton target is measured by :mod:`twill.tune.measure_triton`.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Mapping, Sequence

from twill.errors import TwillError
from twill.kernels.flash_bwd import FAMILY as BACKWARD
from twill.tune.predict import Shape

#: Largest relative error (vs an fp32 torch reference) a measured kernel may have.
MAX_RELERR = 1e-2


def require_gpu() -> None:
    """Raise a one-line :class:`TwillError` unless torch sees a CUDA GPU."""
    try:
        import torch
    except ImportError:
        raise TwillError("--measure needs a CUDA GPU and PyTorch (torch is not installed)") from None
    if not torch.cuda.is_available():
        raise TwillError("--measure needs a CUDA GPU (none found on this machine)")


def _inputs(shape: Shape, dtype: Any) -> tuple[Any, ...]:
    import torch

    if shape.problem == "gemm":
        a = torch.randn(shape["M"], shape["K"], device="cuda", dtype=dtype)
        b = torch.randn(shape["K"], shape["N"], device="cuda", dtype=dtype)
        return a, b, torch.full((shape["M"], shape["N"]), float("nan"), device="cuda", dtype=dtype)
    q, k, v = (torch.randn(shape["B"], shape["H"], shape["S"], shape["D"], device="cuda", dtype=dtype)
               for _ in range(3))
    return q, k, v, torch.full_like(q, float("nan"))


def _backward_inputs(shape: Shape, dtype: Any) -> tuple[Any, ...]:
    """q, k, v, the forward's O and LSE (fp32, :func:`~twill.codegen.gluon.check.attention_statistics`), dO,
    and dq, dk, dv poisoned with NaN."""
    import torch

    from twill.codegen.gluon.check import attention_statistics

    q, k, v, do = (torch.randn(shape["B"], shape["H"], shape["S"], shape["D"], device="cuda", dtype=dtype)
                   for _ in range(4))
    o, lse = attention_statistics(q, k, v)
    return (q, k, v, o, do, lse, *(torch.full_like(q, float("nan")) for _ in range(3)))


def time_kernel(module: Any, shape: Shape, dtype: str) -> float:
    """Median device time in seconds of one launch of an emitted kernel on ``shape`` (an attention backward's:
    the main kernel with its dO·O pre-pass, as ``launch`` runs them)."""
    import torch
    from triton.testing import do_bench

    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    backward = getattr(module, "KERNEL", None) == BACKWARD.name
    if backward:
        args = _backward_inputs(shape, torch_dtype)

        def launch() -> Any:
            return module.launch(*args[:6], dq=args[6], dk=args[7], dv=args[8])
    elif shape.problem == "gemm":
        args = _inputs(shape, torch_dtype)

        def launch() -> Any:
            return module.launch(*args)
    else:
        args = _inputs(shape, torch_dtype)

        def launch() -> Any:
            return module.launch(*args[:3], out=args[3])
    launch()
    torch.cuda.synchronize()
    outputs = args[6:] if backward else args[-1:]
    if not all(torch.isfinite(out).all() for out in outputs):
        raise TwillError("the kernel left non-finite values in its output")
    return do_bench(launch, warmup=50, rep=200, return_mode="median") * 1e-3


def _check(module: Any, shape: Shape, attrs: Mapping[str, Any]) -> float:
    from twill.codegen.gluon.check import check_attention, check_attention_backward, check_gemm

    dtype = str(attrs.get("dtype", "fp16"))
    if shape.problem == "gemm":
        rows = check_gemm(module, dtype)
    elif attrs.get("kernel") == BACKWARD.name:
        rows = check_attention_backward(module, dtype, int(attrs["head_dim"]))
    else:
        rows = check_attention(module, dtype, int(attrs["head_dim"]))
    return max(float(r["relerr"]) for r in rows)


def measure_one(result: Any, shape: Shape, workdir: str, index: int) -> dict[str, Any]:
    """Emit, check and time one ranked result; a row with predicted and measured microseconds."""
    from twill.codegen.gluon import load_emitted, write_gluon

    row: dict[str, Any] = {"candidate": result.candidate.label(), "settings": result.candidate.settings(),
                           "predicted_us": round(result.prediction.microseconds, 3)}
    try:
        path = os.path.join(workdir, f"candidate_{index}.py")
        write_gluon(result.schedule, path, bool(result.candidate.persistent))
        module = load_emitted(path, f"twill_tune_measure_{index}")
        relerr = _check(module, shape, result.schedule.graph.attrs)
        row["relerr"] = relerr
        if not relerr <= MAX_RELERR:
            row.update(status="wrong", reason=f"relative error {relerr:.3g} over {MAX_RELERR:g}")
            return row
        seconds = time_kernel(module, shape, str(result.schedule.graph.attrs.get("dtype", "fp16")))
    except Exception as exc:  # noqa: BLE001 - one kernel failing to build or run must not stop the others
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        row.update(status="error", reason=f"{type(exc).__name__}: {first}")
        return row
    row.update(status="ok", measured_us=round(seconds * 1e6, 3),
               measured_tflops=round(shape.flops_of(result.schedule.graph) / seconds / 1e12, 2))
    return row


def measure_candidates(results: Sequence[Any], shape: Shape, k: int) -> list[dict[str, Any]]:
    """Measure ``k`` solved results (:class:`twill.tune.rank.Result`, ranked) on the GPU: the best-ranked of
    each tiling first (:func:`twill.tune.rank.measure_picks`)."""
    from twill.tune.rank import measure_picks

    require_gpu()
    with tempfile.TemporaryDirectory(prefix="twill-tune-measure-") as workdir:
        return [{"rank": rank, **measure_one(r, shape, workdir, i)}
                for i, (rank, r) in enumerate(measure_picks(results, k))]


def format_measured(rows: Sequence[Mapping[str, Any]]) -> str:
    """Predicted vs measured, one line per measured candidate."""
    from twill.schedule.report import _table

    table = [[r.get("rank", i + 1), r["candidate"], r["predicted_us"], r.get("measured_us", "-"),
              r.get("measured_tflops", "-"), r["status"] if r["status"] == "ok" else f"{r['status']}: {r['reason']}"]
             for i, r in enumerate(rows)]
    return "\n".join(["predicted vs measured:"] +
                     _table(["rank", "candidate", "predicted us", "measured us", "TFLOP/s", "status"], table))


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman rank correlation of two equally long samples (average ranks for ties); ``None`` below 3
    points or when a sample is constant."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None

    def ranks(values: Sequence[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for t in range(i, j + 1):
                out[order[t]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if vx == 0 or vy == 0 else round(cov / (vx * vy) ** 0.5, 3)
