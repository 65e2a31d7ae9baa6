"""What the GPU benchmark scripts share: importing an emitted module from its file, timing contenders
with CUDA events in interleaved rounds, and the host's time per call (a benchmark helper, not part of the
library)."""

from __future__ import annotations

import os
import re
import statistics
import time
from types import ModuleType
from typing import Any, Callable


def clock_summary(samples: list[tuple[float, float]], start: float, end: float) -> dict[str, float] | None:
    """Min, median and max SM clock (MHz, nvidia-smi: ``ClockSampler.samples``) sampled between ``start`` and
    ``end`` (unix times), and how many readings; None when there was none."""
    window = [mhz for when, mhz in samples if start <= when <= end]
    if not window:
        return None
    return {"min": min(window), "median": statistics.median(window), "max": max(window), "samples": len(window)}


def load_module(path: str, prefix: str) -> ModuleType:
    """Import the Python file ``path`` as module ``prefix + its stem`` (registered in ``sys.modules``, which
    Gluon's and TileLang's compilers need to find the kernel's source)."""
    from twill.codegen.gluon import load_emitted

    return load_emitted(path, prefix + os.path.splitext(os.path.basename(path))[0].replace("-", "_"))


#: Gluon functions that read the SM cycle counter and the global nanosecond timer, as the text the probes
#: (attention_phases.py, kernel_clock.py) insert into an emitted module; ``anchor`` only gives the asm a
#: scalar operand.
COUNTER_READERS = '''@gluon.jit
def _clock64(anchor):
    """The SM cycle counter (benchmark instrumentation)."""
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [anchor], dtype=gl.int64, is_pure=False,
                                     pack=1)

@gluon.jit
def _globaltimer(anchor):
    """The global nanosecond timer (benchmark instrumentation)."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [anchor], dtype=gl.int64,
                                     is_pure=False, pack=1)

'''


def without_waits(text: str, barrier: str = r"\w+_empty") -> tuple[str, int]:
    """The emitted kernel ``text`` without its waits on the barriers whose name matches ``barrier`` (a
    regular expression; by default every producer wait on an empty ring buffer) and how many were removed: a
    sanitizer's negative control, in which one side may touch a buffer the other still uses."""
    return re.subn(rf"^(\s*)mbarrier\.wait\(({barrier})\.index\(([^)]*)\), ([^\n]*?)\)(\s*#[^\n]*)?$",
                   r"\1pass  # broken on purpose: no wait on \2", text, flags=re.M)


def host_us(fn: Callable[[], Any], calls: int) -> float:
    """Microseconds of wall time per call of ``fn`` over ``calls`` calls issued back to back with no
    synchronisation between them (the GPU queue takes them all): what the host needs to issue one call."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) * 1e6 / calls
    torch.cuda.synchronize()
    return host


def events_ms(fn: Callable[[], Any], calls: int) -> float:
    """Milliseconds per call of ``fn``: CUDA events around ``calls`` calls issued back to back."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def event_times(fns: dict[str, Callable[[], Any]], calls: int, rounds: int
                ) -> tuple[dict[str, float], dict[str, list[float]], list[float]]:
    """Time each function device-side: after one warm-up call each, ``rounds`` rounds interleaved over the
    functions, each sample ``calls`` calls between two CUDA events. Returns the median ms per call of each,
    its ``[min, max]`` over the rounds, and the unix-time window the rounds ran in (to read the SM clock)."""
    import torch

    samples: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    window = [time.time()]
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(events_ms(fn, calls))
    window.append(time.time())
    return ({n: statistics.median(s) for n, s in samples.items()},
            {n: [min(s), max(s)] for n, s in samples.items()}, window)


def torch_references(problem: str, args: tuple[Any, ...], flash: str = "flash",
                     causal: bool = False) -> dict[str, Callable[[], Any]]:
    """The torch references of one problem's inputs ``args`` (the generated kernel's, output last): cuBLAS
    (``torch.matmul``) for ``gemm``; otherwise SDPA (``is_causal=causal``) on its cuDNN backend and on its
    flash (FA2) backend, the latter under the key ``flash``."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if problem == "gemm":
        a, b, _ = args
        return {"cublas": lambda: torch.matmul(a, b)}
    q, k, v, _ = args

    def sdpa(backend: Any) -> Callable[[], Any]:
        def call() -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return call

    return {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), flash: sdpa(SDPBackend.FLASH_ATTENTION)}
