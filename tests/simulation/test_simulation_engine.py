"""The engine model of ``castcore simulate``: hand-checked schedules, preemption, never-fit requests, arrivals and
the presets."""

from __future__ import annotations

import dataclasses
import gc

import pytest

from castcore.errors import ModelError
from castcore.simulation.engine import run_engine
from castcore.simulation.presets import PRESETS, EngineLimits, limits
from castcore.simulation.requests import Request as Req


def engine(running=8, budget=100, chunked=True, block=16):
    return EngineLimits(running, budget, chunked, block, 0.9, "device")


def recorder(seconds=1.0, samples=None):
    """A step function recording each iteration's (new, cached) pairs, and in ``samples`` which of them sample."""
    batches = []

    def step(batch):
        batches.append([(new, cached) for new, cached, _ in batch])
        if samples is not None:
            samples.append([flag for _, _, flag in batch])
        return seconds

    return batches, step


def test_one_request_alone():
    batches, step = recorder()
    result = run_engine([Req(0, 10, 3)], engine(), 100, step)
    assert batches == [[(10, 0)], [(1, 10)], [(1, 11)]]
    assert result.iterations == 3
    (done,) = result.finished
    assert (done.arrival_s, done.first_token_s, done.finish_s) == (0.0, 1.0, 3.0)
    assert done.token_times == [1.0, 2.0, 3.0]
    assert list(result.trace.prefill_tokens) == [10, 0, 0] and list(result.trace.decode_tokens) == [0, 1, 1]


def test_the_cyclic_collector_is_off_in_the_loop_and_as_it_was_after():
    seen = []

    def step(batch):
        seen.append(gc.isenabled())
        return 1.0

    assert gc.isenabled()
    run_engine([Req(0, 10, 3)], engine(), 100, step)
    assert seen == [False] * 3 and gc.isenabled()
    gc.disable()
    try:  # a caller that turned it off keeps it off
        run_engine([Req(0, 10, 3)], engine(), 100, step)
        assert not gc.isenabled()
    finally:
        gc.enable()

    def interrupted(batch):
        raise KeyboardInterrupt

    assert run_engine([Req(0, 10, 3)], engine(), 100, interrupted).partial and gc.isenabled()


def test_chunked_prefill_split_by_budget():
    samples: list = []
    batches, step = recorder(samples=samples)
    result = run_engine([Req(0, 10, 2)], engine(budget=4), 100, step)
    assert batches == [[(4, 0)], [(4, 4)], [(2, 8)], [(1, 10)]]
    # only the chunk that ends the prompt samples a token
    assert samples == [
        [False],
        [False],
        [True],
        [True],
    ]
    assert result.finished[0].token_times == [3.0, 4.0]


def test_without_chunking_the_whole_prompt_waits_for_budget():
    batches, step = recorder()
    run_engine([Req(0, 3, 2), Req(1, 4, 1)], engine(budget=5, chunked=False), 100, step)
    assert batches[0] == [(3, 0)]  # the second prompt does not fit the 2 tokens left
    assert batches[1] == [(1, 3), (4, 0)]


def test_max_running_requests_respected():
    batches, step = recorder()
    result = run_engine([Req(i, 4, 5) for i in range(5)], engine(running=2), 100, step)
    assert max(result.trace.running) == 2
    assert max(len(b) for b in batches) == 2
    assert len(result.finished) == 5


def test_blocks_exhausted_preempts_the_latest_and_it_still_finishes():
    # Blocks of 2 tokens, 4 in all; each request peaks at 2 + 4 - 1 = 5 KV tokens = 3 blocks.
    batches, step = recorder()
    result = run_engine([Req(0, 2, 4), Req(1, 2, 4)], engine(block=2), 4, step)
    assert result.preemptions == 1
    by_index = {f.index: f for f in result.finished}
    assert by_index[0].preemptions == 0 and by_index[1].preemptions == 1
    assert all(len(f.token_times) == 4 for f in result.finished)
    # Iteration 4: request 0 needs a third block, request 1 is preempted; it later recomputes 2 + 3 tokens.
    assert batches[3] == [(1, 4)]
    assert (5, 0) in [pair for batch in batches for pair in batch]


