"""Packed variable-length attention, forward or backward: ``twill.ops.attention_varlen`` against SDPA on the same
tokens (a GPU benchmark for issue 34's varlen target, not a test).

A batch of sequences of mixed lengths (drawn once from a seeded log-normal with mean about ``--mean`` tokens,
clipped to ``[16, --max]``), packed as FlashAttention's varlen interface takes them (q ``[total, H, D]``, k, v
``[total, H_kv, D]``, int32 ``cu_seqlens``), causal, bf16. Contenders on the same tokens:

* ``twill``: ``twill.ops.attention_varlen`` on the packed tensors;
* ``sdpa-padded-cudnn`` / ``sdpa-padded-flash``: SDPA on the batch padded to the longest sequence
  (``[B, H, max, D]``; the padding's rows are computed and thrown away), cuDNN or FA2 backend; K/V heads
  repeated for the query heads (FA2 through SDPA takes no GQA);
* ``sdpa-nested``: SDPA on jagged nested tensors (PyTorch's varlen path, FA2 underneath), where it runs.

The padding is done before timing (only the attention call is timed). First every contender's output is
compared per sequence with fp32 attention of that sequence alone (``relerr``, the worst sequence), then all are
timed in interleaved rounds (CUDA events, medians and ``[min, max]``); TFLOP/s count the causal FLOPs of the
real tokens only (2·L²·D per head and sequence), so padding shows as lost speed. ``speedup`` = the fastest SDPA
form's time / twill's. Prints a table and writes ``$OUT/varlen_h200.json``.

With ``--backward`` each contender runs its forward once and the timed call is the gradients of q, k and v
(``torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)``; for the padded forms, of the padded tensors),
checked first against the fp32 gradients of each sequence alone; FLOPs are 2.5 × the forward's; the file is
``$OUT/varlen_bwd_h200.json``.

    python benchmarks/varlen_bench.py [--mean 1024 --max 8192 --tokens 65536 --heads 32 --kv-heads 8] --out $OUT
    python benchmarks/varlen_bench.py --backward --out $OUT
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import event_times  # noqa: E402


def lengths(mean: int, longest: int, tokens: int, seed: int = 0) -> list[int]:
    """Sequence lengths summing to about ``tokens``: log-normal with mean about ``mean``, clipped to
    ``[16, longest]``, with at least one sequence of ``longest`` tokens (the case padding pays most for)."""
    import random

    rng = random.Random(seed)
    sigma = 1.0
    mu = math.log(mean) - sigma * sigma / 2
    out = [longest]
    while sum(out) < tokens:
        out.append(int(min(longest, max(16, rng.lognormvariate(mu, sigma)))))
    return out


def causal_flops(lens: list[int], heads: int, head_dim: int) -> float:
    """FLOPs of the real tokens: 4·L²·D per head and sequence, halved by the causal mask."""
    return sum(2.0 * n * n * head_dim for n in lens) * heads


def run(lens: list[int], heads: int, kv_heads: int, head_dim: int, rounds: int,
        backward: bool = False) -> dict[str, Any]:
    """Check, then time, every contender on one packed batch: the forward, or (``backward``) the gradients of
    q, k and v after one forward (each call ``torch.autograd.grad(out, leaves, dout, retain_graph=True)``)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from twill.ops import attention_varlen

    dtype, device = torch.bfloat16, "cuda"
    total, B, longest = sum(lens), len(lens), max(lens)
    gen = torch.Generator(device).manual_seed(1)
    q = torch.randn(total, heads, head_dim, device=device, dtype=dtype, generator=gen)
    k, v = (torch.randn(total, kv_heads, head_dim, device=device, dtype=dtype, generator=gen) for _ in range(2))
    dout = torch.randn(total, heads, head_dim, device=device, dtype=dtype, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    starts = cu.tolist()
    group = heads // kv_heads

    def padded(t: Any) -> Any:
        out = t.new_zeros(B, longest, t.shape[1], head_dim)
        for b, n in enumerate(lens):
            out[b, :n] = t[starts[b]:starts[b] + n]
        return out.transpose(1, 2)                                      # [B, h, max, D]

    def unpad(out: Any) -> Any:
        o = out.transpose(1, 2)
        return torch.cat([o[b, :n] for b, n in enumerate(lens)])

    def contender(forward: Callable[..., Any], leaves: tuple[Any, ...], grad_out: Any,
                  to_packed: Callable[[Any], Any]) -> tuple[Callable[[], Any], Callable[[Any], tuple[Any, ...]]]:
        """The forward (outputs packed by ``to_packed``), or its gradients w.r.t. ``leaves`` after one forward."""
        if not backward:
            return lambda: forward(*leaves), lambda o: (to_packed(o),)
        leaves = tuple(t.detach().requires_grad_() for t in leaves)
        out = forward(*leaves)
        return (lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True),
                lambda grads: tuple(to_packed(g) for g in grads))

    def sdpa(backend: Any) -> Callable[..., Any]:
        def call(qp: Any, kp: Any, vp: Any) -> Any:
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qp, kp.repeat_interleave(group, dim=1),
                                                      vp.repeat_interleave(group, dim=1), is_causal=True)
        return call

    padded_leaves, padded_dout = (padded(q), padded(k), padded(v)), padded(dout)
    calls: dict[str, Any] = {}
    for name, make in (
            ("twill", lambda: contender(lambda *t: attention_varlen(*t, cu, cu, longest, longest, causal=True),
                                        (q, k, v), dout, lambda o: o)),
            ("sdpa-padded-cudnn", lambda: contender(sdpa(SDPBackend.CUDNN_ATTENTION), padded_leaves, padded_dout,
                                                    unpad)),
            ("sdpa-padded-flash", lambda: contender(sdpa(SDPBackend.FLASH_ATTENTION), padded_leaves, padded_dout,
                                                    unpad)),
            ("sdpa-nested", lambda: contender(_nested_call(cu, group), (q, k, v), dout, lambda o: o))):
        try:
            calls[name] = make()
        except Exception as exc:  # noqa: BLE001 - a contender this GPU or this torch cannot run
            calls[name] = _error(exc)

    refs: list[tuple[Any, ...]] = []
    for b, n in enumerate(lens):
        s = slice(starts[b], starts[b] + n)
        leaves = tuple(t[s].transpose(0, 1).float().requires_grad_(backward) for t in (q, k, v))
        kb, vb = (t.repeat_interleave(group, dim=0) for t in leaves[1:])
        out = F.scaled_dot_product_attention(leaves[0], kb, vb, is_causal=True)
        if backward:
            grads = torch.autograd.grad(out, leaves, dout[s].transpose(0, 1).float())
            refs.append(tuple(g.transpose(0, 1) for g in grads))
        else:
            refs.append((out.detach().transpose(0, 1),))
    result: dict[str, Any] = {"step": "backward" if backward else "forward", "contenders": {}}
    live: dict[str, Callable[[], Any]] = {}
    for name, call in calls.items():
        entry: dict[str, Any] = {}
        result["contenders"][name] = entry
        if isinstance(call, str):
            entry["error"] = call
            continue
        fn, to_packed = call
        try:
            with torch.set_grad_enabled(backward):
                outs = to_packed(fn())
                torch.cuda.synchronize()
            worst = max(float((got[starts[b]:starts[b] + n].float() - ref).norm() / max(float(ref.norm()), 1e-30))
                        for b, n in enumerate(lens) for got, ref in zip(outs, refs[b]))
            entry["relerr"] = worst
            if worst < 2e-2:
                live[name] = fn
            else:
                entry["error"] = f"relative error {worst:.3g} against fp32"
        except Exception as exc:  # noqa: BLE001 - a contender this GPU or this torch cannot run
            entry["error"] = _error(exc)
    del refs
    with torch.set_grad_enabled(backward):
        medians, spreads, window = event_times(live, calls=5, rounds=rounds)
    flops = causal_flops(lens, heads, head_dim) * (2.5 if backward else 1.0)
    for name, ms in medians.items():
        entry = result["contenders"][name]
        entry.update(ms=ms, ms_range=spreads[name], tflops=flops / ms / 1e9)
    sdpa_best = min((ms for n, ms in medians.items() if n != "twill"), default=None)
    if "twill" in medians and sdpa_best is not None:
        result["speedup"] = sdpa_best / medians["twill"]
    result["window"] = window
    return result


