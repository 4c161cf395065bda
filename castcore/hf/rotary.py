"""The rotary-embedding functions of transformers' modeling modules, found and swapped for castcore's fused ones.
Relies on an attention looking them up in its modeling module's globals (checked 5.5.0-5.24.0).
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
import torch

from castcore.hf.causal_lm import is_transformers_module


def standard_rotary(model: torch.nn.Module) -> dict[tuple[types.ModuleType, str], Callable]:
    """The rotary functions an attention with ``q_proj`` calls, by (modeling module, name), when castcore knows
    them: ``apply_rotary_pos_emb`` (q, k, cos, sin, unsqueeze_dim; ``rotate_half``, or gpt-oss's half angles) and
    Llama 4's ``apply_rotary_emb`` (xq, xk, freqs_cis: complex angles, pairs interleaved). Relies on the attention
    looking them up in its module's globals (checked 5.5.0-5.24.0)."""
    found: dict[tuple[types.ModuleType, str], Callable] = {}
    for module in model.modules():
        if not (is_transformers_module(module) and hasattr(module, "q_proj")):
            continue
        home = sys.modules[type(module).__module__]
        original = getattr(home, "apply_rotary_pos_emb", None)
        if original is not None and (hasattr(home, "rotate_half") or half_angle_rotary(original)):
            params = list(inspect.signature(original).parameters)
            if params[:4] == ["q", "k", "cos", "sin"] and "unsqueeze_dim" in params:
                found[home, "apply_rotary_pos_emb"] = original
        complex_angles = getattr(home, "apply_rotary_emb", None)
        if complex_angles is not None and list(inspect.signature(complex_angles).parameters) == [
            "xq",
            "xk",
            "freqs_cis",
        ]:
            found[home, "apply_rotary_emb"] = complex_angles
    return found


def half_angle_rotary(original: Callable) -> bool:
    """gpt-oss's ``apply_rotary_pos_emb``: cos and sin hold each angle once (half the head), the two halves rotated
    by ``_apply_rotary_emb`` as rotate_half rotates them, so the same rotation as with the angles written twice
    (checked 5.5.0-5.24.0)."""
    home = sys.modules.get(getattr(original, "__module__", ""))
    return home is not None and hasattr(home, "_apply_rotary_emb") and not hasattr(home, "rotate_half")


@contextmanager
def rotary_swapped(
    originals: dict[tuple[types.ModuleType, str], Callable], replacement: Callable[[Callable], Callable]
) -> Iterator[None]:
    """Each module's rotary function (``standard_rotary``) replaced by ``replacement(original)``, then put back."""
    try:
        for (home, name), original in originals.items():
            setattr(home, name, replacement(original))
        yield
    finally:
        for (home, name), original in originals.items():
            setattr(home, name, original)
