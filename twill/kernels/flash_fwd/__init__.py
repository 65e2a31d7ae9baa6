"""Flash attention forward (``flash-fwd``): the loop graph (:mod:`.graph`), its kernel plan (:mod:`.plan`), a
body per backend (:mod:`.gluon`, :mod:`.pallas`, :mod:`.tilelang`) and the tuner's cost hooks (:mod:`.tune`)."""

from twill.kernels import Family

#: Roles of the attention forward graph's ops.
ROLES = ("load_k", "load_v", "qk", "rowmax", "exp", "rowsum", "alpha", "rescale", "pv", "convert")


def _claims(roles: frozenset[str]) -> bool:
    """A graph with a ``qk`` and a ``pv`` op."""
    return "qk" in roles and "pv" in roles


FAMILY = Family(name="flash-fwd", package=__name__, planned=True, backends=("gluon", "pallas", "tilelang"),
                tuned=True, persistent=True, aliases=("flash_fwd",), claims=_claims,
                summary="flash attention forward (Triton-tutorial structure), --subtiles 1|2|3")
