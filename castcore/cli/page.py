"""--html on estimate, serve, simulate, sweep and plan: the page's path checked before the work (and plotly
installed), then the page written whole after it (castcore.report.html)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from castcore.cli.common import note


def page_path(args: argparse.Namespace) -> Path | None:
    """--html's path, checked writable and with plotly installed, before anything runs; None without --html."""
    if not args.html:
        return None
    from castcore.report.html.write import check_html

    return check_html(args.html)


def write_page(path: Path | None, command: str, data: dict[str, Any]) -> None:
    """Write the page of ``data`` (castcore.report.html's page data) to ``path`` whole, and say so."""
    if path is None:
        return
    from castcore.report.html.write import write_page as write

    write({**data, "source": f"castcore {command}"}, path)
    note(f"wrote the HTML page {path} (one file; it opens offline in any browser)")


def simulation_figures(report: Any, args: argparse.Namespace, host: Any) -> dict[str, Any]:
    """A simulation's energy (when a plugin host gives the pools' power) and cost, as castcore simulate prints
    them (castcore.report.energy)."""
    from castcore.report.energy import simulation_cost, simulation_energy

    return {
        **(
            simulation_energy([(host.device(use.device), use) for use in report.pool_use], report.summary)
            if host
            else {}
        ),
        **simulation_cost(args.price_per_device_hour, report.pool_use, report.summary),
    }
