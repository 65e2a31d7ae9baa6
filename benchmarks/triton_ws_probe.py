"""The experiments of docs/experiments/triton-warp-specialization.md: when Triton 3.6 warp-specializes a loop for
sm_90, and whether a partition assignment written into the TTGIR is honoured. CPU only (compiles for sm_90, runs
nothing); every row prints what the final TTGIR and PTX hold.

    python benchmarks/triton_ws_probe.py stock      # stock Triton: warp_specialize=True vs num_warps/num_stages
    python benchmarks/triton_ws_probe.py inject     # async_task_id before NVGPUWarpSpecialization
    python benchmarks/triton_ws_probe.py blackwell  # sm_100's AutomaticWarpSpecialization run on sm_90
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

import triton
import triton.language as tl


@triton.jit
def mm_device_desc(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   STAGES: tl.constexpr, WS: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [K, 1], [BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, [K, N], [N, 1], [BK, BN])
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [N, 1], [BM, BN])
    om = tl.program_id(0) * BM
    on = tl.program_id(1) * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BK), num_stages=STAGES, warp_specialize=WS):
        a = a_desc.load([om, k * BK])
        b = b_desc.load([k * BK, on])
        acc = tl.dot(a, b, acc)
    c_desc.store([om, on], acc.to(tl.float16))


@triton.jit
def mm_host_desc(a_desc, b_desc, c_desc, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 STAGES: tl.constexpr, WS: tl.constexpr):
    om = tl.program_id(0) * BM
    on = tl.program_id(1) * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BK), num_stages=STAGES, warp_specialize=WS):
        a = a_desc.load([om, k * BK])
        b = b_desc.load([k * BK, on])
        acc = tl.dot(a, b, acc)
    c_desc.store([om, on], acc.to(tl.float16))


@triton.jit
def attn_fwd(Q, K, V, Out, sm_scale, ZH, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    rows = ZH * N_CTX
    desc_q = tl.make_tensor_descriptor(Q, [rows, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM])
    desc_k = tl.make_tensor_descriptor(K, [rows, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM])
    desc_v = tl.make_tensor_descriptor(V, [rows, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM])
    desc_o = tl.make_tensor_descriptor(Out, [rows, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM])
    offset_y = off_hz * N_CTX
    qo = offset_y + start_m * BLOCK_M
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    q = desc_q.load([qo, 0])
    kv = offset_y
    for start_n in tl.range(0, N_CTX, BLOCK_N, num_stages=STAGES, warp_specialize=WS):
        k = desc_k.load([kv, 0]).T
        qk = tl.dot(q, k)
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        l_ij = tl.sum(p, 1)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + l_ij
        acc = acc * alpha[:, None]
        v = desc_v.load([kv, 0])
        acc = tl.dot(p.to(tl.float16), v, acc)
        m_i = m_ij
        kv += BLOCK_N
    acc = acc / l_i[:, None]
    desc_o.store([qo, 0], acc.to(tl.float16))


PTR = "*fp16"
KERNELS = {
    "mm_device_desc": (mm_device_desc, {"a_ptr": PTR, "b_ptr": PTR, "c_ptr": PTR, "M": "i32", "N": "i32",
                                        "K": "i32"}, {"BM": 128, "BN": 128, "BK": 64}, range(6)),
    "mm_host_desc": (mm_host_desc, {"a_desc": "tensordesc<fp16[128, 64]>", "b_desc": "tensordesc<fp16[64, 128]>",
                                    "c_desc": "tensordesc<fp16[128, 128]>", "K": "i32"},
                     {"BM": 128, "BN": 128, "BK": 64}, [3]),
    "attn_fwd": (attn_fwd, {"Q": PTR, "K": PTR, "V": PTR, "Out": PTR, "sm_scale": "fp32", "ZH": "i32",
                            "N_CTX": "i32"}, {"HEAD_DIM": 128, "BLOCK_M": 128, "BLOCK_N": 128}, [0, 1, 2, 3, 6]),
}


def _source(name, num_stages, ws):
    from triton.compiler import ASTSource

    fn, sig, constexprs, divisible = KERNELS[name]
    constexprs = dict(constexprs, STAGES=num_stages, WS=ws)
    sig = dict(sig, **{k: "constexpr" for k in constexprs})
    return ASTSource(fn, sig, constexprs, {(i,): [["tt.divisibility", 16]] for i in divisible})


def compile_kernel(name, num_warps, num_stages, ws, *, mode=None, edit=None):
    """Compile for sm_90. ``mode`` None: stock pass list. ``"hopper"``: the list cut before
    NVGPUWarpSpecialization, ``edit(text)`` in between. ``"blackwell"``: the sm_90 list with the Hopper pass
    replaced by sm_100's AutomaticWarpSpecialization after ScheduleLoops, ``edit(text)`` before it."""
    from triton import knobs
    from triton._C.libtriton import ir, nvidia, passes
    from triton.backends.compiler import GPUTarget

    def run(mod, *adders):
        pm = ir.pass_manager(mod.context)
        pm.enable_debug()
        for add in adders:
            add(pm)
        pm.run(mod, "probe")

    def front(o, cap):
        return [lambda pm: passes.ttir.add_convert_to_ttgpuir(pm, f"cuda:{cap}", o.num_warps, 32, o.num_ctas),
                passes.ttgpuir.add_coalesce, lambda pm: passes.ttgpuir.add_f32_dot_tc(pm, True),
                nvidia.passes.ttnvgpuir.add_plan_cta, passes.ttgpuir.add_remove_layout_conversions,
                passes.ttgpuir.add_optimize_thread_locality, passes.ttgpuir.add_accelerate_matmul,
                passes.ttgpuir.add_remove_layout_conversions,
                lambda pm: passes.ttgpuir.add_optimize_dot_operands(pm, True),
                nvidia.passes.ttnvgpuir.add_optimize_descriptor_encoding, passes.ttir.add_loop_aware_cse,
                passes.ttgpuir.add_fuse_nested_loops, passes.common.add_canonicalizer, passes.ttir.add_triton_licm,
                passes.common.add_canonicalizer, passes.ttgpuir.add_combine_tensor_select_and_if]

    def back(cap):
        return [passes.common.add_canonicalizer, passes.ttir.add_loop_aware_cse, passes.ttgpuir.add_prefetch,
                lambda pm: passes.ttgpuir.add_optimize_dot_operands(pm, True), passes.ttgpuir.add_coalesce_async_copy,
                nvidia.passes.ttnvgpuir.add_optimize_tmem_layouts, nvidia.passes.ttnvgpuir.add_tma_lowering,
                passes.ttgpuir.add_remove_layout_conversions, nvidia.passes.ttnvgpuir.add_interleave_tmem,
                passes.ttgpuir.add_reduce_data_duplication, passes.ttgpuir.add_reorder_instructions,
                passes.ttir.add_loop_aware_cse, passes.common.add_symbol_dce,
                lambda pm: nvidia.passes.ttnvgpuir.add_fence_insertion(pm, cap), nvidia.passes.ttnvgpuir.add_lower_mma,
                passes.common.add_sccp, passes.common.add_cse, passes.common.add_canonicalizer]

    with tempfile.TemporaryDirectory() as tmp, knobs.cache.scope(), knobs.compilation.scope(), \
            knobs.runtime.scope():
        knobs.cache.dir = tmp
        knobs.compilation.always_compile = True

        def reparse(mod, text):
            path = os.path.join(tmp, "edited.mlir")
            with open(path, "w") as f:
                f.write(edit(text) if edit else text)
            new = ir.parse_mlir_module(path, mod.context)
            new.context = mod.context
            return new

        def hook(backend=None, stages=None, options=None, language=None, capability=None):
            if stages is None or mode is None:
                return "probe", "probe"
            o, cap = options, capability
            latencies = [lambda pm: passes.ttgpuir.add_assign_latencies(pm, o.num_stages),
                         passes.ttgpuir.add_schedule_loops]
            pipeline = lambda pm: passes.ttgpuir.add_pipeline(pm, o.num_stages, False)  # noqa: E731

            def make_ttgir(mod, metadata):
                run(mod, *front(o, cap))
                if mode == "hopper":
                    mod = reparse(mod, str(mod))
                    run(mod, lambda pm: nvidia.passes.hopper.add_hopper_warpspec(pm, o.num_stages, False),
                        *latencies, pipeline)
                else:
                    run(mod, *latencies)
                    mod = reparse(mod, str(mod))
                    run(mod, lambda pm: passes.ttgpuir.add_warp_specialize(pm, o.num_stages), pipeline,
                        passes.ttgpuir.add_optimize_partition_warps)
                run(mod, *back(cap))
                metadata["tensordesc_meta"] = mod.get_tensordesc_metadata()
                return mod

            stages["ttgir"] = make_ttgir
            return "probe", "probe"

        knobs.runtime.add_stages_inspection_hook = hook
        return triton.compile(_source(name, num_stages, ws), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})