def _nested_call(cu: Any, group: int) -> Callable[..., Any]:
    """SDPA on jagged nested tensors of packed q, k, v (K/V heads repeated), FA2 underneath: a packed output."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def jagged(t: Any) -> Any:
        return torch.nested.nested_tensor_from_jagged(t, offsets=cu.long()).transpose(1, 2)

    def call(q: Any, k: Any, v: Any) -> Any:
        nested = [jagged(t) for t in (q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1))]
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(*nested, is_causal=True).transpose(1, 2).values()
    return call


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mean", type=int, default=1024)
    ap.add_argument("--max", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--backward", action="store_true",
                    help="time the gradients of q, k, v after one forward (varlen_bwd_h200.json) instead")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if args.heads % args.kv_heads:
        ap.error("--heads must be a multiple of --kv-heads")

    import torch

    lens = lengths(args.mean, args.max, args.tokens)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "lengths": lens, "heads": args.heads,
           "kv_heads": args.kv_heads, "head_dim": args.head_dim, "dtype": "bf16", "causal": True,
           **run(lens, args.heads, args.kv_heads, args.head_dim, args.rounds, args.backward)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "varlen_bwd_h200.json" if args.backward else "varlen_h200.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"{len(lens)} sequences, {sum(lens)} tokens, longest {max(lens)}, mean {sum(lens) / len(lens):.0f}")
    print(f"{'contender':<18} {'ms':>8} {'TFLOP/s':>8} {'relerr':>9}")
    for name, e in doc["contenders"].items():
        if "ms" in e:
            print(f"{name:<18} {e['ms']:8.3f} {e['tflops']:8.0f} {e['relerr']:9.2e}")
        else:
            print(f"{name:<18} {e.get('error')}")
    if "speedup" in doc:
        print(f"twill vs the fastest SDPA form: {doc['speedup']:.3f}x")


if __name__ == "__main__":
    main()
