"""castcore sweep's spec: axes read off the commands' own parsers, values checked as the commands check them, and
bad input refused in one line, exit 2, with nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from castcore.cli.main import main
from castcore.sweeps.sweep import check, commands, points_of
from castcore.sweeps.spec import MAX_POINTS, check_spec
from castcore.workload.spec import ModelError

DATA = Path(__file__).parents[1] / "data"
LLAMA = str(DATA / "tiny-llama.json")
MIXTRAL = str(DATA / "tiny-mixtral.json")
H100 = str(DATA / "h100-sxm.toml")


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value).replace("'", '"') if isinstance(value, str) else str(value)


def spec_file(folder: Path, **keys) -> Path:
    keys = {"command": "estimate", "no_packs": True, "device_file": [H100], **keys}
    path = folder / "spec.toml"
    path.write_text("".join(f"{k} = {_toml(v)}\n" for k, v in keys.items()))
    return path


def refused(capsys, folder: Path, argv: list[str]) -> str:
    """Run castcore sweep expecting a refusal: exit 2, one error line on stderr, nothing written in ``folder``."""
    before = sorted(folder.iterdir())
    assert main(["sweep", *argv]) == 2
    # Plugin warnings from what else this test process declared may come first; the refusal is one error line.
    err = [
        line
        for line in capsys.readouterr().err.strip().splitlines()
        if not line.startswith("castcore: warning:")
    ]
    assert len(err) == 1 and err[0].startswith("castcore: error: "), err
    assert sorted(folder.iterdir()) == before
    return err[0]


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"bacth": [1, 2]}, "unknown key 'bacth' for castcore estimate (did you mean 'batch'?)"),
        (
            {"phase": ["prefill", "middle"]},
            'line 4: phase = "middle": is not supported; use one of prefill, decode',
        ),
        ({"batch": [1, "four"]}, 'line 4: batch = "four": must be a whole number of at least 1'),
        ({"batch": [1, 2.5]}, "batch = 2.5:"),
        ({"batch": 0}, "sweep spec line 4: batch = 0: must be a whole number of at least 1"),
        ({"eager": "yes"}, 'eager = "yes": is a switch: give true or false'),
        ({"batch": []}, "batch is an empty list"),
        ({"json": True}, "json is how castcore estimate prints"),
        ({"device": ["h100-sxm", "h200"]}, "device = 'h200' is not installed; installed: h100-sxm"),
        ({"model": LLAMA, "tp": [1, 3]}, "tp = 3 is refused at every point: tp = 3: "),
        ({"model": "no-such-model"}, "every point is refused: unknown model 'no-such-model'"),
        (
            {"command": "train"},
            "name the command: command = 'estimate' or 'serve' or 'simulate' (got 'train'; one "
            "command a spec)",
        ),
        (
            {"command": ["serve", "estimate"]},
            "name the command: command = 'estimate' or 'serve' or 'simulate' "
            "(got ['serve', 'estimate']; one command a spec)",
        ),
        (
            {"command": "serve", "batch": 4, "max_batch": True},
            "batch and max_batch cannot go together; keep one of them",
        ),
        (
            {"command": "simulate", "requests": 1_000_000_000_000},
            "line 4: requests = 1000000000000: is over 1,000,000, castcore's limit for requests",
        ),
        (
            {"command": "simulate", "acceptance": [0.7, True]},
            "acceptance = true: takes one value as text: RATE|LIST",
        ),
    ],
)
def test_a_bad_spec_is_one_line_naming_the_key(capsys, tmp_path, keys, expected):
    out = tmp_path / "rows.csv"
    line = refused(capsys, tmp_path, [str(spec_file(tmp_path, **keys)), "--out", str(out)])
    assert expected in line


def test_a_spec_over_the_limit_needs_yes(capsys, tmp_path):
    spec = spec_file(tmp_path, model=LLAMA, batch=list(range(1, 401)), seq=list(range(1, 301)))
    line = refused(capsys, tmp_path, [str(spec), "--out", str(tmp_path / "rows.csv")])
    assert f"expands to 120,000 points, more than {MAX_POINTS:,}: pass --yes" in line
    data = {"command": "estimate", "batch": list(range(1, 401)), "seq": list(range(1, 301))}
    assert check_spec(data, commands()).size == 120_000  # and with yes the size check passes
    check(data, yes=True)


@pytest.mark.parametrize(
    ("out", "expected"),
    [
        ("missing/rows.csv", "the folder"),
        ("rows.xlsx", "name a .parquet, .csv or .jsonl file"),
        ("folder.csv", "is a directory"),
    ],
)
def test_an_unwritable_output_is_refused_before_anything_runs(capsys, tmp_path, out, expected):
    (tmp_path / "folder.csv").mkdir()
    spec = spec_file(tmp_path, model=LLAMA)
    line = refused(capsys, tmp_path, [str(spec), "--out", str(tmp_path / out)])
    assert expected in line and "--out" in line


def test_a_spec_of_random_bytes_or_too_large_is_one_line(capsys, tmp_path):
    noise = tmp_path / "noise.toml"
    noise.write_bytes(bytes(range(256)) * 8)
    assert "noise.toml: not valid TOML: byte 128 is 0x80, not UTF-8 text" in refused(
        capsys, tmp_path, [str(noise)]
    )
    huge = tmp_path / "huge.toml"
    huge.write_text("# padding\n" * 500_000)
    assert "huge.toml: over 4 MiB, castcore's limit for a sweep spec" in refused(
        capsys, tmp_path, [str(huge)]
    )


def test_numbers_are_text_for_a_text_option():
    """acceptance = [0.7, 0.5] is two points, each a rate (as --acceptance 0.7 is)."""
    spec = check_spec({"command": "simulate", "acceptance": [0.7, 0.5]}, commands())
    assert spec.axes["acceptance"] == ["0.7", "0.5"]


def test_bad_toml_and_resume_without_out(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("command = estimate\n")
    assert "not valid TOML" in refused(capsys, tmp_path, [str(bad)])
    assert "--resume reads the rows already in --out" in refused(capsys, tmp_path, [str(bad), "--resume"])


def test_axes_are_the_commands_own_options():
    """The axes are the catalog's: what castcore estimate and castcore serve take, spelled without dashes."""
    estimate, serve = commands()["estimate"], commands()["serve"]
    assert {
        "model",
        "device",
        "batch",
        "seq",
        "phase",
        "kv_len",
        "tp",
        "pp",
        "ep",
        "weights",
        "kv_cache",
        "eager",
        "micro_batches",
    } <= set(estimate.axes())
    assert {"input", "output", "max_batch", "tp", "weights"} <= set(serve.axes())
    assert "seq" not in serve.axes() and "input" not in estimate.axes()
    for name in ("json", "csv", "trace", "plot", "device_file", "no_packs", "on_error"):
        assert name not in estimate.axes()


