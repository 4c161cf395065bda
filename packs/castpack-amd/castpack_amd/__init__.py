"""castcore pack for AMD Instinct MI300X, MI325X and MI355X: device profiles only.

castcore imports this module through the entry point in pyproject.toml. Everything declared
while it is imported belongs to this pack: any ``@pack.hookimpl`` functions here. It declares
none: a pack of device profiles only, whose operators castcore's own formulas and roofline price.
The device profiles in ``profiles/`` are read as data through the ``castcore.profiles`` entry point.
"""

from __future__ import annotations

PACK = "castpack-amd"
DEVICE = "mi300x"
CASTCORE_API = 1
