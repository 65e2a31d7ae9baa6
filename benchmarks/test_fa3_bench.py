"""CPU checks of ``benchmarks/fa3_bench.py``'s own logic: its cases, FLOP counts, rows, tables, command line,
layout decision and stop-and-save plumbing, with the GPU steps replaced (the harness itself runs on the GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:      # the harnesses import each other as ``benchmarks.*``, as when run as scripts
    sys.path.insert(0, str(ROOT))

from benchmarks import fa3_bench as fb  # noqa: E402

SCRIPT = str(ROOT / "benchmarks" / "fa3_bench.py")


def test_the_module_and_its_command_line_need_no_torch_jax_or_triton():
    """Importing the harness and parsing its command line import nothing of the GPU stack (lazy imports)."""
    code = ("import sys\n"
            "for m in ('torch', 'jax', 'triton', 'fa3_fwd_interface', 'flash_attn3_jax'): sys.modules[m] = None\n"
            f"sys.path.insert(0, {str(ROOT)!r})\n"
            "from benchmarks import fa3_bench\n"
            "args = fa3_bench.parse_args(['fwd', '--cases', 'd64', '--out', 'o'])\n"
            "print(args.cases, args.seqs, args.rounds)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "('d64',) (2048, 4096, 8192, 16384) 7"


def test_the_cases_are_the_issues_table_at_b4_and_hidden_4096():
    assert [c.name for c in fb.FWD_CASES] == ["d128", "d128_causal", "d128_causal_kv8", "d64", "d64_causal",
                                             "d256", "d256_causal"]
    assert [c.heads() for c in fb.FWD_CASES] == [32, 32, 32, 64, 64, 16, 16]
    assert fb.FWD_CASES[2].label() == "D=128 causal, 8 K/V heads" and fb.FWD_CASES[3].label() == "D=64 non-causal"
    assert [c.name for c in fb.BWD_CASES] == ["d128_causal", "d128", "d256_causal", "d256"]
    assert [fb.bwd_heads(c.head_dim) for c in fb.BWD_CASES] == [16, 16, 8, 8]
    assert [fb.bwd_batch(s) * s for s in fb.BWD_SEQS] == [16384] * 3 and fb.bwd_batch(2048) == 8
    assert fb.selected(fb.FWD_CASES, ("d256", "d128")) == [fb.FWD_CASES[0], fb.FWD_CASES[5]]


def test_flops_count_two_gemms_forward_half_when_causal_and_two_and_a_half_times_that_backward():
    full = 4 * 4 * 32 * 4096 * 4096 * 128
    assert fb.forward_flops(4, 32, 4096, 128, False) == full
    assert fb.forward_flops(4, 32, 4096, 128, True) == full / 2
    assert fb.backward_flops(4, 32, 4096, 128, True) == 2.5 * full / 2


def test_a_row_has_the_issues_keys_tflops_spread_and_the_ratio_to_fa3():
    case = fb.Case(128, True, 8)
    flops = 1e12
    row = fb.build_row(case, 4096, "bf16", flops, {"twill": 2.0, "fa3": 1.8, "cudnn": "RuntimeError: no kernel"},
                       {"twill": [1.9, 2.5], "fa3": [1.8, 1.8]}, {"twill": 1e-3, "fa3": 2e-3})
    assert {"D", "S", "causal", "kv_heads", "dtype", "twill_tflops", "fa3_tflops", "cudnn_tflops",
            "ratio"} <= row.keys()
    assert (row["D"], row["S"], row["causal"], row["kv_heads"], row["dtype"]) == (128, 4096, True, 8, "bf16")
    assert row["twill_tflops"] == pytest.approx(500.0) and row["fa3_tflops"] == pytest.approx(1e12 / 1.8 / 1e9)
    assert row["ratio"] == pytest.approx(0.9) and row["cudnn_tflops"] == "RuntimeError: no kernel"
    assert row["spread"]["twill"] == pytest.approx([400.0, 1e12 / 1.9 / 1e9]) and "cudnn" not in row["spread"]
    assert row["relerr"] == {"twill": 1e-3, "fa3": 2e-3, "cudnn": None} and row["clock_ghz"] is None
    missing = fb.build_row(case, 4096, "bf16", flops, {"twill": 2.0}, {}, {})
    assert missing["fa3_tflops"] == "not run" and missing["ratio"] is None
    assert fb.ratio(500.0, "import failed") is None and fb.ratio(None, 400.0) is None


def test_the_tables_show_each_case_contender_and_ratio():
    case = fb.Case(64, False)
    rows = [fb.build_row(case, s, "bf16", 1e12, {"twill": 2.0, "fa3": 1.6, "cudnn": 2.5}, {}, {"twill": 1e-3})
            for s in (8192, 4096)]
    rows.append(fb.build_row(fb.Case(128, True), 1000, "bf16", 1e12,
                             {"twill": 2.0, "fa3": "ImportError: no fa3_fwd_interface"}, {}, {}))
    doc = {"step": "fwd", "versions": {"gpu": "H200", "torch": "2.11"}, "rows": rows,
           "cases": [{"case": "d64", "twill_layout": "strided", "cudnn_gqa": None}]}
    md = fb.markdown(doc).splitlines()
    assert md[2] == "| D=64 non-causal | 4k / 8k | 500 / 500 | 625 / 625 | 400 / 400 | 0.80 / 0.80 |"
    assert md[3] == "| D=128 causal | 1000 | 500 | - | - | - |"
    text = fb.table(doc).splitlines()
    assert text[0].startswith("fwd: H200 | torch 2.11") and text[1] == "d64: twill_layout strided"
    assert "twill  500  fa3  625  cudnn  400  twill/fa3 0.80" in text[2]
    assert text[-1] == "    fa3: ImportError: no fa3_fwd_interface"
    doc["step"] = "bwd"
    assert fb.markdown(doc).splitlines()[2].startswith("| D=64 non-causal, bf16 | 4k / 8k |")


@pytest.mark.parametrize("argv, message", [
    (["fwd", "--cases", "d128,d96"], "unknown case d96 (known: d128, d128_causal"),
    (["fwd", "--seqs", "2048,x"], "expected comma-separated integers"),
    (["fwd", "--seqs", "0"], "expected positive integers"),
    (["fwd", "--rounds", "0"], "--rounds must be at least 1"),
    (["bwd", "--seqs", "3000"], "3000 does not divide B·S = 16384"),
    (["bwd", "--dtypes", "fp8"], "unknown dtype fp8"),
    (["bwd", "--cases", "d128_causal_kv8"], "unknown case d128_causal_kv8 (known: d128_causal, d128, d256_causal, "
                                            "d256)"),
])
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        fb.parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err.splitlines()[-1] and "Traceback" not in err


def test_arguments_select_cases_sizes_and_dtypes():
    args = fb.parse_args(["bwd", "--seqs", "4096,8192", "--dtypes", "bf16", "--cases", "d128_causal", "--out", "o"])
    assert (args.seqs, args.dtypes, args.cases, args.rounds, args.out) == ((4096, 8192), ("bf16",),
                                                                          ("d128_causal",), 7, "o")
    assert fb.parse_args(["fwd"]).cases == tuple(c.name for c in fb.FWD_CASES)


def test_the_op_gets_the_views_only_when_it_takes_them_without_a_copy():
    assert fb.layout_decision("UnsupportedFeatureError: q must be contiguous", 0, 0)[0] == "contiguous"
    layout, why = fb.layout_decision(None, 3 * 1024, 1024)
    assert layout == "contiguous" and "copies" in why
    assert fb.layout_decision(None, 0, 1024)[0] == "strided"
    assert fb.layout_decision(None, 100, 1024)[0] == "strided"      # scratch smaller than a copy of q


def test_poisoned_outputs_are_those_inside_the_freed_block_and_its_bytes_are_nan():
    assert fb.poisoned_spans([(1000, 500)], [(1000, 200), (1300, 200), (1400, 200), (10, 5)]) == [
        True, True, False, False]
    torch = pytest.importorskip("torch")
    block = torch.full((16,), 255, dtype=torch.uint8)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert block.view(dtype).isnan().all()


def test_a_contender_is_timed_only_after_a_clean_check():
    assert fb.worst([1e-3, 4e-3]) == 4e-3 and fb.worst([]) is None
    assert fb.worst([1e-3, "RuntimeError: x"]) == 1e-3         # a refused shape does not count ...
    assert fb.worst(["RuntimeError: x", "RuntimeError: y"]) == "RuntimeError: x"   # ... unless all were
    assert fb.worst([1e-3, float("nan")]) != fb.worst([1e-3, float("nan")])   # NaN
    assert fb.check_failure(4e-3) is None
    assert "relative error 5.00e-02" in fb.check_failure(5e-2)
    assert "nan" in fb.check_failure(float("nan"))
    assert fb.check_failure("RuntimeError: x") == "check failed: RuntimeError: x"
    assert fb.check_failure(None) == "check failed: no check ran"


def test_the_fp32_reference_is_sdpa_with_grouped_heads_and_the_causal_mask():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 37, 16, generator=gen)
    k, v = (torch.randn(2, 2, 37, 16, generator=gen) for _ in range(2))
    for causal in (False, True):
        expected = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                  is_causal=causal)
        assert torch.allclose(fb.reference(q, k, v, causal), expected, atol=1e-5)


def test_a_run_stopped_by_sigterm_keeps_its_rows_with_their_clocks(tmp_path, monkeypatch, capsys):
    """``timeout`` stops a step with SIGTERM: the rows measured so far are written (atomically, after each
    row), the clock readings attached, the table printed, and the exit status is 1."""
    pytest.importorskip("triton", reason="the clock sampler's module imports Triton")
    from twill.machine import microbench

    class Sampler:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def median_ghz(self, start, end):
            return 1.8 if (start, end) == (0.0, 1.0) else None

    def forward(args, doc, save):
        doc["rows"].append({**fb.build_row(fb.Case(128, False), 2048, "bf16", 1e12, {"twill": 2.0, "fa3": 2.0},
                                           {}, {}), "window": [0.0, 1.0]})
        save()
        assert json.loads((tmp_path / fb.FWD_FILE).read_text())["rows"][0]["window"] == [0.0, 1.0]
        fb._stop(15, None)

    monkeypatch.setattr(microbench, "ClockSampler", Sampler)
    monkeypatch.setattr(fb, "versions", lambda: {"gpu": "H200"})
    monkeypatch.setattr(fb, "run_forward", forward)
    assert fb.main(["fwd", "--out", str(tmp_path)]) == 1
    doc = json.loads((tmp_path / fb.FWD_FILE).read_text())
    assert doc["stopped"] == "signal 15 after 1 rows" and doc["rows"][0]["clock_ghz"] == 1.8
    assert "window" not in doc["rows"][0] and doc["rows"][0]["ratio"] == 1.0
    assert capsys.readouterr().out.splitlines()[-1] == "STOPPED: signal 15 after 1 rows"


def test_the_table_step_prints_the_markdown_of_a_result_file_or_refuses_it(tmp_path):
    good = tmp_path / "fa3_h200.json"
    good.write_text(json.dumps({"step": "fwd", "rows": [fb.build_row(fb.Case(256, True), 16384, "bf16", 1e12,
                                                                     {"twill": 2.0, "fa3": 2.0}, {}, {})]}))
    run = subprocess.run([sys.executable, SCRIPT, "table", str(good)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.splitlines()[-1] == "| D=256 causal | 16k | 500 | 500 | - | 1.00 |"
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    run = subprocess.run([sys.executable, SCRIPT, "table", str(bad)], capture_output=True, text=True)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1 and "cannot read" in run.stderr
    run = subprocess.run([sys.executable, SCRIPT, "table", str(tmp_path / "none.json")], capture_output=True,
                         text=True)
    assert run.returncode == 2 and "no such file" in run.stderr.splitlines()[-1]


def _cpu_stand_ins(monkeypatch, tmp_path, *, strided: bool):
    """The GPU pieces replaced on the CPU: tensors on the CPU, torch.cuda's bookkeeping a no-op, the three
    contenders torch's SDPA in their layouts (twill refusing views unless ``strided``; cuDNN refusing
    ``enable_gqa``), FA3's JAX backward a JAX reference, CUDA events a fixed time per contender."""
    torch = pytest.importorskip("torch")
    from benchmarks import _common
    from twill.machine import microbench

    F = torch.nn.functional
    seen: dict[str, list] = {"layouts": [], "timed": []}

    def sdpa(q, k, v, causal):
        group = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                              is_causal=causal)

    def twill(q, k, v, causal=False):
        seen["layouts"].append((q.shape[2], q.is_contiguous()))
        if not strided and not q.is_contiguous():
            raise ValueError("q must be contiguous")
        return sdpa(q, k, v, causal)

    def cudnn(q, k, v, causal, gqa=False):
        if gqa:
            raise RuntimeError("No available kernel")
        return sdpa(q, k, v, causal)

    def fa3(q, k, v, causal):
        return sdpa(*(t.transpose(1, 2) for t in (q, k, v)), causal).transpose(1, 2)

    def jax_mods():
        jax = pytest.importorskip("jax")
        jnp = jax.numpy

        def attention(q, k, v, scale, causal):
            s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
            if causal:
                n = q.shape[1]
                s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
            return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v.astype(jnp.float32)).astype(q.dtype)

        def fwd(q, k, v, scale, causal, window):
            return attention(q, k, v, scale, causal), jnp.zeros(q.shape[:3], jnp.float32)

        def bwd(do, q, k, v, o, lse, scale, causal, window):
            return jax.vjp(lambda q, k, v: attention(q, k, v, scale, causal), q, k, v)[1](do)

        return jax, jnp, fwd, bwd

    def event_times(fns, calls, rounds):
        seen["timed"].append(sorted(fns))
        for fn in fns.values():
            fn()
        ms = {"twill": 2.0, "fa3": 1.8, "cudnn": 2.2}      # a variant: 1.6
        return {n: ms.get(n, 1.6) for n in fns}, {n: [ms.get(n, 1.6), ms.get(n, 1.6) * 1.1] for n in fns}, [0.0, 1.0]

    class Sampler:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def median_ghz(self, start, end):
            return 1.9

    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 0)
    monkeypatch.setattr(_common, "event_times", event_times)
    monkeypatch.setattr(microbench, "ClockSampler", Sampler)
    monkeypatch.setattr(fb, "versions", lambda: {"gpu": "CPU"})
    monkeypatch.setattr(fb, "DEVICE", "cpu")
    monkeypatch.setattr(fb, "HIDDEN", 2048)
    monkeypatch.setattr(fb, "BATCH", 1)
    monkeypatch.setattr(fb, "FWD_RAGGED", ((1, 40), (1, 70)))
    monkeypatch.setattr(fb, "BWD_RAGGED", ((1, 40),))
    monkeypatch.setattr(fb, "BWD_TOKENS", 128)
    monkeypatch.setattr(fb, "BWD_HEADS", 2)
    monkeypatch.setattr(fb, "POISON_SLACK", 0)
    monkeypatch.setattr(fb, "_load_twill", lambda: twill)
    monkeypatch.setattr(fb, "_load_fa3", lambda: fa3)
    monkeypatch.setattr(fb, "_sdpa_cudnn", cudnn)
    monkeypatch.setattr(fb, "_jax", jax_mods)
    return seen


