"""Multi-LoRA serving (--lora-rank R --adapters N): the adapters' grouped GEMMs per token, their memory, and the
weights a batch reads growing with how many adapters it mixes."""

from __future__ import annotations

from pathlib import Path

import pytest

import castcore
from castcore.builtin.formulas.matmul import touched_experts
from castcore.cli.main import main
from castcore.recording import routing

DATA = Path(__file__).parents[1] / "data"
LLAMA, H100 = str(DATA / "tiny-llama.json"), str(DATA / "h100-sxm.toml")
# tiny-llama's projections (in + out features) per layer, 2 layers, deployed: the merged q/k/v, three adapters side by
# side (64 in each, 64+32+32 out), o 64+64, the merged gate/up, two adapters (64 in each, 320 out), down 160+64: as
# many as adapters on each projection unmerged.
FEATURES = 2 * ((3 * 64 + 128) + 128 + (2 * 64 + 320) + 224)


@pytest.fixture(scope="module")
def session():
    return castcore.Session(load_packs=[], device_files=[H100])


def decode(session, **lora):
    return session.estimate(castcore.build_workload(LLAMA, phase="decode", batch=32, kv_len=64, **lora))


def grouped(report) -> list:
    return [r for r in report.records if r.invoke.name == "aten::_grouped_mm"]


def test_each_token_runs_its_adapters_shrink_and_expand(session):
    plain, adapted = decode(session), decode(session, lora_rank=16, adapters=4)
    assert not grouped(plain) and len(grouped(adapted)) == 2 * 8  # shrink and expand on 8 projections
    flops = sum(sum(c.mma_ops for c in r.properties.compute_ops.values()) for r in grouped(adapted))
    assert flops == 2 * 32 * 16 * FEATURES  # 32 tokens, rank 16
    # Every adapter is resident: 4 x rank x (in + out) bf16 weights more.
    assert adapted.memory.weight_bytes - plain.memory.weight_bytes == 4 * 16 * FEATURES * 2
    assert any(n.startswith("multi-LoRA: 4 adapters of rank 16 on 8 projections") for n in adapted.notes)


def test_mixing_more_adapters_reads_more_adapter_weights(session):
    few, many = (decode(session, lora_rank=16, adapters=n) for n in (4, 64))
    shrink = [grouped(report)[0] for report in (few, many)]  # layer 0's q/k/v: A is [adapters, 64, 3 x 16]
    read = [
        r.properties.memory_read_bytes - r.invoke.args[0].nbytes - r.invoke.args[2].nbytes for r in shrink
    ]
    assert read[0] == pytest.approx(64 * 48 * 2 * touched_experts(4, 32))
    assert read[1] == pytest.approx(64 * 48 * 2 * touched_experts(64, 32))
    assert read[1] > read[0]


def test_popular_adapters_cut_the_adapter_weights_a_batch_reads(session):
    def shrink(**more):
        report = session.estimate(
            castcore.build_workload(
                LLAMA, phase="decode", batch=32, kv_len=64, lora_rank=16, adapters=64, **more
            )
        )
        first = grouped(report)[0]  # layer 0's q/k/v: A is [64, 64, 3 x 16]
        return first.properties.memory_read_bytes - first.invoke.args[0].nbytes - first.invoke.args[2].nbytes

    even, skewed = shrink(), shrink(adapter_skew=1.2)
    assert even == pytest.approx(64 * 48 * 2 * touched_experts(64, 32))  # 32 requests reach 25.3 of 64 evenly
    # Zipf odds i^-1.2: the most popular of 16 adapters is picked 37% of the time, the least 1.3%; 256 picks miss
    # the least popular 3.4% of the time, so 15.9 are touched. 32 requests over 64 such adapters touch 15.2.
    assert routing.popular_touched(16, 256, 1.2) == pytest.approx(15.89, abs=0.01)
    assert (
        routing.popular_touched(4, 1, 1.2) == pytest.approx(1.0) and routing.popular_touched(4, 2, 0) == 1.75
    )
    assert skewed == pytest.approx(64 * 48 * 2 * routing.popular_touched(64, 32, 1.2))
    assert skewed < 0.65 * even


def test_under_tensor_parallelism_each_device_holds_its_share_and_adds_no_communication(session):
    plain, adapted = decode(session, tp=2), decode(session, tp=2, lora_rank=16, adapters=4)
    # Column-parallel q/k/v and gate/up keep their A's whole and split B's outputs (2 query heads and 1 KV head
    # of 16 a device); row-parallel o and down split A's inputs.
    local = 2 * ((3 * 64 + 64) + (32 + 64) + (2 * 64 + 160) + (80 + 64))
    assert adapted.memory.weight_bytes - plain.memory.weight_bytes == 4 * 16 * local * 2
    flops = sum(sum(c.mma_ops for c in r.properties.compute_ops.values()) for r in grouped(adapted))
    assert flops == 2 * 32 * 16 * local
    collectives = [
        [r.invoke.name for r in report.records if r.invoke.name.startswith("_c10d_functional::")]
        for report in (plain, adapted)
    ]
    # the row-parallel all-reduce carries the adapters'
    assert collectives[0] and collectives[1] == collectives[0]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--lora-rank", "16"], "multi-LoRA needs both --lora-rank and --adapters"),
        (["--lora-rank", "12", "--adapters", "4"], "--lora-rank 12: give a multiple of 8"),
        (["--adapter-skew", "1.2"], "--adapter-skew 1.2 needs --lora-rank and --adapters"),
    ],
)
def test_bad_lora_options_are_one_line(capsys, argv, said):
    assert main(["estimate", "--model", LLAMA, "--device-file", H100, "--no-packs", *argv]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("castcore: error:")]
    assert len(errors) == 1 and said in errors[0]
