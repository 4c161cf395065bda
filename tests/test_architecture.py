"""The package's shape: layers without cycles, two public faces, packs that use only theirs, a quick start-up."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import castcore
import castcore.pack

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "castcore"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """castcore modules ``path`` imports, at any depth, except under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for child in node.body for n in ast.walk(child)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("castcore"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("castcore"))
    return found


def _graph() -> dict[str, set[str]]:
    files = [p for p in PACKAGE.rglob("*.py") if "pack_template" not in p.parts]
    modules = {_module_name(p): p for p in files}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def test_the_import_graph_has_no_cycle():
    graph = _graph()
    # The two faces only re-export; a package __init__ is its folder's docstring.
    faces = {"castcore", "castcore.pack"}
    graph = {k: v - faces for k, v in graph.items() if k not in faces}
    done, on_path, cycles = set(), [], []

    def visit(node: str) -> None:
        if node in on_path:
            cycles.append(on_path[on_path.index(node):] + [node])
            return
        if node in done:
            return
        on_path.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        on_path.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_modules_stay_small():
    big = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > 420}
    assert not big, f"split these modules, each into parts with one job: {big}"


def _castcore_uses(path: Path) -> list[str]:
    """Every way ``path`` reaches into castcore: imported modules and names, and castcore.X attributes."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "castcore":
            uses += [f"{node.module}:{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            uses += [a.name for a in node.names if a.name.split(".")[0] == "castcore"]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "castcore":
            uses.append(f"castcore:{node.attr}")
    return uses


def _allowed(use: str) -> bool:
    if use in ("castcore", "castcore.pack"):
        return True
    module, _, name = use.partition(":")
    if module == "castcore":
        return name in castcore.__all__ or name == "pack"
    return module == "castcore.pack" and name in castcore.pack.__all__


def _pack_side_files() -> list[Path]:
    files = list((ROOT / "packs").glob("castpack-*/**/*.py"))
    files += list((PACKAGE / "pack_template").rglob("*.py")) + list((ROOT / "examples").rglob("*.py"))
    return [f for f in files if "build" not in f.relative_to(ROOT).parts]


def test_packs_the_template_and_examples_use_only_the_public_faces():
    files = _pack_side_files()
    assert len(files) > 10
    bad = {str(f.relative_to(ROOT)): sorted({u for u in _castcore_uses(f) if not _allowed(u)}) for f in files}
    assert not {k: v for k, v in bad.items() if v}, "import these from castcore.pack (or castcore's own names)"


def test_the_check_catches_an_internal_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from castcore.builtin.formulas import pointwise\nimport castcore\ncastcore.audit\n")
    assert [u for u in _castcore_uses(bad) if not _allowed(u)] == ["castcore.builtin.formulas:pointwise",
                                                                  "castcore:audit"]


def test_every_public_name_resolves():
    for name in castcore.__all__:
        assert getattr(castcore, name) is not None, name
    for name in castcore.pack.__all__:
        assert getattr(castcore.pack, name) is not None, name
    with pytest.raises(AttributeError):
        castcore.no_such_name  # noqa: B018


def _run_without_torch(*argv: str, tmp_path: Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    code = ("import sys\nfrom castcore.cli.main import main\n"
            "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)\nsys.exit(code)")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, cwd=cwd)


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["estimate", "--help"]])
def test_help_and_version_import_no_torch(argv, tmp_path):
    done = _run_without_torch(*argv, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().endswith("NO-TORCH"), done.stderr


def test_devices_imports_no_torch_once_the_packs_are_known(tmp_path, h100_file):
    first = _run_without_torch("packs", "--json", tmp_path=tmp_path)  # a full load notes each pack's hooks
    assert first.returncode == 0, first.stderr
    done = _run_without_torch("devices", "--json", "--device-file", str(h100_file), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().endswith("NO-TORCH"), done.stderr
    assert "h100-sxm" in done.stdout


def test_python_dash_m_castcore_prints_the_version():
    done = subprocess.run([sys.executable, "-m", "castcore", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("castcore "), done.stderr


def test_the_embedding_example_runs(h100_file):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "embed.py"), str(h100_file)], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    prefill, decode = done.stdout.splitlines()
    assert "prefill, batch 4, 128 tokens" in prefill and "decode, batch 4, 1 token over 128 cached" in decode


def test_devices_skips_a_default_custom_op_dir_when_told(tmp_path, h100_file):
    project = tmp_path / "project"
    (project / "custom_op").mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    (project / "custom_op" / "mine.py").write_text("import torch\n")
    argv = ["devices", "--json", "--no-packs", "--device-file", str(h100_file)]
    loaded = _run_without_torch(*argv, tmp_path=tmp_path, cwd=project)
    skipped = _run_without_torch(*argv, "--no-default-custom-op-dirs", tmp_path=tmp_path, cwd=project)
    assert loaded.returncode == skipped.returncode == 0, (loaded.stderr, skipped.stderr)
    assert loaded.stderr.strip().endswith("TORCH") and not loaded.stderr.strip().endswith("NO-TORCH")
    assert skipped.stderr.strip().endswith("NO-TORCH")
    assert json.loads(loaded.stdout) == json.loads(skipped.stdout)