@pytest.mark.parametrize("strided", [True, False])
def test_the_forward_step_checks_times_and_writes_every_case(strided, tmp_path, monkeypatch):
    """``fwd`` end to end on the CPU (:func:`_cpu_stand_ins`): the op gets the views of FA3's tensors when it
    takes them and contiguous copies when it refuses them, cuDNN expanded K/V when it refuses
    ``enable_gqa``; every contender is checked, then timed in the same rounds; one row per case and S."""
    seen = _cpu_stand_ins(monkeypatch, tmp_path, strided=strided)
    assert fb.main(["fwd", "--out", str(tmp_path), "--cases", "d128,d128_causal_kv8", "--seqs", "64,96"]) == 0
    doc = json.loads((tmp_path / fb.FWD_FILE).read_text())
    layout = "strided" if strided else "contiguous"
    assert [c["twill_layout"] for c in doc["cases"]] == [layout, layout]
    assert [c["cudnn_gqa"] for c in doc["cases"]] == [None, "expanded K/V"]
    assert [(r["D"], r["S"], r["causal"], r["kv_heads"], r["H"]) for r in doc["rows"]] == [
        (128, 64, False, 0, 16), (128, 96, False, 0, 16), (128, 64, True, 8, 16), (128, 96, True, 8, 16)]
    for row in doc["rows"]:
        assert row["ratio"] == pytest.approx(0.9) and row["clock_ghz"] == 1.9 and row["twill_layout"] == layout
        assert all(0 < row["relerr"][n] < 1e-2 for n in fb.CONTENDERS) and row["twill_vs_fa3"] < 1e-2
    assert seen["timed"] == [["cudnn", "fa3", "twill"]] * 4
    # the checks at S = 40 and the timings (the layout probe runs at S = 70): views, or contiguous copies
    assert {c for s, c in seen["layouts"] if s in (40, 64, 96)} == {not strided}
    checks = doc["cases"][1]["checks"]
    assert sorted(checks) == ["cudnn", "fa3", "twill"] and [c["S"] for c in checks["fa3"]] == [40, 70]


