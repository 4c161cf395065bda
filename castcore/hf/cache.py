"""The KV cache of a decode step as castcore pre-fills it, through transformers' cache classes: ``StaticCache``
and its layers, ``cache_utils.Cache`` (checked 5.5.0-5.24.0, as each function says)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from castcore.devices.dtypes import torch_dtype
from castcore.errors import ModelError
from castcore.options.catalog import say

if TYPE_CHECKING:
    from transformers import PreTrainedConfig, PreTrainedModel

CACHE_ARGUMENTS = (
    "cache",
    "past_key_values",
)  # the names a forward takes its KV cache by (see cache_argument)


def cache_argument(model: torch.nn.Module) -> str:
    """The name the model's forward takes its KV cache by: ``cache`` from transformers 5.24.0 (which deprecates
    ``past_key_values`` with a FutureWarning), ``past_key_values`` before."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_layers(value: object) -> list | None:
    """``value.layers`` when value is a transformers Cache (one object per model layer), else None. Looked up in
    ``sys.modules`` so that a model that is not a transformers model never imports it. Relies on
    ``cache_utils.Cache.layers`` (checked 5.5.0-5.24.0)."""
    cache = getattr(sys.modules.get("transformers.cache_utils"), "Cache", None)
    layers = getattr(value, "layers", None) if cache is not None and isinstance(value, cache) else None
    return layers if isinstance(layers, list) else None


