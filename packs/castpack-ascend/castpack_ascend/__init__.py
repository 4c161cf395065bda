"""castcore pack for Huawei Ascend NPUs.

- device profiles: TOML data files in ``profiles/``, every number sourced;
- estimators for aten ops that reflect the Da Vinci core (``cube``: base blocks in waves over the AI cores,
  fractal padding; ``vector``: 32-byte rows; ``hardware``: the fixed cost per kernel);
- fused operators in the ``ascend`` torch.library namespace (``ops``) with their work and time (``fused``);
- ``fuse_model``: swaps a stock Hugging Face Llama / Qwen2 / Mistral's modules for ones calling them (``fuse``).
"""

from __future__ import annotations



from . import cube, fused, ops, vector  # noqa: F401  (their decorators declare this pack's claims)
from .fuse import fuse_model  # noqa: F401  (a castcore hook)

__all__ = ["fuse_model"]
