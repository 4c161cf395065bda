"""The HTML page (--html, castcore report, castcore.write_html) made from real runs of tiny models: one file that
loads nothing from the network, the figures the JSON gives, and one-line refusals that leave no page behind. The
pages are opened in a real browser by tests_browser/ (nox -s browser)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import castcore
from castcore.cli.main import main
from castcore.report.html.charts import PageError

DATA = Path(__file__).parents[1] / "data"
LLAMA, H100 = str(DATA / "tiny-llama.json"), str(DATA / "h100-sxm.toml")
PLUGINS = ["--device-file", H100, "--no-packs"]
BANDS = "\n[error_bands]\nattention_prefill = 0.2\ngemm_bf16 = 0.1\n"
SOURCE = '"error_bands" = "test value"\n'


def outside_plotly(page: str) -> str:
    """The page without the plotly.js bundle inlined in its head (a library's own text, URLs of its docs inside)."""
    start = page.index("<script>") + len("<script>")
    return page[:start] + page[page.index("</script>", start) :]


def assert_self_contained(path: Path) -> str:
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert path.stat().st_size < 6 * 2**20  # plotly.js is most of it
    assert "Plotly.newPlot" in page and "cc-table" in page
    rest = outside_plotly(page)
    # Nothing the browser would fetch: no external scripts, styles, images or frames, no URL at all.
    assert not re.search(r"<(script|link|img|iframe)[^>]*\b(src|href)=", rest, re.IGNORECASE)
    assert not re.search(r"https?://", rest)
    assert "@import" not in rest
    return page


def tables(page: str) -> dict[str, list[list[str]]]:
    """Each table's rows (cell texts) by its id."""
    found = {}
    for name, body in re.findall(
        r'<table class="cc-table" id="([\w-]+)">.*?<tbody>(.*?)</tbody>', page, re.DOTALL
    ):
        found[name] = [
            re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body)
        ]
    return found


@pytest.fixture(scope="module")
def estimated(tmp_path_factory):
    """castcore estimate --json and --html on a profile with error bands."""
    folder = tmp_path_factory.mktemp("html")
    text = Path(H100).read_text(encoding="utf-8").replace('name = "h100-sxm"', 'name = "banded"', 1)
    profile = folder / "banded.toml"
    profile.write_text(text.replace("\n[sources]\n", BANDS + "\n[sources]\n" + SOURCE), encoding="utf-8")
    argv = ["estimate", "--model", LLAMA, "--seq", "16", "--device-file", str(profile), "--no-packs"]
    out = sys.stdout
    capture = folder / "report.json"
    with capture.open("w") as handle:
        sys.stdout = handle
        try:
            assert main([*argv, "--json", "--html", str(folder / "estimate.html")]) == 0
        finally:
            sys.stdout = out
    return {
        "folder": folder,
        "json": json.loads(capture.read_text()),
        "page": folder / "estimate.html",
        "profile": profile,
        "file": capture,
    }


def test_an_estimate_page_is_one_self_contained_file_with_the_jsons_figures(estimated):
    page = assert_self_contained(estimated["page"])
    report = estimated["json"]
    rows = tables(page)["ops-table"]
    assert [row[0] for row in rows] == [op["op"] for op in report["ops"]]  # slowest first, as the JSON
    mm = next(row for row in rows if row[0] == "aten::mm")
    assert mm[1] == str(next(op["calls"] for op in report["ops"] if op["op"] == "aten::mm"))
    assert mm[7] == "core (properties)" and mm[8] == "none" and mm[9] == "±10%"  # answered, shadowed, band
    assert [row[0] for row in tables(page)["modules-table"]] == [m["module"] for m in report["modules"]]
    for section in ('id="totals"', 'id="ops"', 'id="layers"', 'id="roofline"', 'id="memory"'):
        assert section in page
    # The total's band: each banded op's time times its band, added up.
    spread = sum(
        op["time_s"] * op["error_band"]["held_out_median_abs_error"]
        for op in report["ops"]
        if op["error_band"]
    )
    assert spread > 0
    from castcore.report.html.document import seconds

    assert f"{seconds(report['totals']['time_s'])} ± {seconds(spread)}" in page
    # the roofline's hover: the call's shapes
    assert "shapes: %{customdata[1]}" in page and "16x64 bfloat16" in page


