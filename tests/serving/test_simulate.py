"""castcore simulate: mixed batches captured as an engine runs them, the step-time model that prices them within 3% of
a direct capture, KV capacity from the deployment's memory, and the command's figures and refusals."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

import castcore
from castcore.cli.main import main
from castcore.serving.mixed_batch import Chunk, capture_mixed
from castcore.serving.simulation_plan import check
from castcore.serving.step_time import StepTimes, agreement, random_batches

DATA = Path(__file__).parents[1] / "data"
LLAMA, MIXTRAL, DEEPSEEK, H100 = (
    str(DATA / "tiny-llama.json"),
    str(DATA / "tiny-mixtral.json"),
    str(DATA / "tiny-deepseek-v3.json"),
    str(DATA / "h100-sxm.toml"),
)


@pytest.fixture(scope="module")
def session():
    return castcore.Session(load_packs=[], device_files=[H100])


def test_a_packed_prefill_is_the_prefill_and_decodes_read_every_cached_token(session):
    alone = capture_mixed(session.pipeline, castcore.build_workload(LLAMA), [Chunk(16, 0)], "h100-sxm")
    prefill = session.estimate(castcore.build_workload(LLAMA, seq=16), device="h100-sxm")
    # The same work, and the keys and values an engine writes to its cache: 2 layers x 16 tokens x 2 KV heads x
    # (16 + 16) x 2 bytes.
    assert alone.flops == prefill.flops and alone.bytes - prefill.bytes == 2 * 16 * 2 * 32 * 2
    assert alone.time_s == pytest.approx(prefill.time_s, rel=0.01)
    short, long = (
        capture_mixed(session.pipeline, castcore.build_workload(LLAMA), [Chunk(1, kv)] * 4, "h100-sxm")
        for kv in (10, 200)
    )
    attention = [
        [r for r in rep.records if r.invoke.name == "castcore::varlen_attention"] for rep in (short, long)
    ]
    assert len(attention[0]) == 2  # one kernel a layer, whatever the sequences
    # Keys and values read: (cached + new) tokens x 2 KV heads x 16 x (K and V) x 2 bytes, per sequence.
    assert attention[1][0].bytes - attention[0][0].bytes == 4 * (200 - 10) * 2 * 16 * 2 * 2


@pytest.mark.parametrize(
    "model, options",
    [
        (LLAMA, {}),
        (LLAMA, {"tp": 2}),
        (MIXTRAL, {}),
        (DEEPSEEK, {}),
        (DEEPSEEK, {"tp": 2}),
    ],
)
def test_the_step_time_model_agrees_with_a_direct_capture_within_3_percent(session, model, options):
    steps = StepTimes(session.pipeline, castcore.build_workload(model, **options), "h100-sxm", 512, 64)
    verifying = [[Chunk(3, 40), Chunk(1, 30), Chunk(20, 0)], [Chunk(4, 100)] * 5]  # decodes verifying drafts
    rows = agreement(steps, random_batches(20) + verifying)
    assert len(rows) == 22 and all(abs(row["error"]) <= 0.03 for row in rows), rows


def _simulate(capsys, *more: str) -> dict:
    argv = [
        "simulate",
        "--model",
        LLAMA,
        "--device-file",
        H100,
        "--no-packs",
        "--requests",
        "60",
        "--input",
        "uniform:20:120",
        "--output",
        "16",
        "--json",
        *more,
    ]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_reports_vllm_bench_serve_figures_reproducibly(capsys):
    first = _simulate(capsys, "--rate", "40", "--seed", "3", "--slo-ttft", "1s")
    for name in (
        "completed",
        "duration",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "request_goodput",
        "preemptions",
        "mean_running_batch",
        "kv_usage",
        *(
            f"{stat}_{metric}_ms"
            for stat in ("mean", "median", "std", "p90", "p99")
            for metric in ("ttft", "tpot", "itl", "e2el")
        ),
    ):
        assert name in first, name
    assert first["completed"] == 60 and first["total_output_tokens"] == 60 * 16
    assert first["request_goodput"] == pytest.approx(first["request_throughput"])  # every TTFT is under 1 s
    assert first["duration"] >= 59 / 40 * 0.5  # the arrivals spread over about 1.5 s
    assert _simulate(capsys, "--rate", "40", "--seed", "3", "--slo-ttft", "1s") == first
    offline = _simulate(capsys)
    assert offline["duration"] < first["duration"] and offline["mean_ttft_ms"] > 0
    # Multi-step scheduling: arrivals wait for the next of the decisions made every 8 iterations.
    multi = _simulate(capsys, "--rate", "40", "--seed", "3", "--scheduler-steps", "8")
    assert multi["engine_limits"]["scheduler_steps"] == 8 and multi["completed"] == 60
    assert multi["mean_ttft_ms"] > first["mean_ttft_ms"]


def test_a_small_kv_cache_preempts_and_every_request_still_finishes(tmp_path, capsys):
    device = tmp_path / "small.toml"
    device.write_text(Path(H100).read_text().replace("memory_bytes = 85899345920", "memory_bytes = 2097152"))
    argv = [
        "simulate",
        "--model",
        LLAMA,
        "--device-file",
        str(device),
        "--no-packs",
        "--requests",
        "40",
        "--input",
        "100",
        "--output",
        "100",
        "--json",
        "--max-batched-tokens",
        "256",
    ]
    assert main(argv) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["completed"] == 40 and figures["preemptions"] > 0 and figures["never_fit"] == []
    assert figures["kv_blocks"] * 16 < 40 * 200  # the cache cannot hold every request at once
    # TensorRT-LLM's default: wait for room, never preempt
    assert main([*argv, "--kv-policy", "reserve"]) == 0
    reserved = json.loads(capsys.readouterr().out)
    assert reserved["completed"] == 40 and reserved["preemptions"] == 0
    assert reserved["engine_limits"]["kv_policy"] == "reserve"


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--rate", "0"], "--rate 0.0: must be a number above zero"),
        (["--concurrency", "0"], "--concurrency 0: must be a whole number of at least 1"),
        (["--input", "normal:100:-5"], "--input normal:100:-5: "),
        (["--input", "300"], "all 1000 requests are rejected: request 0 needs 300 input + 128 output"),
        (
            ["--input", "100", "--max-model-len", "200"],
            "--input/--output lengths or a dataset that fits, or ",
        ),
        (["--max-model-len", "300"], "--max-model-len 300: above " + LLAMA + "'s position limit of 256"),
        (["--block-size", "0"], "--block-size 0: must be a whole number of at least 1"),
        (["--scheduler-steps", "0"], "--scheduler-steps 0: must be a whole number of at least 1"),
        (["--kv-memory-fraction", "1.5"], "--kv-memory-fraction takes a fraction in (0, 1], not 1.5"),
        (["--max-capture-size", "0"], "--max-capture-size 0: must be a whole number of at least 1"),
        (
            ["--enforce-eager", "--max-capture-size", "8"],
            "--max-capture-size sizes the CUDA graphs --enforce-eager turns off: give one",
        ),
        (
            ["--mixed-chunk", "off"],
            "--mixed-chunk off is SGLang's scheduling (--engine sglang); vllm always runs decodes",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, said):
    assert main(["simulate", "--model", LLAMA, "--device-file", H100, "--no-packs", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("castcore: error: ") and said in err[0], err


def test_a_malformed_dataset_line_is_named(tmp_path, capsys):
    dataset = tmp_path / "trace.jsonl"
    dataset.write_text('{"input_tokens": 10, "output_tokens": 5}\n{"input_tokens": 10}\n')
    assert (
        main(["simulate", "--model", LLAMA, "--device-file", H100, "--no-packs", "--dataset", str(dataset)])
        == 2
    )
    assert "line 2" in capsys.readouterr().err


def test_requests_beyond_the_context_fail_one_by_one_and_the_rest_are_served(tmp_path, capsys):
    dataset = tmp_path / "trace.jsonl"
    lengths = [(100, 20), (250, 10), (60, 60), (200, 57), (30, 5)]  # 260 and 257 tokens: over 256
    dataset.write_text("".join(f'{{"input_tokens": {i}, "output_tokens": {o}}}\n' for i, o in lengths))
    argv = ["simulate", "--model", LLAMA, "--device-file", H100, "--no-packs", "--dataset", str(dataset)]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    figures = json.loads(captured.out)
    assert (figures["completed"], figures["failed"]) == (3, 2)
    assert figures["total_input_tokens"] == 190 and figures["never_fit"] == []
    assert [r["index"] for r in figures["rejected"]] == [1, 3]
    assert (
        figures["rejected"][1]["why"]
        == "200 input + 57 output = 257 tokens, beyond the model's position limit of 256"
    )
    said = [line for line in captured.err.splitlines() if "rejected" in line]
    assert len(said) == 1 and "2 of 5 requests rejected, counted as failed" in said[0]
    assert main([*argv, "--html", str(tmp_path / "page.html")]) == 0  # the page says it too
    page = (tmp_path / "page.html").read_text()
    assert "2 failed (rejected)" in page and "request 3 rejected: 200 input + 57 output" in page
    capsys.readouterr()
    # a smaller context cap refuses more, the same way; the text says how many failed
    assert main([*argv, "--max-model-len", "110"]) == 0  # only the 35-token request fits
    out = capsys.readouterr().out
    counts = [line.split()[-1] for line in out.splitlines() if line.startswith(("Successful", "Failed"))]
    assert counts == ["1", "4"]


def test_the_context_is_the_presets_or_a_smaller_max_model_len():
    long = {"requests": 4, "input_lengths": "20000", "output_lengths": "128"}
    plan = check("llama-3.1-8b", **long)  # 128k positions: served
    assert len(plan.requests) == 4 and plan.rejected == []
    with pytest.raises(
        castcore.ModelError, match=r"^all 4 requests are rejected: .* of 16384; .*a larger max_model_len$"
    ):
        check("llama-3.1-8b", max_model_len=16384, **long)
    with pytest.raises(castcore.ModelError, match=r"^all 4 requests are rejected: .*position limit of 8192"):
        check("llama-3-8b", **long)
    with pytest.raises(
        castcore.ModelError, match=r"^max_model_len=131072: above llama-3-8b's position limit of 8192 "
    ):
        check("llama-3-8b", max_model_len=131072, **long)


def test_the_python_api_gives_what_the_command_prints(capsys):
    figures = _simulate(capsys, "--concurrency", "4")
    report = castcore.Session(load_packs=[], device_files=[H100]).simulate(
        LLAMA, requests=60, input_lengths="uniform:20:120", output_lengths=16, concurrency=4
    )
    assert report.to_dict()["output_throughput"] == pytest.approx(figures["output_throughput"])
    with pytest.raises(castcore.ModelError, match=r"^rate=-1: must be a number above zero$"):
        castcore.Session(load_packs=[], device_files=[H100]).simulate(LLAMA, rate=-1)


def test_the_engine_overheads_are_stated_and_eager_decode_steps_wait_for_their_launches(session, capsys):
    """One request at a time: every decode step is the kernels of one sequence, padded to no larger graph, and
    the CPU work; eager, the step cannot be shorter than its kernels' launches (castcore.simulation.overheads)."""
    graph = _simulate(capsys, "--concurrency", "1")
    eager = _simulate(capsys, "--concurrency", "1", "--enforce-eager")
    assert graph["engine_overheads"]["graphs"] == "CUDA graphs"
    assert graph["engine_overheads"]["max_capture_size"] == 512
    assert eager["engine_overheads"]["graphs"] == "off (eager)" and eager["engine_limits"]["enforce_eager"]
    steps = StepTimes(session.pipeline, castcore.build_workload(LLAMA), "h100-sxm", 8192, 1024)
    decode = steps([Chunk(1, 80)])
    launches = steps.kernels * graph["engine_overheads"]["eager_launch_ms"] / 1e3
    assert launches > decode  # the tiny model's kernels are shorter than their launches
    assert (eager["median_itl_ms"] - graph["median_itl_ms"]) / 1e3 == pytest.approx(
        launches - decode, rel=0.05
    )
    # the CPU work each request waits for before it is scheduled is in every time to first token
    assert graph["mean_ttft_ms"] > graph["engine_overheads"]["request_cpu_ms"]


