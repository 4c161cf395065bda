"""Quantized KV cache (--kv-cache): a decode step's static cache re-made in that dtype, or a prefill's cache
counted in it."""

from __future__ import annotations

from typing import Any

import torch

from castcore.devices.dtypes import dtype_name
from castcore.hf.causal_lm import own_attention
from castcore.hf.cache import cast_on_write
from castcore.options.catalog import say
from castcore.workload.models import BuiltModel
from castcore.workload.spec import ModelError, Workload


def quantize_cache(built: BuiltModel, workload: Workload, dtype: torch.dtype) -> None:
    option = f"--kv-cache {workload.kv_cache}"  # for the notes
    own = own_attention(built.model, workload.fuse) if isinstance(built.model, torch.nn.Module) else None
    if built.inputs_fn is not None and own is not None:
        raise ModelError(
            f"{say('kv_cache', workload.kv_cache)}: {own} keeps its own attention implementation, which reads "
            f"the cache as it is stored and takes no {dtype_name(dtype)} keys; castcore prices a quantized KV "
            f"cache in its attention kernels: drop {say('kv_cache')}"
        )
    if built.inputs_fn is not None:  # a decode step: the static cache among its inputs
        with_dtype = getattr(built.inputs_fn, "with_cache_dtype", None)
        built.inputs_fn = (
            with_dtype(dtype)
            if with_dtype is not None
            else _recast_cache(built.inputs_fn, dtype, workload.kv_cache)
        )
        built.notes.append(
            f"{option}: the decode step's static KV cache holds keys and values in {dtype_name(dtype)}, "
            "the new token's cast to it as they are written"
            + ("" if workload.fuse else "; eager attention dequantizes the whole cache first")
        )
    elif built.config is not None and (workload.named or built.kv_cache_shape is not None):
        batch, seq, _ = built.kv_cache_shape or (workload.batch, workload.seq, dtype)
        built.kv_cache_shape = (batch, seq, dtype)
        built.notes.append(f"{option}: the KV cache this prefill fills is counted in {dtype_name(dtype)}")
    else:
        raise ModelError(
            f"{say('kv_cache', workload.kv_cache)}: castcore finds no KV cache in this workload (no "
            f"transformers config, no cache among its inputs); drop {say('kv_cache')}"
        )


def _recast_cache(inner: Any, dtype: torch.dtype, kind: str) -> Any:
    """``inner`` (an inputs_fn another step wrapped, e.g. to cut the batch) with the static KV caches it makes
    re-made in ``dtype``, each layer casting the new token's keys and values as it writes them; ``kind`` is the
    kv_cache option's value, which a refusal names."""

    def make():
        args, kwargs = inner()
        layers = [
            layer
            for value in (*args, *kwargs.values())
            for layer in getattr(value, "layers", None) or ()
            if isinstance(getattr(layer, "keys", None), torch.Tensor)
            and hasattr(layer, "lazy_initialization")
        ]
        if not layers:
            raise ModelError(
                f"{say('kv_cache', kind)}: this workload's inputs hold no static KV cache to keep in "
                f"another dtype; drop {say('kv_cache')}"
            )
        for layer in layers:
            layer.lazy_initialization(
                layer.keys.narrow(2, 0, 0).to(dtype), layer.values.narrow(2, 0, 0).to(dtype)
            )
            layer.__class__ = cast_on_write(type(layer))
        return args, kwargs

    return make
