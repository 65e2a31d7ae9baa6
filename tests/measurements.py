"""Synthetic microbenchmark measurements shared by the calibration and tuning tests."""

from __future__ import annotations


def calibration_rows() -> list[dict]:
    """A small synthetic measurement set: every microbenchmark the fit needs, with round numbers."""
    rows = []
    for dtype in ("fp16", "bf16"):
        for n, one, two in ((64, 3000.0, 3800.0), (256, 3900.0, 4000.0)):
            rows.append({"bench": "mma", "args": {"n": n, "dtype": dtype, "groups": 1, "lag": 1},
                         "result": {"n": n, "dtype": dtype, "groups": 1, "flops_per_clk": one}})
            rows.append({"bench": "mma", "args": {"n": n, "dtype": dtype, "groups": 2, "lag": 1},
                         "result": {"n": n, "dtype": dtype, "groups": 2, "flops_per_clk": two}})
    for n, cycles in ((64, 200.0), (256, 600.0)):
        rows.append({"bench": "mma", "args": {"n": n, "dtype": "fp16", "groups": 1, "lag": 0},
                     "result": {"n": n, "dtype": "fp16", "groups": 1, "cycles_per_group": cycles}})
    for op, one, best in (("exp2", 12.0, 15.0), ("fma", 100.0, 120.0), ("rowmax", 30.0, 40.0),
                          ("rowsum", 30.0, 50.0)):
        rows.append({"bench": "elementwise", "args": {"op": op, "groups": 1},
                     "result": {"op": op, "groups": 1, "elements_per_clk": one}})
        rows.append({"bench": "elementwise", "args": {"op": op, "groups": 3},
                     "result": {"op": op, "groups": 3, "elements_per_clk": best}})
    rows.append({"bench": "smem", "args": {"groups": 2}, "result": {"bytes_per_clk": 100.0}})
    rows.append({"bench": "tma", "args": {"depth": 1}, "result": {"depth": 1, "cycles_per_tile": 1200.0,
                                                                   "bytes_per_clk": 13.0}})
    rows.append({"bench": "tma", "args": {"depth": 4}, "result": {"depth": 4, "cycles_per_tile": 500.0,
                                                                   "bytes_per_clk": 30.0}})
    rows.append({"bench": "tma", "args": {"depth": 1, "hot_mb": 16},
                 "result": {"depth": 1, "hot_mb": 16, "cycles_per_tile": 700.0, "bytes_per_clk": 24.0}})
    rows.append({"bench": "tma", "args": {"depth": 4, "hot_mb": 16},
                 "result": {"depth": 4, "hot_mb": 16, "cycles_per_tile": 300.0, "bytes_per_clk": 50.0}})
    rows.append({"bench": "tma", "args": {"depth": 4, "hot_mb": 1},
                 "result": {"depth": 4, "hot_mb": 1, "cycles_per_tile": 200.0, "bytes_per_clk": 80.0}})
    rows.append({"bench": "handoff", "args": {"worker_warps": 4}, "result": {"cycles_per_handoff": 70.0}})
    rows.append({"bench": "launch", "args": {}, "result": {"launch_us": 2.5}})
    rows.append({"bench": "clock", "args": {}, "result": {"clock_ghz": 1.9, "wgmma_clock_ghz": 1.7}})
    rows.append({"bench": "smem", "args": {"groups": 3}, "error": "AssertionError: failed on purpose"})
    return rows
