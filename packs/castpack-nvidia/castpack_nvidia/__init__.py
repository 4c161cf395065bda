"""castcore pack for NVIDIA data-center GPUs: device profiles only.

The profiles in ``profiles/`` (A100 SXM4 80GB, H100 SXM5 and PCIe 80GB, H200 SXM, H20, H800 SXM, B200, B300,
one GPU of a GB200 NVL72 and of a GB300 NVL72 rack, L40S, RTX PRO 6000 Blackwell Server Edition) are read as data
through the ``castcore.profiles`` entry point; every number in them carries its source, and every value carried
from another GPU says so. The pack
declares no estimators: castcore's own formulas and roofline price the operators on these devices.
"""

from __future__ import annotations

CASTCORE_API = 1
