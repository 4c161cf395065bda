"""castcore and the installed transformers: one module touches its internals, castcore's own calls raise no
library warning, a release outside the tested range is one warning line, a failure inside transformers one
error line."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from castcore.hf import cache, versions
from castcore.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parents[1] / "data"


def _imports_transformers(path: Path) -> list[int]:
    """Lines of ``path`` that import transformers or look its modules up in sys.modules."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("transformers.")
        ):
            names = [node.value]
        if any(name == "transformers" or name.startswith("transformers.") for name in names):
            lines.append(node.lineno)
    return lines


def test_only_castcore_hf_touches_transformers():
    hf = ROOT / "castcore" / "hf"
    found = {
        str(path.relative_to(ROOT)): lines
        for path in (ROOT / "castcore").rglob("*.py")
        if hf not in path.parents
        and "pack_template" not in path.parts
        and (lines := _imports_transformers(path))
    }
    assert found == {}, "transformers is used outside castcore/hf/: move the touch there"
    # the scan does see imports where they are
    assert _imports_transformers(hf / "causal_lm.py") and _imports_transformers(hf / "cache.py")


@pytest.mark.parametrize(
    "package, found, warned",
    [
        ("transformers", "5.4.0", True),
        ("transformers", "5.5.0", False),
        ("transformers", "5.24.9", False),
        ("transformers", "5.25.0", True),
        ("transformers", "6.0.0", True),
        ("torch", "2.13.0+cpu", False),
        ("torch", "2.12.1", True),
        ("torch", "2.14.0", True),
    ],
)
def test_a_release_outside_the_tested_range_is_one_warning(monkeypatch, package, found, warned):
    monkeypatch.setattr(versions, "installed", lambda name: found if name == package else None)
    lines = versions.version_warnings()
    assert len(lines) == int(warned)
    if warned:
        low, high = versions.TESTED[package]
        assert lines[0].startswith(
            f"{package} {found} is installed; castcore is tested on {package} {low} to {high}.x"
        )


def test_the_command_line_prints_the_version_warning_once(monkeypatch, capsys, tiny_llama, h100_file):
    monkeypatch.setattr(versions, "installed", lambda name: "5.1.0" if name == "transformers" else None)
    assert (
        main(
            [
                "estimate",
                "--model",
                str(tiny_llama),
                "--seq",
                "8",
                "--no-packs",
                "--device-file",
                str(h100_file),
            ]
        )
        == 0
    )
    lines = [line for line in capsys.readouterr().err.splitlines() if "5.1.0" in line]
    assert lines == [
        f"castcore: warning: transformers 5.1.0 is installed; castcore is tested on transformers "
        f"{versions.tested_range('transformers')}: its estimates may fail or differ (pip install "
        f"'transformers>={versions.TESTED['transformers'][0]},<5.25')"
    ]


def test_a_failure_inside_transformers_is_one_line_naming_the_model_and_versions(
    monkeypatch, capsys, tiny_llama, h100_file
):
    """Something transformers' Llama relies on has moved (as a release may do): castcore says what failed where."""
    from transformers.models.llama import modeling_llama

    monkeypatch.delattr(modeling_llama, "rotate_half")  # apply_rotary_pos_emb now fails inside transformers
    argv = [
        "estimate",
        "--model",
        str(tiny_llama),
        "--seq",
        "8",
        "--no-packs",
        "--device-file",
        str(h100_file),
        "--no-cache",
    ]  # (a cached capture would not build the model at all)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        f"castcore: error: LlamaForCausalLM failed inside transformers "
        f"{versions.installed('transformers')} (NameError: name 'rotate_half' is not defined); "
        f"castcore is tested on transformers {versions.tested_range('transformers')}"
    )
    assert not any("Traceback" in line for line in err)
    with pytest.raises(Exception) as raised:  # --debug: the traceback, with transformers' own error under it
        main([*argv, "--debug"])
    assert isinstance(raised.value.__cause__, NameError)