def test_each_engine_puts_its_own_request_path_and_cpu_work_in_the_time_to_first_token(capsys):
    """One request at a time, each engine's path outside the forward passes (castcore.simulation.overheads) is
    in its first tokens. Both run the prefill eagerly here (SGLang runs no graph for it, vLLM is told not to);
    vLLM's prefill iteration also waits for its own CPU work, which SGLang's overlap scheduler hides."""
    vllm = _simulate(capsys, "--concurrency", "1", "--engine", "vllm", "--enforce-eager")
    sglang = _simulate(capsys, "--concurrency", "1", "--engine", "sglang")
    costs = vllm["engine_overheads"]
    path = sglang["engine_overheads"]["request_cpu_ms"] - costs["request_cpu_ms"]
    vllm_cpu = costs["step_cpu_ms"] + costs["sequence_cpu_ms"]
    assert vllm_cpu > 0.1 and vllm["mean_ttft_ms"] > costs["request_cpu_ms"]
    assert sglang["mean_ttft_ms"] - vllm["mean_ttft_ms"] == pytest.approx(path - vllm_cpu, rel=0.05)


def test_each_iteration_prices_its_own_attention(session):
    """Long caches make attention memory-bound even on the tiny model: the model must follow the KV lengths."""
    steps = StepTimes(session.pipeline, castcore.build_workload(LLAMA), "h100-sxm", 64, 8)
    short, long = [Chunk(1, 100)] * 8, [Chunk(1, 100_000)] * 8
    assert steps.attention_time(long) > 5 * steps.attention_time(short) and steps(long) > steps(short)
    assert all(abs(row["error"]) <= 0.03 for row in agreement(steps, [short, long, short]))


