"""Hybrid models with linear-attention or state-space layers (Qwen3-Next, Kimi Linear, Nemotron-H): a prefill on one
device is priced; what castcore cannot price yet is refused in one line naming the layers, before transformers
could fail with its own internals. Tiny configs in tests/data; these families need the newest transformers
castcore is tested on (not a ``models`` test)."""

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


@pytest.mark.parametrize("name, layers", HYBRIDS.items())
@pytest.mark.parametrize(
    "argv, asked",
    [
        (["estimate", "--seq", "16", "--phase", "decode"], "--phase decode is not supported"),
        (["estimate", "--seq", "16", "--tp", "2"], "--tp 2 is not supported"),
        (["serve", "--input", "16", "--output", "4", "--batch", "2"], "--phase decode is not supported"),
        (["simulate", "--input", "16", "--output", "4", "--requests", "3"], "a mixed batch"),
    ],
    ids=["decode", "tp", "serve", "simulate"],
)
def test_what_is_not_priced_yet_is_one_line_naming_the_layers(h100_file, capsys, name, layers, argv, asked):
    code = main([*argv, "--model", str(DATA / name), "--device-file", str(h100_file), "--no-packs"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("castcore: error: "), err
    assert all(line.endswith(" ...") for line in err[:-1]), err  # before it, only what castcore started
    assert asked in err[-1] and layers in err[-1] and "--phase prefill --tp 1" in err[-1], err
    assert "transformers" not in err[-1] and "attribute" not in err[-1]
