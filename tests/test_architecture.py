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


def _packages() -> list[Path]:
    """castcore's folder and every pack's top-level package folder under packs/ (beside its pyproject.toml or
    under src/); the cookiecutter templates and build copies are not packages."""
    found = [PACKAGE]
    for init in sorted((ROOT / "packs").rglob("__init__.py")):
        parts = init.relative_to(ROOT).parts
        if any("{{" in part for part in parts) or {"build", "tests"} & set(parts):
            continue
        if not (init.parent.parent / "__init__.py").exists():
            found.append(init.parent)
    return found


def _modules() -> dict[str, Path]:
    """Every module of those packages by its dotted name."""
    modules = {}
    for package in _packages():
        for path in package.rglob("*.py"):
            if "pack_template" in path.parts:
                continue
            parts = path.relative_to(package.parent).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported_module(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a ``from ... import`` names, a relative one (``from .ops import x``) made absolute."""
    if node.level == 0:
        return node.module or ""
    package = module if is_package else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _imports(path: Path, module: str, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports anywhere: at the top, inside a function or under ``if
    TYPE_CHECKING:`` alike, since each is an arrow between the two modules. ``from a import b`` imports the module
    ``a.b`` when there is one, else ``a``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _imported_module(node, module, path.name == "__init__.py")
            found.update(
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
            )
    return (found & modules.keys()) - {module}


def _graph() -> dict[str, set[str]]:
    """Module -> the modules it imports, over castcore and every pack."""
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def test_the_import_graph_covers_castcore_and_every_pack():
    graph = _graph()
    assert {
        "castcore.session",
        "castpack_ascend.fused",
        "castpack_collectives.alphabeta",
        "castpack_nvidia",
    } <= graph.keys()
    assert "castcore.plugins.host" in graph["castcore.plugins.audit"]  # a TYPE_CHECKING import counts
    assert "castpack_ascend.hardware" in graph["castpack_ascend.fused"]  # so does a relative one


def test_the_import_graph_has_no_cycle():
    graph = _graph()
    done, on_path, cycles = set(), [], []

    def visit(node: str) -> None:
        if node in on_path:
            cycles.append(on_path[on_path.index(node) :] + [node])
            return
        if node in done:
            return
        on_path.append(node)
        for nxt in sorted(graph[node]):
            visit(nxt)
        on_path.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_nothing_inside_castcore_imports_its_faces():
    """castcore and castcore.pack only re-export: a module importing castcore would reach every layer (the
    command line too), and castcore.pack is for packs, which castcore never imports."""
    graph = _graph()
    importers = {
        face: sorted(m for m, imported in graph.items() if m.startswith("castcore.") and face in imported)
        for face in ("castcore", "castcore.pack")
    }
    assert importers == {"castcore": [], "castcore.pack": []}


def test_modules_stay_small():
    big = {
        str(p.relative_to(ROOT)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 420
    }
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
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "castcore"
        ):
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
    assert not {k: v for k, v in bad.items() if v}, (
        "import these from castcore.pack (or castcore's own names)"
    )


def test_the_check_catches_an_internal_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from castcore.builtin.formulas import pointwise\nimport castcore\ncastcore.audit\n")
    assert [u for u in _castcore_uses(bad) if not _allowed(u)] == [
        "castcore.builtin.formulas:pointwise",
        "castcore:audit",
    ]


def test_every_public_name_resolves():
    for name in castcore.__all__:
        assert getattr(castcore, name) is not None, name
    for name in castcore.pack.__all__:
        assert getattr(castcore.pack, name) is not None, name
    with pytest.raises(AttributeError):
        castcore.no_such_name  # noqa: B018


def _run_without_torch(*argv: str, tmp_path: Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    code = (
        "import sys\nfrom castcore.cli.main import main\n"
        "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)\nsys.exit(code)"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, cwd=cwd
    )


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
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "embed.py"), str(h100_file)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
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
