"""Tiled GEMM (``gemm``): the loop graph (:mod:`.graph`), its kernel plan (:mod:`.plan`), a body per backend
(:mod:`.gluon`, :mod:`.pallas`, :mod:`.tilelang`) and the tuner's cost hooks (:mod:`.tune`)."""

from twill.kernels import Family

#: Roles of the GEMM graph's ops.
ROLES = ("load_a", "load_b", "mma", "mma_wait")


def _claims(roles: frozenset[str]) -> bool:
    """A graph of GEMM roles only, with an ``mma``."""
    return roles <= set(ROLES) and "mma" in roles


FAMILY = Family(name="gemm", package=__name__, planned=True, backends=("gluon", "pallas", "tilelang"), tuned=True,
                persistent=True, claims=_claims,
                summary="tiled GEMM: TMA loads of A/B, wgmma/tcgen05, accumulator")