def test_a_contender_that_fails_its_check_or_import_is_a_string_in_its_cells(tmp_path, monkeypatch):
    _cpu_stand_ins(monkeypatch, tmp_path, strided=True)
    torch = pytest.importorskip("torch")

    def missing():
        raise ImportError("No module named 'fa3_fwd_interface'")

    monkeypatch.setattr(fb, "_load_fa3", missing)
    monkeypatch.setattr(fb, "_sdpa_cudnn", lambda q, k, v, causal, gqa=False: torch.zeros_like(q))
    assert fb.main(["fwd", "--out", str(tmp_path), "--cases", "d64", "--seqs", "64"]) == 0
    row = json.loads((tmp_path / fb.FWD_FILE).read_text())["rows"][0]
    assert row["fa3_tflops"].startswith("import failed: ImportError") and row["ratio"] is None
    assert row["cudnn_tflops"].startswith("check failed: relative error 1.00e+00")
    assert isinstance(row["twill_tflops"], float) and row["relerr"]["cudnn"] == pytest.approx(1.0)


def test_the_backward_step_times_the_gradients_and_fa3_only_when_causal(tmp_path, monkeypatch):
    """``bwd`` end to end on the CPU: dq, dk, dv of twill, cuDNN and (causal) FA3's JAX backward against
    fp32 autograd, then timed ``BWD_CALLS`` calls per sample; the non-causal rows name why FA3 is absent."""
    pytest.importorskip("jax")
    seen = _cpu_stand_ins(monkeypatch, tmp_path, strided=True)
    assert fb.main(["bwd", "--out", str(tmp_path), "--seqs", "64", "--dtypes", "bf16",
                    "--cases", "d128_causal,d128"]) == 0
    doc = json.loads((tmp_path / fb.BWD_FILE).read_text())
    causal, full = doc["rows"]
    assert (causal["causal"], causal["S"], causal["B"], causal["dtype"]) == (True, 64, 2, "bf16")
    flops = fb.backward_flops(2, 2, 64, 128, True)
    assert causal["twill_tflops"] == pytest.approx(flops / (2.0 / fb.BWD_CALLS) / 1e9)
    assert causal["ratio"] == pytest.approx(0.9) and all(0 < causal["relerr"][n] < 2e-2 for n in fb.CONTENDERS)
    assert full["fa3_tflops"] == fb.FA3_NO_NONCAUSAL_BWD and full["ratio"] is None
    assert full["relerr"]["fa3"] is None and isinstance(full["cudnn_tflops"], float)
    assert seen["timed"] == [["cudnn", "fa3", "twill"], ["cudnn", "twill"]]
    assert set(doc["cases"][0]["checks"]["fa3"][0]) >= {"dq", "dk", "dv", "relerr"}


