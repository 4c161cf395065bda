"""Hostile input on the serving surface, as a user would give it: each case is refused in one line (exit 2, no
traceback, nothing written), or discarded with one warning where castcore's own cache holds it."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from castcore.errors import ModelError
from castcore.options.traffic import SIMULATE as SIMULATE_OPTIONS
from castcore.options.option import Objective
from castcore.recording import stored
from castcore.simulation.metrics import format_ms
from castcore.sweeps import capacity
from castcore.sweeps.plan import PlanRequest
from castcore.tomlfiles import CONFIG_BYTES
from castcore.workload import draft_heads
from castcore.workload.spec import load_model_config

DATA = Path(__file__).parents[1] / "data"
LLAMA, MIXTRAL, H100 = DATA / "tiny-llama.json", DATA / "tiny-mixtral.json", str(DATA / "h100-sxm.toml")
DEVICE = ["--device-file", H100, "--no-packs"]


def castcore(folder: Path, *argv: str) -> subprocess.CompletedProcess:
    """``castcore ARGV`` in ``folder``, with a cache and a temporary folder of the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    env.update(XDG_CACHE_HOME=str(folder / "cache"), TMPDIR=str(folder / "tmp"))
    (folder / "tmp").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "castcore", *argv], capture_output=True, text=True, env=env, cwd=folder
    )


def refused(folder: Path, *argv: str) -> str:
    """The one error line of a refused command; nothing new in ``folder`` but the cache and temporary folders."""
    before = sorted(p.name for p in folder.iterdir())
    done = castcore(folder, *argv)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and lines[0].startswith("castcore: error: "), lines
    assert done.stdout == ""
    assert sorted(p.name for p in folder.iterdir() if p.name not in ("cache", "tmp")) == [
        name for name in before if name not in ("cache", "tmp")
    ]
    return lines[0]


def model_folder(folder: Path, **changes) -> Path:
    """tiny-llama's config.json in ``folder``/model, with ``changes``."""
    (folder / "model").mkdir()
    config = folder / "model" / "config.json"
    config.write_text(json.dumps({**json.loads(LLAMA.read_text()), **changes}))
    return config


SIMULATE = ["simulate", "--model", str(LLAMA), *DEVICE, "--input", "64", "--output", "8"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["--requests", "1000000000000", "--rate", "1"],
            "--requests 1000000000000: is over 1,000,000, castcore's limit",
        ),
        (["--requests", "100000000", "--rate", "1"], "--requests 100000000: is over 1,000,000"),
        (
            ["--requests", "10", "--spec-tokens", "100000", "--draft-model", "eagle", "--acceptance", "0.7"],
            "--spec-tokens 100000: a verification pass of its last token and 100000 draft tokens does not fit the "
            "--max-batched-tokens 8192 token budget (the vllm preset): give at most --spec-tokens 8191",
        ),
        (
            [
                "--requests",
                "10",
                "--spec-tokens",
                "64",
                "--draft-model",
                "eagle",
                "--acceptance",
                "0.7",
                "--max-batched-tokens",
                "32",
            ],
            "does not fit the --max-batched-tokens 32 token budget: give at most",
        ),
        (
            ["--requests", "10", "--burstiness", "0.3"],
            "--burstiness 0.3 shapes the gaps between arrivals at --rate, "
            "and without it every request arrives at once: give --rate QPS",
        ),
        (
            ["--requests", "10", "--burstiness", "0.3", "--concurrency", "2"],
            "without it a closed loop starts",
        ),
    ],
)
def test_simulate_refuses_counts_and_options_it_would_ignore_or_choke_on(tmp_path, argv, said):
    assert said in refused(tmp_path, *SIMULATE, *argv)


def test_attention_dp_that_does_not_divide_the_experts_names_attention_dp(tmp_path):
    line = refused(tmp_path, "simulate", "--model", str(MIXTRAL), *DEVICE, "--attention-dp", "3")
    assert "--attention-dp 3 spreads the experts over 3 groups of --tp 1, 3 devices" in line
    assert "4 experts do not divide by 3; use an --attention-dp whose groups times --tp divide 4" in line
    assert "--ep" not in line


def test_a_block_larger_than_the_kv_memory_names_block_size(tmp_path):
    """Refused once the step times are captured (they size the memory left): the progress line, then the error."""
    done = castcore(tmp_path, *SIMULATE, "--requests", "10", "--block-size", "999999999")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert last.startswith("castcore: error: --block-size 999999999: one block of 999,999,999 tokens' KV")
    assert "use a --block-size of at most" in last and "--tp" not in last