def test_the_attention_line_is_the_plugins_answer_and_decode_runs_are_the_iterations_one_by_one(session):
    """castcore.serving.attention_pricing: the fitted line prices every batch as the plugins do; a decode run's
    times are those of its iterations asked one at a time; a pack's per-call answer is asked every iteration."""
    from castcore.serving import attention_pricing
    from castcore.serving.packed_calls import attention_call

    steps = StepTimes(session.pipeline, castcore.build_workload(LLAMA), "h100-sxm", 512, 64)
    assert all(isinstance(k, attention_pricing.LinearKernel) for k in steps._kernels)
    resolver = session.pipeline.host.resolver
    for chunks in random_batches(40, seed=11, sequences=60, kv=(1, 50_000), chunk=(2, 400)):
        exact = [
            resolver.estimate(attention_call(t, chunks), steps.profile).time_s for _, t in steps.attention
        ]
        assert steps.attention_kernels(chunks) == pytest.approx(exact, rel=1e-9)
    cached = [5, 900, 17, 40_000]
    assert steps.decode_times(cached, 30) == pytest.approx(
        [steps([Chunk(1, c + j) for c in cached]) for j in range(30)], rel=1e-12
    )
    # With each engine's graphs (padded to a capture size, or eager) and CPU time, as EngineStep prices each.
    from castcore.simulation.overheads import ENGINES, EngineStep
    from castcore.simulation.presets import limits

    for engine in ENGINES:
        for eager in (False, True):
            priced = EngineStep(steps, engine, limits(engine, enforce_eager=eager), steps.kernels)
            for batch in (cached, cached * 3 + [7], list(range(1, 300))):
                one_by_one = [priced([Chunk(1, c + j) for c in batch]) for j in range(12)]
                assert priced.decode_times(batch, 12) == pytest.approx(one_by_one, rel=1e-12), (engine, eager)
    # An estimate that is not a line through the batch's sums (per-sequence tiles) is asked every call.
    tiled = attention_pricing.fit(
        lambda chunks: (
            t := 1e-6 * sum(-(-c.new // 64) * -(-(c.cached + c.new) // 64) for c in chunks),
            t,
            0.0,
            0.0,
        ),
        (True, 0, 0),
        512,
    )
    assert tiled is None


def test_latent_attention_is_two_lines_one_for_the_decodes_and_one_for_the_prompts(session):
    """Multi-head latent attention runs its decodes absorbed and its prompt chunks decompressed, two kernels: each
    set is priced on its own fitted line as the plugins price that set's call, and a decode run is its iterations."""
    from castcore.builtin.attention_ops import is_decode
    from castcore.serving import attention_pricing
    from castcore.serving.packed_calls import attention_call

    steps = StepTimes(session.pipeline, castcore.build_workload(DEEPSEEK), "h100-sxm", 512, 64)
    (counts, template), (kernel,) = steps.attention[0], steps._kernels
    assert counts == [4] and isinstance(kernel, attention_pricing.SplitKernel)
    assert isinstance(kernel.decodes, attention_pricing.LinearKernel)
    assert isinstance(kernel.prompts, attention_pricing.LinearKernel)
    resolver = session.pipeline.host.resolver
    for chunks in random_batches(30, seed=5, sequences=60, kv=(1, 50_000), chunk=(2, 400)):
        parts = [[c for c in chunks if is_decode(c.new, c.cached) == d] for d in (True, False)]
        exact = sum(resolver.estimate(attention_call(template, p), steps.profile).time_s for p in parts if p)
        assert kernel(chunks) == pytest.approx(exact, rel=1e-9)
    cached = [5, 900, 17, 40_000]
    assert steps.decode_times(cached, 20) == pytest.approx(
        [steps([Chunk(1, c + j) for c in cached]) for j in range(20)], rel=1e-12
    )


def test_a_sweep_runs_simulate_points_checked_as_the_command_checks_them():
    grid = {
        "command": "simulate",
        "model": LLAMA,
        "requests": 20,
        "input": "uniform:10:60",
        "output": 8,
        "rate": [20, 80],
        "device_file": [H100],
        "no_packs": True,
    }
    rows = castcore.sweep(grid, workers=1)
    assert [row["rate"] for row in rows] == [20.0, 80.0]
    assert all(
        row["error"] is None and row["completed"] == 20 and row["total_output_tokens"] == 160 for row in rows
    )
    capped = castcore.sweep({**grid, "rate": 20, "max_model_len": 60}, workers=1)[0]  # over 60 tokens: failed
    assert capped["completed"] + capped["failed"] == 20 and capped["failed"] > 0 and "rejected" not in capped
    assert rows[1]["duration"] < rows[0]["duration"]  # the same requests arrive four times as fast
    with pytest.raises(castcore.ModelError, match=r"every point is refused: .*position limit of 256"):
        castcore.sweep({**grid, "input": 400}, workers=1)


def test_the_trace_shows_every_iteration_and_request(tmp_path, capsys):
    out = tmp_path / "run.json"
    figures = _simulate(capsys, "--rate", "40", "--trace", str(out))
    events = json.loads(out.read_text())["traceEvents"]
    iterations = [e for e in events if e["name"] == "iteration"]
    requests = [e for e in events if e["name"].startswith("request ")]
    assert len(iterations) == figures["iterations"] and len(requests) == 60
    # the last token of each is not run
    assert sum(e["args"]["decode_tokens"] + e["args"]["prefill_tokens"] for e in iterations) >= (
        figures["total_input_tokens"] + figures["total_output_tokens"] - 60
    )


def test_a_mixed_batch_splits_attention_even_where_a_pack_rewrites_it(tmp_path):
    """A pack's fuse_model rewrite would hide castcore's attention: a mixed batch runs castcore's own kernels."""
    asked = tmp_path / "asked"
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "rewriting.py").write_text(
        "import pathlib\nimport castcore.pack\n\n@castcore.pack.hookimpl\ndef fuse_model(model, device):\n"
        f"    pathlib.Path({str(asked)!r}).write_text('asked')\n"
    )
    session = castcore.Session(load_packs=[], device_files=[H100], custom_op_dirs=[str(tmp_path / "plugins")])
    report = capture_mixed(
        session.pipeline, castcore.build_workload(LLAMA), [Chunk(1, 50), Chunk(8, 0)], "h100-sxm"
    )
    assert (
        sum(r.invoke.name == "castcore::varlen_attention" for r in report.records) == 2 and not asked.exists()
    )
    session.estimate(castcore.build_workload(LLAMA, seq=8), device="h100-sxm")
    assert asked.exists()  # an estimate asks the pack, as always


def test_a_model_keeping_its_own_attention_is_refused_not_priced_as_one_prompt(session):
    with pytest.raises(
        castcore.ModelError, match="its attention does not run through castcore's fused attention"
    ):
        capture_mixed(
            session.pipeline,
            castcore.build_workload(str(DATA / "tiny-falcon.json")),
            [Chunk(1, 50), Chunk(8, 0)],
            "h100-sxm",
        )


def test_the_capture_cache_keeps_the_mixed_batches_and_gives_the_same_figures(tmp_path, monkeypatch):
    from castcore.sweeps.capture import FORMAT, CaptureCache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    options = {"requests": 30, "input_lengths": "uniform:20:120", "output_lengths": 8, "rate": 20.0}
    runs = []
    for _ in range(2):  # a new cache each time, as a new process has: the second finds every capture on disk
        cache = CaptureCache()
        report = castcore.Session(load_packs=[], device_files=[H100], capture_step=cache).simulate(
            LLAMA, **options
        )
        runs.append((report.summary, cache.stats))
    (first, made), (second, found) = runs
    assert made.captured >= 4 and made.loaded == 0  # the ladder's mixed batches and the KV probe
    # the second reads the smallest ladder capture and the probe whole, the other ladder points as they were
    # priced (castcore.sweeps.capture.CaptureCache.priced)
    priced = list((tmp_path / "castcore" / "captures").glob("*.priced"))
    assert found.captured == 0 and found.loaded == 2 and len(priced) == made.captured - 2
    assert second == first
    # an entry altered into other data is priced again, with the same figures
    priced[0].write_bytes(zlib.compress(json.dumps({"format": FORMAT, "value": {"ops": 3}}).encode()))
    again = castcore.Session(load_packs=[], device_files=[H100], capture_step=CaptureCache()).simulate(
        LLAMA, **options
    )
    assert again.summary == first
    fresh = castcore.Session(load_packs=[], device_files=[H100]).simulate(LLAMA, **options)
    assert fresh.summary == first


def test_replicas_share_their_captures_whatever_replica_count_made_them(tmp_path, monkeypatch):
    from castcore.sweeps.capture import CaptureCache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    options = {"requests": 30, "input_lengths": "uniform:20:120", "output_lengths": 8, "rate": 20.0}
    stats = []
    for dp in (2, 1):  # a new cache each time, as a new process has
        cache = CaptureCache()
        castcore.Session(load_packs=[], device_files=[H100], capture_step=cache).simulate(
            LLAMA, dp=dp, **options
        )
        stats.append(cache.stats)
    assert stats[0].captured >= 3 and stats[1].captured == 0  # one replica's captures, found on disk


def test_a_second_simulation_of_a_deployment_reuses_its_step_time_model():
    from castcore.sweeps.capture import CaptureCache

    cache = CaptureCache(disk=False)
    session = castcore.Session(load_packs=[], device_files=[H100], capture_step=cache)
    options = {"requests": 20, "input_lengths": "uniform:20:120", "output_lengths": 8}
    first = session.simulate(LLAMA, rate=10.0, **options)
    made = cache.stats.captured
    again = session.simulate(LLAMA, rate=20.0, dp=2, **options)  # another rate, more replicas: the same model
    assert cache.stats.captured == made and len(session.pipeline.derived) == 1
    assert again.summary["completed"] == 20 and again.summary != first.summary
    assert "data-parallel: 2 replicas, each serving every 2nd request" in again.notes
    session.simulate(LLAMA, rate=10.0, tp=2, **options)  # another deployment: its own
    assert cache.stats.captured > made and len(session.pipeline.derived) == 2


def test_the_plot_draws_the_distributions_and_throughput(tmp_path, capsys):
    picture = tmp_path / "run.png"
    figures = _simulate(capsys, "--rate", "40", "--plot", str(picture))
    assert figures["completed"] == 60
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 20_000
    assert [p.name for p in tmp_path.iterdir()] == ["run.png"]  # no temporary left beside it
    assert (
        main(
            [
                "simulate",
                "--model",
                LLAMA,
                "--device-file",
                H100,
                "--no-packs",
                "--input",
                "100",
                "--plot",
                str(tmp_path / "missing" / "run.png"),
            ]
        )
        == 2
    )
    assert "the folder" in capsys.readouterr().err


def test_pipeline_stages_split_an_iteration_and_serve_micro_batches_in_flight(session):
    whole = StepTimes(session.pipeline, castcore.build_workload(LLAMA), "h100-sxm", 512, 64)
    staged = StepTimes(session.pipeline, castcore.build_workload(LLAMA, pp=2), "h100-sxm", 512, 64)
    for chunks in random_batches(5, seed=1):
        stages = staged.stage_times(chunks)
        # The same ops, split: the embedding and layer 0 first, layer 1 and the LM head last.
        assert len(stages) == 2 and sum(stages) == pytest.approx(whole(chunks), rel=1e-9)
        assert staged(chunks) >= max(2 * max(stages), sum(stages))
    decoding = [Chunk(1, 50)] * 8
    assert staged.stage_times(decoding)[1] > staged.stage_times([Chunk(1, 50, samples=False)] * 8)[1]
    offline = {
        pp: castcore.Session(load_packs=[], device_files=[H100]).simulate(
            LLAMA, requests=60, input_lengths="uniform:20:120", output_lengths=16, pp=pp
        )
        for pp in (1, 2)
    }
    assert (
        offline[2].summary["completed"] == 60 and "pipeline-parallel: 2 micro-batches" in offline[2].notes[-1]
    )
    # Each device holds half the layers' keys and values: twice the blocks (the tiny weights hardly count).
    assert offline[2].kv_blocks / offline[1].kv_blocks == pytest.approx(2, rel=0.01)
    # A token passes both stages and the send between them, and the last stage also runs the LM head: at the same
    # batch per scheduler (the engine's CPU work per iteration grows with it), each token takes longer.
    closed = {
        pp: castcore.Session(load_packs=[], device_files=[H100]).simulate(
            LLAMA, requests=40, input_lengths="uniform:20:120", output_lengths=16, pp=pp, concurrency=4 * pp
        )
        for pp in (1, 2)
    }
    assert closed[2].summary["mean_tpot_ms"] > closed[1].summary["mean_tpot_ms"]


def test_a_run_where_no_request_can_be_served_is_one_line(capsys):
    argv = [
        "simulate",
        "--model",
        LLAMA,
        "--device-file",
        H100,
        "--no-packs",
        "--requests",
        "3",
        "--input",
        "200",
        "--output",
        "8",
        "--chunked-prefill",
        "off",
        "--max-batched-tokens",
        "64",
    ]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    assert len(err) == 1 and err[0].startswith(
        "castcore: error: no request can be served: all 3 never fit; "
    ), err
    assert "Traceback" not in err[0]


@pytest.mark.parametrize(
    "n, said",
    [
        (2, "2nd"),
        (3, "3rd"),
        (4, "4th"),
        (11, "11th"),
        (12, "12th"),
        (21, "21st"),
        (22, "22nd"),
        (101, "101st"),
        (113, "113th"),
    ],
)
def test_the_replica_notes_count_requests_in_english_ordinals(n, said):
    from castcore.serving.traffic import _ordinal

    assert _ordinal(n) == said


def test_the_step_time_models_kept_are_the_last_used(monkeypatch):
    """A plan revisits its layouts round after round: a model used again is kept over one not used since."""
    from castcore.serving import kv_capacity
    from castcore.sweeps.capture import CaptureCache

    monkeypatch.setattr(kv_capacity, "KEPT_STEP_TIMES", 2)
    session = castcore.Session(load_packs=[], device_files=[H100], capture_step=CaptureCache(disk=False))
    options = {"requests": 20, "input_lengths": "uniform:20:120", "output_lengths": 8, "rate": 10.0}
    session.simulate(LLAMA, tp=1, **options)
    session.simulate(LLAMA, tp=2, **options)
    first = next(iter(session.pipeline.derived.values()))
    session.simulate(LLAMA, tp=1, **options)  # used again: now the last used
    session.simulate(LLAMA, weights="int8", **options)  # a third: the least recently used (tp 2) goes
    kept = list(session.pipeline.derived.values())
    assert len(kept) == 2 and kept[0] is first


def test_sglang_runs_prompts_apart_from_the_decodes_unless_mixed_chunks_are_on(capsys):
    """SGLang's default runs an iteration of prompts alone, so the decodes running then wait a whole prompt
    iteration for their next token (castcore.simulation.scheduler); --mixed-chunk on batches them together."""
    apart = _simulate(capsys, "--engine", "sglang", "--rate", "800")
    mixed = _simulate(capsys, "--engine", "sglang", "--rate", "800", "--mixed-chunk", "on")
    assert apart["engine_limits"]["mixed_chunk"] is False and mixed["engine_limits"]["mixed_chunk"] is True
    assert apart["p99_itl_ms"] > 2 * mixed["p99_itl_ms"]
    assert apart["mean_itl_ms"] > mixed["mean_itl_ms"]
    # a prompt's iteration is its own: its first token comes no later than when it shares one
    assert apart["mean_ttft_ms"] <= mixed["mean_ttft_ms"] * 1.01