def test_the_memory_curve_peaks_where_the_report_says(estimated):
    session = castcore.Session(load_packs=[], device_files=[estimated["profile"]])
    report = session.estimate(castcore.build_workload(LLAMA, seq=16), device="banded")
    memory = report.memory
    assert len(memory.timeline) == len(report.records)
    assert max(memory.timeline) == memory.activation_peak_bytes
    assert memory.timeline.index(memory.activation_peak_bytes) == memory.peak_index


def test_the_python_api_writes_the_page_the_command_line_writes(estimated, tmp_path):
    session = castcore.Session(load_packs=[], device_files=[estimated["profile"]])
    report = session.estimate(castcore.build_workload(LLAMA, seq=16), device="banded")
    written = castcore.write_html(report, tmp_path / "api.html", session=session)
    assert written == tmp_path / "api.html"
    api, cli = (tables(p.read_text(encoding="utf-8")) for p in (written, estimated["page"]))
    assert api == cli


def test_a_saved_estimate_renders_later_with_what_the_file_holds(estimated, capsys):
    page_path = estimated["folder"] / "later.html"
    assert main(["report", str(estimated["file"]), "--html", str(page_path)]) == 0
    assert "(estimate)" in capsys.readouterr().err
    page = assert_self_contained(page_path)
    assert [row[0] for row in tables(page)["ops-table"]] == [op["op"] for op in estimated["json"]["ops"]]
    assert "not in the results file" in page  # the roofline's hover has no shapes to show


def _run(argv: list[str], capsys) -> dict:
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_serve_and_simulate_pages_show_their_figures(tmp_path, capsys):
    serve = _run(
        [
            "serve",
            "--model",
            LLAMA,
            "--input",
            "32",
            "--output",
            "8",
            "--batch",
            "2",
            *PLUGINS,
            "--html",
            str(tmp_path / "serve.html"),
        ],
        capsys,
    )
    page = assert_self_contained(tmp_path / "serve.html")
    assert 'id="chart-itl"' in page and 'id="chart-memory"' in page and "ops-table-0" in tables(page)
    from castcore.report.html.document import seconds

    assert seconds(serve["ttft_s"]) in page
    simulated = _run(
        [
            "simulate",
            "--model",
            LLAMA,
            "--requests",
            "40",
            "--input",
            "32",
            "--output",
            "8",
            "--rate",
            "20",
            *PLUGINS,
            "--html",
            str(tmp_path / "simulate.html"),
        ],
        capsys,
    )
    page = assert_self_contained(tmp_path / "simulate.html")
    for chart in ("chart-ttft", "chart-tpot", "chart-itl", "chart-throughput", "chart-kv", "chart-batches"):
        assert f'id="{chart}"' in page
    latency = {row[0]: row for row in tables(page)["latency-table"]}
    from castcore.report.html.document import millis

    assert latency["time to first token"][2] == millis(simulated["median_ttft_ms"])
    # The same results saved and rendered later: the statistics, not the requests.
    saved = tmp_path / "simulate.json"
    saved.write_text(json.dumps(simulated))
    assert main(["report", str(saved), "--html", str(tmp_path / "later.html")]) == 0
    later = assert_self_contained(tmp_path / "later.html")
    assert 'id="chart-distributions"' in later and 'id="chart-ttft"' not in later
    assert tables(later)["latency-table"] == tables(page)["latency-table"]


