"""``twill ops``: the kernels of ``twill.ops.attention``.

    twill ops prepare --head-dim 128 --dtype bf16 --causal   # emit one configuration's modules into the cache
    twill ops regenerate                                      # solve the shipped schedules again (minutes)
    twill ops regenerate --kernel flash-fwd -o DIR            # the forward's only, into another folder
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from twill.errors import TwillError
from twill.files import check_outputs


def _cmd_prepare(args: argparse.Namespace) -> int:
    from twill.ops.flash import cache_dir, prepare

    try:
        path = prepare(args.head_dim, args.dtype, causal=args.causal, kv_heads=args.kv_heads,
                       backward=not args.no_backward)
    except OSError as exc:
        raise TwillError(f"cannot write the kernel cache {cache_dir()}: {exc.strerror or exc}") from None
    print(path)
    return 0


def _cmd_regenerate(args: argparse.Namespace) -> int:
    from twill.ops.shipped import SCHEDULE_DIR, regenerate

    folder = Path(args.output) if args.output else SCHEDULE_DIR
    check_outputs(folders=[str(folder)])

    def progress(message: str) -> None:
        print(f"twill: {message}", file=sys.stderr, flush=True)

    written = regenerate(folder, kernels=args.kernel or _kernels(), progress=progress)
    print(f"wrote {len(written)} schedules to {folder}")
    return 0


def _kernels() -> tuple[str, ...]:
    from twill.ops.flash import BACKWARD, FORWARD

    return FORWARD.name, BACKWARD.name


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ops", help="the kernels of twill.ops.attention: prepare them, regenerate their schedules")
    actions = p.add_subparsers(dest="ops_action", metavar="ACTION")
    actions.required = True
    g = actions.add_parser("prepare", help="emit one configuration's kernel modules into the kernel cache (no GPU, "
                                           "no solver) and print the forward module's path")
    g.add_argument("--head-dim", type=int, required=True, help="64, 128 or 256")
    g.add_argument("--dtype", required=True,
                   help="fp16, bf16 or fp8e4m3 (or float16, bfloat16, float8_e4m3fn); fp8e4m3 with --no-backward")
    g.add_argument("--causal", action="store_true", help="the causal mask")
    g.add_argument("--kv-heads", type=int, default=0, metavar="N",
                   help="K/V head count of grouped-query attention (default 0: as many as the query heads)")
    g.add_argument("--no-backward", action="store_true", help="the forward only")
    g.set_defaults(func=_cmd_prepare)
    r = actions.add_parser("regenerate", help="solve the schedules twill.ops ships again and write them (minutes: "
                                              "the backward's are checked by ptxas; needs OR-Tools and Triton)")
    r.add_argument("-o", "--output", default=None, metavar="DIR",
                   help="folder to write the schedule files into (default: the package's twill/ops/schedules)")
    r.add_argument("--kernel", action="append", choices=_kernels(), default=None,
                   help="regenerate this kernel's schedules only (repeatable; default both)")
    r.set_defaults(func=_cmd_regenerate)
