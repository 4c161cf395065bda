"""What every benchmark writes: the machine it ran on, its JSON figures and their Markdown table beside them."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    return {
        "machine": platform.platform(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }


def write(out: str | Path, figures: dict[str, Any], markdown: Callable[[dict[str, Any]], str]) -> None:
    """``out`` (JSON: the machine and ``figures``) and ``out`` with .md: ``markdown(machine)``; print the table."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    about = machine()
    out.write_text(json.dumps({**about, **figures}, indent=2))
    table = markdown(about)
    out.with_suffix(".md").write_text(table)
    print(table)
    print(f"wrote {out} and {out.with_suffix('.md')}")


def peer_versions(peers: dict[str, str], script: str, session: str) -> dict[str, str]:
    """The installed version of each peer (exits naming ``session`` when one is missing), with a warning when it
    is not the version the sources cite."""
    import sys
    from importlib import metadata

    versions = {}
    for name, wanted in peers.items():
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            sys.exit(
                f"{script} needs {name}=={wanted} installed beside castcore (nox -s {session} installs it)"
            )
        if versions[name] != wanted:
            print(f"warning: {name} {versions[name]} installed; the sources cite {wanted}", file=sys.stderr)
    return versions
