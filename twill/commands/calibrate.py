"""``twill calibrate``: measure the GPU and write a calibrated machine model (``twill-machine/1``).

    twill calibrate --arch h200 -o h200.machine.json --raw h200.raw.json     # on the GPU machine
    twill calibrate --from-raw h200.raw.json -o h200.machine.json             # re-fit recorded data (CPU)
    twill calibrate --from-raw h200.raw.json --clock-fit kernel_clock.json -o h200.machine.json   # + clock model
    twill schedule flash-fwd --machine h200.machine.json                      # use it
"""

from __future__ import annotations

import argparse
import sys

from twill.commands.common import input_files
from twill.files import check_outputs, message_stream, write_json_output
from twill.commands.common import arch_choice
from twill.errors import TwillError


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from twill.machine.calibrate import calibrate, fit, fit_clock_model
    from twill.machine.calibration import (clock_model_from_dict, format_calibration, machine_to_dict,
                                           read_kernel_clock, read_raw_calibration)
    from twill.machine.models import get_machine

    if args.output == "-" and args.raw == "-":
        raise TwillError("-o and --raw cannot both be '-' (stdout); give one of them a file")
    check_outputs(files=[args.output, args.raw], inputs=input_files(args))
    out = message_stream(args.output, args.raw)     # stderr when stdout carries an output
    clocks = read_kernel_clock(args.clock_fit) if args.clock_fit else None
    if args.from_raw:
        if args.raw:
            raise TwillError("--raw writes new measurements; it cannot be combined with --from-raw")
        raw = read_raw_calibration(args.from_raw)
        base = get_machine(args.arch or raw.get("base", ""))
        machine = fit(raw["measurements"], base)
    else:
        def progress(message: str) -> None:
            print(f"twill: {message}", file=sys.stderr, flush=True)

        machine, raw = calibrate(args.arch or "h100", quick=args.quick, progress=progress)
        if args.raw:
            write_json_output(args.raw, raw)
    if clocks is not None:
        source = f"{clocks.get('gpu', '')} {clocks.get('date', '')}".strip()
        model = fit_clock_model(clocks["rows"], machine, source=source)
        machine = replace(machine, clock_model=clock_model_from_dict(model, "clock model"))
    doc = machine_to_dict(machine, gpu=raw.get("software", {}).get("device", ""), measured=raw.get("measured", ""),
                          software=raw.get("software"), name=args.name)
    write_json_output(args.output, doc)
    cal = machine.calibration
    where = "stdout" if args.output == "-" else args.output
    print(f"wrote {where}: {doc['name']} ({doc['gpu'] or machine.name}), sustained clock "
          f"{machine.sustained_clock_ghz:.3f} GHz, fp16 wgmma n256 {cal.mma_rate('fp16', 256):.0f} FLOP/clk/SM "
          f"({cal.mma_rate('fp16', 256) / machine.tc_flops_per_clk['fp16']:.0%} of datasheet), ex2 "
          f"{cal.ex2_per_clk:.1f}/clk, handoff {cal.barrier_handoff_cycles:.0f} clk", file=out)
    if machine.clock_model:
        print(f"clock model: 1/f = {machine.clock_model['ns_per_clk']:.4f} + "
              f"{machine.clock_model['ns_per_tensor_clk']:.4f} x tensor-core duty ns per cycle "
              f"({machine.clock_at(0.5):.3f} GHz at duty 0.5, {machine.clock_at(1.0):.3f} at 1.0)", file=out)
    if args.table:
        print(format_calibration(machine), file=out)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure the GPU and write a calibrated machine model (GPU)")
    p.add_argument("--arch", default=None, type=arch_choice,
                   help="built-in machine the measurements refine (h100, h200; default h100, or the raw file's)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.json",
                   help="machine model to write ('-' for stdout)")
    p.add_argument("--raw", default=None, metavar="FILE.json",
                   help="also write every raw measurement here ('-' for stdout)")
    p.add_argument("--from-raw", default=None, metavar="FILE.json",
                   help="fit from measurements recorded with --raw instead of measuring (no GPU needed)")
    p.add_argument("--clock-fit", default=None, metavar="FILE.json",
                   help="also fit the clock model (SM clock vs tensor-core duty) to the GEMM rows of a "
                        "benchmarks/kernel_clock.py measurement")
    p.add_argument("--name", default=None, help="model name written in the file (default '<arch>-calibrated')")
    p.add_argument("--table", action="store_true", help="print the fitted rates beside the datasheet's")
    p.add_argument("--quick", action="store_true", help="fewer instruction widths and dtypes (about a minute)")
    p.set_defaults(func=_cmd_calibrate)