def test_a_dataset_over_the_request_limit_is_refused(tmp_path):
    dataset = tmp_path / "trace.jsonl"
    dataset.write_text('{"input_tokens": 4, "output_tokens": 4}\n' * 1_000_001)
    line = refused(tmp_path, *SIMULATE, "--dataset", str(dataset))
    assert "1,000,001 lines, over 1,000,000, castcore's limit for --requests" in line


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("huge", f"over {CONFIG_BYTES // 2**20} MiB, castcore's limit for a model config"),
        ("loop", "cannot read it: Too many levels of symbolic links"),
        ("deep", "nested too deep to read as JSON"),
        ("binary", "not valid JSON: byte 0 is 0x89, not UTF-8 text"),
        ("string quantization_config", "its quantization_config is a JSON string, not an object"),
        ("hf_quant_config not JSON", "hf_quant_config.json: not valid JSON"),
        (
            "hf_quant_config quantization string",
            "hf_quant_config.json: its quantization is a JSON string, not an object",
        ),
    ],
)
def test_a_hostile_model_config_is_one_line(tmp_path, case, said):
    config = tmp_path / "model" / "config.json"
    if case == "string quantization_config":
        model_folder(tmp_path, quantization_config="fp8")
    else:
        model_folder(tmp_path)
    if case == "huge":
        with config.open("ab") as out:
            out.truncate(50 * 2**20)  # 50 MB, the rest zeros
    elif case == "loop":
        config.unlink()
        config.symlink_to("config.json")
    elif case == "deep":
        config.write_text("[" * 200_000)
    elif case == "binary":
        config.write_bytes(b"\x89PNG\r\n\x1a\n")
    elif case.startswith("hf_quant_config"):
        (config.parent / "hf_quant_config.json").write_text(
            "not json" if case.endswith("not JSON") else json.dumps({"quantization": "fp8"})
        )
    line = refused(tmp_path, "simulate", "--model", str(config), *DEVICE, "--requests", "10")
    assert said in line and str(config.parent) in line
    assert "AttributeError" not in line and "transformers" not in line


def _serve_results(**changes) -> dict:
    """The fields a serve --json file holds that its page reads."""
    found = {
        "model": "tiny-llama",
        "device": "h100-sxm",
        "batch": 1,
        "input_tokens": 16,
        "output_tokens": 4,
        "ttft_s": 0.001,
        "tpot_s": 0.0002,
        "latency_s": 0.002,
        "output_tokens_per_s": 2000.0,
        "output_tokens_per_s_per_device": 2000.0,
        "devices": 1,
        "peak_bytes": 1e6,
        "weight_bytes": 5e5,
        "kv_cache_bytes": 1e4,
        "activation_bytes": 1e4,
        "free_bytes": 8e10,
        "device_memory_bytes": 8e10,
        "fits": True,
        "tpot_fit": {"a_s": 0.0002, "b_s_per_token": 1e-10},
        "decode_points": [{"kv_len": 16, "time_s": 0.0002}],
    }
    return {**found, **changes}


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"output_tokens": 1e300}, "its output_tokens is 1e+300, not a whole number from 0 to 1,000,000,000"),
        ({"output_tokens": 4.0}, "its output_tokens is 4.0, not a whole number"),
        ({"batch": "4"}, 'its batch is "4", not a whole number'),
        ({"ttft_s": -1}, "its ttft_s is -1, not a finite number of at least 0"),
        ({"model": ["a"]}, 'its model is ["a"], not a name'),
    ],
)
def test_report_checks_a_saved_files_fields(tmp_path, changes, said):
    results = tmp_path / "serve.json"
    results.write_text(json.dumps(_serve_results(**changes)))
    line = refused(tmp_path, "report", str(results), "--html", "page.html")
    assert f"{results}: {said}" in line


def test_report_of_a_deep_or_huge_results_file_is_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000)
    assert "nested too deep to read as JSON" in refused(tmp_path, "report", str(deep), "--html", "page.html")
    deep_rows = tmp_path / "rows.jsonl"
    deep_rows.write_text("[" * 200_000 + "\n")
    assert "cannot read its rows (RecursionError" in refused(
        tmp_path, "report", str(deep_rows), "--html", "p.html"
    )
    for name in ("huge.json", "huge.csv", "huge.jsonl"):
        with (tmp_path / name).open("wb") as out:
            out.truncate(300 * 2**20)  # sparse: refused by its size, never read
        line = refused(tmp_path, "report", str(tmp_path / name), "--html", "p.html")
        assert f"{tmp_path / name}: over 256 MiB, castcore's limit for a" in line


