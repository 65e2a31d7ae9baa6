"""One Llama-style decoder layer's training step with attention by ``twill.ops.attention`` against SDPA's cuDNN and
FA2 backends (a GPU benchmark for issue 34's decoder-layer target, not a test).

The layer (d 4096, 32 query heads of 128, 8 K/V heads, SwiGLU 14336, bf16, causal, RoPE, RMSNorm) is written
here in plain PyTorch, as models write it: q, k and v come out of their projections as ``[B, S, H, D]`` and are
handed to attention as ``.transpose(1, 2)`` views, the output is transposed back and projected. One step is the
forward and the backward over every parameter and the input.

* ``step_ms``: the median step time in interleaved rounds between CUDA events (``[min, max]`` over rounds) and
  ``speedup`` = cuDNN's time / the contender's;
* ``check``: the output and the input's gradient of each contender against cuDNN's on the same weights and
  data (relative Frobenius error);
* ``profile``: for each contender, one step under ``torch.profiler``: GPU time per kernel class (attention,
  GEMM, copy: a kernel whose name holds ``copy``, other) and the copy kernels' names and counts;
  ``extra_copies``: the copy kernels of a contender's step beyond cuDNN's (the layer's own, RoPE's
  concatenations among them, are in both): the issue asks for none from the op.

Prints a table and writes ``$OUT/decoder_step.json``.

    python benchmarks/decoder_step.py [--shapes 2x4096 1x8192] [--rounds 7] --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import event_times  # noqa: E402

D_MODEL, HEADS, KV_HEADS, HEAD_DIM, FFN = 4096, 32, 8, 128, 14336
CONTENDERS = ("twill", "cudnn", "fa2")


def _attention(name: str) -> Callable[[Any, Any, Any], Any]:
    """``[B, H, S, D]`` q and ``[B, H_kv, S, D]`` k, v (strided views) -> ``[B, H, S, D]``, causal."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name == "twill":
        import twill.ops

        return lambda q, k, v: twill.ops.attention(q, k, v, causal=True)
    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}[name]

    def sdpa(q: Any, k: Any, v: Any) -> Any:
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    return sdpa


def _layer(seq: int) -> Any:
    import torch

    class DecoderLayer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
            self.norm1 = torch.nn.RMSNorm(D_MODEL)
            self.norm2 = torch.nn.RMSNorm(D_MODEL)
            self.q, self.k, self.v = lin(D_MODEL, HEADS * HEAD_DIM), lin(D_MODEL, KV_HEADS * HEAD_DIM), \
                lin(D_MODEL, KV_HEADS * HEAD_DIM)
            self.o = lin(HEADS * HEAD_DIM, D_MODEL)
            self.gate, self.up, self.down = lin(D_MODEL, FFN), lin(D_MODEL, FFN), lin(FFN, D_MODEL)
            inv = 1.0 / (500000.0 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
            angles = torch.outer(torch.arange(seq).float(), inv)
            self.register_buffer("cos", torch.cat([angles.cos()] * 2, -1), persistent=False)
            self.register_buffer("sin", torch.cat([angles.sin()] * 2, -1), persistent=False)
            self.attend: Callable[[Any, Any, Any], Any] = lambda q, k, v: None

        def rope(self, x: Any) -> Any:   # x [B, S, H, D]
            half = x.shape[-1] // 2
            rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
            cos, sin = (t[None, :, None, :].to(x.dtype) for t in (self.cos, self.sin))
            return x * cos + rotated * sin

        def forward(self, x: Any) -> Any:
            B, S, _ = x.shape
            h = self.norm1(x)
            q = self.rope(self.q(h).view(B, S, HEADS, HEAD_DIM))
            k = self.rope(self.k(h).view(B, S, KV_HEADS, HEAD_DIM))
            v = self.v(h).view(B, S, KV_HEADS, HEAD_DIM)
            a = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            x = x + self.o(a.transpose(1, 2).reshape(B, S, HEADS * HEAD_DIM))
            h = self.norm2(x)
            return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))

    torch.manual_seed(0)
    return DecoderLayer().to(device="cuda", dtype=torch.bfloat16)


def _step(layer: Any, x: Any, dy: Any, name: str) -> Callable[[], Any]:

    attend = _attention(name)

    def step() -> Any:
        layer.attend = attend
        y = layer(x)
        y.backward(dy)
        grad = x.grad
        x.grad = None
        layer.zero_grad(set_to_none=True)
        return y.detach(), grad

    return step


#: The generated attention kernels' names (forward, backward pre-pass, backward, dQ conversion).
TWILL_KERNELS = ("attention_kernel", "preprocess_kernel", "backward_kernel", "dq_convert_kernel")


