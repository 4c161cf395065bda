"""Every kind of HTML page castcore writes, opened in a real headless Chromium (the system's, driven by Playwright)
with the network cut off: no request leaves the file, no console error, the Plotly charts are drawn with their
traces, a table sorts by a click on its header and filters as one types, the roofline's hover names the call. The
screenshots go to docs/images/, where docs/report.md shows them. ``nox -s browser`` runs these; the pages come from
real castcore runs on a tiny model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).parent.parent
DATA = ROOT / "tests" / "data"
IMAGES = ROOT / "docs" / "images"
LLAMA, H100, A100 = (
    str(DATA / "tiny-llama.json"),
    str(DATA / "h100-sxm.toml"),
    str(DATA / "a100-sxm-80gb.toml"),
)
PLUGINS = ["--device-file", H100, "--no-packs"]
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

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
    # Twelve layers, dense and MoE in turn, so that their numeric order differs from their text order and they do
    # not all fold into one bar.
    layers = {
        **json.loads((DATA / "tiny-llama4.json").read_text()),
        "num_hidden_layers": 12,
        "interleave_moe_layer_step": 2,
    }
    for listed in ("moe_layers", "no_rope_layers"):
        layers.pop(listed)
    (folder / "llama4-12.json").write_text(json.dumps(layers))
    spec = folder / "spec.toml"
    spec.write_text(
        f'command = "serve"\nmodel = {json.dumps(LLAMA)}\ndevice = ["h100-sxm", "a100-sxm-80gb"]\n'
        f"batch = [1, 8]\ntp = [1, 2]\ninput = 32\noutput = 8\ndevice_file = {json.dumps([H100, A100])}\n"
        f"no_packs = true\n"
    )
    page = {kind: ["--html", str(folder / f"{kind}.html")] for kind in PAGES}
    return {
        "estimate": [
            "estimate",
            "--model",
            str(folder / "llama4-12.json"),
            "--seq",
            "32",
            *PLUGINS,
            *page["estimate"],
        ],
        "serve": [
            "serve",
            "--model",
            LLAMA,
            "--input",
            "32",
            "--output",
            "16",
            "--batch",
            "4",
            *PLUGINS,
            *page["serve"],
        ],
        "simulate": [
            "simulate",
            "--model",
            LLAMA,
            "--requests",
            "100",
            "--input",
            "uniform:16:64",
            "--output",
            "uniform:4:16",
            "--rate",
            "400",
            "--weights",
            "fp8",
            "--activations",
            "fp8",
            "--slo-ttft",
            "0.3ms",
            "--slo-tpot",
            "1s",
            *PLUGINS,
            "--json",
            *page["simulate"],
        ],
        "sweep": ["sweep", str(spec), "--out", str(folder / "rows.jsonl"), "--workers", "1", *page["sweep"]],
        "plan": [
            "plan",
            "--model",
            LLAMA,
            "--input",
            "32",
            "--output",
            "8",
            "--tp",
            "1",
            "--ttft",
            "1ms",
            "--workers",
            "1",
            *PLUGINS,
            *page["plan"],
        ],
    }


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """Each kind's page from a real run, the runs side by side; report renders the simulation's saved --json."""
    folder = tmp_path_factory.mktemp("pages")
    env = {**os.environ, "XDG_CACHE_HOME": str(folder / "cache"), "XDG_CONFIG_HOME": str(folder / "config")}
    running = {
        kind: subprocess.Popen(
            [sys.executable, "-m", "castcore", *argv],
            cwd=folder,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for kind, argv in commands(folder).items()
    }
    for kind, process in running.items():
        out, err = process.communicate()
        assert process.returncode == 0, f"{kind}: {err}"
        if kind == "simulate":
            (folder / "simulate.json").write_text(out)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "castcore",
            "report",
            str(folder / "simulate.json"),
            "--html",
            str(folder / "report.html"),
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return {kind: folder / f"{kind}.html" for kind in PAGES}


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), (
        f"{CHROMIUM} is missing: apt-get install -y chromium (nox -s browser does)"
    )
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            args=FLAGS,
            headless=True,
            viewport={"width": 1280, "height": 860},
        )
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
    return page.eval_on_selector(
        f"#{table}",
        f"""t => Array.from(t.tBodies[0].rows).map(
        r => parseFloat(r.cells[{index}].getAttribute('data-v')))""",
    )


@pytest.mark.parametrize("opened", list(PAGES), indirect=True)
def test_each_page_draws_sorts_and_filters_offline(opened):
    kind, page, errors, asked = opened
    charts, table, header, word, shown_section = PAGES[kind]
    # Every chart drawn by Plotly, each with its traces.
    drawn = page.eval_on_selector_all(".js-plotly-plot", "nodes => nodes.map(n => n.data.length)")
    assert len(drawn) == charts and all(traces > 0 for traces in drawn)
    assert page.locator(".plot-container svg.main-svg").count() >= charts
    # Sort by a click on a numeric header, ascending, then descending; the header says which.
    headers = page.eval_on_selector(
        f"#{table}", "t => Array.from(t.tHead.rows[0].cells).map(c => c.textContent)"
    )
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
    shown = page.eval_on_selector(
        f"#{table}", "t => Array.from(t.tBodies[0].rows).filter(r => r.style.display !== 'none').length"
    )
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
    page.mouse.move(
        box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    )  # as a person points: Plotly's drag
    # layer above the points takes the pointer and finds the nearest point
    hover = page.wait_for_selector("#chart-roofline .hoverlayer .hovertext")
    text = hover.text_content()
    assert "shapes:" in text and "module:" in text and "FLOP/s" in text
    assert errors == [] and asked == []


# Measured in the page as drawn: each text's own box (a Range around it), not its cell's, so that a header set left
# above figures set right is seen.
EDGES = """t => Array.from(t.rows).slice(0, 6).map(r => Array.from(r.cells).map(c => {
    const range = document.createRange(); range.selectNodeContents(c);
    const box = range.getBoundingClientRect(); return [box.left, box.right, c.classList.contains('num')]; }))"""
E_NOTATION = r"\d(\.\d+)?e[+-]?\d"


def test_every_header_lines_up_with_its_column_and_no_figure_is_in_e_notation(browser, pages):
    for kind in PAGES:
        page = browser.new_page()
        page.goto(pages[kind].as_uri())
        for table in page.locator("table.cc-table").element_handles():
            if not table.is_visible():
                continue
            header, *rows = table.evaluate(EDGES)
            for index, (left, right, figures) in enumerate(header):
                for row in rows:
                    cell = row[index]
                    if cell[1] > cell[0]:  # a cell with text
                        # figures: right edges together; text: left edges together (within a pixel)
                        assert abs((cell[1] - right) if figures else (cell[0] - left)) <= 1, (kind, index)
                    assert cell[2] == figures
        shown = page.eval_on_selector_all(".facts, table.cc-table", "nodes => nodes.map(n => n.innerText)")
        assert not [t for t in shown if re.search(E_NOTATION, t)], kind
        page.close()


@pytest.mark.parametrize("opened", ["simulate"], indirect=True)
def test_the_simulate_page_bins_its_latencies_draws_its_slos_and_shows_both_kinds_of_tokens(opened):
    _, page, errors, asked = opened
    assert "weights fp8, activations fp8, KV cache bf16" in page.text_content("header")
    assert "TTFT at most 300 us, TPOT at most 1 s" in page.text_content("#figures .facts")
    # The ITL histogram: several bars drawn, its count axis from 0 in whole numbers.
    bars = page.eval_on_selector_all(
        "#chart-itl .barlayer .point path",
        "ps => ps.filter(p => p.getBoundingClientRect().height >= 1).length",
    )
    assert bars >= 5
    for chart in ("ttft", "tpot", "itl"):
        ticks = page.eval_on_selector_all(f"#chart-{chart} .ytick text", "ts => ts.map(t => t.textContent)")
        assert ticks[0] == "0" and all(re.fullmatch(r"[\d,]+", t) for t in ticks), (chart, ticks)
    # The SLO targets: a red line on the TTFT chart among its bars, on the TPOT chart at the edge it lies beyond.
    for chart in ("ttft", "tpot"):
        lines = page.eval_on_selector(f"#chart-{chart}", "c => c.layout.shapes.map(s => s.line.color)")
        assert "#d62728" in lines
        assert page.locator(f"#chart-{chart} .shapelayer path[style*='rgb(214, 39, 40)']").count() >= 1
    assert "SLO target 1 s beyond" in page.text_content("#chart-tpot")
    # The batch chart: both panels start at 0 with whole-number ticks, and the decode bars are drawn.
    for axis in ("yaxis", "yaxis2"):
        low, high = page.eval_on_selector("#chart-batches", f"c => c._fullLayout.{axis}.range")
        assert low == 0 and high > 0
    ticks = page.eval_on_selector_all("#chart-batches .ytick text", "ts => ts.map(t => t.textContent)")
    assert ticks and all(re.fullmatch(r"[\d,]+", t) for t in ticks), ticks
    for trace in ("prefill tokens", "decode tokens"):
        # Its tallest bar against its own panel's height: a stack of a few decode tokens on a prompt's many would
        # be a sliver of a pixel or two.
        drawn = page.eval_on_selector(
            "#chart-batches",
            f"""c => {{
            const n = c.data.findIndex(d => d.name === {json.dumps(trace)});
            const axis = c._fullLayout['yaxis' + (c._fullData[n].yaxis.slice(1))];
            const heights = Array.from(c.querySelectorAll('.barlayer .trace.bars')[n].querySelectorAll('.point path'))
                .map(p => p.getBoundingClientRect().height);
            return Math.max(...heights) / axis._length; }}""",
        )
        assert drawn > 0.25, trace
    assert errors == [] and asked == []


@pytest.mark.parametrize("opened", ["estimate"], indirect=True)
def test_the_layers_come_in_numeric_order_and_the_flat_module_table_is_one_click_away(opened):
    _, page, errors, asked = opened
    # The layer chart's bars, top to bottom as drawn.
    labels = page.eval_on_selector_all(
        "#chart-layers .ytick text",
        """ts => ts.map(
        t => [t.getBoundingClientRect().top, t.textContent]).sort((a, b) => a[0] - b[0]).map(p => p[1])""",
    )
    numbers = [int(re.search(r"layers\.(\d+)", label).group(1)) for label in labels if "layers." in label]
    assert len(numbers) > 10 and numbers == sorted(numbers)
    assert page.eval_on_selector("#chart-layers", "c => c._fullLayout.xaxis.range[0]") == 0
    # The modules grouped by kind in sight; every module's row behind one click.
    assert (
        page.locator("#module-kinds-table").is_visible() and not page.locator("#modules-table").is_visible()
    )
    kinds = page.eval_on_selector(
        "#module-kinds-table",
        "t => Array.from(t.tBodies[0].rows).map(r => parseInt(r.cells[1].getAttribute('data-v')))",
    )
    page.click("summary:has-text('every module')")
    assert page.locator("#modules-table").is_visible()
    assert page.locator("#modules-table tbody tr").count() == sum(kinds) > len(kinds)
    assert errors == [] and asked == []
