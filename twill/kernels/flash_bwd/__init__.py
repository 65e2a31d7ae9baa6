"""Flash attention backward (``flash-bwd``): the loop graph (:mod:`.graph`), its kernel plan (:mod:`.plan`),
its Gluon body (:mod:`.gluon`) and the tuner's cost hooks (:mod:`.tune`)."""

from twill.kernels import Family

FAMILY = Family(name="flash-bwd", package=__name__, planned=True, backends=("gluon",), tuned=True,
                summary="flash attention backward, single-pass FA3 algorithm (5 GEMMs, exp, dQ atomic add)")