def test_the_reserve_policy_admits_only_what_fits_whole_and_never_preempts():
    # The same two requests and 4 blocks: each reserves its 3 blocks at admission, so the second waits.

    batches, step = recorder()
    reserving = dataclasses.replace(engine(block=2), kv_policy="reserve")
    result = run_engine([Req(0, 2, 4), Req(1, 2, 4)], reserving, 4, step)
    assert result.preemptions == 0 and len(result.finished) == 2
    assert batches[:4] == [[(2, 0)], [(1, 2)], [(1, 3)], [(1, 4)]]  # request 1 starts when request 0 has left
    assert batches[4] == [(2, 0)]
    assert PRESETS["trtllm"].kv_policy == "reserve" and PRESETS["vllm"].kv_policy == "preempt"
    with pytest.raises(ModelError, match="kv_policy takes preempt or reserve, not 'never'"):
        limits("vllm", kv_policy="never")


def test_multi_step_scheduling_admits_only_at_a_decision():
    # Three steps per decision, one second each. Request 0 arrives at 0 and runs iterations 1-3 (its prefill, then
    # two decodes); request 1 arrives at 0.5 and waits for the decision at t=3, though budget and blocks are free.
    batches, step = recorder()
    multi = dataclasses.replace(engine(), scheduler_steps=3)
    result = run_engine([Req(0, 4, 5, 0.0), Req(1, 2, 2, 0.5)], multi, 100, step)
    assert batches[:4] == [[(4, 0)], [(1, 4)], [(1, 5)], [(1, 6), (2, 0)]]
    by_index = {f.index: f for f in result.finished}
    assert by_index[1].first_token_s == 4.0  # one step at a time, it would have been admitted at t=1: 2.0
    single = run_engine([Req(0, 4, 5, 0.0), Req(1, 2, 2, 0.5)], engine(), 100, recorder()[1])
    assert {f.index: f for f in single.finished}[1].first_token_s == 2.0
    # Request 1 leaves at t=5 and request 0 at t=5 too (its fifth token): nothing runs, so the next decision is at
    # once for a request arriving later.
    late = run_engine([Req(0, 4, 5, 0.0), Req(1, 2, 2, 0.5), Req(2, 3, 1, 10.0)], multi, 100, step)
    assert {f.index: f for f in late.finished}[2].first_token_s == 11.0


def test_request_too_big_for_the_cache_is_reported_and_others_finish():
    _, step = recorder()
    result = run_engine([Req(0, 4, 2), Req(1, 100, 2), Req(2, 4, 2)], engine(block=4), 10, step)
    assert [n.index for n in result.never_fit] == [1]
    assert "needs 26 KV blocks" in result.never_fit[0].why
    assert sorted(f.index for f in result.finished) == [0, 2]


def test_prompt_over_budget_without_chunking_never_fits():
    _, step = recorder()
    result = run_engine([Req(0, 50, 2)], engine(budget=10, chunked=False), 100, step)
    assert not result.finished and "without chunked prefill" in result.never_fit[0].why


def test_concurrency_two_keeps_at_most_two_in_the_system():
    _, step = recorder()
    result = run_engine([Req(i, 4, 2 + i) for i in range(4)], engine(), 100, step, concurrency=2)
    finished = {f.index: f for f in result.finished}
    assert (finished[0].arrival_s, finished[1].arrival_s) == (0.0, 0.0)
    assert finished[2].arrival_s == finished[0].finish_s == 2.0
    assert finished[3].arrival_s == finished[1].finish_s == 3.0
    for t in [0.5 + k for k in range(10)]:
        assert sum(f.arrival_s <= t < f.finish_s for f in result.finished) <= 2


def test_offline_and_rate_arrivals():
    _, step = recorder()
    offline = run_engine([Req(0, 4, 2), Req(1, 4, 2)], engine(), 100, step)
    assert [f.first_token_s for f in offline.finished] == [1.0, 1.0]
    at_rate = run_engine([Req(0, 4, 2, 0.0), Req(1, 4, 2, 5.0)], engine(), 100, step)
    late = next(f for f in at_rate.finished if f.index == 1)
    assert (late.arrival_s, late.first_token_s, late.finish_s) == (5.0, 6.0, 7.0)
    assert list(at_rate.trace.time) == [0.0, 1.0, 5.0, 6.0]  # idle time jumps to the arrival


def test_kv_usage_is_bounded():
    _, step = recorder(0.001)
    result = run_engine([Req(i, 8, 400) for i in range(30)], engine(running=4), 1000, step)
    assert result.iterations > 2000 and len(result.kv_usage) <= 2000
    assert all(0 <= share <= 1 for _, share in result.kv_usage)