def test_values_come_out_as_the_parser_reads_them_and_dashes_are_accepted():
    spec = check_spec(
        {
            "command": "estimate",
            "kv-len": [16, "32"],
            "micro_batches": 2,
            "eager": [False, True],
            "weights": "int8",
            "device_file": H100,
        },
        commands(),
    )
    assert spec.axes == {
        "kv_len": [16, 32],
        "micro_batches": [2],
        "eager": [False, True],
        "weights": ["int8"],
    }
    assert spec.session == {"device_file": [H100]} and spec.size == 4


def test_a_combination_the_command_refuses_is_an_error_row_and_the_rest_run():
    data = {
        "command": "estimate",
        "model": [LLAMA, MIXTRAL],
        "ep": [1, 2],
        "batch": 2,
        "seq": 16,
        "device_file": H100,
        "no_packs": True,
    }
    spec, plugins, _ = check(data)
    points = points_of(spec, plugins)
    assert len(points) == 4 and all(p.params["device"] == "h100-sxm" for p in points)
    failing = [p for p in points if p.error]
    assert [(p.params["model"], p.params["ep"]) for p in failing] == [(LLAMA, 2)]
    assert "ep = 2" in failing[0].error and "no mixture-of-experts layers" in failing[0].error
    ok = [p for p in points if not p.error]
    assert all(p.job.workload.seq == 16 and p.job.device == "h100-sxm" for p in ok)


def test_serve_points_are_checked_as_castcore_serve_checks_them():
    data = {
        "command": "serve",
        "model": LLAMA,
        "input": [16, 200],
        "output": [8, 100],
        "device_file": H100,
        "no_packs": True,
    }
    spec, plugins, _ = check(data)
    points = points_of(spec, plugins)
    assert [p.error for p in points][:3] == [None, None, None]
    assert points[0].job.serve == {**points[0].job.serve, "input_tokens": 16, "output_tokens": 8, "batch": 1}
    assert (
        "input = 200 + output = 100 tokens exceed" in points[3].error and "context of 256" in points[3].error
    )
    with pytest.raises(ModelError, match="every point is refused: input = 300 is longer than"):
        points_of(*check({**data, "input": 300})[:2])


def test_never_more_workers_than_points_cores_or_memory(monkeypatch):
    from castcore.sweeps import run

    monkeypatch.setattr(run, "default_workers", lambda: 2)
    # The machine's free memory as the test sets it, never as it happens to be: 64 GiB free, then 4 MiB.
    monkeypatch.setattr(run.os, "sysconf", lambda name: 2**24 if name == "SC_AVPHYS_PAGES" else 4096)
    assert run.worker_count(64, 2) == (2, "--workers 64: starting 2 (2 points, 2 cores)")
    # Ray: the cluster's cores, not this machine's
    assert run.worker_count(64, 1000, local=False) == (
        64,
        None,
    )
    assert run.worker_count(None, 1) == (1, None)  # the default says nothing
    # 4 MiB free
    monkeypatch.setattr(run.os, "sysconf", lambda name: 1024 if name == "SC_AVPHYS_PAGES" else 4096)
    count, why = run.worker_count(2, 10)
    assert count == 1 and why == "--workers 2: starting 1 (free memory for 1)"