def _kernel_class(name: str) -> str:
    low = name.lower()
    if low.startswith(TWILL_KERNELS) or any(w in low for w in ("attention", "attn", "flash", "fmha", "cudnn",
                                                                 "sm90_xmma_fprop")):
        return "attention"
    if any(w in low for w in ("gemm", "sm90_xmma", "cutlass", "nvjet", "wgmma")):
        return "gemm"
    if "copy" in low:
        return "copy"
    return "other"


def _profile(step: Callable[[], Any]) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    per_class: dict[str, float] = {}
    copies: dict[str, list[float]] = {}
    kernels: dict[str, list[float]] = {}
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = evt.device_time if hasattr(evt, "device_time") else evt.cuda_time
        cls = _kernel_class(evt.name)
        per_class[cls] = per_class.get(cls, 0.0) + us
        entry = kernels.setdefault(evt.name[:120], [0, 0.0])
        entry[0] += 1
        entry[1] += us
        if cls == "copy":
            copies.setdefault(evt.name[:120], [0, 0.0])
            copies[evt.name[:120]][0] += 1
            copies[evt.name[:120]][1] += us
    top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:12]
    return {"us_per_class": per_class, "copy_kernels": copies,
            "top_kernels": [{"name": n, "count": c, "us": u} for n, (c, u) in top]}


def _relerr(a: Any, b: Any) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def run_shape(B: int, S: int, rounds: int, only: tuple[str, ...]) -> dict[str, Any]:
    import torch

    layer = _layer(S)
    gen = torch.Generator("cuda").manual_seed(1)
    x = torch.randn(B, S, D_MODEL, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_(True)
    dy = torch.randn(B, S, D_MODEL, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.01
    steps = {name: _step(layer, x, dy, name) for name in only}
    row: dict[str, Any] = {"B": B, "S": S, "contenders": {}}
    results = {}
    for name, step in steps.items():
        try:
            results[name] = step()
        except Exception as exc:  # noqa: BLE001 - a contender this GPU or torch cannot run
            row["contenders"][name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    for name in list(steps):
        if name not in results:
            steps.pop(name)
    ref = results.get("cudnn")
    for name, (y, g) in results.items():
        entry = row["contenders"].setdefault(name, {})
        if ref is not None:
            entry["check"] = {"out_relerr": _relerr(y, ref[0]), "dx_relerr": _relerr(g, ref[1])}
        entry["finite"] = bool(torch.isfinite(y).all() and torch.isfinite(g).all())
    medians, spreads, window = event_times(steps, calls=1, rounds=rounds)
    for name in steps:
        entry = row["contenders"][name]
        entry["step_ms"], entry["step_ms_range"] = medians[name], spreads[name]
        if "cudnn" in medians:
            entry["speedup"] = medians["cudnn"] / medians[name]
        entry["profile"] = _profile(steps[name])
    if "cudnn" in steps:
        base = row["contenders"]["cudnn"]["profile"]["copy_kernels"]
        for name in steps:
            mine = row["contenders"][name]["profile"]["copy_kernels"]
            row["contenders"][name]["extra_copies"] = {
                k: [c - base.get(k, [0, 0.0])[0], u - base.get(k, [0, 0.0])[1]] for k, (c, u) in mine.items()
                if c > base.get(k, [0, 0.0])[0]}
    row["window"] = window
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["2x4096", "1x8192"], help="BxS")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()

    import torch

    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": []}
    os.makedirs(args.out, exist_ok=True)
    for shape in args.shapes:
        B, S = (int(t) for t in shape.split("x"))
        doc["rows"].append(run_shape(B, S, args.rounds, tuple(args.only)))
        with open(os.path.join(args.out, "decoder_step.json"), "w") as fh:
            json.dump(doc, fh, indent=1)
    print(f"{'B x S':<8} {'who':<6} {'step ms':>8} {'vs cuDNN':>9} {'copy us':>8} {'attn us':>8} "
          f"{'extra copies':>12}  check")
    for row in doc["rows"]:
        for name, e in row["contenders"].items():
            if "error" in e:
                print(f"{row['B']}x{row['S']:<6} {name:<6} {e['error']}")
                continue
            prof = e["profile"]["us_per_class"]
            print(f"{row['B']}x{row['S']:<6} {name:<6} {e['step_ms']:8.2f} {e.get('speedup', float('nan')):8.3f}x "
                  f"{prof.get('copy', 0.0):8.0f} {prof.get('attention', 0.0):8.0f} "
                  f"{sum(c for c, _ in e.get('extra_copies', {}).values()):12d}  {e.get('check')}")


if __name__ == "__main__":
    main()
