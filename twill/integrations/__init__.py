"""Host-compiler integrations: everything Twill needs to read, schedule and rebuild another compiler's kernels.

* :mod:`twill.integrations.triton` — Triton kernels (``path.py:fn`` or a TTGIR dump): compiled to the
  pre-pipeline TTGIR, lowered to a loop graph, Twill's schedule injected before Triton's pipeliner
  (:mod:`~twill.integrations.triton.inject`), launched through their modules' hooks
  (:mod:`~twill.integrations.triton.launch`); real kernels in :mod:`twill.integrations.triton.kernels`.
* :mod:`twill.integrations.tilelang` — TileLang kernels: a ``T.Pipelined`` loop lowered to a loop graph and
  rewritten with Twill's stage/order or warp assignment (:mod:`~twill.integrations.tilelang.planner`).

Importing these packages imports neither Triton nor TileLang; their functions do when called.
"""