def test_a_long_serve_output_draws_without_a_step_by_step_loop(tmp_path):
    """A saved serve of 10^9 output tokens (the bound) draws its page from 400 points, not a billion steps."""
    from castcore.report.html.serve import _static_charts

    pytest.importorskip("plotly")
    charts = _static_charts(_serve_results(output_tokens=10**9))
    assert len(charts) >= 2


def test_a_draft_head_planted_in_the_shared_temporary_folder_is_never_read_or_written(tmp_path):
    """Another user's folder of head configs in the temporary folder, with a file under every name a head of
    tiny-llama could take and a link to a victim's file: castcore keeps its head in the user's own cache."""
    planted = tmp_path / "tmp" / "castcore-draft-heads"
    planted.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("theirs")
    text = json.dumps(
        draft_heads.head_config(load_model_config(str(LLAMA)), "eagle", str(LLAMA)), sort_keys=True
    )
    bad = {**json.loads(text), "num_hidden_layers": 48}
    name = f"eagle-{hashlib.sha256(text.encode()).hexdigest()[:16]}"  # where castcore once kept it
    (planted / f"{name}.json").write_text(json.dumps(bad))
    (planted / f"{name}.tmp").symlink_to(victim)
    done = castcore(
        tmp_path,
        *SIMULATE,
        "--requests",
        "10",
        "--spec-tokens",
        "2",
        "--draft-model",
        "eagle",
        "--acceptance",
        "0.7",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "theirs"
    heads = list((tmp_path / "cache" / "castcore" / "draft-heads").iterdir())
    assert len(heads) == 1 and json.loads(heads[0].read_text())["num_hidden_layers"] == 1
    assert not heads[0].stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def test_a_draft_head_file_is_rewritten_unless_it_is_the_users_own_and_holds_the_head(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = load_model_config(str(LLAMA))
    path = Path(draft_heads.draft_source(str(LLAMA), config, "eagle"))
    assert path.parent == tmp_path / "cache" / "castcore" / "draft-heads" and draft_heads.is_head(str(path))
    head = path.read_text()
    victim = tmp_path / "victim.json"
    victim.write_text("theirs")
    path.unlink()
    path.symlink_to(victim)  # a link by the head's name: replaced, never written through
    assert draft_heads.draft_source(str(LLAMA), config, "eagle") == str(path)
    assert not path.is_symlink() and path.read_text() == head and victim.read_text() == "theirs"
    path.write_text(json.dumps({**json.loads(head), "num_hidden_layers": 48}))  # altered: written again
    draft_heads.draft_source(str(LLAMA), config, "eagle")
    assert path.read_text() == head
    path.parent.chmod(0o777)  # a folder every user may write is not the user's own
    try:
        with pytest.raises(ModelError, match="draft_model='eagle': the head's config cannot be kept in"):
            draft_heads.draft_source(str(LLAMA), config, "eagle")
    finally:
        path.parent.chmod(0o700)


def _bomb(megabytes: int) -> bytes:
    """A zlib stream of ``megabytes`` MiB of spaces: a few hundred bytes a MiB."""
    packer, chunk = zlib.compressobj(9), b" " * 2**20
    return b"".join(packer.compress(chunk) for _ in range(megabytes)) + packer.flush()


def test_a_cache_entry_that_inflates_far_is_discarded_before_it_is_inflated():
    bomb = _bomb(256)
    assert len(bomb) < 2**20
    with pytest.raises(stored.StoredError, match=r"it inflates past \d+ MiB") as refused_entry:
        stored.loads(bomb)  # stopped at 100 times its size plus 1 MiB, not at 256 MiB
    assert int(str(refused_entry.value).split("past ")[1].split(" MiB")[0]) < 256


def test_a_cut_or_deeply_nested_cache_entry_is_discarded():
    deep = zlib.compress(b"[" * 200_000)
    with pytest.raises(stored.StoredError, match="nested too deep"):
        stored.loads(deep)
    whole = zlib.compress(json.dumps({"capture": {}}).encode())
    with pytest.raises(stored.StoredError, match="cut short"):
        stored.loads(whole[:-4])


def test_durations_keep_their_digits():
    assert [format_ms(v) for v in (0.162, 30.0, 7.9, 0.25, 19_150.4, 0.0)] == [
        "0.162 ms",
        "30.0 ms",
        "7.90 ms",
        "0.250 ms",
        "19,150 ms",
        "0 ms",
    ]
    request = PlanRequest(model=str(LLAMA), ttft=Objective.parse("p99:1us", SIMULATE_OPTIONS["slo_ttft"]))
    row = {"error": None, "never_fit": 0, "p99_ttft_ms": 0.162}
    assert capacity.misses(request, row) == ["p99 TTFT 0.162 ms over 0.00100 ms"]  # not "p99 TTFT 0 ms"
