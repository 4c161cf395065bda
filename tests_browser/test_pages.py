"""Every kind of HTML page castcore writes, opened in a real headless Chromium (the system's, driven by Playwright)
with the network cut off: no request leaves the file, no console error, the Plotly charts are drawn with their
traces, a table sorts by a click on its header and filters as one types, the roofline's hover names the call. The
screenshots go to docs/images/, where docs/report.md shows them. ``nox -s browser`` runs these; the pages come from
real castcore runs on a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).parent.parent
DATA = ROOT / "tests" / "data"
IMAGES = ROOT / "docs" / "images"
LLAMA, H100, A100 = str(DATA / "tiny-llama.json"), str(DATA / "h100-sxm.toml"), str(DATA / "a100-sxm-80gb.toml")
PLUGINS = ["--device-file", H100, "--no-packs"]
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# kind: (charts on the page, the table sorted and filtered, its numeric column, a word some of its rows hold, the
# section the screenshot shows)
PAGES = {
    "estimate": (3, "ops-table", "time", "aten", "#roofline"),
    "serve": (3, "ops-table-0", "bytes", "castcore", "#request"),
    "simulate": (6, "latency-table", "p99", "token", "#batches"),
    "sweep": (1, "candidates-table", "batch", "a100", "#front"),
    "plan": (1, "candidates-table", "served_batch", "int8", "#front"),
    "report": (2, "latency-table", "mean", "latency", "#distributions"),
}


def commands(folder: Path) -> dict[str, list[str]]:
    spec = folder / "spec.toml"
    spec.write_text(f'command = "serve"\nmodel = {json.dumps(LLAMA)}\ndevice = ["h100-sxm", "a100-sxm-80gb"]\n'
                    f'batch = [1, 8]\ntp = [1, 2]\ninput = 32\noutput = 8\ndevice_file = {json.dumps([H100, A100])}\n'
                    f'no_packs = true\n')
    page = {kind: ["--html", str(folder / f"{kind}.html")] for kind in PAGES}
    return {
        "estimate": ["estimate", "--model", LLAMA, "--seq", "32", *PLUGINS, *page["estimate"]],
        "serve": ["serve", "--model", LLAMA, "--input", "32", "--output", "16", "--batch", "4", *PLUGINS,
                  *page["serve"]],
        "simulate": ["simulate", "--model", LLAMA, "--requests", "100", "--input", "uniform:16:64", "--output",
                     "uniform:4:16", "--rate", "40", *PLUGINS, "--json", *page["simulate"]],
        "sweep": ["sweep", str(spec), "--out", str(folder / "rows.jsonl"), "--workers", "1", *page["sweep"]],
        "plan": ["plan", "--model", LLAMA, "--input", "32", "--output", "8", "--tp", "1", "--ttft", "1ms",
                 "--workers", "1", *PLUGINS, *page["plan"]],
    }


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """Each kind's page from a real run, the runs side by side; report renders the simulation's saved --json."""
    folder = tmp_path_factory.mktemp("pages")
    env = {**os.environ, "XDG_CACHE_HOME": str(folder / "cache"), "XDG_CONFIG_HOME": str(folder / "config")}
    running = {kind: subprocess.Popen([sys.executable, "-m", "castcore", *argv], cwd=folder, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for kind, argv in commands(folder).items()}
    for kind, process in running.items():
        out, err = process.communicate()
        assert process.returncode == 0, f"{kind}: {err}"
        if kind == "simulate":
            (folder / "simulate.json").write_text(out)
    done = subprocess.run([sys.executable, "-m", "castcore", "report", str(folder / "simulate.json"), "--html",
                           str(folder / "report.html")], cwd=folder, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return {kind: folder / f"{kind}.html" for kind in PAGES}


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install -y chromium (nox -s browser does)"
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=FLAGS, headless=True, viewport={"width": 1280, "height": 860})
        yield context
        context.close()


@pytest.fixture
def opened(browser, pages, request):
    """The page of the test's kind, opened offline; the requests it tried and the console errors it made."""
    kind = request.param
    page = browser.new_page()
    errors: list[str] = []
    asked: list[str] = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))

    def route(handle):
        if handle.request.url.startswith("file:"):
            handle.continue_()
        else:
            asked.append(handle.request.url)
            handle.abort()

    page.route("**/*", route)
    page.goto(pages[kind].as_uri())
    page.wait_for_selector(".plot-container svg.main-svg")
    yield kind, page, errors, asked
    page.close()


def column(page, table: str, index: int) -> list[float]:
    return page.eval_on_selector(f"#{table}", f"""t => Array.from(t.tBodies[0].rows).map(
        r => parseFloat(r.cells[{index}].getAttribute('data-v')))""")


@pytest.mark.parametrize("opened", list(PAGES), indirect=True)
def test_each_page_draws_sorts_and_filters_offline(opened):
    kind, page, errors, asked = opened
    charts, table, header, word, shown_section = PAGES[kind]
    # Every chart drawn by Plotly, each with its traces.
    drawn = page.eval_on_selector_all(".js-plotly-plot", "nodes => nodes.map(n => n.data.length)")
    assert len(drawn) == charts and all(traces > 0 for traces in drawn)
    assert page.locator(".plot-container svg.main-svg").count() >= charts
    # Sort by a click on a numeric header, ascending, then descending; the header says which.
    headers = page.eval_on_selector(f"#{table}", "t => Array.from(t.tHead.rows[0].cells).map(c => c.textContent)")
    index = headers.index(header)
    before = column(page, table, index)
    assert before != sorted(before)  # so that the click is seen to change the order
    page.click(f"#{table} th:nth-child({index + 1})")
    assert column(page, table, index) == sorted(before)
    assert page.get_attribute(f"#{table} th:nth-child({index + 1})", "aria-sort") == "ascending"
    page.click(f"#{table} th:nth-child({index + 1})")
    assert column(page, table, index) == sorted(before, reverse=True)
    # Filter: only the rows holding the word stay, and the counter says how many.
    texts = page.eval_on_selector(f"#{table}", "t => Array.from(t.tBodies[0].rows).map(r => r.textContent)")
    holding = sum(word in text.lower() for text in texts)
    assert 0 < holding < len(texts)
    page.fill(f'input[data-table="{table}"]', word)
    shown = page.eval_on_selector(f"#{table}", "t => Array.from(t.tBodies[0].rows).filter("
                                  "r => r.style.display !== 'none').length")
    assert shown == holding
    assert page.text_content(f"#{table}-count") == f"{holding} of {len(texts)} rows"
    page.fill(f'input[data-table="{table}"]', "")
    IMAGES.mkdir(exist_ok=True)
    page.locator(shown_section).screenshot(path=str(IMAGES / f"report-{kind}.png"))
    assert errors == [] and asked == []


@pytest.mark.parametrize("opened", ["estimate"], indirect=True)
def test_the_roofline_hover_names_the_op_its_shapes_and_module(opened):
    _, page, errors, asked = opened
    page.locator("#chart-roofline").scroll_into_view_if_needed()
    box = page.locator("#chart-roofline .scatterlayer .point").first.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)  # as a person points: Plotly's drag
    # layer above the points takes the pointer and finds the nearest point
    hover = page.wait_for_selector("#chart-roofline .hoverlayer .hovertext")
    text = hover.text_content()
    assert "shapes:" in text and "module:" in text and "FLOP/s" in text
    assert errors == [] and asked == []