@pytest.mark.parametrize("name", ["vllm", "sglang", "trtllm"])
def test_each_preset_has_numbers_and_sources(name):
    preset = PRESETS[name]
    assert preset.max_running_requests >= 1 and preset.max_batched_tokens >= 1 and preset.block_size >= 1
    assert 0 < preset.kv_memory_fraction <= 1 and preset.memory_share_of in ("device", "free")
    assert preset.sources and all(len(source) > 20 for source in preset.sources)


def test_documented_values():
    assert (
        PRESETS["vllm"].max_batched_tokens,
        PRESETS["vllm"].block_size,
        PRESETS["vllm"].kv_memory_fraction,
    ) == (8192, 16, 0.9)
    assert PRESETS["sglang"].block_size == 1 and PRESETS["sglang"].max_batched_tokens == 8192
    assert (PRESETS["trtllm"].max_running_requests, PRESETS["trtllm"].memory_share_of) == (2048, "free")


def test_overrides_apply_and_bad_ones_are_refused_in_one_line():
    assert limits("vllm", block_size=32, chunked_prefill=False).block_size == 32
    for bad, option in [
        ({"block_size": 0}, "block_size"),
        ({"max_batched_tokens": 2.5}, "max_batched_tokens"),
        ({"kv_memory_fraction": 1.5}, "kv_memory_fraction"),
        ({"chunked_prefill": "yes"}, "chunked_prefill"),
        ({"colour": 1}, "'colour'"),
    ]:
        with pytest.raises(ModelError) as error:
            limits("vllm", **bad)
        assert option in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ModelError, match="engine='tgi' is not known"):
        limits("tgi")


def test_ctrl_c_ends_the_run_with_the_requests_finished_so_far():
    calls = []

    def step(batch):
        calls.append(batch)
        if len(calls) == 6:  # the user presses Ctrl-C during the sixth iteration
            raise KeyboardInterrupt
        return 1.0

    # Two short requests finish in the first iterations; the long one is still decoding at the sixth.
    result = run_engine([Req(0, 4, 2), Req(1, 4, 3), Req(2, 4, 50)], engine(), 100, step, leaping=False)
    assert result.partial and result.iterations == 5
    assert sorted(f.index for f in result.finished) == [0, 1]
    # A decode-only run is timed whole before it is booked: interrupted there, none of it is kept.
    calls.clear()
    result = run_engine([Req(0, 4, 2), Req(1, 4, 3), Req(2, 4, 50)], engine(), 100, step)
    assert result.partial and result.iterations == 3
    assert sorted(f.index for f in result.finished) == [0, 1]


def test_a_cached_prefix_is_skipped_and_its_blocks_held_once():
    # Both prompts start with the same 40-token prefix; blocks of 16: its 2 whole blocks (32 tokens) are cached
    # once the first request has computed its prompt, so the second (arriving later) prefills 50 - 32 tokens.
    batches, step = recorder()
    first = Req(0, 50, 2, 0.0, prefix_id=7, prefix_tokens=40)
    second = Req(1, 50, 2, 5.0, prefix_id=7, prefix_tokens=40)
    result = run_engine([first, second], engine(block=16), 10, step)
    assert batches[0] == [(50, 0)] and batches[2] == [(18, 32)]
    assert (result.prefix_hits, result.cached_tokens) == (1, 32)
    # While the second runs it holds its own 2 blocks (tokens 32-51) beside the 2 cached ones: 4 of 10 in use.
    assert result.trace.kv_used[2] == pytest.approx(0.4)
    # A request whose prefix is the whole prompt still computes its last token.
    batches, step = recorder()
    run_engine(
        [
            Req(0, 32, 1, 0.0, prefix_id=1, prefix_tokens=32),
            Req(1, 32, 1, 5.0, prefix_id=1, prefix_tokens=32),
        ],
        engine(block=16),
        10,
        step,
    )
    assert batches[1] == [(16, 16)]


def test_speculative_decoding_verifies_k_drafts_and_keeps_the_accepted_tokens():
    # k = 2 drafts, 2.5 tokens kept a step on average: after the prompt's token, steps keep 2, 3 (1 + the carried
    # half, capped at what is left) ...; each verification pass runs 3 new tokens.
    batches, step = recorder()
    result = run_engine([Req(0, 10, 6)], engine(), 100, step, speculation=(2, 2.5))
    assert batches == [[(10, 0)], [(3, 10)], [(3, 12)]]
    (done,) = result.finished
    assert done.token_times == [1.0, 2.0, 2.0, 3.0, 3.0, 3.0]
    # Without it, one token a step.
    assert run_engine([Req(0, 10, 6)], engine(), 100, recorder()[1]).iterations == 6