def kv_written(attention: torch.nn.Module, tp: int) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(heads, dim) of the keys and of the values one attention module writes to its cache layer on one device,
    where they are not num_key_value_heads x head_dim; None where they are. Relies on the attention classes'
    attributes and on DeepSeek-V3's ``expand_kv``, whose presence means transformers caches the latent
    (checked 5.5.0-5.24.0)."""
    config = getattr(attention, "config", None)
    # castcore.deploy.kernels.latent: one entry, held in the keys
    if getattr(attention, "castcore_latent", False) and config is not None:
        return (1, config.kv_lora_rank + config.qk_rope_head_dim), (1, 0)
    if hasattr(attention, "kv_a_proj_with_mqa") and config is not None:  # multi-head latent attention, eager
        if hasattr(type(attention), "expand_kv"):
            return (1, config.kv_lora_rank), (1, config.qk_rope_head_dim)
        heads = config.num_attention_heads // tp
        return (heads, config.qk_nope_head_dim + config.qk_rope_head_dim), (heads, config.v_head_dim)
    if hasattr(attention, "new_decoder_architecture"):  # Falcon: multi-query, or grouped and then expanded
        heads = attention.num_heads if attention.new_decoder_architecture else attention.num_kv_heads
        # Falcon's ints, which torch's Module.__getattr__ types as tensors or submodules
        return (heads, attention.head_dim), (heads, attention.head_dim)  # type: ignore[return-value]
    return None


def decode_inputs(
    model: PreTrainedModel,
    batch: int,
    kv_len: int,
    dtype: torch.dtype,
    tp: int = 1,
    cache_dtype: torch.dtype | None = None,
) -> DecodeInputs:
    """Inputs of one decode step, as a function run inside the fake mode (so nothing is allocated): one new token
    over a static KV cache already holding ``kv_len`` tokens, written in place as serving engines do. With ``tp``
    > 1 the cache is one device's (num_key_value_heads / tp heads; ``per_device(n)`` makes that one); it holds
    ``cache_dtype`` (``with_cache_dtype(d)``; the step casts as it writes); ``with_kv_len(n)`` makes the same
    inputs over ``n`` cached tokens. A layer whose attention writes another shape (``kv_written``: multi-query,
    latent) gets that shape, read from the model as it is captured (fused and sharded). Relies on
    ``StaticCache(config=, max_cache_len=)``, each layer's ``lazy_initialization(keys, values)``, which sizes it,
    and its ``cumulative_length`` tensor (checked 5.5.0-5.24.0)."""
    config = model.config
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if tp > 1 and kv_heads % tp and not getattr(config, "kv_lora_rank", None):
        raise ModelError(
            f"{say('tp', tp)}: num_key_value_heads = {kv_heads} does not divide by {tp}; each device "
            f"holds num_key_value_heads / {tp} heads of the decode step's KV cache (choose a "
            f"{say('tp')} that divides it)"
        )
    standard = ((kv_heads // tp, head_dim),) * 2
    return DecodeInputs(model, config, batch, kv_len, dtype, tp, cache_dtype, standard, cache_argument(model))


class _StaticLayer(Protocol):
    """What castcore uses of a static cache layer (transformers' StaticLayer and its subclasses)."""

    cumulative_length: torch.Tensor

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None: ...


@dataclass(frozen=True, eq=False)
class DecodeInputs:
    """What ``decode_inputs`` makes: called, the inputs of one decode step; ``per_device``,
    ``with_cache_dtype`` and ``with_kv_len`` make the same step's inputs with one thing changed."""

    model: PreTrainedModel
    config: PreTrainedConfig  # the model's config when decode_inputs was called
    batch: int
    kv_len: int
    dtype: torch.dtype
    tp: int
    cache_dtype: torch.dtype | None
    standard: tuple[tuple[int, int], ...]  # (heads, dim) of the keys and values of a layer kv_written leaves
    argument: str  # the name the forward takes its cache by (cache_argument)
    # the class a static layer takes so its update writes as a serving engine does (with_writes)
    writes: Callable[[type], type] | None = None

    def __call__(self) -> tuple[tuple, dict[str, object]]:
        from transformers import StaticCache

        written = {
            getattr(m, "layer_idx", None): kv_written(m, self.tp)
            for m in self.model.modules()
            if type(m).__name__.endswith("Attention")
        }
        cache = StaticCache(config=self.config, max_cache_len=self.kv_len + 1)
        dtype = self.cache_dtype or self.dtype
        # StaticLayers: transformers types Cache.layers for every kind of cache, and their cumulative_length as
        # the int other layers hold
        layers: list[_StaticLayer] = cache.layers  # type: ignore[assignment]
        for index, layer in enumerate(layers):
            if not hasattr(layer, "cumulative_length"):  # a linear-attention layer: its states, not keys
                if hasattr(layer, "recurrent_states"):  # (Nemotron-H's MLP layers hold a DummyLayer: nothing)
                    self._hold_states(layer, index, dtype)
                continue
            (k_heads, k_dim), (v_heads, v_dim) = written.get(index) or self.standard
            layer.lazy_initialization(
                torch.empty((self.batch, k_heads, 1, k_dim), dtype=dtype),
                torch.empty((self.batch, v_heads, 1, v_dim), dtype=dtype),
            )
            layer.cumulative_length.fill_(self.kv_len)
            index_dim = getattr(self.config, "index_head_dim", None)
            if isinstance(index_dim, int) and hasattr(layer, "lazy_initialization_indexer"):
                # DeepSeek-V3.2's indexer keys, held beside the latent entries (StaticIndexedLayer, 5.24.0)
                layer.lazy_initialization_indexer(torch.empty((self.batch, 1, index_dim), dtype=self.dtype))
                layer.indexer_cumulative_length.fill_(self.kv_len)  # type: ignore[attr-defined]
            if self.writes is not None:
                layer.__class__ = self.writes(type(layer))
            if self.cache_dtype not in (None, self.dtype):
                layer.__class__ = cast_on_write(type(layer))
        input_ids = torch.zeros((self.batch, 1), dtype=torch.long)
        return (), {"input_ids": input_ids, self.argument: cache, "use_cache": True}

    def _hold_states(self, layer: object, index: int, dtype: torch.dtype) -> None:
        """A Gated DeltaNet layer's (or Kimi Linear's delta attention's) states after ``kv_len`` tokens, one device's share: the convolution's last
        inputs of q, k and v, and value_heads x key_dim x value_dim (Qwen3-Next's config fields), the heads read
        from the device's shard of the layer's projection (its KV split may differ: ``per_device``); a Mamba-2
        mixer's (``_mamba_states``). Relies on LinearAttentionLayer's ``lazy_initialization`` and
        ``has_previous_state`` (checked 5.24.0)."""
        c = self.config
        mixer = next(
            m
            for m in self.model.modules()
            if any(hasattr(m, part) for part in ("in_proj_qkvz", "ssm_state_size", "forget_gate"))
            and m.layer_idx == index
        )
        if not hasattr(mixer, "in_proj_qkvz"):
            kda = hasattr(mixer, "forget_gate")
            conv, state = (self._kda_states if kda else self._mamba_states)(mixer, dtype)
            layer.lazy_initialization(  # type: ignore[attr-defined]
                conv_states=conv, recurrent_states=state, conv_kernel_size=conv.shape[-1]
            )
            layer.has_previous_state[0] = True  # type: ignore[attr-defined]
            return
        dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
        ratio = c.linear_num_value_heads // c.linear_num_key_heads
        k_heads = _local_rows(mixer.in_proj_qkvz) // (2 * dk + 2 * ratio * dv)
        layer.lazy_initialization(  # type: ignore[attr-defined]
            conv_states=torch.empty(
                (self.batch, k_heads * (2 * dk + ratio * dv), c.linear_conv_kernel_dim - 1), dtype=dtype
            ),
            recurrent_states=torch.empty((self.batch, k_heads * ratio, dk, dv), dtype=dtype),
            conv_kernel_size=c.linear_conv_kernel_dim - 1,
        )
        layer.has_previous_state[0] = True  # type: ignore[attr-defined]

    def _kda_states(self, mixer: Any, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Kimi Linear's delta attention's states, one device's share: the convolution's last
        ``conv_kernel_size - 1`` inputs of q, k and v, and heads x head_dim x head_dim."""
        dim = mixer.head_dim
        heads = _local_rows(mixer.q_proj) // dim
        conv = torch.empty((self.batch, 3 * heads * dim, mixer.conv_kernel_size - 1), dtype=dtype)
        return conv, torch.empty((self.batch, heads, dim, dim), dtype=dtype)

    def _mamba_states(self, mixer: Any, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """A Mamba-2 mixer's states, one device's share (``mamba_share``): the convolution's last
        ``conv_kernel - 1`` inputs of x, B and C, and heads x head_dim x ssm_state_size in
        ``ssm_state_dtype``."""
        heads, groups = mamba_share(mixer, _local_rows(mixer.in_proj))
        size = mixer.ssm_state_size
        channels = heads * mixer.head_dim + 2 * groups * size
        conv = torch.empty((self.batch, channels, mixer.conv_kernel_size - 1), dtype=dtype)
        state = torch.empty((self.batch, heads, mixer.head_dim, size), dtype=ssm_state_dtype(mixer, dtype))
        return conv, state

    def per_device(self, n: int) -> DecodeInputs:
        return self._remade(tp=n)

    def with_cache_dtype(self, cache_dtype: torch.dtype) -> DecodeInputs:
        return self._remade(cache_dtype=cache_dtype)

    def with_kv_len(self, n: int) -> DecodeInputs:
        return self._remade(kv_len=n)

    def with_writes(self, writes: Callable[[type], type]) -> DecodeInputs:
        """The same step's inputs, each static cache layer's class made ``writes(its class)``."""
        return replace(self, writes=writes)

    def _remade(self, **changed: Any) -> DecodeInputs:
        options = {"kv_len": self.kv_len, "tp": self.tp, "cache_dtype": self.cache_dtype, **changed}
        remade = decode_inputs(
            self.model,
            self.batch,
            options["kv_len"],
            self.dtype,
            tp=options["tp"],
            cache_dtype=options["cache_dtype"],
        )
        return replace(remade, writes=self.writes)


def _local_rows(projection: Any) -> int:
    """The output width of one device's share of a projection (its DTensor's local shard under tensor
    parallelism)."""
    weight = projection.weight
    return (weight.to_local() if hasattr(weight, "to_local") else weight).shape[0]


def mamba_share(mixer: Any, width: int) -> tuple[int, int]:
    """(heads, groups) of one device's share of a Mamba-2 mixer (transformers' NemotronHMamba2Mixer, checked
    5.24.0) whose input projection writes ``width`` channels: z, x (heads x head_dim each), B, C (groups x
    ssm_state_size each) and dt (heads), the heads and groups split alike, as vLLM's MambaMixer2 splits them."""
    heads, groups = mixer.num_heads, mixer.n_groups
    whole = heads * (2 * mixer.head_dim + 1) + 2 * groups * mixer.ssm_state_size
    return heads * width // whole, groups * width // whole


