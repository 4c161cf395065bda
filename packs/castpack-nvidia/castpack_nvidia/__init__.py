"""castcore pack for NVIDIA data-center GPUs: device profiles only.

The profiles in ``profiles/`` (A100 SXM4 80GB, H100 SXM5 and PCIe 80GB, H200 SXM, B200, L40S) are read as
data through the ``castcore.profiles`` entry point; every number in them carries its source. The pack
declares no estimators: castcore's own formulas and roofline price the operators on these devices.
"""

from __future__ import annotations

CASTCORE_API = 1