def test_sweep_and_plan_pages_mark_the_front_and_the_chosen(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'command = "serve"\nmodel = {json.dumps(LLAMA)}\nbatch = [1, 4]\ntp = [1, 2]\ninput = 32\n'
        f"output = 8\ndevice_file = [{json.dumps(H100)}]\nno_packs = true\n"
    )
    out = tmp_path / "rows.csv"
    assert (
        main(
            ["sweep", str(spec), "--out", str(out), "--workers", "1", "--html", str(tmp_path / "sweep.html")]
        )
        == 0
    )
    page = assert_self_contained(tmp_path / "sweep.html")
    rows = tables(page)["candidates-table"]
    assert len(rows) == 4 and page.count('<tr class="chosen">') == 1
    # The chosen row is the one of highest throughput per device; castcore report reads the CSV back alike.
    assert main(["report", str(out), "--html", str(tmp_path / "later.html")]) == 0
    assert tables(assert_self_contained(tmp_path / "later.html"))["candidates-table"] == rows
    plan = _run(
        [
            "plan",
            "--model",
            LLAMA,
            "--input",
            "32",
            "--output",
            "8",
            "--tp",
            "1",
            "--weights",
            "bf16",
            "--ttft",
            "1ms",
            "--workers",
            "1",
            *PLUGINS,
            "--html",
            str(tmp_path / "plan.html"),
        ],
        capsys,
    )
    page = assert_self_contained(tmp_path / "plan.html")
    chosen = re.search(r'<tr class="chosen">(.*?)</tr>', page).group(1)
    assert f">{plan['best'][0]['served_batch']}<" in chosen
    assert "TTFT p99 objective 1 ms" in page  # the objective drawn as a line on the front's TTFT axis
    # every point evaluated, not only the best
    assert len(tables(page)["candidates-table"]) > len(plan["best"])


