"""Helpers for tests that write custom-op files and look at how castcore loaded them."""

from __future__ import annotations

from pathlib import Path

import torch

import castcore


def ops_dir(tmp_path: Path, **files: str) -> Path:
    """A custom-op directory ``tmp_path/ops`` holding ``name.py`` for each keyword."""
    folder = tmp_path / "ops"
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text)
    return folder


def info_of(session: castcore.Session, path: Path):
    """The PluginInfo of the custom-op file at ``path``."""
    return next(i for i in session.plugins.infos if i.origin == str(path))


def mm_answer(session: castcore.Session) -> tuple[str, float]:
    """Who answers a small aten.mm on h100-sxm, and its time."""
    report = session.estimate(
        torch.mm, torch.empty(8, 4, device="meta"), torch.empty(4, 2, device="meta"), device="h100-sxm"
    )
    return str(report.records[0].estimate.source), report.records[0].estimate.time_s
