"""Compile a ``@triton.jit`` kernel ahead of time (no GPU needed) with Triton 3.6.0, split at the pipeliner.

Triton's ``make_ttgir`` stage is replaced, through ``triton.knobs.runtime.add_stages_inspection_hook``, by
the same pass list cut in two at ``TritonGPUPipeline``: :data:`PRE_PIPELINE` (up to and including
``ScheduleLoops``, which writes Triton's own ``loop.stage``/``loop.cluster``) and :data:`POST_PIPELINE`
(the pipeliner and everything after it). Between the two a callback sees the module as text; it may only
read it (the frontend) or rewrite the schedule attributes (:mod:`twill.integrations.triton.inject`), after which the
text is re-parsed. The lists are copies of ``triton/backends/nvidia/compiler.py`` of Triton 3.6.0, so any
other version is refused.

Triton 3.6.0 does not put the hook into its compile-cache key: every compile here runs with a private,
empty cache directory and ``always_compile``, so no cached kernel with another schedule is ever reused.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from twill.errors import TwillError, UnsupportedFeatureError

TRITON_VERSION = "3.6.0"
SUPPORTED_CAPABILITIES = (90, 100)

#: A schedule edit: pre-pipeline TTGIR text in, text to continue compiling with out.
TextEdit = Callable[[str], str]


class _Captured(Exception):
    """Raised inside the hook to stop compiling once the pre-pipeline TTGIR has been read."""


def require_triton():
    """Import Triton and check its version; :class:`UnsupportedFeatureError` unless it is 3.6.0."""
    try:
        import triton
    except ImportError:
        raise UnsupportedFeatureError("the Triton frontend needs triton==3.6.0: pip install 'twill-gpu[triton]'") \
            from None
    if triton.__version__ != TRITON_VERSION:
        raise UnsupportedFeatureError(
            f"Triton {triton.__version__} is installed but Twill's Triton frontend and schedule injection are "
            f"written against the pass pipeline of Triton {TRITON_VERSION}: pip install triton=={TRITON_VERSION}")
    return triton


# -- signature and constexprs ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Argument:
    """A kernel argument of the signature: Triton type string and whether it is divisible by 16."""

    name: str
    type: str
    divisible: bool


#: The element types of Triton 3.6's signatures (``triton.language.str_to_ty``), as docs/triton.md lists them.
SCALAR_TYPES = ("i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64", "fp8e4nv", "fp8e5", "fp8e4b8",
                "fp8e5b16", "fp8e4b15", "fp16", "bf16", "fp32", "fp64")
_SCALAR = "|".join(SCALAR_TYPES)
#: Triton argument types: scalars, pointers (``*fp16``, ``*kfp16`` for const) and tensor descriptors
#: (``tensordesc<fp16[128, 64]>``: element type and block shape).
_ARG_TYPE = re.compile(rf"^(\*k?)?({_SCALAR})$|^tensordesc<({_SCALAR})\[\s*\d+(\s*,\s*\d+)*\s*\]>$")
_TYPE_HELP = (f"TYPE is a scalar ({', '.join(SCALAR_TYPES)}), a pointer *TYPE (*kTYPE: const) or a tensor "
              f"descriptor tensordesc<TYPE[D0, D1]>")


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "<[(":
            depth += 1
        elif ch in ">])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def parse_signature(text: str) -> tuple[Argument, ...]:
    """``"a_ptr=*fp16:16,M=i32:16,scale=fp32"`` -> arguments; ``:16`` marks ``tt.divisibility = 16``.

    The names may be left out (``"*fp16:16,i32:16,fp32"``): the types then go to the kernel's non-constexpr
    arguments in order (the argument name is empty until :meth:`KernelSpec.source` assigns it)."""
    out = []
    parts = _split_top(text)
    named = ["=" in p for p in parts]
    if any(named) and not all(named):
        raise TwillError(f"signature {text!r} mixes NAME=TYPE and bare TYPE entries: name all or none")
    for part in parts:
        name, typ = (s.strip() for s in part.split("=", 1)) if "=" in part else ("", part.strip())
        divisible = False
        m = re.match(r"^(.*):(\d+)$", typ)
        if m and not typ.endswith(">"):
            typ, div = m.group(1).strip(), int(m.group(2))
            if div != 16:
                raise TwillError(f"signature entry {part!r}: only ':16' (tt.divisibility 16) is supported")
            divisible = True
        if (name and not name.isidentifier()) or not _ARG_TYPE.match(typ):
            raise TwillError(f"signature entry {part!r} must be NAME=TYPE or TYPE (e.g. a_ptr=*fp16:16, i32); "
                             f"{_TYPE_HELP}")
        out.append(Argument(name, typ, divisible))
    if not out:
        raise TwillError("empty signature: list every non-constexpr argument, e.g. a_ptr=*fp16:16,M=i32:16")
    return tuple(out)


def parse_constexpr_value(text: str) -> Any:
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"True": True, "False": False, "true": True, "false": False, "None": None}.get(text, text)


#: torch's names of the fp8 formats -> Triton's; every other torch dtype name is Triton's long name
#: (``torch.bfloat16`` -> ``tl.bfloat16``) or one of these aliases.
_TORCH_DTYPES = {"float8_e4m3fn": "float8e4nv", "float8_e5m2": "float8e5", "float8_e4m3fnuz": "float8e4b8",
                 "float8_e5m2fnuz": "float8e5b16", "half": "float16", "float": "float32", "double": "float64",
                 "bool": "int1"}
_DTYPE_PREFIXES = ("triton.language.", "tl.", "torch.")


def dtype_constexpr(value: Any) -> Any:
    """The ``tl.dtype`` a constexpr value names, else the value unchanged. A kernel that uses a constexpr as a
    dtype (``x.to(compute_type)``) needs a ``tl.dtype``; the command line gives strings, so Triton's short
    names (``bf16``, ``fp8e4nv``), its long names (``bfloat16``, ``tl.bfloat16``) and torch's
    (``torch.bfloat16``, ``torch.float8_e4m3fn``, or a torch dtype object) become that dtype."""
    if type(value).__module__ == "torch":
        value = str(value)
    if not isinstance(value, str):
        return value
    name = value.strip()
    prefix = next((p for p in _DTYPE_PREFIXES if name.startswith(p)), "")
    name = name[len(prefix):]
    if prefix == "torch.":
        name = _TORCH_DTYPES.get(name, name)
    import triton.language as tl

    short = tl.dtype.SINT_TYPES + tl.dtype.UINT_TYPES + tl.dtype.FP_TYPES
    if not prefix and name in short:
        return tl.dtype(name)
    found = getattr(tl, name, None) if name.isidentifier() else None
    if isinstance(found, tl.dtype) and found.name in short:
        return found
    return value


def parse_constexprs(items: Sequence[str]) -> dict[str, Any]:
    """``["BLOCK_M=128", "CAUSAL=False"]`` -> ``{"BLOCK_M": 128, "CAUSAL": False}``."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise TwillError(f"constexpr {item!r} must be NAME=VALUE (e.g. BLOCK_M=128)")
        name, value = (s.strip() for s in item.split("=", 1))
        if not name.isidentifier():
            raise TwillError(f"constexpr {item!r} must be NAME=VALUE (e.g. BLOCK_M=128)")
        out[name] = parse_constexpr_value(value)
    return out


