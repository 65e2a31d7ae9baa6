"""Synchronization checks of the generated Gluon kernels on a GPU (not a test).

compute-sanitizer's racecheck reports shared-memory hazards in every generated kernel, always at the kernel's
entry line and at its ``gl.warp_specialize`` (or epilogue) line, never inside the emitted rings
(benchmarks/results/gluon_racecheck_h100.txt). This script separates Triton's warp-specialization runtime
from our synchronization:

``probe``
    Launches a minimal ``gl.warp_specialize`` kernel that allocates no shared memory and synchronizes
    nothing itself (each partition stores its own output). Run it under ``compute-sanitizer --tool
    racecheck``: hazards here come from Triton's lowering of ``warp_specialize``, not from any user code.
``probe-mbarrier``
    The same with one shared-memory tile handed from a worker to the default partition through an mbarrier,
    correctly synchronized: hazards here are racecheck's view of mbarrier hand-offs, not a missing wait.
``consan KERNEL_DIR``
    Triton's concurrency sanitizer (``TRITON_INSTRUMENTATION_MODE=consan``; it models mbarriers, TMA and
    wgmma, which racecheck does not) over one checked launch of every kernel in ``KERNEL_DIR``
    (``benchmarks/gluon_bench.py sanity``), then over a *broken* copy of the first GEMM whose producer skips its
    empty-buffer waits: ConSan must report that one, or a clean pass means nothing.

    compute-sanitizer --tool racecheck python benchmarks/gluon_sanitize.py probe
    compute-sanitizer --tool racecheck python benchmarks/gluon_sanitize.py probe-mbarrier
    TRITON_INSTRUMENTATION_MODE=consan CUDA_LAUNCH_BLOCKING=1 \\
        python benchmarks/gluon_sanitize.py consan benchmarks/gluon_kernels [NAME ...] [--no-control]

``--no-control`` skips the broken control (the script runs itself that way for the control).
NAME: only kernels whose manifest name contains it (instrumented kernels run slowly: about 25 s each on an
H200 with compilation, so the whole directory does not fit one 10-minute device command).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import without_waits  # noqa: E402


#: Seconds the uninstrumented broken control may run (without its empty-buffer waits it can deadlock).
PLAIN_TIMEOUT = 60


def probe() -> int:
    """Launch a minimal warp-specialized kernel; check its outputs (they must be exact)."""
    import torch
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    @gluon.jit
    def store_partition(out_ptr, value: gl.constexpr, BLOCK: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        offs = gl.arange(0, BLOCK, layout)
        gl.store(out_ptr + gl.program_id(0) * BLOCK + offs, offs * 0 + value)

    @gluon.jit
    def probe_kernel(a_ptr, b_ptr, BLOCK: gl.constexpr):
        gl.warp_specialize([
            (store_partition, (a_ptr, 1, BLOCK)),
            (store_partition, (b_ptr, 2, BLOCK)),
        ], [1], [24])

    block, grid = 256, 132
    a = torch.full((grid * block,), -1, dtype=torch.int32, device="cuda")
    b = torch.full((grid * block,), -1, dtype=torch.int32, device="cuda")
    probe_kernel[(grid,)](a, b, BLOCK=block, num_warps=4)
    torch.cuda.synchronize()
    ok = bool((a == 1).all() and (b == 2).all())
    print(f"probe: warp_specialize without shared memory, outputs {'exact' if ok else 'WRONG'}", flush=True)
    return 0 if ok else 1


def probe_mbarrier() -> int:
    """A minimal correct producer/consumer: the worker writes a shared-memory tile and arrives on an
    mbarrier, the default partition waits on it and copies the tile out. Hazards racecheck reports here
    are about how it sees Gluon's warp specialization and mbarriers, not about a missing wait."""
    import torch
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier

    @gluon.jit
    def producer(buf, bar, BLOCK: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        buf.store(gl.arange(0, BLOCK, layout) + gl.program_id(0))
        mbarrier.arrive(bar)

    @gluon.jit
    def consumer(buf, bar, out_ptr, BLOCK: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        mbarrier.wait(bar, 0)
        offs = gl.arange(0, BLOCK, layout)
        gl.store(out_ptr + gl.program_id(0) * BLOCK + offs, buf.load(layout))

    @gluon.jit
    def probe_kernel(out_ptr, BLOCK: gl.constexpr):
        smem: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        buf = gl.allocate_shared_memory(gl.int32, [BLOCK], smem)
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        gl.warp_specialize([
            (consumer, (buf, bar, out_ptr, BLOCK)),
            (producer, (buf, bar, BLOCK)),
        ], [1], [24])

    block, grid = 32, 132
    out = torch.full((grid * block,), -1, dtype=torch.int32, device="cuda")
    probe_kernel[(grid,)](out, BLOCK=block, num_warps=4)
    torch.cuda.synchronize()
    want = torch.arange(block, device="cuda", dtype=torch.int32)[None, :] + torch.arange(grid, device="cuda",
                                                                                        dtype=torch.int32)[:, None]
    ok = bool((out.view(grid, block) == want).all())
    print(f"probe-mbarrier: worker -> shared memory -> mbarrier -> default, outputs {'exact' if ok else 'WRONG'}",
          flush=True)
    return 0 if ok else 1


def broken_copy(kernel_dir: str, dest: str) -> str:
    """A copy of the first GEMM of ``kernel_dir`` whose load partition no longer waits for empty buffers."""
    with open(os.path.join(kernel_dir, "manifest.json")) as fh:
        entry = next(m for m in json.load(fh) if m["kernel"] == "gemm")
    with open(os.path.join(kernel_dir, entry["file"])) as fh:
        text = fh.read()
    broken, count = without_waits(text)
    if not count:
        raise SystemExit(f"no empty-buffer wait found in {entry['file']}")
    path = os.path.join(dest, "broken_" + entry["file"])
    with open(path, "w") as fh:
        fh.write(broken)
    manifest = [{**entry, "name": "broken_" + entry["name"], "file": os.path.basename(path)}]
    with open(os.path.join(dest, "manifest.json"), "w") as fh:
        json.dump(manifest, fh)
    return path


def consan(kernel_dir: str, names: list[str], *, control: bool = True) -> int:
    """ConSan over every kernel of ``kernel_dir``, then over the broken control (in a child process: ConSan
    aborts the process on the first violation)."""
    if os.environ.get("TRITON_INSTRUMENTATION_MODE") != "consan":
        raise SystemExit("set TRITON_INSTRUMENTATION_MODE=consan (and CUDA_LAUNCH_BLOCKING=1)")
    failures = run_sanity(kernel_dir, names or None)
    if not control:
        return failures
    with tempfile.TemporaryDirectory() as tmp:
        broken_copy(kernel_dir, tmp)
        child = subprocess.run([sys.executable, __file__, "consan", tmp, "--no-control"], capture_output=True,
                               text=True)
        # The same broken kernel without instrumentation: a crash above must be ConSan's, not the kernel's.
        plain_env = {**os.environ, "TRITON_INSTRUMENTATION_MODE": ""}
        try:
            plain = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); "
                                    "from benchmarks.gluon_bench import sanity; "
                                    "sys.exit(1 if sanity(%r, inner=1024) else 0)" % (ROOT, tmp)],
                                   capture_output=True, text=True, env=plain_env, timeout=PLAIN_TIMEOUT)
            plain_text, plain_rc = plain.stdout + plain.stderr, str(plain.returncode)
        except subprocess.TimeoutExpired:
            plain_text, plain_rc = "", f"none: hung, killed after {PLAIN_TIMEOUT} s"
    detected = child.returncode != 0
    print(f"control (producer skips its empty-buffer waits) under ConSan: exit {child.returncode}, "
          f"{'violation reported' if detected else 'NOT DETECTED'}; last lines:", flush=True)
    for line in (child.stdout + child.stderr).strip().splitlines()[-12:]:
        print("    " + line[:240], flush=True)
    print(f"control without ConSan: exit {plain_rc}; last lines:", flush=True)
    for line in plain_text.strip().splitlines()[-4:]:
        print("    " + line[:240], flush=True)
    return failures + (0 if detected else 1)


def run_sanity(kernel_dir: str, only: list[str] | None = None) -> int:
    import torch
    import triton

    def allocate(size: int, alignment: int, stream: int | None):
        return torch.empty(size, dtype=torch.int8, device="cuda")

    triton.set_allocator(allocate)  # ConSan keeps its state in global scratch memory
    from benchmarks.gluon_bench import sanity

    # 16 K tiles / 8 KV tiles: every ring (at most 4 deep) wraps several times.
    return sanity(kernel_dir, only, inner=1024, seq_len=1024)


def main() -> int:
    if len(sys.argv) >= 2 and sys.argv[1] == "probe":
        return probe()
    if len(sys.argv) >= 2 and sys.argv[1] == "probe-mbarrier":
        return probe_mbarrier()
    if len(sys.argv) >= 3 and sys.argv[1] == "consan":
        rest = sys.argv[3:]
        return consan(sys.argv[2], [a for a in rest if a != "--no-control"], control="--no-control" not in rest)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
