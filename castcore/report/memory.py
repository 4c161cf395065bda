"""How much device memory a captured call holds: weights, inputs, KV cache and the activation peak.

One linear pass over the capture finds, for every storage, the first and the last op that
touches it (reads it or writes it). A storage an op outputs for the first time is a new
allocation; views, aliases and in-place ops reuse their input's storage id, so they add
nothing. A storage is live from its first op through its last, except weights, inputs and
the call's outputs, which are live throughout. The peak is the op where weights + inputs +
KV cache + live activations is largest (the first such op on a tie).

The KV cache: a cache object passed in (a decode step's static cache) is found by the capture
(``state_storages``) and counted as cache, live throughout. A prefill with ``use_cache=False``
builds none, so the cache it would fill is an argument, ``analyze_memory(captured,
kv_cache_bytes=kv_cache_bytes(config, batch, kv_len, dtype))``, also counted as live for the
whole call. Pass it only when the capture did not already hold the cache.

What this does not model: allocator fragmentation and caching, workspace memory of kernels,
framework and communication buffers, and gradients or optimizer state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from castcore.devices.dtypes import torch_dtype
from castcore.recording.recorder import Capture

GiB = 2**30


@dataclass(frozen=True, slots=True)
class LiveStorage:
    """One activation storage live at the peak, and the op that allocated it."""

    storage: int
    bytes: int
    index: int  # the op that first wrote it
    op: str
    module: str

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass
class MemoryReport:
    """Bytes held on one device over a captured call. ``peak_bytes`` is what must fit."""

    weight_bytes: int = 0
    input_bytes: int = 0
    kv_cache_bytes: int = 0
    activation_peak_bytes: int = 0  # live activations (neither weight nor input) at the peak op
    peak_index: int = -1  # -1: the capture has no op
    peak_op: str = ""
    peak_module: str = ""
    top_live: list[LiveStorage] = field(default_factory=list)  # largest activations live at the peak
    # Live activation bytes after each op, for a chart of memory over the capture (the HTML page); not in
    # to_dict, so the JSON stays the size it was.
    timeline: list[int] = field(default_factory=list, compare=False, repr=False)

    @property
    def peak_bytes(self) -> int:
        return self.weight_bytes + self.input_bytes + self.kv_cache_bytes + self.activation_peak_bytes

    def fits(self, device_memory_bytes: float | Any) -> bool:
        """Whether the peak fits in ``device_memory_bytes`` (a number, or a DeviceProfile)."""
        return self.peak_bytes <= _memory_of(device_memory_bytes)

    def summary_lines(self, device: Any) -> list[str]:
        """One line per figure, and a warning line when the peak exceeds ``device.memory_bytes``."""
        capacity = _memory_of(device)
        where = f"op {self.peak_index} {self.peak_op}" if self.peak_index >= 0 else "no op"
        if self.peak_module:
            where += f" in {self.peak_module}"
        lines = [
            f"weights      {format_bytes(self.weight_bytes)}",
            f"inputs       {format_bytes(self.input_bytes)}",
        ]
        if self.kv_cache_bytes:
            lines.append(f"KV cache     {format_bytes(self.kv_cache_bytes)}")
        lines += [
            f"activations  {format_bytes(self.activation_peak_bytes)} at the peak ({where})",
            f"peak memory  {format_bytes(self.peak_bytes)} of {format_bytes(capacity)}"
            f"{' on ' + device.name if getattr(device, 'name', None) else ''} ({self.peak_bytes / capacity:.1%})",
        ]
        if not self.fits(capacity):
            lines.append(
                f"warning: does not fit: needs {format_bytes(self.peak_bytes)} of {format_bytes(capacity)}; "
                f"try --tp {_tp_hint(self.peak_bytes, capacity)} or a smaller --batch/--seq"
            )
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "weight_bytes": self.weight_bytes,
            "input_bytes": self.input_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "activation_peak_bytes": self.activation_peak_bytes,
            "peak_bytes": self.peak_bytes,
            "peak_index": self.peak_index,
            "peak_op": self.peak_op,
            "peak_module": self.peak_module,
            "top_live": [s.to_dict() for s in self.top_live],
        }


def analyze_memory(captured: Capture, kv_cache_bytes: int = 0, top: int = 5) -> MemoryReport:
    """The memory footprint of ``captured``; ``kv_cache_bytes`` (see ``kv_cache_bytes()``) is added as live
    throughout, since a capture cannot tell cache tensors from other activations."""
    if kv_cache_bytes < 0:
        raise ValueError(f"kv_cache_bytes must be >= 0 (got {kv_cache_bytes})")
    weights = captured.weight_storages
    inputs = {s: b for s, b in captured.input_storages.items() if s not in weights}
    # Tensors inside input objects (a decode step's KV cache) are held throughout, as cache.
    state = {s: b for s, b in captured.state_storages.items() if s not in weights and s not in inputs}
    resident = weights.keys() | inputs.keys() | state.keys()

    first: dict[int, int] = {}  # storage -> first op touching it
    last: dict[int, int] = {}  # storage -> last op touching it
    size: dict[int, int] = {}
    invokes = captured.invokes
    for i, invoke in enumerate(invokes):
        for t in (*invoke.inputs(), *invoke.outputs()):
            s = t.storage
            if s < 0 or s in resident:
                continue
            if s not in first:
                first[s] = i
            last[s] = i
            size[s] = max(size.get(s, 0), t.storage_nbytes)  # a storage may grow (resize_ of an out= tensor)

    end = len(invokes) - 1
    delta = [0] * (len(invokes) + 1)
    for s, born in first.items():
        delta[born] += size[s]
        delta[end + 1 if s in captured.output_storages else last[s] + 1] -= size[s]
    peak_index, peak, live = -1, 0, 0
    timeline = [0] * len(invokes)
    for i in range(len(invokes)):
        live += delta[i]
        timeline[i] = live
        if peak_index < 0 or live > peak:
            peak_index, peak = i, live

    top_live: list[LiveStorage] = []
    if peak_index >= 0:
        alive = [
            s
            for s, born in first.items()
            if born <= peak_index and (s in captured.output_storages or last[s] >= peak_index)
        ]
        alive.sort(key=lambda s: (-size[s], s))
        for s in alive[:top]:
            maker = invokes[first[s]]
            top_live.append(
                LiveStorage(storage=s, bytes=size[s], index=first[s], op=maker.name, module=maker.module)
            )

    at_peak = invokes[peak_index] if peak_index >= 0 else None
    return MemoryReport(
        weight_bytes=sum(weights.values()),
        input_bytes=sum(inputs.values()),
        kv_cache_bytes=int(kv_cache_bytes) + sum(state.values()),
        activation_peak_bytes=peak,
        peak_index=peak_index,
        peak_op=at_peak.name if at_peak else "",
        peak_module=at_peak.module if at_peak else "",
        top_live=top_live,
        timeline=timeline,
    )


def config_field(config: Any, name: str) -> Any:
    """A field of a transformers config, built (whose attribute map turns GPT-2's n_head into
    num_attention_heads) or a config.json dict; None when it has none."""
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def language_config(config: Any) -> Any:
    """The language model's config: multimodal configs nest it as text_config."""
    text = config_field(config, "text_config")
    return text if config_field(config, "num_hidden_layers") is None and text is not None else config