@dataclass(frozen=True)
class KernelSpec:
    """Everything needed to compile one kernel ahead of time."""

    fn: Any
    signature: tuple[Argument, ...]
    constexprs: Mapping[str, Any]
    num_warps: int = 4
    num_stages: int | None = None
    capability: int = 90

    def __post_init__(self) -> None:
        if self.capability not in SUPPORTED_CAPABILITIES:
            raise UnsupportedFeatureError(f"compute capability {self.capability} is not supported "
                                          f"(Twill targets sm_90 and sm_100)")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise TwillError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if self.num_stages is not None and self.num_stages < 1:
            raise TwillError(f"num_stages must be >= 1, got {self.num_stages}")

    @property
    def name(self) -> str:
        return self.fn.__name__

    def options(self) -> dict[str, int]:
        opts = {"num_warps": self.num_warps}
        if self.num_stages is not None:
            opts["num_stages"] = self.num_stages
        return opts

    def source(self):
        """The ``ASTSource``: types for every argument, constexpr values, divisibility attributes."""
        from triton.compiler import ASTSource

        arg_names = list(self.fn.arg_names)
        given = {a.name: a for a in self._named_signature(arg_names)}
        for name in list(given) + list(self.constexprs):
            if name not in arg_names:
                raise TwillError(f"kernel {self.name!r} has no argument {name!r} "
                                 f"(arguments: {', '.join(arg_names)})")
        constexprs = {name: dtype_constexpr(value) for name, value in self.constexprs.items()}
        params = {p.name: p for p in getattr(self.fn, "params", [])}
        sig: dict[str, str] = {}
        no_value, no_type = [], []
        for name in arg_names:
            param = params.get(name)
            if name in constexprs or (param is not None and param.is_constexpr):
                if name not in constexprs:
                    default = param._param.default if param is not None else None
                    if default is None or default is param._param.empty:
                        no_value.append(name)
                        continue
                    constexprs[name] = default
                sig[name] = "constexpr"
            elif name in given:
                sig[name] = given[name].type
            else:
                no_type.append(name)
        if no_value or no_type:
            raise TwillError(f"kernel {self.name!r}: {missing_text(no_value, no_type)}")
        attrs = {(arg_names.index(a.name),): [["tt.divisibility", 16]] for a in given.values() if a.divisible}
        return ASTSource(self.fn, sig, constexprs, attrs)

    def _named_signature(self, arg_names: list[str]) -> tuple[Argument, ...]:
        """The signature with names: a name-less signature is matched in order with the arguments that are
        neither ``tl.constexpr`` nor given by ``--constexpr``."""
        if all(a.name for a in self.signature):
            return self.signature
        params = {p.name: p for p in getattr(self.fn, "params", [])}
        runtime = [n for n in arg_names
                   if n not in self.constexprs and not (n in params and params[n].is_constexpr)]
        if len(runtime) != len(self.signature):
            raise TwillError(f"kernel {self.name!r}: the signature lists {len(self.signature)} types but the "
                             f"kernel has {len(runtime)} non-constexpr arguments ({', '.join(runtime)})")
        return tuple(Argument(n, a.type, a.divisible) for n, a in zip(runtime, self.signature))

    def target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.capability, 32)


