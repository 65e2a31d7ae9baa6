"""The op's attention forward with FlashAttention-3's 176-key tile, written as Gluon 3.6 allows it (CPU step of an
experiment behind docs/experiments/fa3-gap.md; not part of the library).

FA3's D = 128 non-causal forward takes 176 keys per iteration (one m64n176 wgmma for S, eleven k16 steps for
O += P V). Gluon 3.6 takes only power-of-two shapes for register tensors, shared buffers and TMA blocks, so this
writes the tile as three key pieces of 128, 32 and 16: three S accumulators and wgmmas, three K and V rings
(two buffers each, as FA3's two stages; three would not fit in shared memory), three TMA boxes per tile, an
online softmax whose row max and sum combine the pieces, and O += P V as three wgmmas. It is a text edit of
the op's emitted persistent non-causal D = 128 bf16 module (``twill.ops.flash.kernel_path``): correct on any
shape (keys past seq_k masked in each piece), so ``fa3_bench.py fwd --variants`` checks and times it beside the
op and FA3.

    python benchmarks/fa3_wide_tile.py DIR [--count]     # writes DIR/wide176.py and DIR/manifest.json
    python3 benchmarks/fa3_bench.py fwd --cases d128 --variants DIR --out $OUT     # on the GPU machine

``--count`` compiles it and the op's module for sm_90 and prints each compute loop's instructions per 64 x 64
scores on the mask-free path (``fa3_sass.py``'s measure) and ptxas's spill bytes. Exit 2 with one line when the
op's module lacks a text the edit expects (a generator change).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NAME = "wide176"


#: The key pieces: (first key in the tile, size constant).
PIECES = (("0", "N0"), ("N0", "N1"), ("N0 + N1", "N2"))

CONSTANTS = """\
BLOCK_N       = gl.constexpr(176)  # keys per loop iteration, as pieces of 128, 32 and 16 keys (power-of-two tensors)
N0            = gl.constexpr(128)  # key piece 0: keys [0, 128) of the tile
N1            = gl.constexpr(32)  # key piece 1: keys [128, 160)
N2            = gl.constexpr(16)  # key piece 2: keys [160, 176)"""

SOFTMAX = '''@gluon.jit
def _masked(s, kv_start, seq_k, col_layout: gl.constexpr, N: gl.constexpr):
    """S piece with keys past seq_k set to -inf."""
    cols = gl.arange(0, N, col_layout)
    return gl.where((kv_start + cols < seq_k)[None, :], s, float("-inf"))


@gluon.jit
def online_softmax(s0, s1, s2, m_i, l_i, kv_start, seq_k, qk_scale, row: gl.constexpr, c0: gl.constexpr,
                   c1: gl.constexpr, c2: gl.constexpr):
    """One online-softmax step on S's three key pieces (fp32, wgmma layouts): P's pieces, alpha, m_new and
    l_new, the pieces' row statistics combined in ``row`` (piece 0's row layout). Keys past seq_k are masked."""
    if kv_start + BLOCK_N > seq_k:
        s0 = _masked(s0, kv_start, seq_k, c0, N0)
        s1 = _masked(s1, kv_start + N0, seq_k, c1, N1)
        s2 = _masked(s2, kv_start + N0 + N1, seq_k, c2, N2)
    row1: gl.constexpr = gl.SliceLayout(1, s1.type.layout)
    row2: gl.constexpr = gl.SliceLayout(1, s2.type.layout)
    m12 = gl.maximum(gl.convert_layout(gl.max(s1, 1), row2), gl.max(s2, 1))
    m_new = gl.maximum(m_i, gl.maximum(gl.max(s0, 1), gl.convert_layout(m12, row)) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p0 = gl.exp2(s0 * qk_scale - m_new[:, None])
    p1 = gl.exp2(s1 * qk_scale - gl.convert_layout(m_new, row1)[:, None])
    p2 = gl.exp2(s2 * qk_scale - gl.convert_layout(m_new, row2)[:, None])
    l12 = gl.sum(p1, 1) + gl.convert_layout(gl.sum(p2, 1), row1)
    l_new = l_i * alpha + gl.sum(p0, 1) + gl.convert_layout(l12, row)
    return p0, p1, p2, alpha, m_new, l_new


@gluon.jit
def issue_qk(q, k_ring, i, z0, z1, z2):
    """S = Q K^T as three wgmmas, one per key piece (one commit group each)."""
    t0 = warpgroup_mma(q, k_ring[0].index(i).permute((1, 0)), z0, use_acc=False, is_async=True)
    t1 = warpgroup_mma(q, k_ring[1].index(i).permute((1, 0)), z1, use_acc=False, is_async=True)
    t2 = warpgroup_mma(q, k_ring[2].index(i).permute((1, 0)), z2, use_acc=False, is_async=True)
    return t0, t1, t2


@gluon.jit
def issue_pv(a0, a1, a2, v_ring, i, o):
    """O += P V as three wgmmas over the key pieces, accumulating in order."""
    o = warpgroup_mma(a0, v_ring[0].index(i), o, is_async=True)
    o = warpgroup_mma(a1, v_ring[1].index(i), o, is_async=True)
    o = warpgroup_mma(a2, v_ring[2].index(i), o, is_async=True)
    return o


@gluon.jit
def operands(p0, p1, p2, p_layout: gl.constexpr):
    """P's pieces as the register A operands of O += P V."""
    return (gl.convert_layout(p0.to(DTYPE), p_layout), gl.convert_layout(p1.to(DTYPE), p_layout),
            gl.convert_layout(p2.to(DTYPE), p_layout))


'''

