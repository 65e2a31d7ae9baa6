"""Where the host time of ``twill.ops.attention``'s forward + backward goes, at the tiny shape of
``op_launch_cost.py`` (B = 1, 8 heads, S = 128, D = 128, bf16, causal): each piece timed alone, host wall time
per call of 50 back-to-back calls, median of 7 rounds, two rounds of all pieces interleaved (a GPU experiment
behind docs/performance.md's "Host time per call", not a test).

Pieces: the op's training step and cuDNN's (``torch.autograd.grad`` of the forward), the same step through a
plain ``torch.autograd.Function`` that calls the emitted modules' ``launch`` directly (``plain_function_step``)
and through one that only allocates its outputs (``empty_function_step``: what a Python autograd function's
round trip costs), the backward module's ``launch`` with and without the gradients preallocated, the forward
module's with and without an LSE, the op's forward with and without a gradient asked for, cuDNN's forward,
three ``empty_like``, the backward's pre-pass alone. Then the backward launch split into its Python and its
three launches (``launches``). Prints the pieces and writes ``$OUT/op_host_parts.json``.

    python3 benchmarks/op_host_parts.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import host_us  # noqa: E402


def host(fn: Callable[[], Any], calls: int = 50, rounds: int = 7) -> float:
    """Median µs per call over ``rounds`` samples of :func:`host_us` (``calls`` back-to-back calls each), after
    three warm-up calls."""
    for _ in range(3):
        fn()
    return statistics.median(host_us(fn, calls) for _ in range(rounds))


def run() -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import twill.ops
    from twill.ops.flash import KernelSpec, kernel_module

    B, H, S, D = 1, 8, 128, 128
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    dout = torch.randn_like(q)
    fwd = kernel_module(KernelSpec("flash-fwd", D, "bf16", True, 0))
    bwd = kernel_module(KernelSpec("flash-bwd", D, "bf16", True, 0))
    out, lse = fwd.launch(q, k, v, return_lse=True)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))

    class Plain(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any) -> Any:
            o, l = fwd.launch(q, k, v, return_lse=True)
            ctx.save_for_backward(q, k, v, o, l)
            return o

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            q, k, v, o, l = ctx.saved_tensors
            return bwd.launch(q, k, v, o, g, l)

    class Empty(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any) -> Any:
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return torch.empty_like(g), torch.empty_like(g), torch.empty_like(g)

    def cudnn_step() -> Any:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
        return torch.autograd.grad(o, (qg, kg, vg), dout)

    pieces: dict[str, Callable[[], Any]] = {
        "twill_step": lambda: torch.autograd.grad(twill.ops.attention(qg, kg, vg, causal=True), (qg, kg, vg), dout),
        "cudnn_step": cudnn_step,
        "plain_function_step": lambda: torch.autograd.grad(Plain.apply(qg, kg, vg), (qg, kg, vg), dout),
        "empty_function_step": lambda: torch.autograd.grad(Empty.apply(qg, kg, vg), (qg, kg, vg), dout),
        "bwd_launch_prealloc": lambda: bwd.launch(q, k, v, out, dout, lse, dq=dq, dk=dk, dv=dv),
        "bwd_launch": lambda: bwd.launch(q, k, v, out, dout, lse),
        "fwd_launch_lse": lambda: fwd.launch(q, k, v, return_lse=True),
        "fwd_launch": lambda: fwd.launch(q, k, v),
        "op_fwd_nograd": lambda: twill.ops.attention(q, k, v, causal=True),
        "op_fwd_grad": lambda: twill.ops.attention(qg, kg, vg, causal=True),
        "cudnn_fwd": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "empty_like_x3": lambda: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)),
        "bwd_preprocess": lambda: bwd.preprocess(out, dout),
    }
    samples: dict[str, list[float]] = {}
    for _ in range(2):
        for name, fn in pieces.items():
            samples.setdefault(name, []).append(host(fn))
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "shape": [B, H, S, D],
                           "us": {n: statistics.median(s) for n, s in samples.items()}}
    launches: list[tuple[Any, ...]] = []
    real = bwd._launch
    bwd._launch = lambda *args: launches.append(args)
    bwd.launch(q, k, v, out, dout, lse)
    bwd._launch = lambda *args: None
    python = host(lambda: bwd.launch(q, k, v, out, dout, lse))
    bwd._launch = real
    doc["launches"] = {"python": python, **{args[0].__name__: host(lambda args=args: real(*args))
                                            for args in launches}}
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    doc = run()
    with open(os.path.join(args.out, "op_host_parts.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    for name, us in {**doc["us"], **{f"bwd {n}": v for n, v in doc["launches"].items()}}.items():
        print(f"{name:28s} {us:7.1f} us")


if __name__ == "__main__":
    main()
