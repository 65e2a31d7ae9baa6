"""Real Triton kernels that the Triton frontend schedules (``twill graph``, ``twill inject``).

Each module holds one ``@triton.jit`` kernel plus the compile settings the tests and the A/B benchmark use
(``SIGNATURE``, ``CONSTEXPRS``, ``NUM_WARPS``, ``NUM_STAGES``), a ``grid`` helper and the ``twill_launch``
hook of ``twill tune --measure`` (:mod:`twill.integrations.triton.launch`). Import
them only where Triton is installed.
"""