def ssm_state_dtype(mixer: Any, dtype: torch.dtype) -> torch.dtype:
    """A Mamba-2 state's dtype: its config's ``mamba_ssm_cache_dtype`` (fp32 by default), else ``dtype``."""
    named = getattr(getattr(mixer, "config", None), "mamba_ssm_cache_dtype", None)
    return torch_dtype(named) if isinstance(named, str) and named != "auto" else dtype


def writes_whole(layer_class: type) -> bool:
    """Whether a static cache layer's ``update`` is ``StaticLayer``'s (a whole cache, written at the new
    positions), not its own (a sliding window rolls its keys)."""
    from transformers.cache_utils import StaticLayer

    return getattr(layer_class, "update", None) is StaticLayer.update


def cache_layer_classes(config: Any) -> list[type]:
    """The classes of the layers a model's ``StaticCache`` holds (their tensors are made on first use, not here)."""
    from transformers import StaticCache

    return [type(layer) for layer in StaticCache(config=config, max_cache_len=2).layers]


def static_update(layer: Any, key_states: torch.Tensor, value_states: torch.Tensor, write) -> tuple:
    """What ``StaticLayer.update`` does (the same in 5.5.0-5.24.0), the two copies at the new positions done by
    ``write(keys, values, position, key_states, value_states)``."""
    if not layer.is_initialized:
        layer.lazy_initialization(key_states, value_states)
    kv_length = key_states.shape[-2]
    position = torch.arange(kv_length, device=layer.device) + layer.cumulative_length
    layer.cumulative_length.add_(kv_length)
    write(layer.keys, layer.values, position, key_states, value_states)
    return layer.keys, layer.values


