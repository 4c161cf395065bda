"""Sequence parallelism (--sp): norms and residual adds on 1/tp of the tokens, reduce-scatter and all-gather
instead of all-reduce, the same matmuls as tensor parallelism."""

from __future__ import annotations

from collections import Counter

import pytest

import castcore
from castcore.cli.main import main

LAYERS, HIDDEN, BATCH, SEQ, TP = 2, 64, 2, 16, 2  # tiny-llama: hidden 64, 4 heads, 2 KV heads, vocab 500
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")
NORMS = ("castcore::rms_norm", "castcore::add_rms_norm")


def _estimate(session, tiny_llama, fuse: bool, **options):
    return session.estimate(
        castcore.build_workload(str(tiny_llama), batch=BATCH, seq=SEQ, tp=TP, fuse=fuse, **options)
    )


def _collectives(report) -> Counter:
    return Counter(
        r.invoke.name.split("::")[1]
        for r in report.records
        if r.invoke.name.startswith("_c10d_functional::") and r.invoke.name != "_c10d_functional::wait_tensor"
    )


def _norm_flops(report, fuse: bool) -> float:
    # Fused: the norm kernels; eager: every op of the RMSNorm modules (input_layernorm, ..., model.norm).
    return sum(
        r.flops
        for r in report.records
        if (r.invoke.name in NORMS if fuse else r.invoke.module.endswith("norm"))
    )


