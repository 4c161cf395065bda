"""Run by `nox -s template`, not collected by pytest: a pack made by `castcore new-pack` and pip-installed
beside a non-editable castcore is listed by `castcore packs` and wins its example op in `castcore audit`.

usage: python tests/template_check.py PACK_DIR DISTRIBUTION ENTRY_POINT DEVICE
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import castcore

CHECKOUT = Path(__file__).resolve().parents[1]
OTHER_DEVICE = CHECKOUT / "tests" / "data" / "h100-sxm.toml"


def castcore_json(*args: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    done = subprocess.run(["castcore", *args], capture_output=True, text=True, env=env)
    assert done.returncode == 0, f"castcore {' '.join(args)} exited {done.returncode}: {done.stderr}"
    return json.loads(done.stdout)


def main(pack_dir: str, distribution: str, entry_point: str, device: str) -> None:
    # The template really ships in the installed distribution, dotfiles included.
    installed = Path(castcore.__file__).resolve().parent
    assert installed != CHECKOUT / "castcore", (
        f"castcore imported from the checkout {installed}, not an install"
    )
    template = installed / "pack_template"
    for name in (
        "cookiecutter.json",
        "hooks/pre_gen_project.py",
        "{{cookiecutter.pack_name}}/.gitignore",
        "{{cookiecutter.pack_name}}/{{cookiecutter.module_name}}/ops.py",
    ):
        assert (template / name).is_file(), f"{template / name} is missing from the installed castcore"
    for name in (
        ".gitignore",
        "README.md",
        "noxfile.py",
        "pyproject.toml",
        "tests/test_pack.py",
        f"{distribution.replace('-', '_')}/profiles/{device}.toml",
    ):
        assert (Path(pack_dir) / name).is_file(), f"new-pack did not make {name} in {pack_dir}"

    packs = {row["name"]: row for row in castcore_json("packs", "--json")}
    assert entry_point in packs, f"castcore packs does not list {entry_point}: {sorted(packs)}"
    row = packs[entry_point]
    assert (row["kind"], row["distribution"], row["status"]) == ("pack", distribution, "loaded"), row
    assert row["claims"] >= 2, row

    rows = {
        r["device"]: r
        for r in castcore_json("audit", "--json", "--op", "aten::mm", "--device-file", str(OTHER_DEVICE))
    }
    mm = rows[device]
    assert mm["op"] == "aten::mm" and mm["status"] == "ok", mm
    assert mm["winner"]["plugin"] == f"{distribution} {row['version']}", mm["winner"]
    assert (mm["winner"]["kind"], mm["winner"]["device"]) == ("estimator", f"{device}*"), mm["winner"]
    # The example claims its own devices only: on another device the core still answers.
    assert rows["h100-sxm"]["winner"]["plugin"] == "core", rows["h100-sxm"]
    print(f"template check: {distribution} is loaded and wins aten::mm on {device} (not on h100-sxm)")


if __name__ == "__main__":
    main(*sys.argv[1:])