S_LAYOUTS = """\
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[COMPUTE_WARPS, 1],
                                                       instr_shape=[16, N0, 16])
    s_layout1: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[COMPUTE_WARPS, 1],
                                                        instr_shape=[16, N1, 16])
    s_layout2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[COMPUTE_WARPS, 1],
                                                        instr_shape=[16, N2, 16])"""

#: online_softmax's layout arguments: piece 0's row layout, each piece's column layout.
LAYOUTS = ("gl.SliceLayout(1, s_layout), gl.SliceLayout(0, s_layout), gl.SliceLayout(0, s_layout1), "
           "gl.SliceLayout(0, s_layout2)")


def _load(r: str) -> tuple[str, str]:
    """(the op's TMA load of one ``r`` tile, three loads of its pieces into the piece rings)."""
    old = (f"            mbarrier.expect({r}_ready.index(buffer), {r}_desc.block_type.nbytes)\n"
           f"            tma.async_copy_global_to_shared({r}_desc, [b, kv_h, (j - first) * BLOCK_N, 0], "
           f"{r}_ready.index(buffer),\n"
           f"                                            {r}_ring.index(buffer).reshape([1, 1, BLOCK_N, HEAD_DIM]))\n")
    new = [f"            mbarrier.expect({r}_ready.index(buffer), {r}_desc[0].block_type.nbytes"
           f" + {r}_desc[1].block_type.nbytes\n",
           f"                            + {r}_desc[2].block_type.nbytes)\n",
           "            row = (j - first) * BLOCK_N\n"]
    for i, (offset, n) in enumerate(PIECES):
        new += [f"            tma.async_copy_global_to_shared({r}_desc[{i}], [b, kv_h, row + {offset}, 0], "
                f"{r}_ready.index(buffer),\n",
                f"                                            {r}_ring[{i}].index(buffer).reshape([1, 1, {n}, "
                f"HEAD_DIM]))\n"]
    return old, "".join(new)


def _ring(r: str) -> tuple[str, str]:
    """(the op's allocation of ring ``r``, one ring per key piece)."""
    depth = f"{r.upper()}_DEPTH"
    old = (f"    {r}_ring = gl.allocate_shared_memory(DTYPE, [{depth}, BLOCK_N, HEAD_DIM],\n"
           f"                                       gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], DTYPE))")
    pieces = [f"gl.allocate_shared_memory(DTYPE, [{depth}, {n}, HEAD_DIM], "
              f"gl.NVMMASharedLayout.get_default_for([{n}, HEAD_DIM], DTYPE))" for _, n in PIECES]
    return old, f"    {r}_ring = (  # one ring per key piece\n" + "".join(f"        {p},\n" for p in pieces) + "    )"


