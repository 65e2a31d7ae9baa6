"""The module renderer every emitted Gluon kernel shares: header, constants, rings and barriers, the TMA
producer, the ``gl.warp_specialize`` call and the host launcher. Only the compute partition and the
kernel-specific lines come from the kernel family's :class:`KernelBody` (``twill/kernels/<family>/gluon.py``,
found through :mod:`twill.kernels`).

Every function returns strings and iterates in a fixed order, so emitted files diff cleanly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from twill.codegen.chart import render_chart
from twill.codegen.plan import Barrier, KernelPlan, Partition

#: Gluon dtype of each plan dtype.
GL_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp8e4m3": "float8e4nv", "fp8e5m2": "float8e5"}
#: torch dtype of each plan dtype (the launcher checks its inputs against it).
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp8e4m3": "float8_e4m3fn", "fp8e5m2": "float8_e5m2"}
#: Name of the compute partition function, called once per compute partition with its sub-tile.
COMPUTE_FN = "compute_partition"
LOAD_FN = "load_partition"

IMPORTS = """\
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
import functools
"""

HOST = '''
NUM_WARPS = COMPUTE_WARPS.value
KERNEL_FN = {kernel}


@functools.lru_cache(maxsize=None)
def _shared_layout(shape, dtype):
    """The NVMMA shared layout of a TMA block of ``shape`` (a tuple) and ``dtype``, built once."""
    return gl.NVMMASharedLayout.get_default_for(list(shape), dtype)


def _desc_type(shape, dtype=None, layout=None):
    dtype = dtype or DTYPE.value
    layout = layout or _shared_layout(tuple(shape), dtype)
    return f"tensordesc<{{dtype}}[{{', '.join(map(str, shape))}}],{{layout!r}}>"


def _descriptor(t, shape, dtype=None, layout=None):
    """A TMA descriptor of ``t`` with block ``shape`` (elements of ``dtype``, default the operand dtype) in
    ``layout`` (default: the NVMMA shared layout for the block)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dtype = dtype or DTYPE.value
    return TensorDescriptor.from_tensor(t, shape, layout or _shared_layout(tuple(shape), dtype))


def compile_signature():
    """(signature, constexprs) for ahead-of-time compilation with GluonASTSource (no GPU needed)."""
    sig = {{
{signature}
    }}
    return sig, {{}}
'''


#: Host helpers of the attention launchers: TMA descriptors as plain fields (a rank-4 one over a ``[B, H, S, D]``
#: tensor as it lies in memory, its own strides, no copy, or a ``ValueError`` naming the tensor when TMA cannot
#: read it; one over a buffer of the launcher's own).
TMA_VIEW = '''
class _TmaArg:
    """A TMA descriptor argument: Triton's host ``TensorDescriptor`` fields without its per-call checks (the
    launcher's come first) and ``key``, what Triton's JIT may specialize the kernel on for it
    (:func:`_specialization`). ``_launch`` encodes it for the kernel, or makes it a ``TensorDescriptor`` for
    Triton's JIT (:meth:`descriptor`)."""

    __slots__ = ("base", "shape", "strides", "block_shape", "layout", "padding", "key")

    def __init__(self, base, shape, strides, block_shape, layout, key):
        self.base, self.shape, self.strides = base, shape, strides
        self.block_shape, self.layout, self.padding, self.key = block_shape, layout, "zero", key

    def descriptor(self):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        return TensorDescriptor(self.base, list(self.shape), list(self.strides), list(self.block_shape),
                                self.layout)


_SPECIALIZATIONS = {}
_VIEWS = {}   # (shape, strides, dtype, block, block dtype[, layout id]) -> the fields of a layout TMA can read


def _specialization(t, shape, strides, block, layout, aligned):
    """What Triton's JIT may specialize a kernel on for a TMA descriptor over ``t`` (its dtype, the base's
    16-byte alignment, the block, the layout, and the divisibility by 16 of the shape and strides), as a
    small key that hashes fast: each distinct one is numbered once in ``_SPECIALIZATIONS``."""
    key = (t.dtype, aligned, block, layout, tuple(n % 16 == 0 for n in (*shape, *strides)))
    return ("tma", _SPECIALIZATIONS.setdefault(key, len(_SPECIALIZATIONS)))


