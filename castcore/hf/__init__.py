"""castcore's one contact with transformers: every use of its internals, in one place to adapt.

castcore builds causal LMs on the meta device, puts them on its own attention path, pre-fills a static KV cache
for a decode step, and recognises and swaps parts of transformers' modules. Each function that relies on what
transformers does not promise says what, and the releases it was checked on ("checked 5.5.0-5.24.0": ``nox -s
tests`` runs the newest, ``nox -s oldest`` the lowest bound pyproject admits). When a release moves something,
this package is what to change (the KV cache of a decode step is in ``castcore.hf.cache``): the rest of castcore
imports no transformers module (tests/test_hf.py checks).
transformers is imported inside the functions, so a model that is not a transformers model never pays for it.
"""

from __future__ import annotations

import inspect
import logging
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

from castcore.errors import ModelError
from castcore.hf.cache import cache_argument, cache_layers, cast_on_write, decode_inputs, kv_written  # noqa: F401

# The releases the test suite runs on: from the lowest pyproject admits to the newest checked, any patch release.
TESTED = {"transformers": ("5.5.0", "5.24"), "torch": ("2.13.0", "2.13")}
ATTENTION = "castcore"  # castcore's attention path: transformers' SDPA with the causal flag kept
CACHE_ARGUMENTS = ("cache", "past_key_values")  # the names a forward takes its KV cache by (see cache_argument)


# --- versions --------------------------------------------------------------------------------------------------