def widen(text: str) -> str:
    """The op's module text with the 176-key tile (see the module docstring)."""
    from benchmarks.fa3_ablate import edit

    s = text

    def rep(old: str, new: str) -> None:
        nonlocal s
        s = edit(s, old, new)

    rep("BLOCK_N       = gl.constexpr(128)  # keys per loop iteration", CONSTANTS)
    rep("K_DEPTH       = gl.constexpr(3)", "K_DEPTH       = gl.constexpr(2)")   # 2 x 45 KB of K, FA3's 2 stages
    rep("V_DEPTH       = gl.constexpr(3)", "V_DEPTH       = gl.constexpr(2)")
    for r in "kv":
        rep(*_load(r))
        rep(*_ring(r))
    if "@gluon.jit\ndef online_softmax" not in s or "@gluon.jit\ndef compute_partition" not in s:
        raise ValueError("the module has no online_softmax / compute_partition to edit")
    rep(s[s.index("@gluon.jit\ndef online_softmax"):s.index("@gluon.jit\ndef compute_partition")], SOFTMAX)
    rep("""    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[COMPUTE_WARPS, 1],
                                                       instr_shape=[16, BLOCK_N, 16])""", S_LAYOUTS)
    rep("    s_zero = gl.zeros([SUB_M, BLOCK_N], gl.float32, s_layout)",
        "    z0 = gl.zeros([SUB_M, N0], gl.float32, s_layout)\n"
        "    z1 = gl.zeros([SUB_M, N1], gl.float32, s_layout1)\n"
        "    z2 = gl.zeros([SUB_M, N2], gl.float32, s_layout2)")
    # prologue: S and the softmax of iteration 0
    rep("""        s_tok = warpgroup_mma(q, k_ring.index(first % K_DEPTH).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        s_cur = warpgroup_mma_wait(0, deps=[s_tok])""",
        """        t0, t1, t2 = issue_qk(q, k_ring, first % K_DEPTH, z0, z1, z2)
        s0, s1, s2 = warpgroup_mma_wait(0, deps=[t0, t1, t2])""")
    rep("""        p, alpha, m_i, l_i = online_softmax(s_cur, m_i, l_i, 0, seq_k, qk_scale,
                                            gl.SliceLayout(0, s_layout))
        p_op = gl.convert_layout(p.to(DTYPE), p_layout)  # P stays in registers: wgmma A operand""",
        f"""        p0, p1, p2, alpha, m_i, l_i = online_softmax(s0, s1, s2, m_i, l_i, 0, seq_k, qk_scale,
                                                     {LAYOUTS})
        a0, a1, a2 = operands(p0, p1, p2, p_layout)  # P stays in registers: wgmma A operands""")
    # the loop: S(j+1) and O += P(j) V(j) as three wgmmas each; wait for S's three groups, then for O's
    rep("""            s_tok = warpgroup_mma(q, k_ring.index((first + jn) % K_DEPTH).permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)""",
        "            t0, t1, t2 = issue_qk(q, k_ring, (first + jn) % K_DEPTH, z0, z1, z2)")
    rep("            o_tok = warpgroup_mma(p_op, v_ring.index((first + j) % V_DEPTH), o, is_async=True)",
        "            o_tok = issue_pv(a0, a1, a2, v_ring, (first + j) % V_DEPTH, o)")
    rep("            s_cur, o, p_op = warpgroup_mma_wait(1, deps=[s_tok, o_tok, p_op])",
        "            s0, s1, s2, o, a0, a1, a2 = warpgroup_mma_wait(3, deps=[t0, t1, t2, o_tok, a0, a1, a2])")
    rep("""            p, alpha, m_i, l_i = online_softmax(s_cur, m_i, l_i, jn * BLOCK_N, seq_k, qk_scale,
                                                gl.SliceLayout(0, s_layout))""",
        f"""            p0, p1, p2, alpha, m_i, l_i = online_softmax(s0, s1, s2, m_i, l_i, jn * BLOCK_N, seq_k,
                                                         qk_scale, {LAYOUTS})""")
    rep("            o, p_op = warpgroup_mma_wait(0, deps=[o, p_op])",
        "            o, a0, a1, a2 = warpgroup_mma_wait(0, deps=[o, a0, a1, a2])")
    rep("            p_op = gl.convert_layout(p.to(DTYPE), p_layout)  # P stays in registers: wgmma A operand; P(j+1)",
        "            a0, a1, a2 = operands(p0, p1, p2, p_layout)  # P stays in registers: wgmma A operands; P(j+1)")
    # epilogue: the last O += P V
    rep("""        o_tok = warpgroup_mma(p_op, v_ring.index((first + j) % V_DEPTH), o, is_async=True)
        o, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])""",
        """        o_tok = issue_pv(a0, a1, a2, v_ring, (first + j) % V_DEPTH, o)
        o, a0, a1, a2 = warpgroup_mma_wait(0, deps=[o_tok, a0, a1, a2])""")
    # the kernel takes three descriptors of K and of V (one per piece); the producer gets them as tuples
    rep("def attention_kernel(q_desc, k_desc, v_desc,",
        "def attention_kernel(q_desc, k_desc0, k_desc1, k_desc2, v_desc0, v_desc1, v_desc2,")
    rep("        (load_partition, (k_desc, v_desc, q_desc,",
        "        (load_partition, ((k_desc0, k_desc1, k_desc2), (v_desc0, v_desc1, v_desc2), q_desc,")
    rep('''        "k_desc": _desc_type([1, 1, BLOCK_N.value, HEAD_DIM.value]),
        "v_desc": _desc_type([1, 1, BLOCK_N.value, HEAD_DIM.value]),''',
        '''        **{f"{r}_desc{i}": _desc_type([1, 1, n, HEAD_DIM.value]) for r in "kv"
           for i, n in enumerate((N0.value, N1.value, N2.value))},''')
    rep('''    k_desc = _tma_view(k, "k", [BLOCK_N.value, D])
    v_desc = _tma_view(v, "v", [BLOCK_N.value, D])''',
        '''    k_descs = [_tma_view(k, "k", [n, D]) for n in (N0.value, N1.value, N2.value)]  # a box per key piece
    v_descs = [_tma_view(v, "v", [n, D]) for n in (N0.value, N1.value, N2.value)]''')
    rep("    _launch(attention_kernel, grid, NUM_WARPS, q_desc, k_desc, v_desc, out,",
        "    _launch(attention_kernel, grid, NUM_WARPS, q_desc, *k_descs, *v_descs, out,")
    return s


