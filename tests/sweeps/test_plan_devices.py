"""plan across device types: each type's best under the objective, against the winner's, and a type that cannot
hold the model said so in one line (castcore.sweeps.plan_objective)."""

from __future__ import annotations

import json
from pathlib import Path

from castcore.cli.main import main

DATA = Path(__file__).parents[1] / "data"
LLAMA = str(DATA / "tiny-llama.json")


def _device(tmp_path: Path, base: str, name: str, memory: int) -> str:
    """A test profile renamed and shrunk: the tiny model's largest batch then fits a few MiB."""
    text = (DATA / base).read_text()
    old = text.split('name = "', 1)[1].split('"', 1)[0]
    path = tmp_path / f"{name}.toml"
    path.write_text(
        text.replace(f'name = "{old}"', f'name = "{name}"', 1).replace(
            "memory_bytes = 85899345920", f"memory_bytes = {memory}", 1
        )
    )
    return str(path)


def _plan(tmp_path: Path, *more: str) -> list[str]:
    files = [
        _device(tmp_path, "h100-sxm.toml", "h100-small", 4 << 20),
        _device(tmp_path, "a100-sxm-80gb.toml", "a100-small", 4 << 20),
        _device(tmp_path, "h100-sxm.toml", "h100-none", 64 << 10),  # holds not even the weights
    ]
    argv = ["plan", "--model", LLAMA, "--input", "32", "--output", "8", "--tp", "1", "--workers", "1"]
    argv += ["--device", "a100-small,h100-small,h100-none", "--no-packs", *more]
    for file in files:
        argv += ["--device-file", file]
    return argv


def test_each_device_types_best_is_ranked_against_the_winner(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert main(_plan(tmp_path, "--json")) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["devices"] == ["a100-small", "h100-small", "h100-none"]  # the comma-separated list, in order
    first, second, none = found["by_device"]
    assert first["device"] == "h100-small" and first["ratio"] == 1.0  # the H100's rates win
    assert second["device"] == "a100-small" and second["ratio"] == second["figure"] / first["figure"] < 1
    for entry in (first, second):
        assert entry["figure"] == entry["best"]["output_tokens_per_s_per_device"]
        # no row of the plan's best on that device beats its own best
        assert all(
            r["output_tokens_per_s_per_device"] <= entry["figure"]
            for r in found["best"]
            if r["device"] == entry["device"]
        )
    assert none == {"device": "h100-none", "figure": None, "ratio": None, "best": None}
    assert main(_plan(tmp_path)) == 0
    text = capsys.readouterr().out
    lines = text.split("best on each device (output tokens/s per device)\n", 1)[1].splitlines()
    assert lines[0].startswith("  h100-small") and "the best: 1 device" in lines[0]
    assert lines[1].startswith("  a100-small") and f"{second['ratio']:.2f}x the best (" in lines[1]
    assert lines[2] == "  h100-none   no layout of at most 8 devices holds even batch 1 (raise --max-devices)"
