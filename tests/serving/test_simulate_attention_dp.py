"""Attention data parallelism under traffic (castcore simulate --ep N --attention-dp G): each attention group of
tp devices schedules its own requests with its own KV blocks, its iterations priced as one group's packed row with
the experts split over every device; alone and as a disaggregated pool."""

from __future__ import annotations

from pathlib import Path

import pytest

import castcore

DATA = Path(__file__).parents[1] / "data"
MOE, H100 = str(DATA / "tiny-qwen3-moe.json"), str(DATA / "h100-sxm.toml")
TRAFFIC = dict(device="h100-sxm", input_lengths="64", output_lengths="8")


@pytest.fixture(scope="module")
def session():
    return castcore.Session(load_packs=[], device_files=[H100])


def test_each_attention_group_schedules_its_own_requests(session):
    alone = session.simulate(MOE, **TRAFFIC, requests=1, ep=2, attention_dp=2)
    two = session.simulate(MOE, **TRAFFIC, requests=2, ep=2, attention_dp=2)
    shared = session.simulate(MOE, **TRAFFIC, requests=2, ep=2, tp=2)  # one group of two devices
    # Two requests at once on two groups: each runs alone on its own group, as the single request does.
    assert [f.first_token_s for f in two.finished] == pytest.approx([alone.finished[0].first_token_s] * 2)
    assert two.iterations == 2 * alone.iterations
    assert shared.iterations == alone.iterations  # one scheduler batching both
    (note,) = [n for n in two.notes if n.startswith("attention data-parallel: 2 groups of 1 device(s)")]
    assert note.endswith("balanced by taking every 2nd request)")
    # Two devices held; each iteration keeps one group's device busy.
    (use,) = two.pool_use
    assert use.devices == 2 and two.summary["completed"] == 2


def test_an_attention_data_parallel_decode_pool(session):
    report = session.simulate(
        MOE,
        **TRAFFIC,
        requests=8,
        rate=20.0,
        prefill_instances=1,
        decode_instances=1,
        prefill_deployment="tp=2 ep=2",
        decode_deployment="ep=2 attention_dp=2",
    )
    assert report.summary["completed"] == 8 and report.summary["devices"] == 4
    assert report.deployment["decode"]["attention_dp"] == 2 and report.deployment["prefill"]["tp"] == 2
    assert [u.devices for u in report.pool_use] == [2, 2]
