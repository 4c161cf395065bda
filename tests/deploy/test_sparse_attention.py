"""DeepSeek-V3.2's sparse attention is not priced yet: every command refuses it in one line naming its indexer,
before transformers' own forward fails on a capture."""

from __future__ import annotations

from pathlib import Path

import pytest

from castcore.cli.main import main

DATA = Path(__file__).parents[1] / "data"
V32, H100 = str(DATA / "tiny-deepseek-v32.json"), str(DATA / "h100-sxm.toml")


@pytest.mark.parametrize(
    "command",
    [
        ["estimate"],
        ["estimate", "--phase", "decode", "--kv-len", "32"],
        ["simulate", "--requests", "4", "--input", "64", "--output", "4"],
    ],
    ids=["prefill", "decode", "simulate"],
)
def test_sparse_attention_is_refused_in_one_line_naming_the_indexer(capsys, command):
    argv = [*command, "--model", V32, "--device-file", H100, "--device", "h100-sxm", "--no-packs"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"castcore: error: {V32}: its sparse attention (an indexer picks 8 keys for each query, "
        "DeepseekV32Indexer) is not priced yet, and pricing every key would hide what it saves; for the same "
        "model with dense attention use deepseek-v3.1"
    )
    assert "Traceback" not in "\n".join(err)