def missing_text(no_value: Sequence[str], no_type: Sequence[str] = (), computed: Sequence[str] = ()) -> str:
    """One sentence naming every constexpr without a value and every argument missing from the signature,
    with the flags that supply them; ``computed``: constexprs an ``@triton.heuristics`` computes from launch
    arguments."""
    parts = []
    values = list(no_value) + [n for n in computed if n not in no_value]
    if values:
        which = ("constexpr " if len(values) == 1 else "constexprs ") + ", ".join(repr(n) for n in values)
        heuristics = "computed by @triton.heuristics from the launch arguments"
        why = (f" ({heuristics})" if len(computed) == len(values) else
               f" ({', '.join(computed)}: {heuristics})" if computed else "")
        flags = " ".join(f"--constexpr {n}=VALUE" for n in values)
        parts.append(f"{which}{why} {'has' if len(values) == 1 else 'have'} no value; pass {flags}")
    if no_type:
        which = ("argument " if len(no_type) == 1 else "arguments ") + ", ".join(repr(n) for n in no_type)
        parts.append(f"{which} {'is' if len(no_type) == 1 else 'are'} missing from the signature (list every "
                     f"non-constexpr argument, e.g. {no_type[0]}=i32:16)")
    return "; ".join(parts)


def capability_of(arch: str) -> int:
    """``"sm_90"``/``"sm_90a"``/``"90"`` -> 90."""
    m = re.match(r"^(?:sm_)?(\d+)a?$", arch.strip())
    if not m:
        raise TwillError(f"cannot read architecture {arch!r} (use sm_90 or sm_100)")
    return int(m.group(1))