def kv_cache_bytes(config: Any, batch: int, kv_len: int, dtype: torch.dtype | str) -> int:
    """Bytes of a full K and V cache for a transformers config (built, or a config.json dict), as an engine holds
    it: 2 * layers * batch * kv_len * num_key_value_heads * head_dim * itemsize; one latent entry of
    kv_lora_rank + qk_rope_head_dim per token and layer for multi-head latent attention (DeepSeek-V3), whole on
    every tensor-parallel device, and DeepSeek-V3.2's indexer key of index_head_dim beside it (held in the cache
    dtype, as transformers holds it; DeepSeek's kernels keep it in fp8); one KV head for Falcon's multi-query attention. A hybrid's linear-attention and
    state-space layers cache no keys: they hold ``recurrent_state_bytes`` per sequence instead, added here.
    ValueError names a missing field."""
    config = language_config(config)
    dtype = torch_dtype(dtype)
    return _attention_cache_bytes(config, batch, kv_len, dtype) + recurrent_state_bytes(config, batch, dtype)


# The layer kinds of a hybrid's ``layer_types`` (Qwen3-Next, Kimi Linear) or ``layers_block_type`` (Nemotron-H)
# that cache no keys and values: each keeps a fixed-size state per sequence.
RECURRENT_KINDS = ("linear_attention", "mamba")


def _layer_kinds(config: Any) -> list[str]:
    """Each layer's kind, as the config lists it or as its checkpoint's config.json says it in short: every
    ``full_attention_interval``-th layer full attention and the rest linear (Qwen3-Next), or a
    ``hybrid_override_pattern`` of M (Mamba), * (attention) and - (MLP) (Nemotron-H)."""
    kinds = config_field(config, "layer_types") or config_field(config, "layers_block_type")
    if kinds:
        return [str(kind) for kind in kinds]
    interval, layers = (
        config_field(config, "full_attention_interval"),
        config_field(config, "num_hidden_layers"),
    )
    if isinstance(interval, int) and isinstance(layers, int):
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    pattern = config_field(config, "hybrid_override_pattern") or ""
    return [{"M": "mamba", "*": "attention"}.get(c, "mlp") for c in str(pattern)]


