"""Decode-only runs booked at once (castcore.simulation.decode_run) give what the scheduler gives iteration by
iteration: the same tokens at the same times, the same trace, under every policy."""

from __future__ import annotations

import dataclasses
import random

import pytest

from castcore.simulation import decode_run
from castcore.simulation.blocks import BlockPool
from castcore.simulation.engine import run_engine
from castcore.simulation.policies import Policies
from castcore.simulation.request_state import RequestState
from castcore.simulation.scheduler import Scheduler
from castcore.simulation.presets import EngineLimits
from castcore.simulation.requests import Request


def step(batch) -> float:
    """An iteration's seconds growing with its tokens and its keys, as a real one does."""
    return 1e-3 + 2e-6 * sum(c[0] for c in batch) + 1e-8 * sum(c[0] + c[1] for c in batch)


def requests(count: int, seed: int, rate: float | None, prefixes: bool = False) -> list[Request]:
    rng = random.Random(seed)
    clock, made = 0.0, []
    for i in range(count):
        clock += rng.expovariate(rate) if rate else 0.0
        prefix = rng.choice([None, 1, 2]) if prefixes else None
        made.append(
            Request(
                i,
                rng.randint(20, 600),
                rng.randint(1, 300),
                clock if rate else None,
                prefix_id=prefix,
                prefix_tokens=16 if prefix else 0,
            )
        )
    return made


VLLM = EngineLimits(64, 512, True, 16, 0.9, "device")
CASES = {
    "rate": (VLLM, 4000, {}, 30.0, False),
    "offline": (VLLM, 4000, {}, None, False),
    "tight KV cache, preemptions": (VLLM, 300, {}, 30.0, False),
    "reserve policy": (dataclasses.replace(VLLM, kv_policy="reserve"), 2000, {}, 30.0, False),
    "multi-step scheduling": (dataclasses.replace(VLLM, scheduler_steps=4), 4000, {}, 30.0, False),
    "no chunked prefill": (
        dataclasses.replace(VLLM, chunked_prefill=False, max_batched_tokens=700),
        4000,
        {},
        30.0,
        False,
    ),
    "closed loop": (VLLM, 4000, {"concurrency": 12}, None, False),
    "engine's path before scheduling": (VLLM, 4000, {"request_s": 0.0013}, 30.0, False),
    "closed loop with that path": (VLLM, 4000, {"concurrency": 12, "request_s": 0.0013}, None, False),
    "prefix cache": (VLLM, 4000, {}, 30.0, True),
    "token budget below the batch": (dataclasses.replace(VLLM, max_batched_tokens=40), 4000, {}, 30.0, False),
    "block of one token": (dataclasses.replace(VLLM, block_size=1), 60000, {}, 30.0, False),
    "a hybrid's recurrent state": (VLLM, 600, {"state_blocks": 5}, 30.0, False),
}


@pytest.mark.parametrize("case", CASES)
def test_runs_at_once_give_what_the_scheduler_gives_one_iteration_at_a_time(case):
    limits, blocks, options, rate, prefixes = CASES[case]
    made = requests(150, 7, rate, prefixes)
    leaping = run_engine(made, limits, blocks, step, **options)
    stepped = run_engine(made, limits, blocks, step, leaping=False, **options)
    assert [(f.index, f.token_times) for f in leaping.finished] == [
        (f.index, f.token_times) for f in stepped.finished
    ]
    assert leaping.never_fit == stepped.never_fit
    assert (leaping.iterations, leaping.preemptions, leaping.mean_running) == (
        stepped.iterations,
        stepped.preemptions,
        stepped.mean_running,
    )
    for field in ("time", "duration", "prefill_tokens", "decode_tokens", "running", "kv_used"):
        assert getattr(leaping.trace, field) == getattr(stepped.trace, field), field


def test_most_iterations_of_a_decode_heavy_run_are_booked_at_once(monkeypatch):
    scheduled = []
    schedule = Scheduler.schedule

    def counting(self):
        scheduled.append(1)
        return schedule(self)

    monkeypatch.setattr(Scheduler, "schedule", counting)
    result = run_engine(requests(50, 3, None), VLLM, 4000, step)
    # The scheduler ran the prefills and the iterations where a request finished; the rest were runs.
    assert len(scheduled) < result.iterations / 2


def test_no_run_while_requests_wait_or_a_prompt_is_computed():
    limits = VLLM
    states = [RequestState.of(r) for r in requests(3, 1, None)]
    scheduler = Scheduler(limits, BlockPool(100, 16), Policies.of(limits, states, None, None))
    for state in states:
        scheduler.add(state)
    assert decode_run.run_length(scheduler) == 0  # all waiting
    scheduler.update(scheduler.schedule(), 1.0)
    assert not scheduler.waiting
    assert decode_run.run_length(scheduler) == (
        0
        if not all(s.decoding for s in scheduler.running)
        else min(s.output - s.generated for s in scheduler.running) - 1
    )


def test_a_hybrid_models_requests_each_hold_their_state_blocks_beside_their_tokens():
    made = requests(150, 7, None)
    plain = run_engine(made, VLLM, 600, step)
    hybrid = run_engine(made, VLLM, 600, step, state_blocks=20)
    assert len(hybrid.finished) == len(plain.finished) == 150
    assert hybrid.mean_running < plain.mean_running  # the same blocks hold fewer requests at once
    # 600 tokens and an output of 300 take 57 blocks of 16; with 560 state blocks more than the 600 there are
    (never,) = run_engine([Request(0, 600, 300, None)], VLLM, 600, step, state_blocks=560).never_fit
    assert "it needs 617 KV blocks" in never.why