def test_an_error_of_castcore_or_the_user_is_not_blamed_on_transformers(session):
    class Broken(__import__("torch").nn.Module):
        def forward(self, x):
            raise AttributeError("the user's own bug")

    import torch

    with pytest.raises(AttributeError, match="the user's own bug"):
        session.estimate(Broken(), torch.zeros(2))


@pytest.mark.parametrize(
    "command",
    [
        ["estimate", "--phase", "decode", "--kv-cache", "fp8", "--kv-len", "64"],
        ["serve", "--kv-cache", "int8", "--batch", "2", "--input", "32", "--output", "8"],
        ["estimate", "--phase", "decode", "--kv-len", "64", "--eager"],
    ],
)
def test_castcore_raises_no_library_warning(h100_file, command):
    """Python warnings shown as they would be to a user (``-W default``): stderr holds castcore's lines only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "default",
            "-m",
            "castcore",
            *command,
            "--model",
            str(DATA / "tiny-llama.json"),
            "--no-packs",
            "--device-file",
            str(h100_file),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stderr.splitlines() if not line.startswith("castcore: ")] == []


def test_the_tested_range_starts_at_the_lowest_bound_pyproject_admits():
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    with open(ROOT / "pyproject.toml", "rb") as file:
        requirements = {r.name: r for r in map(Requirement, tomllib.load(file)["project"]["dependencies"])}
    for package, (low, high) in versions.TESTED.items():
        bound = next(s.version for s in requirements[package].specifier if s.operator == ">=")
        assert Version(bound) == Version(low), (
            f"pyproject admits {package} from {bound}; castcore.hf says {low}"
        )


def test_the_oldest_session_runs_every_test_file_that_builds_models():
    from conftest import MODEL_TESTS

    files = {path.stem for path in Path(__file__).parents[1].rglob("test_*.py")}
    assert MODEL_TESTS <= files
    # Files that build a model from the shipped configs or a preset but are left to the newest-only run:
    # sweeps and plans (their model work is what the files above test), the fidelity and bench scripts, plugin
    # loading, entry points and audits, the option catalog (which reads a preset's config only), and hostile input
    # (refused before or beside the model it names).
    newest_only = {
        "test_sweep",
        "test_sweep_plan",
        "test_plan_traffic",
        "test_plan_frontier",
        "test_plan_space",
        "test_plan_validation",
        "test_steady",
        "test_sweep_spec",
        "test_sweep_ray",
        "test_fidelity",
        "test_bench",
        "test_audit",
        "test_formulas",
        "test_roofline",
        "test_plugin_defects",
        "test_interrupts",
        "test_catalog",
        "test_entry_points",
        "test_hostile",
        # Qwen3-Next's Gated DeltaNet as engines run it needs transformers 5.24's linear-attention cache (an older
        # one is refused in one line, castcore.deploy.recurrent_layers), and Kimi Linear and Nemotron-H its classes;
        # so do Nemotron-H's Mamba-2 decode steps and mixed batches
        "test_linear_attention",
        "test_kimi_delta",  # kimi_linear is not in 5.5.0
        "test_mamba",
        "test_recurrent_layers",
        "test_sparse_attention",  # DeepSeek-V3.2's classes came after the oldest transformers castcore takes
    }
    builds = {
        path.stem
        for path in Path(__file__).parents[1].rglob("test_*.py")
        if any(word in path.read_text(encoding="utf-8") for word in ("tiny-", "tiny_llama", "llama-3-8b"))
    }
    assert builds - MODEL_TESTS - newest_only == set()


def test_what_counts_as_a_failure_inside_transformers(tiny_llama):
    import torch
    import transformers  # noqa: F401  (raised_inside looks for its package)

    with pytest.raises(
        AttributeError
    ) as ours:  # castcore's own touch of transformers failing, as 5.24 made it
        cache.cache_argument(object())
    assert versions.raised_inside(ours.value)
    with pytest.raises(RuntimeError) as torch_op:  # an operator torch refuses is torch's, whoever called it
        torch.mm(torch.zeros(2, 3), torch.zeros(2, 3))
    assert not versions.raised_inside(torch_op.value)
