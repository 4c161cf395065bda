"""The KV cache a simulated deployment gets by its engine's rule (castcore.serving.engine_memory), and the
step-time model of a deployment, kept for the next simulation of it (castcore.serving.traffic and
castcore.serving.disaggregated both need them)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from castcore.devices.dtypes import torch_dtype
from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.deploy.parallel.tensor import per_device_config
from castcore.report.memory import format_bytes, recurrent_state_bytes
from castcore.simulation.presets import EngineLimits
from castcore.serving.engine_memory import RULES, KvBudget, budget
from castcore.workload import draft_heads
from castcore.workload.spec import load_model_config
from castcore.serving.step_time import StepTimes

if TYPE_CHECKING:
    from castcore.deploy.pipeline import Pipeline

KV_PROBE = 256  # the KV length of the decode step whose cache gives the bytes a token's keys and values take


def kv_capacity(pipeline: Pipeline, steps: StepTimes, engine: str, limits: EngineLimits) -> KvBudget:
    """The KV cache ``engine``'s own rule gives one device under ``limits`` (castcore.serving.engine_memory), and
    the bytes one token's keys and values take; ModelError when it holds no block."""
    if steps.probed is None:  # kept with the step-time model: a plan simulates one deployment many times
        probe = pipeline.run(replace(steps.base, phase="decode", batch=1, kv_len=KV_PROBE), steps.profile)
        state = state_bytes(steps.base)
        steps.probed = (
            probe.memory.weight_bytes,
            max(1, round((probe.memory.kv_cache_bytes - state) / (KV_PROBE + 1))),
            state,
        )
    # The weights one device holds (under --pp its heaviest stage's) from the probe, the activations of a full
    # token budget (the LM head over the sequences that sample, as vLLM's profile run) from the step-time
    # model's largest capture.
    (weights, per_token, state), activations = steps.probed, steps.activation_peak_bytes
    found = budget(engine, limits, steps.profile, steps.base, weights, activations, per_token, state)
    usable = found.kv_bytes
    if found.blocks < 1 and usable >= per_token:  # room for tokens, not for one block of them
        raise ModelError(
            f"{say('block_size', limits.block_size)}: one block of {limits.block_size:,} tokens' KV "
            f"({format_bytes(limits.block_size * per_token)}) is more than the "
            f"{format_bytes(usable)} the engine leaves for the KV cache; use a {say('block_size')} of "
            f"at most {int(usable // per_token):,} (engines use 16 to 256)"
        )
    if found.blocks < 1:
        # SGLang's reserve holds the activations: only its share frees memory
        fix = (
            f"a larger {say('kv_memory_fraction')}"
            if engine == "sglang"
            else f"a smaller {say('max_batched_tokens')}"
        )
        raise ModelError(
            f"the deployment leaves no memory for a KV cache: {found.formula()} per device "
            f"({RULES[engine]}); use a larger {say('tp')}, {say('weights', 'int8')} or {fix}"
        )
    return found


def state_bytes(base: Any) -> int:
    """The state one sequence of a hybrid model holds on one device in its linear-attention or state-space layers
    (castcore.report.memory.recurrent_state_bytes, the heads split by --tp), in the KV cache's dtype; 0 for
    another model."""
    if not isinstance(base.model, str):
        return 0
    config = per_device_config(load_model_config(base.model), base.tp)
    return recurrent_state_bytes(config, 1, torch_dtype(base.kv_cache or base.dtype))


def with_draft(
    pipeline: Pipeline, draft: Any, device: Any, blocks: int, per_token: int, block_size: int
) -> tuple[int, int]:
    """The KV blocks left when a draft model's weights and its own cache share the memory (the model's cache bytes
    less the draft's weights, over both caches' bytes per token), and the bytes a token takes in the draft's cache."""
    probe = pipeline.run(replace(draft, phase="decode", batch=1, kv_len=KV_PROBE), device)
    draft_per_token = max(1, round(probe.memory.kv_cache_bytes / (KV_PROBE + 1)))
    left = blocks * block_size * per_token - max(0, probe.memory.weight_bytes - shared_bytes(draft))
    found = int(left // (block_size * (per_token + draft_per_token)))
    if found < 1:
        raise ModelError(
            f"the draft model's weights ({format_bytes(probe.memory.weight_bytes)}) leave no memory for a "
            f"KV cache; give a smaller {say('draft_model')} or a larger {say('tp')}"
        )
    return found, draft_per_token


# A plan under traffic revisits each layout it searches (more replicas, its confirmation): a 70B layout's model
# holds about 50-100 MB
KEPT_STEP_TIMES = 16


def shared_bytes(draft: Any) -> int:
    """The weights a draft shares with the model: a built-in head's embedding and LM head (castcore.workload.
    draft_heads), none for a draft model of its own."""
    if not draft_heads.is_head(draft.model):
        return 0
    return draft_heads.shared_weight_bytes(
        load_model_config(draft.model), torch_dtype(draft.dtype).itemsize, draft.tp
    )


def step_times(pipeline: Pipeline, base: Any, device: Any, engine: EngineLimits) -> StepTimes:
    """The step-time model of ``base``'s deployment under the engine's limits, kept on the pipeline for the next
    simulation of that deployment (a plan's rounds: other rates, more replicas), whose captures and step times it
    has already made; replicas share one."""
    profile = pipeline.host.device(device)
    replica = replace(base, dp=1)  # whichever replica count made it, its captures are keyed as one replica's
    key = (
        "step_times",
        json.dumps(replica.options(), sort_keys=True, default=repr),
        profile.name,
        engine.max_batched_tokens,
        min(engine.max_running_requests, engine.max_batched_tokens),
    )
    kept = pipeline.derived
    found = kept.pop(key, None)
    if found is None:
        found = StepTimes(pipeline, replica, profile, *key[3:])
    kept[key] = found  # the last used goes last
    while len(kept) > KEPT_STEP_TIMES:
        del kept[next(iter(kept))]  # the least recently used goes
    return found
