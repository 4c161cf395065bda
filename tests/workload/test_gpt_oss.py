"""gpt-oss runs with deployed kernels: attention sinks and alternating sliding windows in castcore::attention,
its biased, clamped-SwiGLU experts in castcore::clamped_swiglu, the same logits as transformers' own eager
model; tensor parallelism splits the sinks with the heads, and expert parallelism takes its experts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import castcore
from castcore.hf.attention import ATTENTION
from castcore.hf.cache import cache_argument
from castcore.hf.configs import configs
from castcore.deploy.kernels.fusing import rewrite
from castcore.workload.models import BuiltModel
from tests.deploy.test_fusing import real_model

# 2 layers: sliding (16) then full; 4 experts
GPT_OSS = str(Path(__file__).parents[1] / "data" / "tiny-gpt-oss.json")


def _logits(model, prompt, step):
    from transformers import DynamicCache

    cache = {cache_argument(model): DynamicCache(config=model.config)}
    with torch.no_grad():
        return model(prompt, **cache, use_cache=True).logits, model(step, **cache, use_cache=True).logits


def _set_attention(model, name: str) -> None:
    for config in configs(model):
        config._attn_implementation = name


def test_fused_gpt_oss_gives_transformers_own_eager_logits():
    model = real_model("tiny-gpt-oss.json")
    with torch.no_grad():
        model.model.layers[0].self_attn.sinks.mul_(10)  # sinks large enough to move the softmax visibly
    prompt, step = torch.randint(3, 200, (2, 24)), torch.randint(3, 200, (2, 1))  # past the 16-token window
    _set_attention(model, "eager")  # transformers' own attention, with its sink column
    want = _logits(model, prompt, step)
    _set_attention(model, ATTENTION)
    built = BuiltModel(model=model)
    done, stayed = rewrite(built)
    assert stayed == []
    assert any("clamped SwiGLU" in line for line in done) and any(
        "castcore::attention" in line for line in done
    )
    with built.while_capturing():
        got = _logits(model, prompt, step)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    with torch.no_grad():  # and the sinks matter: without them the logits move
        model.model.layers[0].self_attn.sinks.fill_(-1e4)
    with built.while_capturing():
        assert not torch.allclose(_logits(model, prompt, step)[0], got[0], atol=1e-3)


def _invokes(session, **options):
    return [r.invoke for r in session.estimate(castcore.build_workload(GPT_OSS, **options)).records]


def test_gpt_oss_captures_deployed_kernels_with_sinks_and_windows(session):
    invokes = _invokes(session, seq=24)
    names = {i.name for i in invokes}
    assert {
        "castcore::clamped_swiglu",
        "castcore::moe_permute",
        "castcore::moe_unpermute",
        "castcore::topk_softmax",
        "castcore::rotary_embedding",
    } <= names
    attention = [i for i in invokes if i.name == "castcore::attention"]
    assert [i.argument("window") for i in attention] == [16, 0]  # sliding, then full, as layer_types says
    assert all(tuple(i.args[-1].shape) == (4,) for i in attention)  # one sink per head
    unpermute = [i for i in invokes if i.name == "castcore::moe_unpermute"]
    # the down bias
    assert all(i.args[3] is not None and tuple(i.args[3].shape) == (4, 64) for i in unpermute)


@pytest.mark.parametrize(
    "options, heads, gate_up_bias",
    [
        ({"tp": 2}, 2, (4, 32)),  # every expert split over 2 devices: half of 2 x 32 intermediate columns
        ({"ep": 2}, 4, (2, 64)),  # 2 whole experts per device
        ({"tp": 2, "ep": 2}, 2, (2, 64)),
    ],
)
def test_gpt_oss_splits_across_devices(session, options, heads, gate_up_bias):
    invokes = _invokes(session, seq=16, **options)
    attention = [i for i in invokes if i.name == "castcore::attention"]
    assert attention and all(
        i.args[0].shape[1] == heads and tuple(i.args[-1].shape) == (heads,) for i in attention
    )
    swiglu = [i for i in invokes if i.name == "castcore::clamped_swiglu"]
    assert swiglu and all(tuple(i.args[1].shape) == gate_up_bias for i in swiglu)
