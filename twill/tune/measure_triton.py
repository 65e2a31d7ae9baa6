"""GPU measurement of a Triton target (``twill tune path.py:fn --measure K``); torch and Triton are imported
only when it runs.

Every configuration is compiled with Triton's own schedule and the best ``k`` predicted also with Twill's
schedule injected, launched through the kernel module's ``twill_launch`` hook
(:mod:`twill.integrations.triton.launch`), timed interleaved, and compared with what ``@triton.autotune``
picks over the same configurations (:func:`compare_with_autotune`); ``benchmarks/triton_tune.py`` runs the
same functions over fixed configuration lists and several shapes.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from twill.errors import TwillError
from twill.targets import python_target
from twill.tune.measure import MAX_RELERR, require_gpu, spearman
from twill.tune.predict import Shape

#: The two ways a Triton configuration is compiled: Triton's own software-pipelining schedule, and Twill's
#: schedule injected (``twill.integrations.triton.inject``).
VARIANTS = ("triton", "twill")


def measured_triton_kernel(target: str) -> Any:
    """For ``--measure`` on a Triton target ``path.py:fn``: the kernel, once its module is known to define the
    ``twill_launch`` hook (a one-line error otherwise, before any solve); ``None`` for other targets."""
    match = python_target(target)
    if not match:
        return None
    from twill.integrations.triton.compile import load_kernel

    fn = load_kernel(match.path, match.fn).fn
    launch_hook(fn)
    return fn


def launch_hook(fn: Any) -> Any:
    """The ``twill_launch(fn, shape, **meta)`` hook of the module that defines the ``@triton.jit`` ``fn``
    (:mod:`twill.integrations.triton.launch`); a one-line :class:`TwillError` when it has none."""
    import sys

    module = sys.modules.get(getattr(getattr(fn, "fn", None), "__module__", ""))
    hook = getattr(module, "twill_launch", None)
    if not callable(hook):
        where = getattr(module, "__file__", None) or "its module"
        raise TwillError(f"cannot measure Triton kernel {fn.__name__!r}: {where} defines no "
                         f"twill_launch(fn, shape, **meta) hook (see docs/tuning.md, 'Measuring Triton kernels')")
    return hook


def triton_meta(candidate: Any) -> dict[str, Any]:
    """The launch keywords of a Triton candidate: its constexprs (a string naming a dtype as that
    ``tl.dtype``, as the compile uses it), ``num_warps`` and ``num_stages``."""
    from twill.integrations.triton.compile import dtype_constexpr

    meta = {**{name: dtype_constexpr(value) for name, value in dict(candidate.options).items()},
            "num_warps": candidate.num_warps or 4}
    if candidate.num_stages is not None:
        meta["num_stages"] = candidate.num_stages
    return meta


@contextmanager
def triton_runtime() -> Iterator[str]:
    """Context for JIT launches of both variants; yields a scratch directory. Triton's file cache is off and
    moved to the scratch directory (it is not keyed on the injection hook), and the device allocator that
    on-device TMA descriptors need is set."""
    import torch
    import triton
    from triton import knobs

    saved = (knobs.compilation.always_compile, knobs.cache.dir)
    with tempfile.TemporaryDirectory(prefix="twill-tune-triton-") as scratch:
        knobs.compilation.always_compile, knobs.cache.dir = True, scratch
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        try:
            yield scratch
        finally:
            knobs.compilation.always_compile, knobs.cache.dir = saved


@dataclass(frozen=True)
class HookedKernel:
    """A kernel whose launches ``kernel[grid](...)`` run with ``inspection_hook`` as Triton's stages hook, so
    that every compile they trigger (a new specialization on a later shape included) takes Twill's schedule;
    Triton's own launches never see the hook."""

    fn: Any
    inspection_hook: Any

    def __getitem__(self, grid: Any) -> Any:
        """``fn[grid]`` with the hook set around each call."""
        from triton import knobs

        launch = self.fn[grid]

        def run(*args: Any, **kwargs: Any) -> Any:
            knobs.runtime.add_stages_inspection_hook = self.inspection_hook
            try:
                return launch(*args, **kwargs)
            finally:
                knobs.runtime.add_stages_inspection_hook = None

        return run


