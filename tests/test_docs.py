"""The documentation keeps up with the command line: every command has its generated reference, no page names an
option castcore lacks, and the README's links into docs/ lead somewhere. ``nox -s docs`` builds the whole site in
strict mode; these checks need no mkdocs."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from castcore.cli import reference

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"


def _hook():
    """docs/hooks/reference.py, the mkdocs hook, loaded as a module (it imports mkdocs only to raise its error)."""
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_command_has_its_marker_in_the_reference_page():
    page = (DOCS / "reference.md").read_text()
    markers = re.findall(r"^<!--\s*castcore-reference:\s*([\w-]+)\s*-->", page, re.MULTILINE)
    assert reference.commands(), "castcore.cli.reference lists no command"
    assert sorted(markers) == sorted(reference.commands())
    assert len(markers) == len(set(markers)), "a command's reference appears twice"


def test_every_reference_renders():
    for command in reference.commands():
        assert reference.markdown(command).strip(), command


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert pages
    assert [p for p in pages if f" {p}\n" not in nav] == []


def test_no_page_names_an_option_castcore_lacks():
    hook = _hook()
    known = hook._known_options()
    assert {"--batch", "--max-batch", "--version"} <= known
    for page in sorted(DOCS.rglob("*.md")):
        unknown = set(hook._options_written(page.read_text())) - known
        assert not unknown, f"{page.relative_to(ROOT)} names {sorted(unknown)}"


def test_the_option_check_reads_castcore_command_lines_and_bare_options_only():
    hook = _hook()
    text = (
        "Use `--batch 8`, `castcore serve --max-batch`, `python bench/scale.py --models x` and `nox -s peers -- "
        "--quick`.\n\n```console\n$ castcore plan --ttft 1s\n$ pip install --no-deps x\n```\n"
    )
    assert hook._options_written(text) == ["--ttft", "--batch", "--max-batch"]


def test_a_page_naming_a_missing_option_fails_the_build_naming_both():
    hook = _hook()
    from mkdocs.exceptions import PluginError  # nox -s tests installs the docs extra for this

    class Page:
        class file:
            src_uri = "cli.md"

    with pytest.raises(PluginError, match=r"cli\.md names --bacth"):
        hook.on_page_markdown("Try `castcore estimate --bacth 8`.", Page, None, None)


def test_the_readme_starts_with_the_two_set_up_commands_and_links_into_docs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    block = re.search(r"```sh\n(.*?)\n```", readme, re.DOTALL).group(1).splitlines()
    assert block[0].startswith("python3 -m venv .venv && ") and block[0].endswith(
        " && .venv/bin/castcore estimate"
    )
    assert block[1] == "python3 -m pip install nox && python3 -m nox" and block[1] in ci
    assert readme.index("```sh") < readme.index("\n## ")  # before anything else
    links = re.findall(r"\]\(((?:docs/)[^)#\s]+)(?:#[^)]*)?\)", readme)
    assert links, "the README links into docs/"
    assert [link for link in links if not (ROOT / link).is_file()] == []
    assert len(readme.splitlines()) <= 300


def test_the_install_line_gives_every_extra_the_readme_shows_and_the_demo_session_runs_it():
    """The README's venv runs every feature the README shows (`--html` needs plotly, `--plot` matplotlib); the
    getting-started page and ``nox -s demo`` install what the README's line does."""
    readme = (ROOT / "README.md").read_text()
    line = re.search(r"```sh\n(.*?)\n", readme).group(1)
    assert line in (DOCS / "getting-started.md").read_text()
    words = line.split(" && ")[1].split()
    assert words[:3] == [".venv/bin/pip", "install", "torch==2.13.0"]
    extras = re.fullmatch(r"'\.\[(.*)\]'", words[words.index("-e") + 1])
    assert extras, words
    extras = set(extras[1].split(","))
    needs = {"html": "`--html", "plot": "`--plot`", "sweep": ".parquet"}
    assert {extra for extra, shown in needs.items() if shown in readme} <= extras
    packs = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "-e"][1:]
    demo = (ROOT / "noxfile.py").read_text().split("def demo(")[1].split("@nox.session")[0]
    installs = f'session.install(".[{",".join(sorted(extras))}]", {", ".join(map(repr, packs))})'.replace(
        "'", '"'
    )
    # as the formatter wraps it, a trailing comma and all
    assert re.sub(r"\s+", "", installs) in re.sub(r",\)", ")", re.sub(r"\s+", "", demo))


def test_every_device_an_example_names_is_one_the_packs_install_or_its_device_file_gives():
    """`--device h100` on a page must work as written: the name is a profile the packs ship (what `castcore devices`
    lists after the README's install), or the example passes the device file that gives it."""
    import tomllib

    shipped = {tomllib.loads(f.read_text())["name"] for f in ROOT.glob("packs/*/castpack_*/profiles/*.toml")}
    assert "h100-sxm5-80gb" in shipped and "ascend-910b3" in shipped
    wrong = []
    for page in [*DOCS.rglob("*.md"), ROOT / "README.md"]:
        text = page.read_text()
        blocks = re.findall(r"```.*?```", text, re.DOTALL)
        examples = [line for block in blocks for line in block.splitlines()]  # a command or statement a line
        examples += re.findall(r"`[^`\n]+`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
        for example in examples:
            if re.search(r"device[-_]files?\b", example):
                continue  # the device file given names its device
            for given in re.findall(r"--device[ =]([\w.,-]+)|\bdevice=[\"']([\w.-]+)[\"']", example):
                for name in "".join(given).split(","):  # plan takes several, comma-separated
                    # D: a placeholder
                    if name not in shipped and name not in ("meta", "cpu") and not name.isupper():
                        wrong.append(f"{page.relative_to(ROOT)}: {name}")
    assert wrong == []


def test_every_repository_path_the_pages_name_exists():
    """A file or folder a page names (`castcore/hf/`, `bench/results/peers.md`) is there: a move must move the
    page's words too."""
    prefixes = ("castcore/", "packs/", "bench/", "tests/", "examples/", "docs/", ".ci/")
    named = set()
    for page in [*DOCS.rglob("*.md"), ROOT / "README.md"]:
        for span in re.findall(r"`([^`\s]+)`", page.read_text()):
            if span.startswith(prefixes):
                braces = re.fullmatch(r"(.*)\{(.*)\}(.*)", span)  # bench/results/fidelity.{json,md}
                named.update(
                    [f"{braces[1]}{alt}{braces[3]}" for alt in braces[2].split(",")] if braces else [span]
                )
    assert named
    assert sorted(path for path in named if not (ROOT / path.rstrip("/")).exists()) == []


def test_the_architecture_page_draws_the_layers_of_the_import_contract_in_order():
    import tomllib

    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contract if c["name"] == "castcore's layers"]
    drawn = [[m.strip().removeprefix("castcore.") for m in line.split("|")] for line in layers]
    page = (DOCS / "architecture.md").read_text()
    diagram = re.search(r"```text\n(.*?)```", page, re.DOTALL).group(1)
    rows = [
        [cell.strip().split()[0] for cell in line.strip(" |").split("|") if cell.strip()]
        for line in diagram.splitlines()
        if line.strip().startswith("|") and "re-exports" not in line
    ]
    assert rows == drawn, (
        "docs/architecture.md's drawing is not the layers of pyproject.toml's import contract"
    )
    table = re.findall(r"^\| `castcore\.(\w+)` \|", page, re.MULTILINE)
    assert table == [layer for line in drawn for layer in line], (
        "docs/architecture.md's table is not the contract's"
    )