def module_text() -> str:
    """The widened module of the op's persistent non-causal D = 128 bf16 forward."""
    from twill.ops.flash import kernel_path
    from twill.ops.spec import KernelSpec

    with open(kernel_path(KernelSpec("flash-fwd", 128, "bf16", False, 0))) as fh:
        return widen(fh.read())


def per_64x64(path: str, block_n: int) -> tuple[list[float], int]:
    """(instructions per 64 x 64 scores of each compute loop's mask-free path, ptxas spill bytes)."""
    from benchmarks import fa3_sass as fs
    from twill.codegen.gluon import aot, load_emitted
    from twill.tune.spills import ptxas_report

    compiled = aot.compile_sm90(load_emitted(path, "twill_wide_" + os.path.basename(path)[:-3]))
    described = fs.describe({"name": path, "facts": {}, "usage": {}, "sass": aot.sass(compiled)}, block_n)
    return ([lp["unmasked_per_64x64"] for lp in described["compute_loops"]],
            ptxas_report(compiled.asm["ptx"], 90)["spill_bytes"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/fa3_wide_tile.py", description=__doc__.splitlines()[0])
    p.add_argument("folder", metavar="DIR")
    p.add_argument("--count", action="store_true", help="compile and print instructions per 64 x 64 scores")
    args = p.parse_args(argv)
    try:
        text = module_text()
    except ValueError as exc:
        print(f"fa3_wide_tile: {exc}", file=sys.stderr)
        return 2
    os.makedirs(args.folder, exist_ok=True)
    path = os.path.join(args.folder, NAME + ".py")
    with open(path, "w") as fh:
        fh.write(text)
    row = {"name": NAME, "file": NAME + ".py", "kernel": "flash-fwd",
           "options": {"head_dim": 128, "dtype": "bf16", "causal": False, "kv_heads": 0, "block_n": 176},
           "persistent": True, "streaming_depth": 2, "sha256": hashlib.sha256(text.encode()).hexdigest()}
    with open(os.path.join(args.folder, "manifest.json"), "w") as fh:
        json.dump([row], fh, indent=2)
    print(f"wrote {path} and manifest.json")
    if args.count:
        from twill.ops.flash import kernel_path
        from twill.ops.spec import KernelSpec

        op = str(kernel_path(KernelSpec("flash-fwd", 128, "bf16", False, 0)))
        for label, file, block_n in (("op, 128 keys", op, 128), ("176 keys in three pieces", path, 176)):
            loops, spills = per_64x64(file, block_n)
            print(f"{label:26s} per 64x64 scores {'/'.join(f'{x:.1f}' for x in loops)}  spills {spills} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