_CASTING: dict[type, type] = {}


def cast_on_write(layer_class: type) -> type:
    """A static cache layer class whose ``update`` casts new keys and values to the cache's dtype as it writes
    them, as vLLM's reshape_and_cache does (a per-tensor scale folds into the attention). The dtype is the
    ``keys`` tensor's: layers have no ``dtype`` attribute from 5.24.0 (checked 5.5.0-5.24.0)."""
    if layer_class in _CASTING.values():
        return layer_class
    if layer_class not in _CASTING:

        def update(self, key_states, value_states, *args, **kwargs):
            if key_states.dtype != self.keys.dtype:
                key_states, value_states = key_states.to(self.keys.dtype), value_states.to(self.keys.dtype)
            return layer_class.update(self, key_states, value_states, *args, **kwargs)

        _CASTING[layer_class] = type(f"Casting{layer_class.__name__}", (layer_class,), {"update": update})
    return _CASTING[layer_class]


def _cache_layer(cache: object, index: int) -> Any:
    """Layer ``index`` of a transformers cache, None where ``cache`` is none or has no such layer."""
    layers = cache_layers(cache)
    return layers[index] if layers is not None and index < len(layers) else None


def recurrent_state(cache: object, index: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (convolution, recurrent) states a linear-attention cache layer holds from a sequence's earlier tokens,
    None where it holds none yet (or ``cache`` is no transformers cache). Relies on LinearAttentionLayer's
    ``conv_states``, ``recurrent_states`` and ``has_previous_state`` dicts, one entry per state (checked 5.24.0;
    5.5.0's one flag and tensors are not read)."""
    layer = _cache_layer(cache, index)
    flags = getattr(layer, "has_previous_state", None)
    if not isinstance(flags, dict) or not flags.get(0):
        return None
    return layer.conv_states[0], layer.recurrent_states[0]


def keep_recurrent_state(cache: object, index: int, conv: torch.Tensor, state: torch.Tensor) -> None:
    """Hold a sequence's states after its tokens in its linear-attention cache layer (see ``recurrent_state``)."""
    layer = _cache_layer(cache, index)
    if layer is not None and isinstance(getattr(layer, "recurrent_states", None), dict):
        layer.conv_states[0], layer.recurrent_states[0] = conv, state
        layer.has_previous_state[0] = True
