"""The paper's running example (``paper-example``): its loop graph only (:mod:`.graph`)."""

from twill.kernels import Family

FAMILY = Family(name="paper-example", package=__name__,
                summary="the paper's running example: S = gemm, P = exp, O += gemm (unit costs)")
