"""Hybrid models with linear-attention or state-space layers (Qwen3-Next, Kimi Linear, Nemotron-H): a prefill on one
device is priced, and so is all of their deployed serving (static and under traffic:
tests/deploy/test_linear_attention.py, tests/deploy/test_mamba.py, tests/deploy/test_kimi_delta.py); what castcore
cannot price yet (their decode steps eager) is refused in one line naming the layers, before transformers could fail with its own internals. Tiny configs in tests/data;
these families need the newest transformers castcore is tested on (not a ``models`` test)."""

from __future__ import annotations

import pytest

import castcore
from castcore.cli.main import main

from tests.deploy.test_fusing import DATA

HYBRIDS = {
    "tiny-qwen3-next.json": "Gated DeltaNet linear-attention layers",
    "tiny-kimi-linear.json": "delta-rule linear-attention layers",
    "tiny-nemotron-h.json": "Mamba state-space layers",
}


@pytest.mark.parametrize("name", HYBRIDS)
def test_a_prefill_on_one_device_is_priced(session, name):
    report = session.estimate(castcore.build_workload(str(DATA / name), seq=16), device="h100-sxm")
    assert report.time_s > 0 and report.flops > 0


EAGER = (
    ["estimate", "--seq", "16", "--phase", "decode", "--eager"],
    "--phase decode is not supported with --eager",
)
REFUSED = [  # Qwen3-Next's Gated DeltaNet, Nemotron-H's Mamba-2 and Kimi Linear's KDA run deployed, not eager
    ("tiny-qwen3-next.json", *EAGER),
    ("tiny-nemotron-h.json", *EAGER),
    ("tiny-kimi-linear.json", *EAGER),
]


@pytest.mark.parametrize("name, argv, asked", REFUSED)
def test_what_is_not_priced_yet_is_one_line_naming_the_layers(h100_file, capsys, name, argv, asked):
    layers = HYBRIDS[name]
    code = main([*argv, "--model", str(DATA / name), "--device-file", str(h100_file), "--no-packs"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("castcore: error: "), err
    assert all(line.endswith(" ...") for line in err[:-1]), err  # before it, only what castcore started
    fix = "drop --eager" if "--eager" in argv else "--phase prefill --tp 1"
    assert asked in err[-1] and layers in err[-1] and fix in err[-1], err
    assert "transformers" not in err[-1] and "attribute" not in err[-1]


@pytest.mark.parametrize(
    "name, cached",
    [
        # Qwen3-Next: one full-attention layer of 16 tokens x 2 KV heads x 16 x (K, V) x 2 bytes; three Gated
        # DeltaNet layers, each a state of 4 value heads x 16 x 16 and the convolution's last 3 inputs of
        # q, k (2 heads x 16 each) and v (4 x 16), in bf16.
        ("tiny-qwen3-next.json", 2 * 16 * 2 * 16 * 2 + 3 * (4 * 16 * 16 + 3 * (2 * 32 + 64)) * 2),
        # Nemotron-H: one attention layer the same; one Mamba-2 layer: the convolution's last 3 inputs of x
        # (8 heads x 16) and B, C (2 groups x 16 each) in bf16, the state 8 x 16 x 16 in its fp32 cache dtype.
        ("tiny-nemotron-h.json", 2 * 16 * 2 * 16 * 2 + 3 * (128 + 64) * 2 + 8 * 16 * 16 * 4),
        # Kimi Linear: one latent attention layer of 16 tokens x (rank 16 + rope 8); three KDA layers, each a
        # state of 4 heads x 16 x 16 and the convolution's last 3 inputs of q, k and v (4 heads x 16 each), bf16.
        ("tiny-kimi-linear.json", 16 * (16 + 8) * 2 + 3 * (4 * 16 * 16 + 3 * 3 * 64) * 2),
    ],
)
def test_a_prefill_holds_its_attention_layers_keys_and_each_recurrent_layers_state(session, name, cached):
    report = session.estimate(castcore.build_workload(str(DATA / name), seq=16), device="h100-sxm")
    assert report.memory.kv_cache_bytes == cached


def test_an_older_transformers_is_refused_in_one_line_for_gated_deltanet(session, monkeypatch):
    from castcore.deploy import recurrent_layers

    monkeypatch.setattr(recurrent_layers, "installed", lambda package: "5.5.0")
    with pytest.raises(
        castcore.CastcoreError, match=r"transformers 5\.24 or newer, and 5\.5\.0 is installed"
    ):
        session.estimate(
            castcore.build_workload(str(DATA / "tiny-qwen3-next.json"), seq=16), device="h100-sxm"
        )


def test_an_older_transformers_is_refused_in_one_line_for_mamba2_decode_steps(session, monkeypatch):
    from castcore.deploy import recurrent_layers

    monkeypatch.setattr(recurrent_layers, "installed", lambda package: "5.5.0")
    nemotron_h = str(DATA / "tiny-nemotron-h.json")
    # a prefill runs on any release: its state starts from zeros and is not read back
    assert session.estimate(castcore.build_workload(nemotron_h, seq=16), device="h100-sxm").time_s > 0
    with pytest.raises(
        castcore.CastcoreError, match=r"Mamba-2 layers' decode steps run .* 5\.5\.0 is installed"
    ):
        session.estimate(castcore.build_workload(nemotron_h, phase="decode", kv_len=16), device="h100-sxm")