# -- variants ------------------------------------------------------------------------------------------------
def _manifest_row(name, kernel="flash-fwd", **options):
    return {"name": name, "file": f"{name}.py", "kernel": kernel, "options": options, "persistent": True}


def test_variants_match_a_case_by_head_dim_mask_kv_heads_and_dtype():
    manifest = [_manifest_row("a", head_dim=128, dtype="bf16"),
                _manifest_row("fp16_by_default", head_dim=128),                   # gluon_bench's default dtype
                _manifest_row("causal", head_dim=128, dtype="bf16", causal=True),
                _manifest_row("kv8", head_dim=128, dtype="bf16", causal=True, kv_heads=8),
                _manifest_row("d64", head_dim=64, dtype="bf16", subtiles=3),
                _manifest_row("gemm", kernel="gemm", dtype="bf16"),
                _manifest_row("d128_by_default", dtype="bf16")]
    names = {c.name: [r["name"] for r in fb.case_variants(manifest, c)] for c in fb.FWD_CASES}
    assert names == {"d128": ["a", "d128_by_default"], "d128_causal": ["causal"], "d128_causal_kv8": ["kv8"],
                     "d64": ["d64"], "d64_causal": [], "d256": [], "d256_causal": []}
    assert fb.variant_case({}) == (128, False, 0, "fp16")


