"""Host time per call of ``twill.ops.attention`` against cuDNN (SDPA) and FlashAttention-3 at a shape where the GPU
idles and wall time is host work (a GPU experiment behind docs/performance.md's "Host cost per call", not a test).

For each caller (``twill`` the op, ``twill_grad`` the op on inputs that require a gradient (the forward of a
training step), ``module`` the emitted module's ``launch`` alone, ``module_jit`` the same
with its launch cache emptied before each call, so that every launch goes through Triton's JIT, ``cudnn``,
``fa3`` when ``fa3_fwd_interface`` imports) and each of forward and forward + backward:

* ``host_us``: wall time per call of ``CALLS`` calls issued back to back with no synchronisation, median of
  ``ROUNDS`` (what the host needs to issue one call);
* ``gpu_us``: CUDA events around the same calls (the GPU's view, host gaps included).

Then ``graph``: the op's forward and forward + backward captured in a CUDA graph and replayed, outputs and
gradients compared with the eager call's (a capture that fails is reported, not raised), ``parts``: the host
time of each step of one forward launch alone (a descriptor, the launch cache's key, the driver's encoding of
one descriptor, the compiled kernel's launcher, the raw C launcher with encoded descriptors, an output
allocation, the stream lookup), and ``profile``: the op's forward and forward + backward under ``cProfile`` (the
functions with the most own and the most cumulative time). Prints a table and writes ``$OUT/op_launch_cost.json``.

    python benchmarks/op_launch_cost.py [--batch 1 --heads 8 --seq 128 --head-dim 128] --out $OUT

``--python-only`` needs no GPU: it times the emitted launchers' own Python (checks, descriptors, launch key,
descriptor encodings) for the forward and the backward, on CPU tensors, with Triton's JIT, its descriptor
encoding and its C launcher replaced by stand-ins that do nothing (Triton's Python wrapper around the C
launcher is kept), then the op's whole call the same way (its forward without and with a gradient asked for,
and forward + backward), and writes ``$OUT/op_launch_python.json``; ``--twill DIR`` imports twill from another
checkout (an earlier commit's launchers, timed the same way; the op's rows need its ``library.is_eager``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import events_ms, host_us  # noqa: E402

#: Calls per sample, and samples per measurement.
CALLS, ROUNDS = 50, 9


def measure(fn: Callable[[], Any]) -> dict[str, Any]:
    for _ in range(3):
        fn()
    host, gpu = [], []
    for _ in range(ROUNDS):
        host.append(host_us(fn, CALLS))
        gpu.append(events_ms(fn, CALLS) * 1e3 / CALLS)
    return {"host_us": statistics.median(host), "host_spread": [min(host), max(host)],
            "gpu_us": statistics.median(gpu), "gpu_spread": [min(gpu), max(gpu)]}


def _graph_check(fn: Callable[[], Any]) -> dict[str, Any]:
    """Capture ``fn`` (returning a tuple of tensors) in a CUDA graph, replay it, compare with an eager call."""
    import torch

    try:
        eager = [t.clone() for t in fn()]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = fn()
        for t in captured:
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(captured, eager))
        replay_us = events_ms(graph.replay, 20) * 1e3 / 20
        return {"captured": True, "max_abs_diff": diff, "replay_us": replay_us}
    except Exception as exc:  # noqa: BLE001 - reported as the result
        return {"captured": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}


def _profile(fn: Callable[[], Any], calls: int = 200, rows: int = 25) -> dict[str, list[str]]:
    fn()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    out = {}
    for order in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(rows)
        out[order] = [line for line in buf.getvalue().splitlines() if line.strip()][-(rows + 2):]
    return out


def _parts(module: Any, q: Any, k: Any, v: Any, out: Any, reps: int = 500) -> dict[str, float]:
    """Microseconds of host time of each step of one forward launch of ``module``, each timed alone over
    ``reps`` repetitions, fewer than the launch queue holds (the GPU is synchronised after each batch)."""
    import torch
    from triton.backends.nvidia import driver as nvdriver
    from triton.runtime import driver

    seen = []
    real = module._launch
    module._launch = lambda kernel, grid, num_warps, *args: seen.append((kernel, grid, num_warps, args))
    try:
        module.launch(q, k, v, out=out)
    finally:
        module._launch = real
    kernel, grid, num_warps, args = seen[0]
    real(kernel, grid, num_warps, *args)   # fills the launch cache
    device = driver.active.get_current_device()
    compiled, entry_point = module._COMPILED[(kernel, device, len(grid), num_warps, *map(module._arg_key, args))]
    descs = [a for a in args if isinstance(a, module._TmaArg)]
    metas = compiled.metadata.tensordesc_meta
    stream = driver.active.get_current_stream(device)
    g = (*grid, 1, 1)
    run = compiled.run
    triton_args = [a.descriptor() if isinstance(a, module._TmaArg) else a for a in args]
    steps = {
        "tma_view": lambda: module._tma_view(q, "q", list(descs[0].block_shape[2:])),
        "triton_descriptor": lambda: descs[0].descriptor(),
        "launch_key": lambda: (kernel, device, len(grid), num_warps, *map(module._arg_key, args)),
        "encode_descriptor": lambda: nvdriver.make_tensordesc_arg(descs[0], metas[0]),
        "tritons_launcher": lambda: run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata,
                                        None, None, None, *triton_args),
        "direct_launch": lambda: real(kernel, grid, num_warps, *args),
        "empty_like": lambda: torch.empty_like(q),
        "stream": lambda: driver.active.get_current_stream(driver.active.get_current_device()),
    }
    if entry_point is not None:
        raw, descriptors = entry_point
        final = module._c_args(args, descriptors)
        steps["c_launcher"] = lambda: raw(g[0], g[1], g[2], stream, compiled.function, False, False, None, None,
                                          compiled.packed_metadata, None, None, None, *final)
    result = {}
    for name, fn in steps.items():
        samples = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            samples.append((time.perf_counter() - t0) * 1e6 / reps)
            torch.cuda.synchronize()
        result[name] = statistics.median(samples)
    return result


def run(B: int, H: int, S: int, D: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import twill.ops
    from twill.ops.flash import KernelSpec, kernel_module

    dtype = torch.bfloat16
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dtype) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    dout = torch.randn_like(q)
    module = kernel_module(KernelSpec("flash-fwd", D, "bf16", True, 0))
    out = torch.empty_like(q)

    def cudnn_fwd():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def cudnn_step():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
        return torch.autograd.grad(o, (qg, kg, vg), dout)

    def twill_step():
        o = twill.ops.attention(qg, kg, vg, causal=True)
        return torch.autograd.grad(o, (qg, kg, vg), dout)

    callers: dict[str, dict[str, Callable[[], Any]]] = {
        "forward": {"twill": lambda: twill.ops.attention(q, k, v, causal=True),
                    "twill_grad": lambda: twill.ops.attention(qg, kg, vg, causal=True),
                    "module": lambda: module.launch(q, k, v, out=out),
                    "module_jit": lambda: (module._COMPILED.clear(), module.launch(q, k, v, out=out)),
                    "cudnn": cudnn_fwd},
        "forward+backward": {"twill": twill_step, "cudnn": cudnn_step},
    }
    try:
        from fa3_fwd_interface import flash_attn_func

        qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))   # FA3 reads [B, S, H, D]
        callers["forward"]["fa3"] = lambda: flash_attn_func(qs, ks, vs, causal=True)
    except ImportError:
        pass
    rows = []
    for what, fns in callers.items():
        for who, fn in fns.items():
            rows.append({"what": what, "who": who, **measure(fn)})
            print(json.dumps(rows[-1]), flush=True)
    graph = {"forward": _graph_check(lambda: (twill.ops.attention(q, k, v, causal=True),)),
             "forward+backward": _graph_check(twill_step)}
    print(json.dumps(graph), flush=True)
    parts = _parts(module, q, k, v, out)
    print(json.dumps(parts), flush=True)
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "shape": [B, H, S, D], "dtype": "bf16",
            "causal": True, "calls": CALLS, "rounds": ROUNDS, "rows": rows, "graph": graph,
            "parts": parts, "profile_forward": _profile(lambda: twill.ops.attention(q, k, v, causal=True)),
            "profile_step": _profile(twill_step, calls=100)}


def table(doc: dict[str, Any]) -> str:
    """Microseconds per call (medians) and each caller's host time over cuDNN's."""
    cudnn = {r["what"]: r["host_us"] for r in doc["rows"] if r["who"] == "cudnn"}
    lines = ["| call | who | host µs | GPU µs | host / cuDNN |", "|---|---|---|---|---|"]
    for r in doc["rows"]:
        lines.append(f"| {r['what']} | {r['who']} | {r['host_us']:.0f} | {r['gpu_us']:.0f} "
                     f"| {r['host_us'] / cudnn[r['what']]:.2f} |")
    return "\n".join(lines)


def python_only(B: int, H: int, S: int, D: int, calls: int = 5000) -> dict[str, Any]:
    """Microseconds of the forward's and the backward's launcher Python per call (median of 5 runs of
    ``calls``), with Triton's JIT, descriptor encoding and C launcher stood in for (see the module doc)."""
    import types

    import torch
    from triton.backends.nvidia import driver as nvidia_driver
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime import driver

    import twill
    from twill.ops.flash import KernelSpec, kernel_module

    driver._active = types.SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: 7)
    nvidia_driver.make_tensordesc_arg = lambda arg, meta: [("tensormap", arg.base.data_ptr()), *arg.shape,
                                                           *arg.strides]

    def jit(*args, num_warps):
        signature = {f"a{i}": "tensordesc" if isinstance(a, TensorDescriptor) else "i32" for i, a in enumerate(args)}
        metas = [{"swizzle": 3, "elem_size": 2, "elem_type": 10, "block_size": list(a.block_shape),
                  "fp4_padded": False} for a in args if isinstance(a, TensorDescriptor)]
        wrapper = nvidia_driver.wrap_handle_tensordesc(lambda *c: None, signature, metas)

        class Run:   # Triton's CudaLauncher without a compiled C module
            launch, launch_cooperative_grid, launch_pdl = staticmethod(wrapper), False, False
            global_scratch_size = profile_scratch_size = 0

            def __call__(self, gx, gy, gz, stream, function, *rest):
                self.launch(gx, gy, gz, stream, function, False, False, None, None, *rest)

        return types.SimpleNamespace(run=Run(), function=1, packed_metadata=(4, 1, 0),
                                     metadata=types.SimpleNamespace(tensordesc_meta=metas))

    class Kernel:
        def __getitem__(self, grid):
            return jit

    kernel_stand_in = Kernel()

    q, k, v, o, do = (torch.randn(B, S, H, D, dtype=torch.bfloat16).transpose(1, 2) for _ in range(5))
    lse = torch.randn(B, H, S)
    import platform

    result: dict[str, Any] = {"twill": os.path.dirname(twill.__file__), "shape": [B, H, S, D], "calls": calls,
                              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                              "python": platform.python_version(), "torch": torch.__version__,
                              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for kernel, call in (("flash-fwd", lambda m: m.launch(q, k, v, out=o, lse=lse)),
                         ("flash-bwd", lambda m: m.launch(q, k, v, o, do, lse))):
        module = kernel_module(KernelSpec(kernel, D, "bf16", True, 0))
        real = module._launch
        module._launch = (lambda fn, grid, num_warps, *args, real=real:
                          real(kernel_stand_in, grid, num_warps, *args))
        module._sm_count = lambda device: 132
        if hasattr(module, "_work_counter"):
            module._work_counter = lambda device: torch.zeros(2, dtype=torch.int32)
        call(module)   # the JIT launch
        result[kernel] = _cpu_us(lambda: call(module), calls)
        print(f"{kernel}: {result[kernel]['us']:.1f} us of launcher Python per call", flush=True)
    result.update(_op_python(q, k, v, do, calls))
    return result


def _cpu_us(call: Callable[[], Any], calls: int) -> dict[str, Any]:
    """Microseconds per call of ``call`` on the CPU: the median of 5 runs of ``calls`` calls, and their range."""
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        samples.append((time.perf_counter() - t0) * 1e6 / calls)
    return {"us": statistics.median(samples), "spread": [min(samples), max(samples)]}


def _op_python(q: Any, k: Any, v: Any, do: Any, calls: int) -> dict[str, Any]:
    """The op's whole Python per call on CPU tensors taken for eager CUDA ones (``library.is_eager``), the
    launchers as :func:`python_only` stands them in: its forward without and with a gradient asked for, and
    forward + backward through ``torch.autograd.grad`` (the CPU's autograd engine). Empty for a checkout
    whose op has no ``is_eager`` (its eager path cannot be taken on CPU tensors)."""
    import contextlib

    import torch

    import twill.ops
    from twill.ops import library

    if not hasattr(library, "is_eager"):
        return {}
    library.is_eager = lambda t: type(t) is torch.Tensor
    library.check_device = lambda *tensors: None
    library.on_device = lambda t: contextlib.nullcontext()
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    rows = {"op_forward": lambda: twill.ops.attention(q, k, v, causal=True),
            "op_forward_grad": lambda: twill.ops.attention(qg, kg, vg, causal=True),
            "op_forward_backward": lambda: torch.autograd.grad(twill.ops.attention(qg, kg, vg, causal=True),
                                                               (qg, kg, vg), do)}
    result = {}
    for name, call in rows.items():
        call()
        result[name] = _cpu_us(call, calls)
        print(f"{name}: {result[name]['us']:.1f} us of Python per call", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256))
    ap.add_argument("--python-only", action="store_true", help="time the launchers' Python on the CPU (no GPU)")
    ap.add_argument("--twill", metavar="DIR", help="with --python-only: import twill from this checkout")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.python_only:
        if args.twill:
            sys.path.insert(0, os.path.abspath(args.twill))
        doc = python_only(args.batch, args.heads, args.seq, args.head_dim)
        with open(os.path.join(args.out, "op_launch_python.json"), "w") as fh:
            json.dump(doc, fh, indent=1)
        return
    doc = run(args.batch, args.heads, args.seq, args.head_dim)
    with open(os.path.join(args.out, "op_launch_cost.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    for what in ("profile_forward", "profile_step"):
        print("\n".join(doc[what]["cumulative"]))
    print(table(doc))


if __name__ == "__main__":
    main()