def _tma_buffer(t, block, dtype, layout=None):
    """A TMA descriptor of the launcher's own buffer ``t`` (dense, 16-byte aligned) with block ``block`` of
    ``dtype`` elements in ``layout`` (default: the NVMMA shared layout for the block); its fields are kept per
    shape, strides, dtype, block and layout (``_VIEWS``)."""
    if t.data_ptr() % 16:
        raise ValueError(f"a TMA buffer starts at address {t.data_ptr():#x}; TMA needs a 16-byte aligned base")
    shape, strides = t.shape, t.stride()
    key = (shape, strides, t.dtype, *block, dtype, id(layout))
    fields = _VIEWS.get(key)
    if fields is None:
        block, shape = tuple(block), tuple(shape)
        layout = layout or _shared_layout(block, dtype)
        fields = _VIEWS[key] = (shape, strides, block, layout,
                                _specialization(t, shape, strides, block, layout, True))
    return _TmaArg(t, *fields)


def _tma_view(t, name, block, dtype=None):
    """A TMA descriptor of the 4-d tensor ``t`` ([B, heads, S, D], any strides) with block ``[1, 1, *block]``
    in the NVMMA shared layout of that block: the kernel reads ``t`` where it lies, each (batch, head) bounded
    by its own S rows (TMA zero-fills rows past S). Raises ValueError naming ``t`` unless its last dimension
    is contiguous and its other strides and base address are 16-byte aligned (what TMA requires)."""
    shape, strides = t.shape, t.stride()
    if t.data_ptr() % 16:
        raise ValueError(f"{name} starts at address {t.data_ptr():#x}; TMA needs a 16-byte aligned base")
    key = (shape, strides, t.dtype, *block, dtype)
    fields = _VIEWS.get(key)
    if fields is None:
        size = t.element_size()
        if strides[-1] != 1:
            raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {strides}")
        if any(n > 1 and s * size % 16 for n, s in zip(shape[:-1], strides[:-1])):
            raise ValueError(f"{name} has strides {strides} ({size}-byte elements); TMA needs every stride "
                             f"but the last to be a multiple of 16 bytes")
        # a dimension of one element is never stepped: any aligned stride
        strides = tuple(shape[-1] * 16 if n == 1 else s for n, s in zip(shape[:-1], strides[:-1])) + (1,)
        full, shape = (1, 1, *block), tuple(shape)
        layout = _shared_layout(full, dtype or DTYPE.value)
        fields = _VIEWS[key] = (shape, strides, full, layout, _specialization(t, shape, strides, full, layout, True))
    return _TmaArg(t, *fields)


def _cdiv(a, b):
    """ceil(a / b) for host integers (``triton.cdiv`` is a constexpr function: slow to call from the host)."""
    return -(-a // b)
'''


#: Host helper of the varlen attention launchers (forward and backward): the sequence offsets' checks.
VARLEN_OFFSETS = '''
def _check_offsets(cu_seqlens_q, cu_seqlens_k, batch, device):
    """Raises ValueError unless ``cu_seqlens_q`` and ``cu_seqlens_k`` are contiguous int32 vectors of
    ``batch + 1`` offsets on ``device`` (the kernels read them as plain arrays)."""
    import torch

    for t, name in ((cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k")):
        if (t.dtype != torch.int32 or t.dim() != 1 or t.numel() != batch + 1 or t.device != device
                or t.stride(0) != 1):
            raise ValueError(f"{name} must be a contiguous int32 vector of batch + 1 = {batch + 1} offsets on "
                             f"{device}")
'''


#: Host helper of the attention launchers: a kernel launch that goes through Triton's JIT once per argument
#: specialization and device, and after that straight to the compiled kernel's C launcher, with each TMA
#: descriptor encoded once per address, shape and strides (no argument binding, cache-key string, global-variable
#: check or descriptor encoding per call: docs/codegen.md, "Host time per call").
DIRECT_LAUNCH = '''
from triton import knobs as _knobs  # noqa: E402 (the launch path reads them on every call)
from triton.runtime import driver as _driver  # noqa: E402

_COMPILED = {}
_ENCODED = {}
_ENCODED_MAX = 4096   # encoded descriptors kept (the table is emptied when full)


def _arg_key(a):
    """What Triton's JIT may specialize argument ``a`` on, or more (a key that differs only sends one more launch
    through the JIT): an integer's value being 1, its divisibility by 16 and its width; a tensor's dtype and
    16-byte alignment; a TMA descriptor's dtype, block, layout and the divisibility of its base, shape and
    strides (a ``_TmaArg`` carries it); None, a bool's value; any float alike."""
    kind = type(a)
    if kind is _TmaArg:
        return a.key
    if kind is int:
        return (a == 1, a % 16 == 0, -(1 << 31) <= a < (1 << 31))
    if a is None or kind is bool:
        return a
    if isinstance(a, int):
        return (a == 1, a % 16 == 0, -(1 << 31) <= a < (1 << 31))
    if isinstance(a, float):
        return float
    if hasattr(a, "data_ptr"):   # a tensor
        return (a.dtype, a.data_ptr() % 16 == 0)
    base = a.base   # Triton's host-side TensorDescriptor
    return (base.dtype, base.data_ptr() % 16 == 0, tuple(a.block_shape), a.layout, a.padding,
            tuple(n % 16 == 0 for n in (*a.shape, *a.strides)))


def _entry_point(compiled):
    """(C launcher, [(argument position, descriptor metadata, its key)]) of ``compiled``: the function
    Triton's launcher wraps, which takes each TMA descriptor encoded. None when the launch needs scratch memory
    or Triton's wrapper is not the one this reads (Triton's launcher then takes every launch)."""
    run = compiled.run
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    wrapper = run.launch
    code = getattr(wrapper, "__code__", None)
    if code is None:   # the C launcher itself, which Triton calls directly when no argument is a descriptor
        return None if getattr(compiled.metadata, "tensordesc_meta", None) else (wrapper, [])
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in wrapper.__closure__ or ())))
    launcher, indices, metas = (cells.get(n) for n in ("launcher", "tensordesc_indices", "tensordesc_meta"))
    if launcher is None or indices is None or not metas or None in metas:
        return None
    keys = [tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in m.items())) for m in metas]
    return launcher, list(zip(sorted(indices), metas, keys))


