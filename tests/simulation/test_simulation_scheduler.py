"""The engine's parts one by one: a request's status through the scheduler, the block pool, and the policies the
preset chooses."""

from __future__ import annotations

import pytest

from castcore.errors import ModelError
from castcore.simulation.blocks import BlockPool
from castcore.simulation.chunks import Chunk
from castcore.simulation.policies import MultiStep, OnDemand, Policies, Reserve, Speculation
from castcore.simulation.presets import EngineLimits, limits
from castcore.simulation.request_state import RequestState, Status
from castcore.simulation.requests import Request
from castcore.simulation.scheduler import Scheduler


def scheduler_for(requests, kv_blocks=100, **overrides):
    engine = EngineLimits(
        **{
            "max_running_requests": 8,
            "max_batched_tokens": 100,
            "chunked_prefill": True,
            "block_size": 4,
            "kv_memory_fraction": 0.9,
            "memory_share_of": "device",
            **overrides,
        }
    )
    states = [RequestState.of(r) for r in requests]
    scheduler = Scheduler(
        engine, BlockPool(kv_blocks, engine.block_size), Policies.of(engine, states, None, None)
    )
    for state in states:
        scheduler.add(state)
    return scheduler, states


def test_a_request_goes_from_waiting_to_running_to_finished_and_gives_its_blocks_back():
    scheduler, (state,) = scheduler_for([Request(0, 10, 2)])
    assert state.status is Status.WAITING
    batch = scheduler.schedule()
    assert batch.chunks == [Chunk(new=10, cached=0, samples=True)] and batch.requests == [state]
    assert state.status is Status.RUNNING and scheduler.pool.free == 100 - 3  # 10 tokens in blocks of 4
    progress = scheduler.update(batch, clock=1.0)
    assert (progress.prefill_tokens, progress.decodes, progress.finished) == (10, 0, [])
    batch = scheduler.schedule()
    assert batch.chunks == [Chunk(1, 10)]
    assert scheduler.update(batch, clock=2.0).finished == [state]
    assert state.status is Status.FINISHED and state.token_times == [1.0, 2.0]
    assert scheduler.pool.free == 100 and state.held == 0


def test_a_preempted_request_waits_again_holding_nothing():
    # 3 blocks of 2 tokens: both prompts fit (1 block each); then the first's decode takes the last free block, and
    # the second, asking for one more, is the latest admitted: it is preempted itself.
    scheduler, (first, second) = scheduler_for(
        [Request(0, 2, 4), Request(1, 2, 4)], kv_blocks=3, block_size=2
    )
    scheduler.update(scheduler.schedule(), 1.0)
    batch = scheduler.schedule()
    assert batch.preempted and batch.requests == [first]
    assert second.status is Status.WAITING and second.preemptions == 1 and second.held == second.computed == 0
    assert list(scheduler.waiting) == [second] and scheduler.preemptions == 1
    assert scheduler.pool.free == 1 and first.held == 2  # the second's block came back


def test_the_preset_chooses_the_kv_policy_and_the_decisions():
    states = [RequestState.of(Request(0, 10, 5))]
    trtllm = Policies.of(limits("trtllm"), states, None, None)
    vllm = Policies.of(limits("vllm", scheduler_steps=3), states, None, (2, 1.5))
    assert isinstance(trtllm.kv, Reserve) and isinstance(vllm.kv, OnDemand)
    assert (
        trtllm.kv.admission_tokens(states[0], 0, 4) == 14 and vllm.kv.admission_tokens(states[0], 0, 4) == 4
    )
    assert isinstance(vllm.decisions, MultiStep) and isinstance(vllm.decoding, Speculation)
    assert [vllm.decisions.deciding(True) for _ in range(5)] == [True, False, False, True, False]
    assert vllm.decisions.deciding(False)  # nothing left running: decide at once


def test_speculation_counts_out_accepted_tokens_whole_as_they_accrue():
    state = RequestState.of(Request(0, 10, 10))
    spec = Speculation(2, 1.5)
    assert [spec.accept(state, 3) for _ in range(4)] == [1, 2, 1, 2]  # 1.5 a step: credit 1.5, 2.0, 1.5, 2.0
    state.generated = 9
    assert spec.accept(state, 3) == 1  # never beyond the output


def test_without_mixed_chunks_the_prompts_run_alone_and_the_decodes_wait_for_them():
    """SGLang's default: an iteration with prompt work runs only that (a chunked prompt's next chunk too); the
    decodes run when no prompt is left. vLLM's scheduler runs them together."""
    for mixed in (True, False):
        scheduler, (first, second, third) = scheduler_for(
            [Request(0, 10, 4), Request(1, 150, 4), Request(2, 10, 4)], mixed_chunk=mixed
        )
        scheduler.waiting.pop()
        scheduler.waiting.pop()  # the first alone: it prefills, then decodes
        scheduler.update(scheduler.schedule(), 1.0)
        scheduler.add(second)
        scheduler.add(third)
        batch = scheduler.schedule()  # the second's prompt is longer than the 100-token budget
        if mixed:
            assert batch.requests == [first, second] and batch.chunks == [Chunk(1, 10), Chunk(99, 0, False)]
            continue
        assert batch.requests == [second] and batch.chunks == [Chunk(100, 0, False)]
        scheduler.update(batch, 2.0)
        batch = scheduler.schedule()  # the rest of the second's prompt, and the third's
        assert batch.requests == [second, third]
        assert batch.chunks == [Chunk(50, 100, True), Chunk(10, 0, True)]
        scheduler.update(batch, 3.0)
        batch = scheduler.schedule()  # no prompt left: every decode
        assert batch.requests == [first, second, third] and all(c.new == 1 for c in batch.chunks)
        scheduler.update(batch, 4.0)
        assert first.token_times == [1.0, 4.0]  # its second token waited out both prompt iterations


def test_only_sglang_batches_its_decodes_apart():
    assert limits("sglang").mixed_chunk is False and limits("vllm").mixed_chunk
    assert limits("sglang", mixed_chunk=True).mixed_chunk
    for engine in ("vllm", "trtllm"):
        with pytest.raises(ModelError, match=f"SGLang's scheduling .*; {engine} always runs decodes"):
            limits(engine, mixed_chunk=False)