def describe(kernel) -> str:
    """What the final TTGIR/PTX show: warp_specialize regions, who runs the TMA loads and the wgmma, registers."""
    ttgir, ptx = kernel.asm["ttgir"], kernel.asm["ptx"]
    regions, where, current = [], {}, None
    for line in ttgir.splitlines():
        m = re.match(r"\s*(default)\s*\{|\s*(partition\d+)\(.*num_warps\((\d+)\)", line)
        if m:
            current = m.group(1) or m.group(2)
            regions.append(current + (f"({m.group(3)}w)" if m.group(3) else ""))
        for kind, needle in (("tma_load", "async_tma_copy_global_to_local"), ("wgmma", "warp_group_dot ")):
            if needle in line:
                where.setdefault(kind, set()).add(current or "kernel")
    regs = re.search(r"requestedRegisters = array<i32: ([\d, ]+)>", ttgir)
    nreg = sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)))
    waits = sorted(set(re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx)))
    return (f"ws={'yes' if 'ttg.warp_specialize(' in ttgir else 'no'} warps={kernel.metadata.num_warps} "
            f"smem={kernel.metadata.shared} regions={regions or '-'} "
            f"tma_load@{sorted(where.get('tma_load', []))} wgmma@{sorted(where.get('wgmma', []))} "
            f"requestedRegisters={regs.group(1) if regs else '-'} "
            f"setmaxnreg={['.'.join(r) for r in nreg] or '-'} wgmma.wait_group={waits}")