@pytest.mark.parametrize("fuse", [True, False])
def test_sp_prefill_reduce_scatters_and_all_gathers_instead_of_all_reducing(session, tiny_llama, fuse):
    tp, sp = (_estimate(session, tiny_llama, fuse, sp=sp) for sp in (False, True))
    assert _collectives(tp) == {"all_reduce": 1 + 2 * LAYERS, "all_gather_into_tensor": 1}
    # The embedding and every block's output reduce-scattered; every block's input all-gathered, and after the
    # last layer each device's last position, then the vocab-parallel logits.
    assert _collectives(sp) == {
        "reduce_scatter_tensor": 1 + 2 * LAYERS,
        "all_gather_into_tensor": 2 * LAYERS + 2,
    }
    # On whole rows of tokens: this device's batch x seq / tp of them, no copy around any collective.
    scatters = [r.invoke for r in sp.records if r.invoke.name == "_c10d_functional::reduce_scatter_tensor"]
    assert {tuple(i.outputs()[0].shape) for i in scatters} == {(BATCH * SEQ // TP, HIDDEN)}
    copies = [
        Counter(
            r.invoke.name
            for r in report.records
            if r.invoke.name in ("aten::cat", "aten::clone") and "layers" in r.invoke.module
        )
        for report in (tp, sp)
    ]
    assert copies[0] == copies[1]
    # Norms (and the residual adds fused into them) run on 1/tp of the tokens; the matmuls are TP's.
    assert _norm_flops(sp, fuse) * TP == _norm_flops(tp, fuse) > 0
    norm_outputs = {
        tuple(r.invoke.outputs()[0].shape)
        for r in sp.records
        if (
            r.invoke.name in NORMS
            if fuse
            else r.invoke.name == "aten::mul.Tensor" and r.invoke.module.endswith("norm")
        )
    }
    assert norm_outputs == {(1, BATCH * SEQ // TP, HIDDEN)}
    matmul = [sum(r.flops for r in report.records if r.invoke.name in MATMULS) for report in (tp, sp)]
    assert matmul[0] == matmul[1] > 0
    assert "sequence parallel" in sp.description


@pytest.mark.parametrize("fuse", [True, False])
def test_the_lm_head_sees_the_last_token_of_the_whole_sequence(session, tiny_llama, fuse):
    report = _estimate(session, tiny_llama, fuse, sp=True)
    # Each device's share of the sequences' last tokens (batch / tp rows), gathered.
    gathers = [
        r.invoke for r in report.records if r.invoke.name == "_c10d_functional::all_gather_into_tensor"
    ]
    assert tuple(gathers[-2].args[0].shape) == (BATCH // TP, HIDDEN)
    assert tuple(gathers[-2].outputs()[0].shape) == (BATCH, HIDDEN)
    (head,) = [
        r.invoke
        for r in report.records
        if r.invoke.name == "aten::mm" and r.invoke.module.endswith("lm_head")
    ]
    assert tuple(head.args[0].shape) == (BATCH, HIDDEN) and tuple(head.args[1].shape) == (HIDDEN, 500 // TP)
    every = _estimate(session, tiny_llama, fuse, sp=True, all_logits=True)
    (head,) = [
        r.invoke for r in every.records if r.invoke.name == "aten::mm" and r.invoke.module.endswith("lm_head")
    ]
    assert tuple(head.args[0].shape) == (BATCH * SEQ, HIDDEN)  # scoring: the whole sequence gathered


def test_sp_replays_layers_as_a_full_capture_does(session, tiny_llama):
    reused, full = (_estimate(session, tiny_llama, True, sp=True, reuse=reuse) for reuse in (True, False))
    assert [(r.invoke.name, r.invoke.module, r.invoke.key) for r in reused.records] == [
        (r.invoke.name, r.invoke.module, r.invoke.key) for r in full.records
    ]
    assert reused.memory.to_dict() == full.memory.to_dict()


def test_a_decode_step_under_sp_runs_as_plain_tp(session, tiny_llama):
    report = session.estimate(
        castcore.build_workload(str(tiny_llama), phase="decode", kv_len=16, batch=BATCH, tp=TP, sp=True)
    )
    assert _collectives(report)[
        "all_reduce"
    ] == 1 + 2 * LAYERS and "reduce_scatter_tensor" not in _collectives(report)
    assert any(n.startswith("--sp: a decode step") for n in report.notes)


@pytest.mark.parametrize(
    "argv,option",
    [
        (["--sp"], "--sp"),  # without --tp
        (["--sp", "--tp", "2", "--seq", "15"], "--sp"),  # the sequence does not split over the devices
    ],
)
def test_sp_refusals_are_one_line(tiny_llama, h100_file, capsys, argv, option):
    code = main(
        [
            "estimate",
            "--no-packs",
            "--device-file",
            str(h100_file),
            "--model",
            str(tiny_llama),
            "--seq",
            "16",
            *argv,
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith(f"castcore: error: {option}") and "Traceback" not in "".join(err)


def test_sp_on_mixture_of_experts_is_refused(session):
    from pathlib import Path

    mixtral = Path(__file__).parents[1] / "data" / "tiny-mixtral.json"
    with pytest.raises(castcore.ModelError, match="^sp=True: sequence parallelism of mixture-of-experts"):
        session.estimate(castcore.build_workload(str(mixtral), seq=16, tp=2, sp=True))


def test_gpt2_with_a_tied_embedding_cuts_it_to_the_devices_tokens(session, tmp_path):
    # The tied (replicated) embedding needs no reduce-scatter: its output is cut to this device's tokens.
    import json

    path = tmp_path / "tiny-gpt2.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "gpt2",
                "n_embd": 64,
                "n_layer": 2,
                "n_head": 4,
                "vocab_size": 500,
                "n_positions": 256,
            }
        )
    )
    tp, sp = (
        session.estimate(castcore.build_workload(str(path), seq=SEQ, batch=BATCH, tp=TP, sp=sp))
        for sp in (False, True)
    )
    assert _collectives(tp) == {"all_reduce": 2 * LAYERS}
    assert _collectives(sp) == {"reduce_scatter_tensor": 2 * LAYERS, "all_gather_into_tensor": 2 * LAYERS + 1}
    matmul = [sum(r.flops for r in report.records if r.invoke.name in MATMULS) for report in (tp, sp)]
    assert matmul[0] == matmul[1] > 0