def _injected(base: Any, schedule: Any, meta: Mapping[str, Any], machine: Any, workdir: str) -> HookedKernel:
    """A fresh ``JITFunction`` of ``base``'s source whose launches compile with ``schedule`` injected (the load
    lead of ``meta``'s ``num_stages``, as Triton's own schedule uses)."""
    import triton

    from twill.integrations.triton.inject import default_load_lead, make_jit_hook

    return HookedKernel(triton.jit(base.fn), make_jit_hook(
        base.__name__, schedule, machine, workdir=workdir, load_lead=default_load_lead(meta.get("num_stages")),
        capability=machine.capability))


def _first_launch(launch: Any) -> dict[str, int]:
    """Launch once (compiling); the kernel's registers, spills and shared memory."""
    import torch

    kernel = launch()
    torch.cuda.synchronize()
    return {"regs": int(getattr(kernel, "n_regs", 0) or 0), "spills": int(getattr(kernel, "n_spills", 0) or 0),
            "shared_bytes": int(kernel.metadata.shared)}


def time_interleaved(launches: Mapping[str, Any], reps: int) -> dict[str, list[float]]:
    """``do_bench`` medians in µs of each launch, interleaved ``reps`` times, the order reversed every other
    round (A, B, B, A, A, B...), so that clock and thermal drift, and whatever favours the first of a round,
    hit every variant alike."""
    from triton.testing import do_bench

    times: dict[str, list[float]] = {name: [] for name in launches}
    for rep in range(reps):
        for name in (list(launches) if rep % 2 == 0 else list(launches)[::-1]):
            times[name].append(do_bench(launches[name], warmup=25, rep=100, return_mode="median") * 1e3)
    return times