def _tag(line: str, attr: str) -> str:
    m = re.search(r"\{([^{}]*)\}\s*:", line)
    if m and ("=" in m.group(1) or not m.group(1).strip()):
        inner = m.group(1).strip()
        return line[:m.start()] + "{" + (inner + ", " if inner else "") + attr + "}" + line[m.end() - 1:]
    cut = line.index(" : ")
    return line[:cut] + " {" + attr + "}" + line[cut:]


def task_edit(load, alloc, mma, store=None, index=None, loop_attr=False):
    """Write ``async_task_id``s: TMA loads, the local_alloc receiving each, the wgmma, the store after the loop,
    the index arithmetic of the loads (``arith.muli`` in the loop); ``loop_attr``: add tt.warp_specialize."""
    def edit(text):
        out = []
        for line in text.split("\n"):
            for needle, task in (("tt.descriptor_load", load), ("ttng.warp_group_dot ", mma),
                                 ("tt.descriptor_store", store), ("= arith.muli %arg", index)):
                if needle in line and task is not None:
                    line = _tag(line, f"async_task_id = array<i32: {task}>")
            if re.search(r"ttg\.local_alloc %\S+ (\{|:)", line):
                line = _tag(line, f"async_task_id = array<i32: {alloc}>")
            if loop_attr and line.strip().startswith("} {tt.num_stages") and "tt.warp_specialize" not in line:
                line = line.replace("} {tt.num_stages", "} {tt.warp_specialize, tt.num_stages")
            out.append(line)
        return "\n".join(out)
    return edit