def _encoded(a, meta, meta_key):
    """The C launcher's arguments for TMA descriptor ``a`` under the kernel's ``meta``: Triton's encoding,
    made once per address, shape, strides and metadata (it holds no more than those)."""
    key = (a.base.data_ptr(), tuple(a.shape), tuple(a.strides), a.padding, meta_key)
    args = _ENCODED.get(key)
    if args is None:
        from triton.backends.nvidia.driver import make_tensordesc_arg

        if len(_ENCODED) >= _ENCODED_MAX:
            _ENCODED.clear()
        args = _ENCODED[key] = make_tensordesc_arg(a, meta)
    return args


def _c_args(args, descriptors):
    """The kernel arguments ``args`` as the C launcher takes them: each TMA descriptor at ``descriptors``'
    positions (from :func:`_entry_point`) replaced by its encoding."""
    final, done = [], 0
    for i, meta, meta_key in descriptors:
        final.extend(args[done:i])
        final.extend(_encoded(args[i], meta, meta_key))
        done = i + 1
    final.extend(args[done:])
    return final


def _launch(kernel, grid, num_warps, *args):
    """``kernel[grid](*args, num_warps=num_warps)``: the first launch of each specialization key (the device,
    the grid's rank and :func:`_arg_key` of every argument) goes through Triton's JIT, which compiles or
    loads the kernel and returns it; later ones call that compiled kernel's C launcher as Triton's own
    launcher does, with each descriptor's encoding from :func:`_encoded`. While a launch hook is set (a
    profiler's), every launch goes through the JIT."""
    if max(grid[1:], default=0) > 65535:
        raise ValueError(f"the launch grid {tuple(grid)} has more than CUDA's 65535 blocks in its second or third "
                         f"dimension")
    device = _driver.active.get_current_device()
    # a hook chain (Triton 3.6's knobs) is set when it holds a hook; a plain hook when it is not None
    hooks = any(getattr(hook, "calls", hook) for hook in (_knobs.runtime.launch_enter_hook,
                                                           _knobs.runtime.launch_exit_hook))
    key = (kernel, device, len(grid), num_warps, *map(_arg_key, args))
    entry = None if hooks else _COMPILED.get(key)
    if entry is None:
        args = [a.descriptor() if isinstance(a, _TmaArg) else a for a in args]
        compiled = kernel[grid](*args, num_warps=num_warps)
        _COMPILED[key] = (compiled, _entry_point(compiled))
        return
    compiled, entry_point = entry
    grid = (*grid, 1, 1)
    stream = _driver.active.get_current_stream(device)
    if entry_point is None:
        args = [a.descriptor() if isinstance(a, _TmaArg) else a for a in args]
        compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None, None,
                     None, *args)
        return
    launcher, descriptors = entry_point
    run = compiled.run
    launcher(grid[0], grid[1], grid[2], stream, compiled.function, run.launch_cooperative_grid, run.launch_pdl,
             None, None, compiled.packed_metadata, None, None, None, *_c_args(args, descriptors))