def test_the_variants_step_lists_persistent_non_causal_bf16_kernels_of_the_asked_shapes():
    assert [(d, sub, depth) for _, d, sub, depth in fb.VARIANTS] == [(64, 3, 2), (64, 2, 3), (128, 2, 3), (128, 2, 2),
                                                                     (256, 2, 2)]
    assert len({name for name, *_ in fb.VARIANTS}) == len(fb.VARIANTS)
    spec = fb.variant_spec(256, 2, 2)
    assert spec.persistent() and spec.streaming_depth() == 2 and spec.extra_copies() == 1
    assert spec.kernel_options() == {"head_dim": 256, "dtype": "bf16", "causal": False, "kv_heads": 0, "subtiles": 2,
                                     "block_n": 64}
    assert fb.variant_spec(64, 3, 2).kernel_options()["subtiles"] == 3


def test_a_manifest_is_read_or_refused_with_its_reason(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        fb.read_manifest(str(tmp_path))
    (tmp_path / fb.MANIFEST).write_text(json.dumps([_manifest_row("a"), _manifest_row("a")]))
    with pytest.raises(ValueError, match="'a' appears twice"):
        fb.read_manifest(str(tmp_path))
    (tmp_path / fb.MANIFEST).write_text(json.dumps([{"name": "a"}]))
    with pytest.raises(ValueError, match="without a name or file"):
        fb.read_manifest(str(tmp_path))
    (tmp_path / fb.MANIFEST).write_text(json.dumps([_manifest_row("a")]))
    assert fb.read_manifest(str(tmp_path))[0]["file"] == "a.py"
    assert fb.parse_args(["fwd", "--variants", str(tmp_path)]).variants == str(tmp_path)
    assert fb.parse_args(["fwd"]).variants is None


def test_a_folder_without_a_manifest_exits_2_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        fb.parse_args(["fwd", "--variants", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--variants: cannot read" in err.splitlines()[-1]


def test_a_row_with_variants_keeps_its_keys_and_adds_their_cells():
    case, flops = fb.Case(128, False), 1e12
    ms = {"twill": 2.0, "fa3": 1.6, "cudnn": 2.5, "twill:fast": 1.6, "twill:bad": "check failed: relative error 1e+00"}
    spread = {"twill": [2.0, 2.0], "twill:fast": [1.6, 2.0]}
    relerr = {"twill": 1e-3, "twill:fast": 2e-3, "twill:bad": 1.0}
    plain = fb.build_row(case, 4096, "bf16", flops, ms, spread, relerr)
    row = fb.build_row(case, 4096, "bf16", flops, ms, spread, relerr, ("fast", "bad", "absent"))
    assert "variants" not in plain and set(row) == set(plain) | {"variants"}
    assert {k: row[k] for k in plain} == plain
    fast, bad, absent = (row["variants"][n] for n in ("fast", "bad", "absent"))
    assert fast["tflops"] == pytest.approx(625.0) and fast["ratio_fa3"] == pytest.approx(1.0)
    assert fast["ratio_twill"] == pytest.approx(1.25) and fast["relerr"] == 2e-3
    assert fast["spread"] == pytest.approx([500.0, 625.0])
    assert bad == {"tflops": "check failed: relative error 1e+00", "ratio_fa3": None, "ratio_twill": None,
                   "relerr": 1.0}
    assert absent["tflops"] == "not run" and absent["relerr"] is None


def test_the_tables_show_the_variants_after_the_main_table():
    case = fb.Case(128, False)
    rows = [fb.build_row(case, s, "bf16", 1e12, {"twill": 2.0, "fa3": 1.6, "cudnn": 2.5, "twill:v": 1.6,
                                                 "twill:bad": "check failed: x"}, {}, {"twill:v": 1e-3}, ("v", "bad"))
            for s in (4096, 2048)]
    doc = {"step": "fwd", "versions": {}, "rows": rows, "cases": []}
    md = fb.markdown(doc).splitlines()
    assert md[2] == "| D=128 non-causal | 2k / 4k | 500 / 500 | 625 / 625 | 400 / 400 | 0.80 / 0.80 |"
    assert md[3] == "" and md[4] == "| variant | case | S | TFLOP/s | / FA3 | / twill |"
    assert md[6] == "| v | D=128 non-causal | 2k / 4k | 625 / 625 | 1.00 / 1.00 | 1.250 / 1.250 |"
    assert md[7] == "| bad | D=128 non-causal | 2k / 4k | check failed: x | - / - | - / - |"
    assert fb.variants_markdown({"rows": [fb.build_row(case, 2048, "bf16", 1e12, {}, {}, {})]}) == ""
    text = fb.table(doc).splitlines()
    assert text[2] == "    twill:v  625  /fa3 1.00  /twill 1.250  err 1e-03"
    assert text[3] == "    twill:bad: check failed: x"


def _variant_folder(folder, rows):
    """Emitted-module stand-ins: ``launch(q, k, v)`` is torch's SDPA (``good``), zeros (``zeros``), or the file is
    missing (``missing``); each records the strides of the q it got."""
    folder.mkdir(exist_ok=True)
    bodies = {"good": "torch.nn.functional.scaled_dot_product_attention(q, k, v)", "zeros": "torch.zeros_like(q)"}
    manifest = []
    for name, kind, options in rows:
        manifest.append({"name": name, "file": f"{name}.py", "kernel": "flash-fwd", "options": options})
        if kind != "missing":
            (folder / f"{name}.py").write_text("import torch\nSEEN = []\n\n\ndef launch(q, k, v):\n"
                                               f"    SEEN.append((q.shape[2], q.is_contiguous()))\n"
                                               f"    return {bodies[kind]}\n")
    (folder / fb.MANIFEST).write_text(json.dumps(manifest))
    return str(folder)


@pytest.mark.parametrize("strided", [True, False])
def test_the_forward_step_checks_and_times_the_matching_variants_beside_the_others(strided, tmp_path, monkeypatch):
    """``fwd --variants`` on the CPU: a variant matching a case is one more contender of it, called on the very
    tensors the op gets, checked against fp32 and timed in the same rounds; one that fails its check or its
    import holds the reason and is not timed; a variant of another case is not run; the rows keep their keys."""
    seen = _cpu_stand_ins(monkeypatch, tmp_path, strided=strided)
    d128 = {"head_dim": 128, "dtype": "bf16", "causal": False, "kv_heads": 0}
    folder = _variant_folder(tmp_path / "variants", [
        ("vgood", "good", d128), ("vzeros", "zeros", d128), ("vmissing", "missing", d128),
        ("vd64", "good", {**d128, "head_dim": 64}), ("vcausal", "good", {**d128, "causal": True})])
    out = tmp_path / "out"
    assert fb.main(["fwd", "--out", str(out), "--cases", "d128,d128_causal_kv8", "--seqs", "64",
                    "--variants", folder]) == 0
    doc = json.loads((out / fb.FWD_FILE).read_text())
    assert doc["variants"] == {"folder": folder, "matched": {"d128": ["vgood", "vzeros", "vmissing"]}}
    assert [c.get("variants") for c in doc["cases"]] == [["vgood", "vzeros", "vmissing"], None]
    # timed in the same rounds as the others, the failing and missing ones not at all
    assert seen["timed"] == [["cudnn", "fa3", "twill", "twill:vgood"], ["cudnn", "fa3", "twill"]]
    checks = doc["cases"][0]["checks"]
    assert [c["S"] for c in checks["twill:vgood"]] == [40, 70] and "twill:vmissing" not in checks
    full, grouped = doc["rows"]
    assert "variants" not in grouped and set(full) | {"cudnn_gqa"} == set(grouped) | {"variants"}
    assert isinstance(full["twill_tflops"], float) and full["ratio"] == pytest.approx(0.9)
    good, zeros, missing = (full["variants"][n] for n in ("vgood", "vzeros", "vmissing"))
    assert good["tflops"] == pytest.approx(fb.forward_flops(1, 16, 64, 128, False) / 1.6 / 1e9)
    assert good["ratio_fa3"] == pytest.approx(1.8 / 1.6) and good["ratio_twill"] == pytest.approx(2.0 / 1.6)
    assert 0 < good["relerr"] < 1e-2
    assert zeros["tflops"].startswith("check failed: relative error 1.00e+00") and zeros["ratio_fa3"] is None
    assert missing["tflops"].startswith("import failed: FileNotFoundError") and missing["relerr"] is None
    # the variant read the op's very tensors: FA3's views when the op takes them, else contiguous copies
    launched = sys.modules["twill_gluon_vgood"].SEEN
    assert [s for s, _ in launched] == [40, 70, 64, 64] and {c for _, c in launched} == {not strided}
    assert "| vgood | D=128 non-causal | 64 |" in fb.markdown(doc)


def test_the_variants_step_emits_modules_from_the_shipped_schedules_and_their_manifest(tmp_path, capsys):
    """``variants`` on the CPU (two of its kernels, both shipped schedules, no solver): one module per variant
    through the op's own path, persistent, and a manifest ``fwd --variants`` matches to the non-causal cases."""
    pytest.importorskip("triton", reason="the emitted modules import Triton")
    from twill.codegen.gluon import load_emitted

    picked = tuple(v for v in fb.VARIANTS if v[1] in (64, 256) and v[2] == 2)
    assert fb.generate_variants(str(tmp_path), picked) == 0
    manifest = fb.read_manifest(str(tmp_path))
    assert [r["name"] for r in manifest] == [v[0] for v in picked]
    assert all(r["persistent"] and r["schedule"] == "shipped" and r["bytes"] < 64 << 10 for r in manifest)
    d256 = [r["name"] for r in fb.case_variants(manifest, fb.Case(256, False))]
    assert d256 == ["fa_bf16_d256_bn64_sub2_d2_persistent"]
    assert fb.case_variants(manifest, fb.Case(256, True)) == []
    for row in manifest:
        module = load_emitted(str(tmp_path / row["file"]))
        signature, _ = module.compile_signature()
        assert callable(module.launch) and "work_counter" in signature      # the persistent kernel's queue
    assert capsys.readouterr().out.count("ok    ") == 2