def partition_edit(load, mma, stages):
    """sm_100-style partitions: ttg.partition on the loop's loads, allocs and wgmma; stages and tag on the loop."""
    def edit(text):
        out = []
        for line in text.split("\n"):
            if "tt.descriptor_load" in line or re.search(r"ttg\.local_alloc %", line):
                line = _tag(line, f"ttg.partition = array<i32: {load}>")
            elif "ttng.warp_group_dot " in line:
                line = _tag(line, f"ttg.partition = array<i32: {mma}>")
            if line.strip().startswith("} {") and "tt.warp_specialize}" in line:
                line = line.replace("tt.warp_specialize}", f"tt.warp_specialize, ttg.partition.stages = {stages}, "
                                                           f"ttg.warp_specialize.tag = 0 : i32}}")
            out.append(line)
        return "\n".join(out)
    return edit


def _row(label, make):
    try:
        print(f"{label:<58} {describe(make())}", flush=True)
    except Exception as exc:           # a failing pass: Triton's message, which the doc quotes
        print(f"{label:<58} FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", flush=True)


def stock():
    for name in ("mm_device_desc", "mm_host_desc", "attn_fwd"):
        for warps in (4, 8):
            for stages in (2, 3, 4):
                for ws in (False, True):
                    _row(f"{name} num_warps={warps} num_stages={stages} ws={ws}",
                         lambda: compile_kernel(name, warps, stages, ws))


def inject():
    mm = "mm_device_desc"
    cases = [
        ("identity edit (= stock)", mm, 4, True, None),
        ("loads 0, alloc 0, wgmma 1, store 1", mm, 4, True, task_edit(0, 0, 1, 1)),
        ("loads 0, alloc 1, wgmma 1, store 1", mm, 4, True, task_edit(0, 1, 1, 1)),
        ("loads 0, alloc 1, wgmma 1 (store untagged)", mm, 4, True, task_edit(0, 1, 1)),
        ("loads 0, alloc 1, wgmma 1, store 1, index arith 0", mm, 4, True, task_edit(0, 1, 1, 1, index=0)),
        ("loads 0, alloc '1, 2', wgmma '1, 2', store '1, 2'", mm, 4, True, task_edit(0, "1, 2", "1, 2", "1, 2")),
        ("ws=False + tt.warp_specialize written, 0/1/1/1", mm, 4, False, task_edit(0, 1, 1, 1, loop_attr=True)),
        ("num_warps=8, 0/1/1/1", mm, 8, True, task_edit(0, 1, 1, 1)),
        ("host descriptors, 0/1/1/1", "mm_host_desc", 4, True, task_edit(0, 1, 1, 1)),
        ("num_stages=2, loads 0, alloc 1, wgmma 1, store 1", "attn_fwd", 4, True, task_edit(0, 1, 1, 1)),
    ]
    for label, name, warps, ws, edit in cases:
        stages = 2 if name == "attn_fwd" else 3       # attention at 3 stages needs more than 227 KB
        _row(f"{name}: {label}", lambda: compile_kernel(name, warps, stages, ws, mode="hopper", edit=edit))


def blackwell():
    mm = "mm_device_desc"
    _row(f"{mm}: AutomaticWarpSpecialization, own partitions",
         lambda: compile_kernel(mm, 4, 3, True, mode="blackwell"))
    _row(f"{mm}: AutomaticWarpSpecialization, loads 1, wgmma 2",
         lambda: compile_kernel(mm, 4, 3, True, mode="blackwell", edit=partition_edit(1, 2, "[0 : i32, 0 : i32, "
                                                                                          "1 : i32]")))


if __name__ == "__main__":
    which = sys.argv[1:] or ["stock", "inject", "blackwell"]
    for step in which:
        {"stock": stock, "inject": inject, "blackwell": blackwell}[step]()