# -- loading a kernel from a file --------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelSource:
    """A kernel imported from a file: the ``@triton.jit`` function under its decorators, the configs of an
    ``@triton.autotune`` and the constexpr functions of ``@triton.heuristics`` wrapped around it."""

    fn: Any
    configs: tuple[Any, ...] = ()
    heuristics: Mapping[str, Callable[[dict], Any]] = field(default_factory=dict)

    def settings(self, constexprs: Mapping[str, Any], *, config: int | None, num_warps: int | None,
                 num_stages: int | None) -> tuple[dict[str, Any], int | None, int | None]:
        """(constexprs, num_warps, num_stages) to compile with: autotune config ``config`` (the only one
        when there is one) under the values given on the command line, then the heuristics' constexprs."""
        values = dict(constexprs)
        if config is not None and not self.configs:
            raise TwillError(f"--config applies to @triton.autotune kernels; {self.fn.__name__!r} has no configs")
        if self.configs:
            if config is None and len(self.configs) > 1:
                raise TwillError(f"kernel {self.fn.__name__!r} is autotuned over {len(self.configs)} configs: pick "
                                 f"one with --config N; {self.describe_configs()}")
            index = config or 0
            if not 0 <= index < len(self.configs):
                raise TwillError(f"--config {index} is out of range: {self.describe_configs()}")
            chosen = self.configs[index]
            values = {**chosen.kwargs, **values}
            num_warps = num_warps if num_warps is not None else chosen.num_warps
            num_stages = num_stages if num_stages is not None else chosen.num_stages
        computed = []
        for name, rule in self.heuristics.items():
            if name in values:
                continue
            try:
                values[name] = rule(dict(values))
            except Exception:
                computed.append(name)
        if computed:
            no_value = [p.name for p in getattr(self.fn, "params", []) if p.is_constexpr and p.name not in values
                        and p.name not in computed and p._param.default is p._param.empty]
            raise TwillError(f"kernel {self.fn.__name__!r}: {missing_text(no_value, computed=computed)}")
        return values, num_warps, num_stages

    def describe_configs(self) -> str:
        """``0: BLOCK_M=128 BLOCK_N=128 num_warps=8 num_stages=3; 1: ...``."""
        rows = []
        for k, c in enumerate(self.configs):
            items = [f"{n}={v}" for n, v in c.kwargs.items()] + [f"num_warps={c.num_warps}",
                                                                   f"num_stages={c.num_stages}"]
            rows.append(f"{k}: {' '.join(items)}")
        return "; ".join(rows)


def unwrap_kernel(obj: Any, triton) -> KernelSource | None:
    """The :class:`KernelSource` under ``@triton.autotune`` / ``@triton.heuristics`` wrappers, or ``None``
    when ``obj`` is no Triton kernel."""
    from triton.runtime.autotuner import Autotuner, Heuristics

    configs: tuple[Any, ...] = ()
    heuristics: dict[str, Callable[[dict], Any]] = {}
    while isinstance(obj, (Autotuner, Heuristics)):
        if isinstance(obj, Autotuner):
            configs = configs or tuple(obj.configs)
        else:
            heuristics.update(obj.values)
        obj = obj.fn
    if not isinstance(obj, triton.runtime.jit.JITFunction):
        return None
    return KernelSource(obj, configs, heuristics)