def recurrent_state_bytes(config: Any, batch: int, dtype: torch.dtype) -> int:
    """Bytes of the states a hybrid's recurrent layers keep for ``batch`` sequences, as engines hold them (vLLM's
    mamba cache: the convolution's last ``kernel - 1`` inputs and the recurrence's state, in the cache's dtype;
    Nemotron-H's state in its ``mamba_ssm_cache_dtype``): Qwen3-Next's Gated DeltaNet (state value_heads x
    key_dim x value_dim), Kimi Linear's delta attention (heads x head_dim squared, q, k and v convolved) and
    Mamba-2 (heads x head_dim x ssm_state_size). 0 for a model with no such layers."""
    layers = sum(kind in RECURRENT_KINDS for kind in _layer_kinds(config))
    if not layers:
        return 0
    field = lambda name: config_field(config, name) or 0  # noqa: E731
    kind = config_field(config, "model_type")
    state_dtype = dtype
    if kind == "qwen3_next":
        keys, values = (
            field("linear_num_key_heads") * field("linear_key_head_dim"),
            field("linear_num_value_heads"),
        )
        conv = (2 * keys + values * field("linear_value_head_dim")) * (field("linear_conv_kernel_dim") - 1)
        state = values * field("linear_key_head_dim") * field("linear_value_head_dim")
    elif kind == "kimi_linear":
        width = field("linear_num_heads") * field("linear_head_dim")
        conv = 3 * width * (field("linear_conv_kernel_dim") - 1)
        state = field("linear_num_heads") * field("linear_head_dim") ** 2
    else:  # Mamba-2 (Nemotron-H and its kin)
        inner = field("mamba_num_heads") * field("mamba_head_dim")
        conv = (inner + 2 * field("n_groups") * field("ssm_state_size")) * (field("conv_kernel") - 1)
        state = inner * field("ssm_state_size")
        # transformers' NemotronHConfig holds it in fp32 where its config.json names none (checked 5.24.0)
        named = config_field(config, "mamba_ssm_cache_dtype") or ("float32" if kind == "nemotron_h" else None)
        state_dtype = torch_dtype(named) if isinstance(named, str) and named != "auto" else dtype
    return layers * batch * (conv * dtype.itemsize + state * state_dtype.itemsize)


def _attention_cache_bytes(config: Any, batch: int, kv_len: int, dtype: torch.dtype) -> int:
    kinds = _layer_kinds(config)
    layers, heads, hidden = (
        config_field(config, k) for k in ("num_hidden_layers", "num_attention_heads", "hidden_size")
    )
    if any(kind in RECURRENT_KINDS for kind in kinds):  # a hybrid: only its attention layers cache keys
        layers = sum(kind in ("full_attention", "attention") for kind in kinds)
    rank, rope = config_field(config, "kv_lora_rank"), config_field(config, "qk_rope_head_dim")
    if isinstance(rank, int) and isinstance(rope, int) and isinstance(layers, int):
        index_dim = config_field(config, "index_head_dim")  # DeepSeek-V3.2's indexer key, beside the latent
        entry = rank + rope + (index_dim if isinstance(index_dim, int) else 0)
        return layers * batch * kv_len * entry * dtype.itemsize
    kv_heads = config_field(config, "num_key_value_heads") or heads
    if config_field(config, "multi_query") and not config_field(config, "new_decoder_architecture"):
        kv_heads = 1
    elif config_field(config, "new_decoder_architecture"):
        kv_heads = config_field(config, "num_kv_heads") or kv_heads
    head_dim = config_field(config, "head_dim") or (
        hidden // heads if isinstance(hidden, int) and heads else None
    )
    missing = [
        k
        for k, v in (("num_hidden_layers", layers), ("num_attention_heads", heads), ("head_dim", head_dim))
        if not isinstance(v, int)
    ]
    if missing:
        raise ValueError(f"the model config has no {', '.join(missing)}")
    return 2 * layers * batch * kv_len * kv_heads * head_dim * dtype.itemsize


def format_bytes(n: float) -> str:
    """Binary units: 1.50 GiB, 512.00 KiB, 12 B."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _memory_of(device: float | Any) -> float:
    capacity = getattr(device, "memory_bytes", device)
    if not isinstance(capacity, (int, float)) or capacity <= 0:
        raise ValueError(f"device memory must be a positive number of bytes (got {capacity!r})")
    return capacity


def _tp_hint(needed: float, capacity: float) -> int:
    """The smallest power-of-two device count whose memory adds up to ``needed`` (a rough lower bound:
    tensor parallelism splits weights and most activations, not everything)."""
    return 2 ** math.ceil(math.log2(max(needed / capacity, 1.0)))
