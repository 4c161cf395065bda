"""castcore pack for AMD Instinct MI300X, MI325X and MI355X: device profiles, and AITER's fused MoE.

castcore imports this module through the entry point in pyproject.toml. Everything declared
while it is imported belongs to this pack: the estimators in ``aiter_moe`` price a routed-experts
block's parts as AITER's fused MoE kernel runs them on these GPUs; every other operator is priced
by castcore's own formulas and roofline with the profiles' constants.
The device profiles in ``profiles/`` are read as data through the ``castcore.profiles`` entry point.
"""

from __future__ import annotations

from . import aiter_moe  # noqa: F401  (its decorators declare this pack's claims)

PACK = "castpack-amd"
DEVICE = "mi300x"
CASTCORE_API = 1