'''


#: The attention launchers' host helpers, in the order every attention module has them: :data:`TMA_VIEW` and
#: :data:`DIRECT_LAUNCH`.
ATTENTION_HOST = TMA_VIEW.strip("\n") + "\n\n\n" + DIRECT_LAUNCH.strip("\n")


#: Host helper of the persistent launchers (GEMM, attention forward): the SM count, queried once per device.
SM_COUNT = '''
@functools.lru_cache(maxsize=None)
def _sm_count(device):
    """SMs of CUDA device ``device`` (queried once, cached)."""
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count
'''


def heaviest_first_chunks(linear: str, blocks: str, heads: str, block: str, head: str,
                          indent: str = "    ") -> tuple[str, ...]:
    """Lines that hand out a causal attention grid heaviest first: launch index ``linear`` -> ``block`` (0 = the
    heaviest of each head) and ``head``, for ``blocks`` blocks per head and ``heads`` heads. The grid goes out in
    chunks of ``heads_per_chunk`` heads (a kernel parameter: the SMs over the blocks per head, about one wave,
    so its CTAs read about as few heads' tiles as one head after another would), and within a chunk block by
    block, every head's block ``b`` before any block ``b + 1``: greedy list scheduling of the heaviest work
    first. In one head's blocks after another, the last heads' heaviest blocks would start near the end of the
    grid and run on while the other SMs idle (docs/codegen.md)."""
    return (f"{indent}chunk = {linear} // (heads_per_chunk * {blocks})",
            f"{indent}chunk_heads = gl.minimum(heads_per_chunk, {heads} - chunk * heads_per_chunk)",
            f"{indent}rest = {linear} - chunk * heads_per_chunk * {blocks}",
            f"{indent}{block} = rest // chunk_heads",
            f"{indent}{head} = chunk * heads_per_chunk + rest % chunk_heads")


@dataclass(frozen=True, kw_only=True)
class KernelBody:
    """What one kernel adds to the shared module: its compute partition and the kernel-specific lines.

    Attributes:
        title: first header line; ``summary`` the module docstring.
        decisions: header lines naming the kernel's decisions.
        tile_constants, extra_constants: ``(name, value, why)`` before the rings / after the partitions.
        functions: source of the compute partition function and its helpers.
        kernel, kernel_params, kernel_doc: the ``@gluon.jit`` kernel's name, parameters and docstring.
        setup: kernel lines before the rings (program ids, offsets, trip count, extra buffers).
        iv, trip: the producer's loop variable and trip count (a persistent kernel: the bound of its loop
            over output tiles or work items, which the producer takes as its last parameter).
        buffer_shapes: ring -> shape of one buffer; ``coords``: ring -> TMA coordinates of iteration ``iv``.
        load_params, load_setup: extra parameters of the producer and its lines before the loop.
        compute_params: parameters of the compute partition after the rings and barriers.
        constexprs: ``(name, values per compute partition)`` passed to the compute partition.
        before_specialize: kernel lines after the barriers (other barriers).
        results: what the default partition returns (``acc, = `` or empty); ``epilogue`` the lines after.
        signature: ``(parameter, type expression)`` of the kernel for ``compile_signature``.
        launch: source of the host launcher (after the shared host helpers).
        buffer_dtypes: ring -> Gluon dtype of its buffers when not the operand dtype (``gl.float32``).
        tma_shapes: ring -> the block of its rank-4 TMA descriptor (``1, 1, BLOCK_N, HEAD_DIM``) for a ring
            whose descriptor has more dimensions than its buffers: the buffers are allocated in the NVMMA
            layout of their own 2-d shape and each TMA load fills one through a reshaped view.
        load_iteration: producer lines at the top of each loop iteration (before the loads).
        load_ops: producer op -> its lines, for the producer's ops that fill no ring (``dq_atomic``).
        load_after: producer lines after the loop.
        load_loop: the producer's loop header lines, outermost first, with any lines between them (a
            persistent kernel: the loop over its output tiles, then the K loop); the default is
            ``for {iv} in range({trip}):``. The loop body is indented under the last line.
        imports: import lines of the kernel's own, after the shared ones.
    """

    title: str
    summary: str
    decisions: tuple[str, ...]
    tile_constants: tuple[tuple[str, object, str], ...]
    extra_constants: tuple[tuple[str, object, str], ...]
    functions: str
    kernel: str
    kernel_params: str
    kernel_doc: str
    setup: tuple[str, ...]
    iv: str
    trip: str
    buffer_shapes: dict[str, str]
    coords: dict[str, str]
    load_params: tuple[str, ...]
    load_setup: tuple[str, ...]
    compute_params: tuple[str, ...]
    constexprs: tuple[tuple[str, tuple[int, ...]], ...]
    before_specialize: tuple[str, ...]
    results: str
    epilogue: tuple[str, ...]
    signature: tuple[tuple[str, str], ...]
    launch: str
    buffer_dtypes: dict[str, str] = field(default_factory=dict)
    tma_shapes: dict[str, str] = field(default_factory=dict)
    load_iteration: tuple[str, ...] = ()
    load_ops: dict[str, tuple[str, ...]] = field(default_factory=dict)
    load_after: tuple[str, ...] = ()
    load_loop: tuple[str, ...] = ()
    imports: str = ""


def render_module(plan: KernelPlan, body: KernelBody) -> str:
    """The complete emitted module for ``plan``."""
    parts = [render_header(plan, body), f'"""{body.summary}"""\n', IMPORTS + body.imports,
             f'KERNEL = "{plan.kernel}"\n',
             render_constants(plan, body), render_load_partition(plan, body), body.functions,
             render_kernel(plan, body), render_host(plan, body)]
    return "\n\n".join(p.strip("\n") for p in parts) + "\n"


def function_of(p: Partition) -> str:
    """The emitted function a partition runs."""
    return COMPUTE_FN if p.role == "compute" else LOAD_FN


def render_header(plan: KernelPlan, body: KernelBody) -> str:
    """The header comment: II, stages, partitions, rings, decisions, chart."""
    tile = " ".join(f"{k}={v}" for k, v in plan.tile.items())
    lines = [
        body.title,
        "",
        "GENERATED by `twill emit gluon` from a Twill schedule -- do not edit by hand.",
        f"schedule: graph {plan.graph!r}, arch {plan.arch}, solver {plan.solver}, status {plan.status}",
        f"II = {plan.ii} (lower bound {plan.ii_lower_bound}), length L = {plan.length}, "
        f"stages = {plan.num_stages}, dtype {plan.dtype}, tile {tile}",
        "",
        "partitions (gl.warp_specialize; the first is the default partition):",
    ]
    for p in plan.partitions:
        where = f"{function_of(p)}, sub-tile {p.subtile}" if p.role == "compute" else function_of(p)
        lines.append(f"  {p.name:8s} ({where}) warp group {p.group} ({p.group_role}): {p.num_warps} warp(s), "
                     f"{_regs_text(plan, p)}; ops {', '.join(p.ops)}")
    lines.append("rings (shared memory, ready/empty mbarriers):")
    for r in plan.rings:
        lines.append(f"  {r.name}: {r.producer} -> {', '.join(r.consumers)}, {r.depth} buffers, released after "
                     f"{r.release}, barriers {r.barrier}; depth = {r.why}")
    lines += ["", *body.decisions, "", "steady-state chart (digit = stage; cycles scaled onto [0, II)):"]
    lines += ["  " + line for line in render_chart(plan)]
    return "\n".join(("# " + line).rstrip() for line in lines) + "\n"


def _regs_text(plan: KernelPlan, p: Partition) -> str:
    if p is plan.partitions[0]:
        return f"schedule budget {p.regs} regs (default partition: Triton gives it what the workers leave)"
    return f"{p.regs} regs (worker_num_regs)"


def constant_lines(items: list[tuple[str, object, str]]) -> str:
    """``NAME = gl.constexpr(value)  # why`` lines (Gluon kernels may read only constexpr globals)."""
    width = max(len(n) for n, _, _ in items)
    return "\n".join(f"{name:<{width}s} = gl.constexpr({value!r})  # {why}" for name, value, why in items) + "\n"


def render_constants(plan: KernelPlan, body: KernelBody) -> str:
    """Tile, ring, barrier, partition and kernel constants."""
    comp, load = plan.compute, plan.load
    items = list(body.tile_constants)
    items += [(f"{r.name.upper()}_DEPTH", r.depth, f"ring {r.name} buffers: {r.why}") for r in plan.rings]
    items += [(f"{b.name.upper()}_READERS", b.arrivals, f"compute partitions releasing each {b.name} buffer")
              for b in plan.barriers]
    items.append(("COMPUTE_WARPS", comp[0].num_warps, f"warp group {comp[0].group}: default partition (num_warps)"))
    if len(comp) > 1:
        items.append(("COMPUTE_REGS", comp[-1].regs, "setmaxnreg budget of worker compute partitions (schedule)"))
    items += [("LOAD_WARPS", load.num_warps, f"warp group {load.group}: TMA producer"),
              ("LOAD_REGS", load.regs, f"warp group {load.group}: setmaxnreg budget of the producer")]
    items += body.extra_constants
    dtype = f"DTYPE = gl.constexpr(gl.{GL_DTYPES[plan.dtype]})  # operand dtype\n"
    return dtype + constant_lines(items)


def depth_name(barrier: Barrier) -> str:
    """The constant holding a barrier pair's depth (its first ring's)."""
    return f"{barrier.rings[0].upper()}_DEPTH"


def ring_args(plan: KernelPlan) -> list[str]:
    """The rings and barrier arrays the partitions share, in a fixed order."""
    return [f"{r.name}_ring" for r in plan.rings] + [f"{b.name}_{s}" for b in plan.barriers
                                                     for s in ("ready", "empty")]


def compute_def(plan: KernelPlan, params: tuple[str, ...], constexprs: tuple[str, ...], doc: str) -> list[str]:
    """``def compute_partition(compute_args, CONST: gl.constexpr, ...)``, its docstring and the unpacking of
    ``compute_args`` (the rings and barriers, then ``params``)."""
    head = ["compute_args"] + [f"{c}: gl.constexpr" for c in constexprs]
    return ["@gluon.jit", f"def {COMPUTE_FN}({', '.join(head)}):", f'    """{doc}"""',
            *wrap("    ", ring_args(plan) + list(params), " = compute_args", " " * 4)]


def wrap(head: str, args: list[str], tail: str, indent: str) -> list[str]:
    """``head(arg, arg, ...)tail`` wrapped at 110 columns with continuation lines at ``indent``."""
    lines, line = [], head + "("
    for k, a in enumerate(args):
        piece = a + (", " if k < len(args) - 1 else ")" + tail)
        if len(line) + len(piece.rstrip()) > 110 and line.strip():
            lines.append(line.rstrip())
            line = indent
        line += piece
    return lines + [line]


def render_load_partition(plan: KernelPlan, body: KernelBody) -> str:
    """The TMA producer: per loop iteration, each load waits for a free buffer, then fills it."""
    load = plan.load
    params = [f"{r.name}_desc" for r in plan.rings] + list(body.load_params) + ring_args(plan) + [body.trip]
    lines = ["@gluon.jit", *wrap(f"def {LOAD_FN}", params, ":", " " * 19),
             f'    """Warp group {load.group} (TMA producer, {load.num_warps} warp): fills the rings '
             f'{", ".join(r.name for r in plan.rings)}."""',
             *body.load_setup, *(body.load_loop or (f"    for {body.iv} in range({body.trip}):",))]
    inner = list(body.load_iteration)
    iv = body.iv
    for name in load.ops:
        if name in body.load_ops:
            inner += body.load_ops[name]
            continue
        r = next(r for r in plan.rings if r.producer == name)
        bar = plan.barrier(r.barrier)
        depth = f"{r.name.upper()}_DEPTH"
        at = plan.placement(name)
        inner += [f"        # {name}: start {at.start}, stage {at.stage} -> ring {r.name} ({r.depth} buffers)",
                  f"        buffer = {iv} % {depth}"]
        if bar.rings[0] == r.name:
            nbytes = " + ".join(f"{n}_desc.block_type.nbytes" for n in bar.rings)
            inner += [f"        # empty: every compute partition released the buffer (first pass free); "
                      f"{plan.wait('empty', name).why}",
                      f"        mbarrier.wait({bar.name}_empty.index(buffer), (({iv} // {depth}) & 1) ^ 1)",
                      f"        mbarrier.expect({bar.name}_ready.index(buffer), {nbytes})"]
        dest = f"{r.name}_ring.index(buffer)" + (f".reshape([{body.tma_shapes[r.name]}])"
                                                 if r.name in body.tma_shapes else "")
        copy = [f"{r.name}_desc", body.coords[r.name], f"{bar.name}_ready.index(buffer)", dest]
        if r.name in body.tma_shapes:
            inner += wrap("        tma.async_copy_global_to_shared", copy, "", " " * 40)
        else:
            inner.append(f"        tma.async_copy_global_to_shared({', '.join(copy)})")
    loop = lines[-1]
    pad = " " * (len(loop) - len(loop.lstrip()) - 4)   # the body is written at 8 spaces, under a loop at 4
    return "\n".join(lines + [pad + line for line in inner] + list(body.load_after)) + "\n"


def render_kernel(plan: KernelPlan, body: KernelBody) -> str:
    """The kernel: setup, rings and barriers, the ``gl.warp_specialize`` call, the epilogue."""
    lines = ["@gluon.jit", f"def {body.kernel}({body.kernel_params}):", f'    """{body.kernel_doc}"""',
             *body.setup]
    for r in plan.rings:
        dtype = body.buffer_dtypes.get(r.name, "DTYPE")
        shape = body.buffer_shapes[r.name]
        layout = (f"gl.NVMMASharedLayout.get_default_for([{shape}], {dtype})" if r.name in body.tma_shapes
                  else f"{r.name}_desc.layout")
        head = f"    {r.name}_ring = gl.allocate_shared_memory"
        lines += wrap(head, [dtype, f"[{r.name.upper()}_DEPTH, {shape}]", layout], "", " " * (len(head) + 1))
    for b in plan.barriers:
        depth = depth_name(b)
        lines += [
            f"    {b.name}_ready = gl.allocate_shared_memory(gl.int64, [{depth}, 1], mbarrier.MBarrierLayout())",
            f"    {b.name}_empty = gl.allocate_shared_memory(gl.int64, [{depth}, 1], mbarrier.MBarrierLayout())",
            f"    for s in gl.static_range({depth}):",
            f"        mbarrier.init({b.name}_ready.index(s), count=1)  # completed by the TMA transaction bytes",
            f"        mbarrier.init({b.name}_empty.index(s), count={b.name.upper()}_READERS)  # one arrive per "
            f"compute partition",
        ]
    lines += body.before_specialize
    lines += wrap("    compute_args = ", ring_args(plan) + list(body.compute_params), "", " " * 20)
    lines.append(f"    {body.results}gl.warp_specialize([")
    for k in range(len(plan.compute)):
        args = ["compute_args"] + [str(values[k]) for _, values in body.constexprs]
        lines.append(f"        ({COMPUTE_FN}, ({', '.join(args)}{',' if len(args) == 1 else ''})),")
    load_args = [f"{r.name}_desc" for r in plan.rings] + list(body.load_params) + ring_args(plan) + [body.trip]
    lines += wrap(f"        ({LOAD_FN}, ", load_args, "),", " " * 12)
    workers = plan.compute[1:]
    warps = [str(p.num_warps) for p in workers] + ["LOAD_WARPS"]
    regs = ["COMPUTE_REGS" for _ in workers] + ["LOAD_REGS"]
    lines.append(f"    ], [{', '.join(warps)}], [{', '.join(regs)}])")
    lines += body.epilogue
    return "\n".join(lines) + "\n"


def render_host(plan: KernelPlan, body: KernelBody) -> str:
    """Host helpers shared by every kernel, then the kernel's launcher."""
    signature = "\n".join(f'        "{name}": {ty},' for name, ty in body.signature)
    return HOST.format(kernel=body.kernel, signature=signature).lstrip("\n") + "\n\n" + body.launch.strip("\n")


def kv_shape_source(kv_heads: int, head_dim: str) -> str:
    """Launcher lines that set ``kv_shape``, the expected K/V shape of an attention kernel with ``kv_heads``
    K/V heads (0: one per query head; else grouped, after checking that the query heads divide into the
    groups; the key length is k's, which may differ from the query length S); ``head_dim`` is the launcher's
    expression for D. Shared by the attention families' bodies."""
    if kv_heads:
        return ("    if H % KV_HEADS.value:\n"
                "        raise ValueError(f\"{H} query heads are not a multiple of KV_HEADS={KV_HEADS.value}\")\n"
                f"    kv_shape = (B, KV_HEADS.value, k.shape[2], {head_dim})")
    return f"    kv_shape = (B, H, k.shape[2], {head_dim})"
