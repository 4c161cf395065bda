"""Engine overheads: each engine's CUDA-graph capture sizes, decode batches padded to the next one, eager
iterations bound by their kernel launches, the CPU work of every iteration and of every request before its first
token, and the options that change them."""

from __future__ import annotations

import pytest

from castcore.errors import ModelError
from castcore.simulation.engine import run_engine
from castcore.simulation.overheads import ENGINES, EngineStep, describe
from castcore.simulation.presets import limits
from castcore.simulation.requests import Request as Req

KERNELS = 300  # launched per iteration
PER_CHUNK = 1e-4  # the kernels' seconds per sequence in the batch


def kernels_of(batch):
    """The kernels' time of a batch; each batch it is given is kept in ``kernels_of.seen``."""
    kernels_of.seen.append(list(batch))
    return PER_CHUNK * len(batch)


def step_of(engine, **overrides):
    kernels_of.seen = []
    return EngineStep(kernels_of, engine, limits(engine, **overrides), KERNELS)


def decodes(n):
    return [(1, 100 + i) for i in range(n)]


def cpu(engine, n):
    costs = ENGINES[engine]
    return costs.step_s + costs.sequence_s * n


def test_each_engine_captures_the_sizes_its_rule_gives():
    vllm = step_of("vllm").sizes
    assert vllm[:5] == [1, 2, 4, 8, 16] and vllm[-1] == 512  # min(2 x 1024 sequences, 512)
    assert {248, 256, 272} <= set(vllm) and 252 not in vllm and 264 not in vllm
    assert step_of("vllm", max_running_requests=100).sizes[-1] == 200  # 2 x max_num_seqs
    assert step_of("vllm", max_batched_tokens=64).sizes[-1] == 64  # within the token budget
    sglang = step_of("sglang").sizes
    assert sglang[:6] == [1, 2, 4, 8, 12, 16] and sglang[-1] == 256
    assert step_of("trtllm").sizes == [*range(1, 33), 64, 128]
    assert step_of("vllm", max_capture_size=48).sizes[-1] == 48
    assert step_of("vllm", enforce_eager=True).sizes == []


@pytest.mark.parametrize("n, padded", [(1, 1), (3, 4), (5, 8), (9, 16), (250, 256), (257, 272), (512, 512)])
def test_a_decode_batch_replays_the_next_captured_size(n, padded):
    step = step_of("vllm")
    seconds = step(decodes(n))
    (seen,) = kernels_of.seen
    assert len(seen) == padded and seen[:n] == decodes(n)
    assert all(not samples for _, _, samples in seen[n:])  # padding rows sample nothing
    assert seconds == pytest.approx(PER_CHUNK * padded + cpu("vllm", n))  # vLLM does not overlap its CPU work


def test_beyond_the_largest_capture_an_iteration_is_eager_and_bound_by_its_launches():
    step = step_of("vllm")
    launches = KERNELS * ENGINES["vllm"].launch_s
    assert step(decodes(513)) == pytest.approx(max(PER_CHUNK * 513, launches) + cpu("vllm", 513))
    assert len(kernels_of.seen[-1]) == 513  # not padded
    # a mixed batch within the largest size in tokens runs vLLM's piecewise graphs; SGLang's runs eagerly
    mixed = [(40, 0), *decodes(3)]
    assert step(mixed) == pytest.approx(PER_CHUNK * 4 + cpu("vllm", 4))
    sglang = step_of("sglang")
    assert sglang(mixed) == pytest.approx(max(PER_CHUNK * 4, launches))  # its CPU work overlapped


def test_without_padding_a_size_not_captured_runs_eagerly():
    step = step_of("trtllm")
    launches = KERNELS * ENGINES["trtllm"].launch_s
    assert step(decodes(32)) == pytest.approx(PER_CHUNK * 32)  # captured; the CPU hides behind the kernels
    assert step(decodes(33)) == pytest.approx(max(PER_CHUNK * 33, launches))
    assert [len(b) for b in kernels_of.seen] == [32, 33]


def test_enforce_eager_lengthens_every_decode_step_by_the_launches_the_kernels_do_not_cover():
    """One request alone: each inter-token gap is one decode iteration, its kernels then its CPU work."""
    gaps = {}
    for eager in (False, True):
        kernels_of.seen = []
        step = EngineStep(kernels_of, "vllm", limits("vllm", enforce_eager=eager), KERNELS)
        (done,) = run_engine([Req(0, 10, 6)], limits("vllm"), 100, step).finished
        gaps[eager] = [b - a for a, b in zip(done.token_times, done.token_times[1:])]
    launches = KERNELS * ENGINES["vllm"].launch_s
    assert gaps[False] == pytest.approx([PER_CHUNK + cpu("vllm", 1)] * 5)
    assert [e - g for e, g in zip(gaps[True], gaps[False])] == pytest.approx([launches - PER_CHUNK] * 5)


@pytest.mark.parametrize("concurrency", [None, 1])
def test_the_per_request_cpu_time_adds_to_each_time_to_first_token(concurrency):
    requests = [Req(i, 10, 4, None if concurrency else 0.5 * i) for i in range(3)]
    firsts = {}
    for delay in (0.0, ENGINES["vllm"].request_s):
        result = run_engine(requests, limits("vllm"), 100, lambda batch: 0.01, concurrency, None, delay)
        firsts[delay] = [
            f.first_token_s - f.arrival_s for f in sorted(result.finished, key=lambda f: f.index)
        ]
    assert [b - a for a, b in zip(*firsts.values())] == pytest.approx([ENGINES["vllm"].request_s] * 3)


@pytest.mark.parametrize(
    "overrides, said",
    [
        ({"enforce_eager": "yes"}, "takes true or false, not 'yes'"),
        ({"max_capture_size": 0}, "takes a whole number >= 1, not 0"),
        (
            {"enforce_eager": True, "max_capture_size": 64},
            "sizes the CUDA graphs enforce_eager=True turns off",
        ),
    ],
)
def test_bad_graph_options_are_refused(overrides, said):
    with pytest.raises(ModelError, match=said):
        limits("vllm", **overrides)


def test_the_summary_line_names_the_graphs_and_the_cpu_costs():
    assert describe("vllm", step_of("vllm").summary()) == (
        "engine overheads (vllm): CUDA graphs up to batch 512; CPU 0.25 ms + 0.0127 ms per sequence per "
        "iteration, 6.6 ms per request before its first token"
    )
    line = describe("trtllm", step_of("trtllm", enforce_eager=True).summary())
    assert (
        line.startswith("engine overheads (trtllm): off (eager); CPU 0.25 ms") and "100% overlapped" in line
    )
    assert "(no padding)" in describe("trtllm", step_of("trtllm").summary())