def load_kernel(path: str | os.PathLike, fn_name: str) -> KernelSource:
    """Import ``path`` and return its ``@triton.jit`` function ``fn_name`` (under any autotune/heuristics)."""
    triton = require_triton()
    from twill.files import read_text_file

    path = Path(path)
    read_text_file(path, "Triton source")     # a regular, size-capped text file, else one line
    mod_name = f"_twill_kernel_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise TwillError(f"cannot import {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:
        raise TwillError(f"Triton source {str(path)!r} exited while it was loaded (exit status {exc.code!r}); "
                         f"a kernel module must not call sys.exit at import") from None
    except Exception as exc:
        raise TwillError(f"importing {str(path)!r} failed: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise TwillError(f"{str(path)!r} has no function {fn_name!r}")
    source = unwrap_kernel(fn, triton)
    if source is None:
        raise TwillError(f"{fn_name!r} in {str(path)!r} is not a Triton kernel (@triton.jit, possibly under "
                         f"@triton.autotune / @triton.heuristics)")
    return source


# -- the pass pipeline, split at the pipeliner -------------------------------------------------------------
def run_pre_pipeline(mod, options, capability: int, *, before_warpspec: bool = False) -> None:
    """``make_ttgir`` of Triton 3.6.0 up to and including ``ScheduleLoops``; with ``before_warpspec`` (sm_90)
    up to, not including, Hopper's warp specialization (``NVGPUWarpSpecialization``)."""
    from triton._C.libtriton import ir, nvidia, passes

    pm = ir.pass_manager(mod.context)
    dump = pm.enable_debug()
    passes.ttir.add_convert_to_ttgpuir(pm, f"cuda:{capability}", options.num_warps, 32, options.num_ctas)
    passes.ttgpuir.add_coalesce(pm)
    passes.ttgpuir.add_f32_dot_tc(pm, capability // 10 >= 8)
    nvidia.passes.ttnvgpuir.add_plan_cta(pm)
    passes.ttgpuir.add_remove_layout_conversions(pm)
    passes.ttgpuir.add_optimize_thread_locality(pm)
    passes.ttgpuir.add_accelerate_matmul(pm)
    passes.ttgpuir.add_remove_layout_conversions(pm)
    passes.ttgpuir.add_optimize_dot_operands(pm, capability >= 80)
    nvidia.passes.ttnvgpuir.add_optimize_descriptor_encoding(pm)
    passes.ttir.add_loop_aware_cse(pm)
    passes.ttgpuir.add_fuse_nested_loops(pm)
    passes.common.add_canonicalizer(pm)
    passes.ttir.add_triton_licm(pm)
    if capability // 10 == 9:
        passes.common.add_canonicalizer(pm)
        passes.ttgpuir.add_combine_tensor_select_and_if(pm)
        if before_warpspec:
            pm.run(mod, "twill_pre_warpspec")
            return
        nvidia.passes.hopper.add_hopper_warpspec(pm, options.num_stages, dump)
    else:
        passes.ttgpuir.add_optimize_accumulator_init(pm)
        passes.ttgpuir.add_hoist_tmem_alloc(pm, False)
        nvidia.passes.ttnvgpuir.add_promote_lhs_to_tmem(pm)
    passes.ttgpuir.add_assign_latencies(pm, options.num_stages)
    passes.ttgpuir.add_schedule_loops(pm)
    pm.run(mod, "twill_pre_pipeline")


def run_post_pipeline(mod, options, capability: int) -> None:
    """``make_ttgir`` of Triton 3.6.0 from the pipeliner (sm_100: from warp specialization) to its end."""
    from triton._C.libtriton import ir, nvidia, passes

    pm = ir.pass_manager(mod.context)
    dump = pm.enable_debug()
    if capability // 10 == 9:
        passes.ttgpuir.add_pipeline(pm, options.num_stages, dump)
    else:
        passes.ttgpuir.add_warp_specialize(pm, options.num_stages)
        passes.ttgpuir.add_pipeline(pm, options.num_stages, dump)
        passes.ttgpuir.add_optimize_partition_warps(pm)
        passes.ttgpuir.add_combine_tensor_select_and_if(pm)
        passes.ttgpuir.add_hoist_tmem_alloc(pm, True)
        nvidia.passes.ttnvgpuir.add_remove_tmem_tokens(pm)
    passes.common.add_canonicalizer(pm)
    passes.ttir.add_loop_aware_cse(pm)
    passes.ttgpuir.add_prefetch(pm)
    passes.ttgpuir.add_optimize_dot_operands(pm, capability >= 80)
    passes.ttgpuir.add_coalesce_async_copy(pm)
    nvidia.passes.ttnvgpuir.add_optimize_tmem_layouts(pm)
    nvidia.passes.ttnvgpuir.add_tma_lowering(pm)
    passes.ttgpuir.add_remove_layout_conversions(pm)
    nvidia.passes.ttnvgpuir.add_interleave_tmem(pm)
    passes.ttgpuir.add_reduce_data_duplication(pm)
    passes.ttgpuir.add_reorder_instructions(pm)
    passes.ttir.add_loop_aware_cse(pm)
    passes.common.add_symbol_dce(pm)
    nvidia.passes.ttnvgpuir.add_fence_insertion(pm, capability)
    nvidia.passes.ttnvgpuir.add_lower_mma(pm)
    passes.common.add_sccp(pm)
    passes.common.add_cse(pm)
    passes.common.add_canonicalizer(pm)
    pm.run(mod, "twill_post_pipeline")


def run_post_warpspec(mod, options, capability: int) -> None:
    """``make_ttgir`` of Triton 3.6.0 (sm_90) from Hopper's warp specialization to its end: the rest of
    :func:`run_pre_pipeline`, then :func:`run_post_pipeline`."""
    from triton._C.libtriton import ir, nvidia, passes

    pm = ir.pass_manager(mod.context)
    dump = pm.enable_debug()
    nvidia.passes.hopper.add_hopper_warpspec(pm, options.num_stages, dump)
    passes.ttgpuir.add_assign_latencies(pm, options.num_stages)
    passes.ttgpuir.add_schedule_loops(pm)
    pm.run(mod, "twill_warpspec")
    run_post_pipeline(mod, options, capability)


def make_hook(kernel_name: str, edit: TextEdit, workdir: str, *, stop_after_capture: bool = False,
              seen: list[str] | None = None, at_warpspec: bool = False):
    """An ``add_stages_inspection_hook`` that replaces the ``ttgir`` stage of ``kernel_name`` by
    pre-pipeline passes -> ``edit(text)`` -> re-parse -> post-pipeline passes. Kernels of other names
    compile normally. ``seen`` collects the pre-pipeline texts. ``at_warpspec`` (sm_90) cuts the pass list
    before Hopper's warp specialization instead (:func:`run_post_warpspec`)."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import Language

    tag = f"twill-{kernel_name}"

    def hook(backend=None, stages=None, options=None, language=None, capability=None):
        if stages is None:                 # newer Triton asks the hook for a cache key this way
            return tag, tag
        if language != Language.TRITON or capability // 10 not in (9, 10):
            return tag, tag

        def make_ttgir(mod, metadata):
            if options.maxnreg is not None:
                mod.set_attr("ttg.maxnreg", ir.builder(mod.context).get_int32_attr(options.maxnreg))
            run_pre_pipeline(mod, options, capability, before_warpspec=at_warpspec)
            text = str(mod)
            if f"@{kernel_name}(" not in text:
                raise TwillError(f"hook for kernel {kernel_name!r} saw another kernel")
            if seen is not None:
                seen.append(text)
            if stop_after_capture:
                raise _Captured()
            path = os.path.join(workdir, f"{kernel_name}.scheduled.ttgir")
            Path(path).write_text(edit(text))
            context = mod.context
            mod = ir.parse_mlir_module(path, context)
            mod.context = context
            (run_post_warpspec if at_warpspec else run_post_pipeline)(mod, options, capability)
            metadata["tensordesc_meta"] = mod.get_tensordesc_metadata()
            return mod

        stages["ttgir"] = make_ttgir
        return tag, tag

    return hook


def compile_with_edit(spec: KernelSpec, edit: TextEdit | None, *, capture_only: bool = False,
                      workdir: str | None = None, at_warpspec: bool = False):
    """Compile ``spec`` with the schedule edit ``edit`` (``None`` = Triton's own schedule, identity text).

    Returns ``(compiled kernel or None, pre-pipeline TTGIR text)``; with ``capture_only`` compilation stops
    after the pre-pipeline passes and the kernel is ``None``. ``at_warpspec`` (sm_90): the edit sees the
    module before Hopper's warp specialization (:func:`make_hook`).
    """
    triton = require_triton()
    from triton import knobs

    seen: list[str] = []
    with tempfile.TemporaryDirectory(prefix="twill-triton-") as tmp:
        hook = make_hook(spec.name, edit or (lambda text: text), workdir or tmp, stop_after_capture=capture_only,
                         seen=seen, at_warpspec=at_warpspec)
        with knobs.runtime.scope(), knobs.compilation.scope(), knobs.cache.scope():
            knobs.cache.dir = os.path.join(tmp, "cache")
            knobs.compilation.always_compile = True
            knobs.runtime.add_stages_inspection_hook = hook
            with _native_stderr(tmp) as native:
                try:
                    kernel = triton.compile(spec.source(), target=spec.target(), options=spec.options())
                except _Captured:
                    kernel = None
                except TwillError:
                    raise
                except Exception as exc:
                    raise TwillError(f"Triton failed to compile kernel {spec.name!r}"
                                     f"{compile_error_text(exc, spec, native())}") from None
    if not seen:
        raise TwillError(f"kernel {spec.name!r}: the ttgir stage never ran (is it a Triton kernel for CUDA?)")
    return kernel, seen[0]


@contextlib.contextmanager
def _native_stderr(workdir: str):
    """Collect what native code (MLIR diagnostics of a failing pass) writes on file descriptor 2 while the
    block runs; yields a function returning it. The text is passed on to stderr unless the block raises
    (then its first ``error:`` line goes into the error message instead)."""
    path = os.path.join(workdir, "stderr.txt")
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "w+b") as sink:
        os.dup2(sink.fileno(), 2)
        failed = False
        try:
            yield lambda: Path(path).read_text(errors="replace")
        except BaseException:
            failed = True
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not failed:
                sink.seek(0)
                sys.stderr.write(sink.read().decode(errors="replace"))


def compile_error_text(exc: Exception, spec: KernelSpec, native: str = "") -> str:
    """``" at file.py:LINE: Reason: message"`` for a Triton compilation error. Triton wraps the error once per
    ``@triton.jit`` function on the call path (the kernel's line only shows a caret under the call), so the
    innermost :class:`CompilationError` of the exception chain is the helpful one: its line (in the helper
    that failed, ``(in helper, called at file.py:LINE)``) and its reason, named by the exception under it
    (``NameError: x is not defined``). A failing MLIR pass only says ``PassManager::run failed``; its
    diagnostic (``file.py:11:33: error: ...``), printed by native code, is the reason then. A reason about a
    ``str`` names the string constexprs: a dtype is written ``bf16``, ``tl.bfloat16`` or ``torch.bfloat16``."""
    chain = _exception_chain(exc)
    located = [e for e in chain if getattr(e, "node", None) is not None and hasattr(e, "error_message")]
    inner = next((e for e in reversed(located) if e.error_message), located[-1] if located else exc)
    under = chain[chain.index(inner) + 1] if chain.index(inner) + 1 < len(chain) else None
    if under is not None and not hasattr(under, "error_message") and str(under):
        reason, kind = str(under).strip(), type(under).__name__
    else:
        lines = [ln for ln in str(inner).strip().splitlines() if ln.strip()]
        reason = getattr(inner, "error_message", None) or (lines[-1].strip() if lines else "")
        kind = type(inner).__name__
    line = _error_place(located[:located.index(inner) + 1] if inner in located else [inner], spec)
    diagnostic = re.search(r"^(?:.*/)?([^/\s:]+\.py):(\d+):\d+: error: (.*)$", native, re.M)
    if diagnostic:
        line = line or f"{diagnostic.group(1)}:{diagnostic.group(2)}"
        reason = f"{reason}: {diagnostic.group(3).strip()}"
    strings = [f"{n}={v!r}" for n, v in spec.constexprs.items()
               if isinstance(v, str) and dtype_constexpr(v) is v]
    if strings and "'str' object" in reason:
        reason += (f" (string constexpr {', '.join(strings)}; a constexpr used as a dtype takes bf16, tl.bfloat16 "
                   f"or torch.bfloat16)")
    return f"{' at ' + line if line else ''}: {kind}: {str(reason)[:300]}"


def _exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from (``__cause__``, else ``__context__``), outermost first."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _error_place(path: Sequence[BaseException], spec: KernelSpec) -> str | None:
    """``"k.py:21"`` of the failing expression, ``path`` being the :class:`CompilationError` of each function
    from the kernel to the failing one; in a helper, ``"k.py:21 (in _scale, called at k.py:28)"``, each
    call site named with the helper it lies in (``called at k.py:30 in _outer, called at k.py:41``). A
    helper is found by its source text (all a :class:`CompilationError` keeps of it) among the
    ``@triton.jit`` functions the kernel's module and the helpers found so far can see."""
    kernel_src = getattr(spec.fn, "src", None)
    known = [spec.fn]
    places: list[tuple[str, str | None]] = []
    for k, err in enumerate(path):
        src, lineno = getattr(err, "src", None), getattr(getattr(err, "node", None), "lineno", None)
        fn = spec.fn if k == 0 or src == kernel_src else _jit_function_with_source(known, src)
        if fn is not None and fn not in known:
            known.append(fn)
        name = re.search(r"def\s+(\w+)", src or "")
        name = name.group(1) if name else "a helper"
        line = source_line(fn, lineno) if fn is not None and lineno else None
        places.append((name, line or (f"line {lineno} of {name}" if lineno else None)))
    if not places or places[-1][1] is None:
        return None
    where = places[-1][1]
    if len(places) == 1:
        return where
    calls = ", ".join(f"called at {line}" + (f" in {name}" if k else "")
                      for k, (name, line) in reversed(list(enumerate(places[:-1]))) if line)
    return f"{where} (in {places[-1][0]}{', ' + calls if calls else ''})"


def _jit_function_with_source(functions: Sequence[Any], src: str | None) -> Any:
    """The ``@triton.jit`` function whose source is ``src`` among the globals of ``functions`` and the
    attributes of the modules they import, else ``None``."""
    for known in functions:
        scope = getattr(getattr(known, "fn", None), "__globals__", {})
        candidates = list(scope.values())
        candidates += [v for m in scope.values() if type(m).__name__ == "module" for v in vars(m).values()]
        found = next((c for c in candidates if getattr(c, "src", None) == src and hasattr(c, "fn")), None)
        if found is not None:
            return found
    return None


def source_line(kernel: Any, relative: int) -> str | None:
    """``"file.py:LINE"`` of line ``relative`` (1 = the ``def`` line) of a ``@triton.jit`` function's source,
    the numbering Triton's compilation errors and TTGIR locations of the function body use."""
    import inspect

    fn = getattr(kernel, "fn", None)
    try:
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    def_at = next((k for k, text in enumerate(lines) if text.lstrip().startswith("def ")), 0)
    return f"{Path(fn.__code__.co_filename).name}:{start + def_at + relative - 1}"


def capture_prepipeline(spec: KernelSpec) -> str:
    """The TTGIR of ``spec`` as it enters Triton's pipeliner (Triton's own schedule attributes included)."""
    return compile_with_edit(spec, None, capture_only=True)[1]
