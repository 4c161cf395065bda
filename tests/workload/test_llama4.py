"""Llama 4 runs as vLLM runs it: its complex rotary and weightless qk norm as single kernels, its residual add in
the second norm, and its experts (made a grouped-GEMM experts module by the fusing) split by --tp and --ep and
quantized by --weights."""

from __future__ import annotations

from pathlib import Path

import pytest

import castcore

# 4 experts top-1, hidden 64, inter 32, 2 layers
LLAMA4 = str(Path(__file__).parents[1] / "data" / "tiny-llama4.json")


def _records(session, **options):
    return session.estimate(castcore.build_workload(LLAMA4, **options)).records


def test_llama4_standard_blocks_are_single_kernels(session):
    names = [r.invoke.name for r in _records(session, seq=16)]
    rotary = [r.invoke for r in _records(session, seq=16) if r.invoke.name == "castcore::rotary_embedding"]
    assert len(rotary) == 1 and rotary[0].argument("interleaved")  # layer 0 rotates (no_rope_layers: [1, 0])
    # each layer's residual add in its second norm, and its closing one in the next norm: layer 1's input norm,
    # then the final norm
    assert names.count("castcore::add_rms_norm") == 2 + 2
    assert (
        names.count("castcore::rms_norm") == 1 + 2
    )  # layer 0's input norm, q and k of layer 0 (after its rotary)
    assert "aten::view_as_complex" not in names and "aten::pow.Tensor_Scalar" not in names


@pytest.mark.parametrize(
    "options, experts, gate_up",
    [
        ({"tp": 2}, 4, (4, 64, 32)),  # every expert split over 2 devices: [experts, hidden, 2 x inter / 2]
        ({"ep": 2}, 2, (2, 64, 64)),
        ({"tp": 2, "ep": 2}, 2, (2, 64, 64)),
    ],
)
def test_llama4_experts_split_across_devices(session, options, experts, gate_up):
    grouped = [r.invoke for r in _records(session, seq=16, **options) if r.invoke.name == "aten::_grouped_mm"]
    assert grouped and tuple(grouped[0].args[1].shape) == gate_up


@pytest.mark.parametrize(
    "weights, product",
    [("int8", "castcore::weight_only_grouped_mm"), ("fp8-block", "aten::_scaled_grouped_mm")],
)
def test_llama4_experts_take_quantized_weights(session, weights, product):
    names = [r.invoke.name for r in _records(session, seq=16, weights=weights)]
    assert names.count(product) == 4 and "aten::_grouped_mm" not in names  # two products in each of 2 layers


def test_transformers_rope_warnings_are_castcore_notes_not_stderr(capsys):
    """Meta's own Scout config sets high_freq_factor = low_freq_factor, which transformers warns of: castcore
    keeps that as a note of its own instead of a library line on stderr."""
    from castcore.deploy.pipeline import build

    built = build(castcore.build_workload("llama-4-scout", seq=8))
    assert any("transformers warns: `rope_parameters`'s high_freq_factor" in note for note in built.notes)
    assert "rope_parameters" not in capsys.readouterr().err