def _failure(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {first}"


def measure_triton_config(base: Any, hook: Any, meta: Mapping[str, Any], schedule: Any, machine: Any,
                          shapes: Sequence[Shape], *, reps: int, workdir: str) -> list[dict[str, Any]]:
    """One configuration of a Triton kernel on each of ``shapes``: Triton's own schedule (``base``) and, when
    ``schedule`` is given, Twill's injected into a fresh ``JITFunction`` of the same source; each checked
    (:data:`MAX_RELERR`) and timed, interleaved. One row per shape; a variant that fails to build, run or
    check is recorded (``<variant>_status``) and not timed. Call inside :func:`triton_runtime`."""
    fns: dict[str, Any] = {"triton": base}
    if schedule is not None:
        fns["twill"] = _injected(base, schedule, meta, machine, workdir)
    failed: dict[str, str] = {}
    built: set[str] = set()
    rows = []
    for shape in shapes:
        row: dict[str, Any] = {"shape": shape.as_dict()}
        launches = {}
        for variant, fn in fns.items():
            if variant in failed:
                row[f"{variant}_status"] = failed[variant]
                continue
            try:
                launch, check = hook(fn, shape.as_dict(), **meta)
                if variant not in built:
                    row[f"{variant}_kernel"] = _first_launch(launch)
                    built.add(variant)
                relerr = max(check(), check())
            except Exception as exc:  # noqa: BLE001 - one configuration failing must not stop the others
                failed[variant] = row[f"{variant}_status"] = f"error: {_failure(exc)}"
                continue
            row[f"{variant}_relerr"] = relerr
            if relerr <= MAX_RELERR:
                row[f"{variant}_status"] = "ok"
                launches[variant] = launch
            else:
                row[f"{variant}_status"] = f"wrong: relative error {relerr:.3g} over {MAX_RELERR:g}"
        for variant, times in time_interleaved(launches, reps).items():
            row[f"{variant}_us_runs"] = [round(t, 3) for t in times]
            row[f"{variant}_us"] = round(min(times), 3)
            row[f"{variant}_tflops"] = round(shape.flops() / min(times) / 1e6, 1)
        if "triton_us" in row and "twill_us" in row:
            row["speedup"] = round(row["triton_us"] / row["twill_us"], 3)
        rows.append(row)
    return rows


def autotune_choice(base: Any, hook: Any, metas: Sequence[Mapping[str, Any]], shape: Shape,
                    reps: int) -> dict[str, Any]:
    """What a real ``@triton.autotune`` over ``metas`` picks on ``shape`` (it times every configuration with
    Triton's own schedule) and the time of its choice; failures are recorded, not raised."""
    import triton

    def config(meta: Mapping[str, Any]) -> Any:
        kwargs = {k: v for k, v in meta.items() if k not in ("num_warps", "num_stages")}
        return triton.Config(kwargs, num_warps=meta["num_warps"], num_stages=meta.get("num_stages", 3))

    try:
        tuned = triton.autotune(configs=[config(m) for m in metas], key=[])(base)
        launch, check = hook(tuned, shape.as_dict())
        relerr = check()                      # the first launch runs the autotuning
        best = tuned.best_config
        times = time_interleaved({"autotune": launch}, reps)["autotune"]
    except Exception as exc:  # noqa: BLE001 - the cross-check must not stop the run
        return {"status": f"error: {_failure(exc)}"}
    return {"status": "ok" if relerr <= MAX_RELERR else f"wrong: relative error {relerr:.3g}",
            "settings": {**best.kwargs, "num_warps": best.num_warps, "num_stages": best.num_stages},
            "relerr": relerr, "us": round(min(times), 3)}


#: Interleaved rounds of the final head-to-head between autotune's choice and Twill-tuned.
HEAD_TO_HEAD_REPS = 8


def head_to_head(base: Any, hook: Any, auto_meta: Mapping[str, Any], tuned_meta: Mapping[str, Any],
                 schedule: Any, machine: Any, shape: Shape, *, reps: int, workdir: str) -> dict[str, Any]:
    """Autotune's choice (its configuration with Triton's own schedule) and Twill-tuned (its configuration with
    Twill's ``schedule`` injected, or Triton's own where it is None: kept), built again, checked on fresh data
    and timed together, interleaved ``reps`` times. Each pick was the fastest of its own measurements, and the
    fastest of many noisy measurements reads low (autotune's the more: it picks among every configuration,
    Twill among its top K), so the two picks are compared on new measurements. Returns both runs, their best
    and ``ratio`` (autotune's time over Twill-tuned's, > 1 = Twill faster); a failure is recorded in
    ``status``, not raised."""
    try:
        twill_fn = base if schedule is None else _injected(base, schedule, tuned_meta, machine, workdir)
        launches = {}
        for name, fn, meta in (("autotune", base, auto_meta), ("twill", twill_fn, tuned_meta)):
            launch, check = hook(fn, shape.as_dict(), **meta)
            relerr = max(check(), check())
            if relerr > MAX_RELERR:
                return {"status": f"{name}: wrong: relative error {relerr:.3g} over {MAX_RELERR:g}"}
            launches[name] = launch
        times = time_interleaved(launches, reps)
    except Exception as exc:  # noqa: BLE001 - the head-to-head must not stop the run
        return {"status": f"error: {_failure(exc)}"}
    auto, tuned = min(times["autotune"]), min(times["twill"])
    return {"status": "ok", "reps": reps, "autotune_us_runs": [round(t, 3) for t in times["autotune"]],
            "twill_us_runs": [round(t, 3) for t in times["twill"]], "autotune_us": round(auto, 3),
            "twill_us": round(tuned, 3), "ratio": round(auto / tuned, 3)}


def _shipped(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` with ``tuned_us``: the time of the kernel Twill would ship for its configuration, Twill's schedule
    (``twill_us``) where it is injected, Triton's own (``triton_us``) where Twill keeps it (``injected`` False)."""
    out = dict(row)
    out["tuned_us"] = row.get("twill_us") if row.get("injected", True) else row.get("triton_us")
    return out


def compare_with_autotune(rows: Sequence[Mapping[str, Any]], top: int) -> dict[str, Any]:
    """The comparison of one shape from its per-configuration rows (``label``, ``predicted_rank`` — ``None``
    when Twill has no schedule for it —, ``predicted_us``, ``triton_us``, ``twill_us``):

    * ``autotune_choice``: the configuration with the best Triton schedule (``@triton.autotune``'s pick);
    * ``twill_tuned``: the best kernel Twill ships among the ``top`` best predicted configurations: Twill's
      schedule where it is injected, Triton's own where a row's ``injected`` is False (:func:`_shipped`);
    * ``twill_best``: the best kernel Twill ships of all configurations;
    * ``ratio`` and ``ratio_best``: autotune's time over Twill-tuned's (and over the best), > 1 = Twill faster;
    * ``slower_than_triton``: the configurations whose injected Twill schedule is slower than Triton's own;
    * ``kept``: the configurations where Twill keeps Triton's own schedule;
    * ``spearman``: rank correlation of predicted and measured times of the kernels Twill ships.
    """
    def best(key: str, keep: Any) -> Mapping[str, Any] | None:
        timed = [r for r in rows if r.get(key) is not None and keep(r)]
        return min(timed, key=lambda r: r[key], default=None)

    rows = [_shipped(r) for r in rows]
    auto = best("triton_us", lambda r: True)
    tuned = best("tuned_us", lambda r: r.get("predicted_rank") is not None and r["predicted_rank"] < top)
    overall = best("tuned_us", lambda r: True)
    paired = [r for r in rows if r.get("tuned_us") is not None and r.get("predicted_us") is not None]
    out: dict[str, Any] = {
        "top_k": top,
        "autotune_choice": auto and {"label": auto["label"], "us": auto["triton_us"]},
        "twill_tuned": tuned and {"label": tuned["label"], "us": tuned["tuned_us"],
                                  "injected": tuned.get("injected", True)},
        "twill_best": overall and {"label": overall["label"], "us": overall["tuned_us"]},
        "slower_than_triton": [r["label"] for r in rows if r.get("injected", True) and r.get("speedup") is not None
                               and r["speedup"] < 1.0],
        "kept": [r["label"] for r in rows if r.get("injected") is False],
        "spearman": spearman([r["predicted_us"] for r in paired], [r["tuned_us"] for r in paired]),
    }
    if auto and tuned:
        out["ratio"] = round(auto["triton_us"] / tuned["tuned_us"], 3)
    if auto and overall:
        out["ratio_best"] = round(auto["triton_us"] / overall["tuned_us"], 3)
    return out


def measure_triton(fn: Any, results: Sequence[Any], shape: Shape, k: int, machine: Any,
                   reps: int = 2) -> dict[str, Any]:
    """``twill tune path.py:fn --measure K``: every configuration of the sweep (``results``, ranked) with
    Triton's own schedule — what ``@triton.autotune`` chooses among —, the ``k`` best predicted also with
    Twill's schedule; then a real ``@triton.autotune`` over the same configurations as a cross-check.
    Returns ``{"rows": [...], "comparison": ...}`` (:func:`compare_with_autotune`)."""
    hook = launch_hook(fn)
    require_gpu()
    solved = [r for r in results if r.prediction is not None]
    rows = []
    with triton_runtime() as workdir:
        for result in results:
            rank = next((i for i, r in enumerate(solved) if r is result), None)
            top = rank is not None and rank < k
            schedule = result.schedule if top and result.injected is not False else None
            row = measure_triton_config(fn, hook, triton_meta(result.candidate), schedule, machine, [shape],
                                        reps=reps, workdir=workdir)[0]
            row.update(label=result.candidate.label(), settings=result.candidate.settings(), predicted_rank=rank,
                       predicted_us=round(result.prediction.microseconds, 3) if rank is not None else None)
            if top and result.injected is not None:
                row["injected"] = result.injected
            rows.append(row)
        ran = [triton_meta(r.candidate) for r, row in zip(results, rows) if row.get("triton_us") is not None]
        autotune = autotune_choice(fn, hook, ran, shape, reps) if ran else {"status": "no configuration ran"}
        comparison = {**compare_with_autotune(rows, k), "autotune": autotune}
        if comparison["autotune_choice"] and comparison["twill_tuned"]:
            by_label = {r.candidate.label(): r for r in results}
            auto = by_label[comparison["autotune_choice"]["label"]]
            tuned = by_label[comparison["twill_tuned"]["label"]]
            comparison["head_to_head"] = head_to_head(
                fn, hook, triton_meta(auto.candidate), triton_meta(tuned.candidate),
                tuned.schedule if tuned.injected is not False else None, machine, shape,
                reps=max(reps, HEAD_TO_HEAD_REPS), workdir=workdir)
    return {"rows": rows, "comparison": comparison}


def format_triton_measured(measured: Mapping[str, Any]) -> str:
    """Predicted vs measured per configuration, then autotune's choice against Twill-tuned."""
    from twill.integrations.triton.inject import INJECT_MIN_GAIN
    from twill.schedule.report import _table

    table = []
    for row in measured["rows"]:
        bad = [row[f"{v}_status"] for v in VARIANTS if row.get(f"{v}_status", "ok") != "ok"]
        rank = row["predicted_rank"]
        kept = row.get("injected") is False
        table.append(["-" if rank is None else rank + 1, row["label"], row["predicted_us"] or "-",
                      row.get("triton_us", "-"), "Triton's kept" if kept else row.get("twill_us", "-"),
                      row.get("speedup", "-"), "; ".join(bad) or "ok"])
    comp = measured["comparison"]
    lines = ["predicted vs measured (us, do_bench medians; Triton = Triton's own schedule, Twill = Twill's "
             "schedule injected):"]
    lines += _table(["rank", "configuration", "predicted us", "Triton us", "Twill us", "speedup", "status"],
                    table)
    auto, tuned, cross = comp["autotune_choice"], comp["twill_tuned"], comp["autotune"]
    if auto:
        lines.append(f"autotune's choice (best Triton schedule of {len(table)} configurations): "
                     f"{auto['label']}, {auto['us']} us")
    if cross.get("settings"):
        picked = " ".join(f"{k}={v}" for k, v in cross["settings"].items())
        lines.append(f"@triton.autotune picked {picked}, {cross['us']} us ({cross['status']})")
    else:
        lines.append(f"@triton.autotune: {cross['status']}")
    if tuned and auto:
        which = "Twill's schedule" if tuned.get("injected", True) else "Triton's own schedule, kept"
        lines.append(f"Twill-tuned (best of the top {comp['top_k']} predicted, each with Twill's schedule where "
                     f"the model predicts it {INJECT_MIN_GAIN:.0%} faster than Triton's): {tuned['label']} "
                     f"({which}), {tuned['us']} us: {comp['ratio']:.3f}x autotune's choice")
    both = comp.get("head_to_head")
    if both and both["status"] == "ok":
        lines.append(f"the two picks timed again together ({both['reps']} interleaved rounds): autotune's choice "
                     f"{both['autotune_us']} us, Twill-tuned {both['twill_us']} us: {both['ratio']:.3f}x")
    elif both:
        lines.append(f"the two picks timed again together: {both['status']}")
    return "\n".join(lines)