def installed(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def tested_range(package: str) -> str:
    low, high = TESTED[package]
    return f"{low} to {high}.x"


def in_tested_range(package: str, found: str) -> bool:
    from packaging.version import InvalidVersion, Version

    low, high = TESTED[package]
    try:
        release = Version(found).release
    except InvalidVersion:
        return False
    return Version(low).release <= release and release[:2] <= Version(high).release[:2]


def version_warnings() -> list[str]:
    """One line for each of torch and transformers installed at a version the test suite does not run on."""
    lines = []
    for package in TESTED:
        found = installed(package)
        if found is not None and not in_tested_range(package, found):
            low, high = TESTED[package]
            major, minor = (int(part) for part in high.split("."))
            lines.append(f"{package} {found} is installed; castcore is tested on {package} {tested_range(package)}: "
                         f"its estimates may fail or differ (pip install '{package}>={low},<{major}.{minor + 1}')")
    return lines


def raised_inside(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by transformers' own code or by castcore's touches of it here: the innermost
    frame is in one of them (an operator failing under a transformers model is torch's, not this)."""
    module = sys.modules.get("transformers")
    if module is None or not getattr(module, "__file__", None):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = Path(tb.tb_frame.f_code.co_filename) if tb is not None else None
    return where is not None and (where.is_relative_to(Path(module.__file__).parent)
                                  or where.is_relative_to(Path(__file__).parent))


def internals_error(exc: BaseException, model_class: str) -> ModelError:
    """The one line a failure inside transformers becomes: the model class, the installed and tested versions."""
    return ModelError(f"{model_class} failed inside transformers {installed('transformers')} ({_one_line(exc)}); "
                      f"castcore is tested on transformers {tested_range('transformers')}: install one of those, "
                      "or run with --debug for the traceback")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


# --- models ----------------------------------------------------------------------------------------------------

def is_transformers_module(module: Any) -> bool:
    return type(module).__module__.startswith("transformers.")


def is_causal_lm(model: Any) -> bool:
    """Whether ``model`` is a transformers causal LM (or a subclass of one). Relies on
    ``models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (checked 5.5.0-5.24.0)."""
    ours = [c for c in type(model).__mro__ if c.__module__.startswith("transformers.")]
    if not ours:
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    return any(c.__name__ in names for c in ours)


def build_causal_lm(config: dict[str, Any], dtype: torch.dtype,
                    origin: str = "the model config") -> tuple[torch.nn.Module, list[str]]:
    """An AutoModelForCausalLM from a config.json dict on the meta device (no weights), and notes: that the model
    cannot take castcore's attention path, what transformers warns of its RoPE values. ModelError names ``origin``,
    the field at fault and what castcore supports. Relies on ``CONFIG_MAPPING``, ``MODEL_FOR_CAUSAL_LM_MAPPING``,
    ``from_config(dtype=, attn_implementation=)``, the class flags ``_supports_attention_backend`` / ``_supports_sdpa``
    (checked 5.5.0-5.24.0). The mappings import the one modeling module the config names."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    register_attention(ATTENTION, castcore_attention, castcore_mask)
    fields = {k: v for k, v in config.items() if not k.startswith("_")}
    model_type = fields.pop("model_type", None)
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ModelError(f"{origin}: 'model_type' = {model_type!r} is not a transformers model type; castcore "
                         "builds causal language models from a transformers config.json (llama, qwen2, gpt2, ...)")
    said: list[str] = []
    try:
        with _rope_warnings(said):
            hf_config = AutoConfig.for_model(model_type, **fields)
    except Exception as exc:  # transformers' validation errors have no common base: any is the config's fault
        raise ModelError(f"{origin}: transformers refuses this {model_type} config: {_one_line(exc)}") from None
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(hf_config), None)
    if model_class is None:
        raise ModelError(f"{origin}: {model_type} is not a causal language model (transformers has no "
                         f"AutoModelForCausalLM for it, as for encoder-decoder and vision models); estimate your own "
                         "module with castcore.estimate(model, inputs) or --model package.module:factory")
    attention, note = ATTENTION, None
    if not supports_attention_backend(model_class):
        attention = "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"
        note = no_attention_backend_note(model_class.__name__, attention)
    hf_config._attn_implementation = attention
    try:
        with torch.device("meta"), _rope_warnings(said):
            model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation=attention)
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as exc:
        raise ModelError(f"{origin}: transformers cannot build this {model_type} model: {_one_line(exc)}") from None
    return model.eval(), [*([note] if note else []),
                          *(f"{origin}: transformers warns: {line}" for line in dict.fromkeys(said))]


@contextmanager
def _rope_warnings(said: list[str]) -> Iterator[None]:
    """transformers' warnings about a config's RoPE values (``modeling_rope_utils``' logger; checked 5.5.0-5.24.0)
    kept in ``said``, for castcore's notes, instead of printed on stderr beside castcore's own lines."""
    logger = logging.getLogger("transformers.modeling_rope_utils")
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


# --- the attention interface --------------------------------------------------------------------------------------

def supports_attention_backend(model: Any) -> bool:
    """Whether a model (class) calls attention through transformers' interface. Models written before it pick
    their attention class by name at init. Relies on ``_supports_attention_backend`` (checked 5.5.0-5.24.0)."""
    return bool(getattr(model, "_supports_attention_backend", True))


def no_attention_backend_note(model_name: str, attention: str) -> str:
    """What a user should know when a model keeps its own attention."""
    return (f"{model_name} cannot take castcore's attention path, so it runs its own {attention} attention: on "
            "fake tensors that builds an explicit causal mask, so attention is counted over every query-key pair, "
            "about twice the causal work")


def register_attention(name: str, attention: Callable, mask: Callable) -> None:
    """An attention function and its mask function under ``name``, for ``config._attn_implementation``.
    Relies on ``AttentionInterface.register`` and ``masking_utils.AttentionMaskInterface.register`` (the mask
    function is called with sdpa_mask's arguments; checked 5.5.0-5.24.0)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, mask)


def sdpa_mask(*args, **kwargs):
    """transformers' SDPA mask: ``masking_utils.sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset,
    ...)`` (q_length and q_offset from 5.5; cache_position before; checked 5.5.0-5.24.0)."""
    from transformers.masking_utils import sdpa_mask as mask

    return mask(*args, **kwargs)


def castcore_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, attention_mask=None, local_size=None,
                  **kwargs):
    """transformers' SDPA mask, left out when no padding is given: SDPA then applies causality itself
    (``is_causal``) or needs none (one query token). On fake tensors transformers' own SDPA path would
    materialise the causal mask and the attention op would lose its causal flag."""
    window_irrelevant = local_size is None or kv_length <= local_size
    if attention_mask is None and window_irrelevant and (q_length == 1 or q_length == kv_length):
        return None
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask=attention_mask,
                     local_size=local_size, **kwargs)


def castcore_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None,
                       s_aux=None, **kwargs):
    """transformers' SDPA attention; with a logit soft-cap (Gemma 2) or attention sinks (gpt-oss's ``s_aux``),
    which SDPA cannot apply, the ops an eager attention runs: scores, tanh cap, mask, softmax (with the sink
    column), weighted sum. Relies on ``integrations.sdpa_attention.sdpa_attention_forward`` (checked
    5.5.0-5.24.0)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if key.dtype != query.dtype:  # a KV cache in another dtype (--kv-cache): an eager kernel dequantizes it first
        key, value = key.to(query.dtype), value.to(query.dtype)
    if softcap is None and s_aux is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    q_len, kv_len = query.shape[2], key.shape[2]
    if attention_mask is None and q_len > 1:  # castcore_mask left causality to the kernel: apply it here
        attention_mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
    if attention_mask is not None:
        attention_mask = attention_mask[..., :kv_len]
        scores = (scores.masked_fill(~attention_mask, float("-inf")) if attention_mask.dtype == torch.bool
                  else scores + attention_mask)
    if s_aux is not None:
        sinks = s_aux.reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1).to(scores.dtype)
        probs = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1, dtype=torch.float32)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    probs = probs.to(query.dtype)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def attention_chunk(module: torch.nn.Module) -> int:
    """The chunk of a chunked-attention layer (Llama 4: ``layer_types[layer_idx]`` "chunked_attention", its size
    ``attention_chunk_size``), which transformers applies through the mask alone; 0 for any other layer (checked
    5.5.0-5.24.0)."""
    config, index = getattr(module, "config", None), getattr(module, "layer_idx", None)
    types = getattr(config, "layer_types", None) or ()
    if isinstance(index, int) and index < len(types) and types[index] == "chunked_attention":
        return int(getattr(config, "attention_chunk_size", 0) or 0)
    return 0


def configs(model: torch.nn.Module) -> list[Any]:
    """The configs of the model and its sub-models, and their sub-configs (a vision or text config). Relies on
    ``PreTrainedConfig.sub_configs`` (checked 5.5.0-5.24.0)."""
    found: dict[int, Any] = {}
    pending = [m.config for m in model.modules() if hasattr(getattr(m, "config", None), "sub_configs")]
    while pending:
        config = pending.pop()
        if id(config) not in found:
            found[id(config)] = config
            pending += [sub for key in config.sub_configs if hasattr(sub := getattr(config, key, None), "sub_configs")]
    return list(found.values())


def attention_of(model: torch.nn.Module) -> str | None:
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def set_attention(model: torch.nn.Module, attention: str, only_from: str | None = None) -> bool:
    """Every config of ``model`` switched to ``attention`` (when each is on ``only_from``, if given); False and
    nothing switched otherwise. Set one by one through ``_attn_implementation_internal``: transformers' setter
    would give sub-configs their parent's value (checked 5.5.0-5.24.0)."""
    found = configs(model)
    if not found or (only_from is not None and any(c._attn_implementation_internal != only_from for c in found)):
        return False
    for config in found:
        config._attn_implementation_internal = attention
    return True


@contextmanager
def attention_set_to(model: torch.nn.Module, attention: str) -> Iterator[None]:
    """Every config of ``model`` on ``attention``, then each put back to its own earlier value, even on error."""
    saved = [(c, c._attn_implementation_internal) for c in configs(model)]
    try:
        for config, _ in saved:
            config._attn_implementation_internal = attention
        yield
    finally:
        for config, value in saved:
            config._attn_implementation_internal = value


def own_causal_attn(module: torch.nn.Module) -> bool:
    """A model's own attention method written before the interface (GPT-J before 5.24): ``_attn(query, key,
    value, attention_mask)`` on [batch, heads, seq, dim] tensors, dividing the scores by ``scale_attn``, causal.
    Checked 5.5.0-5.23.0; GPT-J takes the interface from 5.24.0, and this then finds nothing."""
    attn = getattr(module, "_attn", None)
    if not callable(attn) or not getattr(module, "is_causal", False) or not hasattr(module, "scale_attn"):
        return False
    return list(inspect.signature(attn).parameters)[:4] == ["query", "key", "value", "attention_mask"]


def replace_own_attn(module: torch.nn.Module, attn: Callable) -> None:
    """``module._attn`` replaced by ``attn(self, query, key, value, mask)`` -> ([batch, heads, seq, dim], None)."""
    module._attn = types.MethodType(attn, module)


# --- rotary embeddings --------------------------------------------------------------------------------------------

def standard_rotary(model: torch.nn.Module) -> dict[tuple[Any, str], Callable]:
    """The rotary functions an attention with ``q_proj`` calls, by (modeling module, name), when castcore knows
    them: ``apply_rotary_pos_emb`` (q, k, cos, sin, unsqueeze_dim; ``rotate_half``, or gpt-oss's half angles) and
    Llama 4's ``apply_rotary_emb`` (xq, xk, freqs_cis: complex angles, pairs interleaved). Relies on the attention
    looking them up in its module's globals (checked 5.5.0-5.24.0)."""
    found = {}
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
        if complex_angles is not None and list(inspect.signature(complex_angles).parameters) == ["xq", "xk",
                                                                                                 "freqs_cis"]:
            found[home, "apply_rotary_emb"] = complex_angles
    return found


def half_angle_rotary(original: Callable) -> bool:
    """gpt-oss's ``apply_rotary_pos_emb``: cos and sin hold each angle once (half the head), the two halves rotated
    by ``_apply_rotary_emb`` as rotate_half rotates them, so the same rotation as with the angles written twice
    (checked 5.5.0-5.24.0)."""
    home = sys.modules.get(getattr(original, "__module__", ""))
    return home is not None and hasattr(home, "_apply_rotary_emb") and not hasattr(home, "rotate_half")


@contextmanager
def rotary_swapped(originals: dict[tuple[Any, str], Callable],
                   replacement: Callable[[Callable], Callable]) -> Iterator[None]:
    """Each module's rotary function (``standard_rotary``) replaced by ``replacement(original)``, then put back."""
    try:
        for (home, name), original in originals.items():
            setattr(home, name, replacement(original))
        yield
    finally:
        for (home, name), original in originals.items():
            setattr(home, name, original)


# --- mixture of experts and GPT-2's linear layers -------------------------------------------------------------

def is_experts_module(module: torch.nn.Module) -> bool:
    """One of transformers 5's ``@use_experts_implementation`` experts modules, whose 3-D weights castcore splits
    and quantizes (the decorator's ``has_gate``, and ``_apply_gate``; checked 5.5.0-5.24.0), or Llama 4's experts
    once castcore.workload.moe_fusing has given them those attributes (``castcore_gate``)."""
    return hasattr(module, "has_gate") and (hasattr(module, "_apply_gate") or hasattr(module, "castcore_gate"))


def is_default_gated_experts(module: torch.nn.Module) -> bool:
    """A ``@use_experts_implementation`` experts module with a gate applied by transformers' default
    (``has_gate``, ``has_bias``, ``is_transposed``, ``_apply_gate`` named ``_default_apply_gate``; checked
    5.5.0-5.24.0)."""
    gate = getattr(type(module), "_apply_gate", None)
    return (getattr(module, "has_gate", False) and not getattr(module, "has_bias", False)
            and not getattr(module, "is_transposed", False)
            and getattr(gate, "__name__", "") == "_default_apply_gate")


def experts_grouped_forward(module: torch.nn.Module) -> Callable | None:
    """transformers' grouped-GEMM experts forward for a ``@use_experts_implementation`` module, whatever
    implementation the model was built with; None for another module. Relies on
    ``integrations.moe.grouped_mm_experts_forward`` calling ``_grouped_linear`` by its global name (checked
    5.5.0-5.24.0)."""
    if not hasattr(module, "has_gate"):
        return None
    try:
        from transformers.integrations import moe
    except ImportError:
        return None
    return getattr(moe, "grouped_mm_experts_forward", None)


def grouped_router_kind(module: torch.nn.Module) -> str | None:
    """Where DeepSeek-V3's grouped top-k routing runs: "router" when the router module chooses the experts and
    returns (logits, weights, indices), "moe" when the MoE block's ``route_tokens_to_experts(logits)`` does and
    returns (indices, weights); None for other modules. Relies on those names and on the attributes num_group,
    topk_group (router) or n_group (MoE block) and e_score_correction_bias (checked 5.5.0: "moe"; 5.24.0:
    "router")."""
    if type(module).__name__.endswith("TopkRouter"):
        found = all(hasattr(module, a) for a in ("num_group", "topk_group", "e_score_correction_bias"))
        return "router" if found else None
    if (callable(getattr(module, "route_tokens_to_experts", None)) and hasattr(module, "n_group")
            and hasattr(getattr(module, "gate", None), "e_score_correction_bias")):
        return "moe"
    return None


def is_conv1d(module: torch.nn.Module) -> bool:
    """transformers' Conv1D (GPT-2's linears): weight [in, out], ``nf`` outputs (checked 5.5.0-5.24.0)."""
    weight = getattr(module, "weight", None)
    return (type(module).__name__ == "Conv1D" and hasattr(module, "nf") and isinstance(weight, torch.Tensor)
            and weight.dim() == 2)