@pytest.mark.parametrize(
    "content, said",
    [
        ('{"traceEvents": []}', "not a castcore results file: it has none of the fields"),
        ("[1, 2]", "not a castcore results file: a JSON list, not an object"),
        ("{not json", "not valid JSON"),
        (
            '{"ops": [], "modules": [], "coverage": {}}',
            "castcore estimate --json of another version: it lacks description, device, totals, notes",
        ),
        (
            '{"engine": "vllm", "kv_usage": []}',
            "castcore simulate --json of another version: it lacks completed",
        ),
    ],
)
def test_a_file_of_another_kind_or_version_is_one_line_and_no_page(tmp_path, capsys, content, said):
    results = tmp_path / "results.json"
    results.write_text(content)
    assert main(["report", str(results), "--html", str(tmp_path / "page.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and err.startswith(f"castcore: error: {results}: ")
    assert list(tmp_path.iterdir()) == [results]  # no page, no temporary left


@pytest.mark.parametrize(
    "name, content, said",
    [
        ("rows.jsonl", "", "an empty sweep: the file has no rows"),
        ("rows.csv", "model,device,batch\n", "an empty sweep: the file has no rows"),
        (
            "rows.jsonl",
            '{"model": "x", "device": "y"}\n',
            "not rows of castcore sweep: the rows hold none of",
        ),
        ("rows.txt", "hello", "castcore report reads .json, .jsonl, .csv and .parquet files"),
    ],
)
def test_an_empty_or_foreign_sweep_is_one_line_and_no_page(tmp_path, capsys, name, content, said):
    results = tmp_path / name
    results.write_text(content)
    assert main(["report", str(results), "--html", str(tmp_path / "page.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err
    assert not (tmp_path / "page.html").exists()


def test_a_page_that_cannot_be_written_fails_before_the_work(tmp_path, capsys):
    argv = ["estimate", "--model", LLAMA, "--seq", "16", *PLUGINS]
    assert main([*argv, "--html", str(tmp_path / "missing" / "page.html")]) == 2
    err = capsys.readouterr()
    assert (
        err.err == f"castcore: error: --html {tmp_path / 'missing' / 'page.html'}: the folder "
        f"{tmp_path / 'missing'} does not exist; create it first\n"
    )
    assert err.out == ""  # failed before the estimate was printed, or made
    assert main([*argv, "--html", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_a_page_that_fails_while_written_leaves_nothing_behind(tmp_path, monkeypatch):
    from castcore.report.html import write

    session = castcore.Session(load_packs=[], device_files=[H100])
    report = session.estimate(castcore.build_workload(LLAMA, seq=16))
    target = tmp_path / "page.html"
    target.write_text("the page of an earlier run")

    def full_disk(path: Path) -> None:
        path.write_text("<!DOCTYPE html><html><head>")
        raise OSError(28, "No space left on device")

    real = write.write_whole  # the real one, the page's writer swapped for one that fails halfway
    monkeypatch.setattr(write, "write_whole", lambda path, option, _: real(path, option, full_disk))
    with pytest.raises(
        castcore.CastcoreError,
        match=r"html='.*page.html': No space left on device; nothing was "
        r"written",
    ):
        castcore.write_html(report, target)
    assert target.read_text() == "the page of an earlier run" and list(tmp_path.iterdir()) == [target]


def test_without_plotly_the_error_names_the_fix(tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "plotly" or m.startswith("plotly.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly raises ImportError
    results = tmp_path / "r.json"
    results.write_text("{}")
    assert main(["report", str(results), "--html", str(tmp_path / "page.html")]) == 2
    assert capsys.readouterr().err == (
        "castcore: error: an HTML page needs plotly: pip install 'castcore[html]'\n"
    )
    with pytest.raises(PageError, match=re.escape("pip install 'castcore[html]'")):
        castcore.write_html(object(), tmp_path / "page.html")
    assert list(tmp_path.iterdir()) == [results]


def test_an_empty_sweep_or_an_unknown_result_has_no_page(tmp_path):
    from castcore.report.html.sweep import sweep_data

    with pytest.raises(PageError, match="an empty sweep: there are no rows to show"):
        sweep_data([], ["model"], "serve")
    with pytest.raises(PageError, match="no page for a dict"):
        castcore.write_html({"ops": []}, tmp_path / "page.html")
    assert list(tmp_path.iterdir()) == []


def test_the_python_api_writes_serve_and_simulate_pages(tmp_path):
    session = castcore.Session(load_packs=[], device_files=[H100])
    served = session.serve(LLAMA, input_tokens=32, output_tokens=8, batch=2)
    page = assert_self_contained(castcore.write_html(served, tmp_path / "serve.html"))
    assert "castcore serve:" in page and 'id="chart-itl"' in page
    simulated = session.simulate(LLAMA, requests=20, input_lengths="32", output_lengths=8, rate=10)
    page = assert_self_contained(castcore.write_html(simulated, tmp_path / "simulate.html"))
    assert 'id="chart-ttft"' in page and 'id="chart-batches"' in page
    latency = {row[0]: row for row in tables(page)["latency-table"]}
    from castcore.report.html.document import millis

    assert latency["time per output token"][5] == millis(simulated.summary["p99_tpot_ms"])


# What a person reads: number formats, bins, axes, groups (the pure-Python parts; tests_browser/ checks them drawn).


@pytest.mark.parametrize(
    "value, text",
    [
        (19150.3, "19,150"),
        (0.23906, "0.2391"),
        (12345678.9, "12,345,679"),
        (2.0, "2"),
        (0.0, "0"),
        (-0.5, "-0.5"),
        (9.99996, "10"),
        (1e-6, "0.000001"),
        (None, "-"),
        (float("nan"), "-"),
    ],
)
def test_numbers_read_as_a_person_writes_them(value, text):
    from castcore.report.html.document import decimal

    assert decimal(value) == text


@pytest.mark.parametrize(
    "ms, text",
    [
        (19150.0, "19.15 s"),
        (1234567.0, "1,235 s"),
        (0.2391, "239.1 us"),
        (2.5, "2.5 ms"),
        (0.0001234, "123.4 ns"),
        (None, "-"),
    ],
)
def test_a_duration_in_ms_takes_the_unit_that_reads_best(ms, text):
    from castcore.report.html.document import millis

    assert millis(ms) == text and "e+" not in text and "e-" not in text


def test_a_narrow_bulk_with_stragglers_gets_several_bars_and_says_what_it_left_out():
    from castcore.report.html.charts import histogram

    # ITL as a simulation gives it: nearly every gap the decode step's time, a few gaps a prefill long.
    values = [0.2391 + 1e-6 * (i % 17) for i in range(900)] + [0.35, 0.41, 0.52]
    found = histogram(values)
    assert len(found["counts"]) >= 5 and sum(c > 0 for c in found["counts"]) >= 5
    assert found["above"] == 3 and found["below"] == 0 and found["largest"] == 0.52
    assert sum(found["counts"]) + found["above"] == len(values)
    assert found["edges"] == sorted(found["edges"]) and not found["log"]
    assert found["edges"][0] == min(values) and found["edges"][-1] < 0.35


def test_a_wide_spread_is_binned_on_a_log_scale_and_one_value_is_one_bar():
    from castcore.report.html.charts import histogram

    found = histogram([1.0 * 1.1**i for i in range(100)])  # 1 to 12,527: about four decades
    ratios = [b / a for a, b in zip(found["edges"], found["edges"][1:])]
    assert found["log"] and max(ratios) == pytest.approx(min(ratios))  # equal bins in log10
    assert sum(found["counts"]) + found["below"] + found["above"] == 100
    single = histogram([2.0] * 10)
    assert single["counts"] == [10] and single["edges"][0] < 2.0 < single["edges"][1]


@pytest.mark.parametrize(
    "high, top, step", [(0, 1, 1), (3, 3, 1), (9.2, 10, 2), (21.6, 25, 5), (64, 80, 20), (1234, 1500, 500)]
)
def test_a_count_axis_starts_at_zero_with_whole_number_ticks(high, top, step):
    from castcore.report.html.charts import count_axis

    axis = count_axis(high)
    assert axis["range"] == [0, top] and axis["dtick"] == step and top >= high and axis["tickformat"] == ",d"


def _modules(times: dict[str, float]) -> list[dict]:
    total = sum(times.values())
    return [
        {"module": m, "calls": 1, "time_s": t, "share": t / total, "flops": 1.0, "bytes": 2.0}
        for m, t in times.items()
    ]


def test_layers_come_in_numeric_order_and_identical_runs_fold_into_one():
    from castcore.report.html.layers import layer_groups, module_kinds

    times = {
        f"m.layers.{i}.{part}": (2e-3 if part == "mlp" and 4 <= i < 8 else 1e-3)
        for i in range(12)
        for part in ("mlp", "attn")
    }
    times.update({"m.layers.11": 5e-4, "m.lm_head": 3e-3})
    groups = layer_groups(_modules(dict(sorted(times.items()))))  # text order: layers.0, 1, 10, 11, 2, ...
    assert [(g["name"], g["layers"]) for g in groups] == [
        ("m.layers.0-3 (x4)", 4),
        ("m.layers.4-7 (x4)", 4),
        ("m.layers.8-10 (x3)", 3),
        ("m.layers.11", 1),
        ("m.lm_head", 1),
    ]
    assert [g["each_s"] for g in groups] == pytest.approx([2e-3, 3e-3, 2e-3, 2.5e-3, 3e-3])
    kinds = {k["module"]: k for k in module_kinds(_modules(times))}
    assert kinds["m.layers.N.mlp"]["count"] == 12 and kinds["m.layers.N.mlp"]["time_s"] == pytest.approx(
        16e-3
    )
    assert kinds["m.layers.N"]["count"] == 1 and sum(k["share"] for k in kinds.values()) == pytest.approx(1.0)


def test_a_figure_column_and_its_header_align_right_and_a_text_column_left():
    from castcore.report.html.document import table

    html = table(
        "t", ["name", "time", "note"], [["a", ("1 ms", 1e-3), "x"], ["b", None, "-"], ["c", 3, None]]
    )
    assert re.findall(r"<th(?: [^>]*)?>", html) == ["<th>", '<th class="num">', "<th>"]
    assert '<td class="num" data-v="">-</td>' in html and '<td class="num" data-v="3.0">3</td>' in html


def test_the_estimate_page_groups_its_modules_with_the_flat_table_one_click_away(estimated):
    page = estimated["page"].read_text(encoding="utf-8")
    found = tables(page)
    modules = estimated["json"]["modules"]
    kinds = found["module-kinds-table"]
    assert len(kinds) < len(modules) and sum(int(row[1]) for row in kinds) == len(modules)
    assert re.search(
        r'<details><summary>every module, one row each \([\d,]+ rows\)</summary>.*?id="modules-table"',
        page,
        re.DOTALL,
    )
    # tiny-llama's first layer runs a plain input norm, its second the residual add in it (the next norm takes
    # each layer's closing add): two unlike layers, each a row
    layers = [row[0] for row in found["layers-table"]]
    assert "LlamaForCausalLM.model.layers.0" in layers and "LlamaForCausalLM.model.layers.1" in layers


def test_alike_layers_fold_into_one_row_on_the_estimate_page(tmp_path):
    four = tmp_path / "four.json"
    four.write_text(json.dumps({**json.loads(Path(LLAMA).read_text()), "num_hidden_layers": 4}))
    page = tmp_path / "four.html"
    argv = ["estimate", "--model", str(four), "--seq", "16", "--device-file", H100, "--no-packs"]
    assert main([*argv, "--html", str(page)]) == 0
    layers = [row[0] for row in tables(page.read_text(encoding="utf-8"))["layers-table"]]
    # the first layer alone (a plain input norm), the three after it alike
    assert "LlamaForCausalLM.model.layers.0" in layers
    assert "LlamaForCausalLM.model.layers.1-3 (x3)" in layers


def test_the_simulate_page_states_the_dtypes_and_draws_the_slo_targets(tmp_path):
    session = castcore.Session(load_packs=[], device_files=[H100])
    simulated = session.simulate(
        LLAMA,
        requests=30,
        input_lengths="uniform:16:64",
        output_lengths=8,
        rate=20,
        weights="fp8",
        activations="fp8",
        slo_ttft=0.3e-3,
        slo_tpot=1.0,
    )
    page = assert_self_contained(castcore.write_html(simulated, tmp_path / "simulate.html"))
    assert "weights fp8, activations fp8, KV cache bf16" in page
    assert "TTFT at most 300 us, TPOT at most 1 s" in page  # stated, and in the table's SLO column
    latency = {row[0]: row for row in tables(page)["latency-table"]}
    assert latency["time to first token"][-1] == "300 us" and latency["inter-token latency"][-1] == "-"
    assert "SLO target 1 s beyond" in page  # TPOT's target far right of its bars: drawn at the edge, said
    assert not re.search(r"\d\.\d+e[+-]\d+ ms", outside_plotly(page))


def test_a_saved_simulation_keeps_its_slo_targets_for_a_page_made_later(tmp_path):
    session = castcore.Session(load_packs=[], device_files=[H100])
    simulated = session.simulate(
        LLAMA, requests=10, input_lengths=32, output_lengths=4, rate=20, slo_ttft=0.3e-3, slo_tpot=1.0
    )
    saved = tmp_path / "simulate.json"
    saved.write_text(simulated.to_json())
    assert json.loads(saved.read_text())["slo_ttft_ms"] == pytest.approx(0.3)
    assert main(["report", str(saved), "--html", str(tmp_path / "later.html")]) == 0
    page = (tmp_path / "later.html").read_text()
    assert "TTFT at most 300 us, TPOT at most 1 s" in page  # as the run's own page states them
    assert "does not record the SLO targets" not in page
