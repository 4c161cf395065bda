"""Expert parallelism (--ep): each device holds 1/ep of the experts and runs the busiest device's share of the
routed rows; inside tensor parallelism an all_reduce sums the devices' shares, under attention data parallelism
all_to_all dispatches and combines them."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

import castcore
from castcore.cli.main import main
from castcore.recording import routing

# 4 experts, top-2, hidden 64, ffn 96, 2 layers
MIXTRAL = str(Path(__file__).parents[1] / "data" / "tiny-mixtral.json")
LAYERS, EXPERTS, TOP_K, HIDDEN, FFN = 2, 4, 2, 64, 96
EXPERT_BYTES = LAYERS * EXPERTS * (2 * FFN * HIDDEN + HIDDEN * FFN) * 2  # gate_up and down, bf16


def _grouped(report) -> list:
    return [r for r in report.records if r.invoke.name == "aten::_grouped_mm"]


def _expert_weight_bytes(report) -> int:
    # Each expert weight is read by one grouped matmul: its tensor is what the device holds.
    return sum(r.invoke.args[1].nbytes for r in _grouped(report))


def _calls(report) -> Counter:
    return Counter(
        r.invoke.name.split("::")[1]
        for r in report.records
        if r.invoke.name.startswith("_c10d_functional::") and r.invoke.name != "_c10d_functional::wait_tensor"
    )


def balanced(model, **options):
    """A workload routed evenly: these tests check the even law (castcore.recording.routing.busiest_rows at 0)."""
    return castcore.build_workload(model, expert_skew=0, **options)


PHASES = [{"seq": 16, "batch": 4}, {"phase": "decode", "kv_len": 16, "batch": 4}]


@pytest.mark.parametrize("phase", PHASES, ids=["prefill", "decode"])
@pytest.mark.parametrize("tp,ep", [(1, 2), (2, 2), (2, 4), (4, 2), (1, 4)])
def test_each_device_holds_and_runs_one_ep_th_of_the_experts(session, phase, tp, ep):
    whole, split = (
        session.estimate(balanced(MIXTRAL, **phase, **options)) for options in ({}, {"tp": tp, "ep": ep})
    )
    assert _expert_weight_bytes(whole) == EXPERT_BYTES
    # ep < tp: each expert is also split over tp/ep devices, so a device holds 1/tp of the expert weights.
    assert _expert_weight_bytes(split) * max(tp, ep) == EXPERT_BYTES
    # The busiest device's rows (castcore.recording.routing.busiest_rows) of the batch's tokens x top-k over ep
    # devices; with ep < tp each row runs 1/(tp/ep) of its expert's product on a device.
    tokens = phase["batch"] * (phase.get("seq") or 1)
    received = max(1, round(routing.busiest_rows(EXPERTS, ep, tokens, TOP_K, 0.0)))
    flops = [sum(r.flops for r in _grouped(report)) for report in (whole, split)]
    assert flops[1] * tokens * TOP_K == pytest.approx(flops[0] * received * min(1, ep / tp), rel=1e-9)
    assert flops[0] > 0 and received > tokens * TOP_K / ep  # more than an even share
    calls = _calls(split)
    if ep <= tp:
        # Every device of the TP group holds every token: nothing dispatched, one all_reduce sums the devices'
        # shares of each MoE layer (beside the embedding's and the attention's); only the logits all-gathered.
        assert calls["all_to_all_single"] == 0 and calls["reduce_scatter_tensor"] == 0
        assert calls["all_reduce"] == 1 + 2 * LAYERS and calls["all_gather_into_tensor"] == 1
        return
    assert calls["all_to_all_single"] == 2 * LAYERS  # dispatch and combine in every MoE layer
    # Attention data-parallel: every TP rank of a group routes 1/tp of its tokens and all-gathers them after the
    # combine; the embedding and the attention all-reduce, the MoE does not.
    assert calls["all_gather_into_tensor"] == (LAYERS + 1) * (tp > 1) and calls["reduce_scatter_tensor"] == 0
    assert calls["all_reduce"] == (1 + LAYERS) * (tp > 1)
    sizes = {
        i.attrs["group_size"]
        for i in (r.invoke for r in split.records)
        if i.name == "_c10d_functional::all_to_all_single"
    }
    assert sizes == {ep}


def test_expert_parallelism_inside_tensor_parallelism_runs_the_rows_as_a_fused_moe_does(session):
    """--tp 2 --ep 2, one decoding token: the busiest device gathers its 2 of the token's 2 rows (one kernel),
    runs them, weights and sums them per token (one kernel) and all-reduces; no integer glue is priced."""
    report = session.estimate(balanced(MIXTRAL, phase="decode", kv_len=16, batch=1, tp=2, ep=2))
    permute = [r.invoke for r in report.records if r.invoke.name == "castcore::moe_permute"]
    unpermute = [r.invoke for r in report.records if r.invoke.name == "castcore::moe_unpermute"]
    assert len(permute) == len(unpermute) == LAYERS
    rows = round(routing.busiest_rows(EXPERTS, 2, 1, TOP_K, 0.0))
    assert rows == 2
    assert tuple(permute[0].outputs()[0].shape) == (rows, HIDDEN)
    assert tuple(unpermute[0].outputs()[0].shape) == (1, HIDDEN)
    experts = [
        r.invoke.name
        for r in report.records
        if r.invoke.module.endswith("layers.0.mlp.experts") and r.estimate.time_s > 0
    ]
    assert [n for n in experts if not n.startswith("_c10d_functional::wait")] == [
        "castcore::moe_permute",
        "aten::_grouped_mm",
        "castcore::silu_and_mul",
        "aten::_grouped_mm",
        "castcore::moe_unpermute",
        "_c10d_functional::all_reduce",
    ]
    assert any("nothing is dispatched" in n and "one all_reduce" in n for n in report.notes)
    asked = session.estimate(
        balanced(MIXTRAL, phase="decode", kv_len=16, batch=1, tp=2, ep=2, ep_kernels="low-latency")
    )
    assert not _calls(asked)["all_to_all_single"]
    assert any(
        "applies to all_to_all dispatch, which only attention data parallelism has" in n for n in asked.notes
    )


def test_the_busiest_device_receives_the_expected_most_rows(session):
    # ep 2 over 2 attention groups, prefill of 4 x 16 tokens: each group routes 32 tokens x top-2 = 64 rows; the
    # two groups' 128 rows land on 2 devices as Poisson counts of mean 64, the busiest's expected count about 69.
    report = session.estimate(balanced(MIXTRAL, seq=16, batch=4, ep=2, attention_dp=2))
    (dispatch, *_) = [
        r.invoke for r in report.records if r.invoke.name == "_c10d_functional::all_to_all_single"
    ]
    busiest = round(routing.busiest_rows(EXPERTS, 2, 64, TOP_K, 0.0))
    assert busiest == 69
    assert tuple(dispatch.args[0].shape) == (64, HIDDEN) and tuple(dispatch.outputs()[0].shape) == (
        busiest,
        HIDDEN,
    )
    gate_up = _grouped(report)[0].invoke
    assert tuple(gate_up.args[0].shape) == (busiest, HIDDEN) and tuple(gate_up.args[1].shape) == (
        2,
        HIDDEN,
        2 * FFN,
    )
    assert any(n.startswith("--ep 2: ") and "expected most" in n for n in report.notes)


@pytest.mark.parametrize(
    "kernels, prefill, decode",
    [
        ("normal", "engine", "engine"),
        ("low-latency", "low-latency", "low-latency"),
        ("auto", "engine", "low-latency"),
    ],
)
def test_ep_kernels_say_how_dispatch_and_combine_run(session, kernels, prefill, decode):
    """The capture records on each dispatch and combine which kernels run it, for the collectives' estimator
    (castpack-collectives prices "low-latency" as DeepEP's low-latency kernels); every other collective of an
    inference step is a serving engine's."""
    for phase, want in ((PHASES[0], prefill), (PHASES[1], decode)):
        report = session.estimate(balanced(MIXTRAL, tp=2, ep=4, ep_kernels=kernels, **phase))
        a2a = [r.invoke for r in report.records if r.invoke.name == "_c10d_functional::all_to_all_single"]
        assert len(a2a) == 2 * LAYERS and {i.attrs.get("kernels") for i in a2a} == {want}
        others = [
            r.invoke
            for r in report.records
            if r.invoke.name.startswith("_c10d_functional::")
            and r.invoke.name != "_c10d_functional::wait_tensor"
            and r.invoke not in a2a
        ]
        assert others and all(i.attrs.get("kernels") == "engine" for i in others)
        assert any("low-latency kernels" in n for n in report.notes) == (want == "low-latency")


def test_a_training_step_leaves_its_collectives_to_the_library(session):
    report = session.estimate(balanced(MIXTRAL, tp=2, train=True, seq=16, batch=4))
    collectives = [
        r.invoke
        for r in report.records
        if r.invoke.name.startswith("_c10d_functional::") and r.invoke.name != "_c10d_functional::wait_tensor"
    ]
    assert collectives and not any("kernels" in i.attrs for i in collectives)


def test_ep_over_tp_runs_attention_on_a_share_of_the_batch(session):
    # ep 4 over tp 2: 2 attention groups, each with 2 of the 4 sequences; its KV cache is the group's.
    whole, split = (
        session.estimate(balanced(MIXTRAL, seq=16, batch=4, **o)) for o in ({}, {"tp": 2, "ep": 4})
    )
    (sdpa, *_) = [r.invoke for r in split.records if r.invoke.name == "castcore::attention"]
    assert sdpa.args[0].shape[0] == 2
    # half the sequences, half the KV heads
    assert split.memory.kv_cache_bytes * 4 == whole.memory.kv_cache_bytes
    assert "2 of 4 sequences" in split.description


def test_attention_dp_is_expert_parallelism_wider_than_tensor_parallelism(session):
    # --attention-dp 2 of --tp 2 spreads the experts over 4 devices: the same deployment as --ep 4 --tp 2.
    sugar = balanced(MIXTRAL, seq=16, batch=4, tp=2, attention_dp=2)
    plain = balanced(MIXTRAL, seq=16, batch=4, tp=2, ep=4)
    assert sugar == plain and (plain.ep, plain.attention_dp) == (4, 2)
    assert balanced(MIXTRAL, seq=16, tp=2, ep=2).attention_dp == 1
    with pytest.raises(
        castcore.ModelError,
        match=r"attention_dp=2 groups of tp=2 spread the experts over 4 devices: "
        r"use ep=4, or leave ep out",
    ):
        balanced(MIXTRAL, seq=16, tp=2, ep=2, attention_dp=2)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_a_batch_that_does_not_divide_over_the_attention_groups_is_priced_as_the_busiest(session, phase):
    # 3 sequences on 2 groups: the busiest holds 2, as with 4; 1 sequence leaves one group idle, as with 2.
    def run(batch):
        return session.estimate(balanced(MIXTRAL, seq=16, batch=batch, attention_dp=2, phase=phase))

    three, four, one, two = run(3), run(4), run(1), run(2)
    assert three.time_s == four.time_s and one.time_s == two.time_s
    assert any("priced as the busiest, with 2 sequences" in n for n in three.notes)
    assert any("priced as the busiest, with 1 sequence; 1 group idle" in n for n in one.notes)
    assert not any("busiest" in n for n in four.notes)


def test_ep_replays_layers_as_a_full_capture_does(session):
    reused, full = (
        session.estimate(balanced(MIXTRAL, seq=16, batch=4, tp=2, ep=2, reuse=r)) for r in (True, False)
    )
    assert [(r.invoke.name, r.invoke.module, r.invoke.key) for r in reused.records] == [
        (r.invoke.name, r.invoke.module, r.invoke.key) for r in full.records
    ]
    assert reused.memory.to_dict() == full.memory.to_dict()


def _cli(h100_file, capsys, *argv) -> tuple[int, str]:
    code = main(["estimate", "--no-packs", "--device-file", str(h100_file), "--seq", "16", *argv])
    return code, capsys.readouterr().err.strip().splitlines()[-1]


def test_ep_refusals_are_one_line(h100_file, tiny_llama, capsys):
    code, err = _cli(h100_file, capsys, "--model", MIXTRAL, "--tp", "3", "--ep", "3", "--batch", "3")
    assert code == 2 and err.startswith("castcore: error: --ep 3") and "4 experts do not divide by 3" in err
    code, err = _cli(h100_file, capsys, "--model", str(tiny_llama), "--tp", "2", "--ep", "2", "--batch", "2")
    assert code == 2 and err.startswith("castcore: error: --ep 2") and "no mixture-of-experts" in err


def test_an_ep_above_tp_without_attention_dp_is_refused_naming_both_readings(h100_file, capsys):
    """vLLM's users read --ep 4 as -tp 4 --enable-expert-parallel, TensorRT-LLM's and SGLang's as DP attention:
    castcore asks which, in one line, before anything is built; either spelling then runs."""
    code, err = _cli(h100_file, capsys, "--model", MIXTRAL, "--ep", "4", "--batch", "4")
    assert code == 2 and err == (
        "castcore: error: --ep 4 leaves open what runs the attention: give --tp 4 --ep 4 (attention and experts over "
        "4 devices, as vLLM's -tp 4 --enable-expert-parallel) or --ep 4 --attention-dp 4 (attention data-parallel "
        "over 4 groups of 1 device(s), the experts over all of them)"
    )
    assert "capturing" not in capsys.readouterr().err
    code, err = _cli(h100_file, capsys, "--model", MIXTRAL, "--tp", "2", "--ep", "4", "--batch", "4")
    assert code == 2 and "give --tp 4 --ep 4" in err and "or --tp 2 --ep 4 --attention-dp 2 (" in err
    notes = []
    for spelling in (["--tp", "4", "--ep", "4"], ["--ep", "4", "--attention-dp", "4"]):
        assert (
            main(
                [
                    "estimate",
                    "--no-packs",
                    "--device-file",
                    str(h100_file),
                    "--seq",
                    "16",
                    "--model",
                    MIXTRAL,
                    "--batch",
                    "4",
                    *spelling,
                ]
            )
            == 0
        )
        notes.append(capsys.readouterr().err)
    assert (
        "the 4 tensor-parallel devices all hold every token" in notes[0] and "data-parallel" not in notes[0]
    )
    assert "attention runs data-parallel on 4 groups of 1 device" in notes[1]


FACTORY = f"""
from castcore.workload.models import build_preset

def make(batch=1, seq=16, phase="prefill", kv_len=None, train=False):
    return build_preset({MIXTRAL!r}, batch=batch, seq=seq, dtype="bf16", phase=phase, kv_len=kv_len, train=train)
"""


def test_a_factory_model_is_checked_when_built(h100_file, capsys, tmp_path, monkeypatch):
    (tmp_path / "castcore_ep_factory.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "castcore_ep_factory", raising=False)
    code, err = _cli(
        h100_file,
        capsys,
        "--model",
        "castcore_ep_factory:make",
        "--ep",
        "8",
        "--attention-dp",
        "8",
        "--batch",
        "8",
    )
    assert code == 2 and err.startswith("castcore: error: ") and "4 experts, which do not divide by 8" in err
    code, err = _cli(h100_file, capsys, "--model", "castcore_ep_factory:make", "--pp", "3")
    assert (
        code == 2
        and err
        == "castcore: error: --pp 3 is more pipeline stages than the model's 2 layers: use --pp 2 or less"
    )


def test_the_op_table_says_how_many_experts_a_device_ran(session):
    # One decoding token, top-2 of 4 experts: 2 rows reach 4 x (1 - (3/4)^2) = 1.75 experts on one device. Under
    # --tp 2 --ep 2 the busiest device gets round(1.52) = 2 of them over its 2 experts: 2 x (1 - (1/2)^2) = 1.5.
    def experts_run(**layout):
        report = session.estimate(balanced(MIXTRAL, phase="decode", kv_len=16, batch=1, **layout))
        found = [s.experts_run for s in report.by_op() if s.experts_run is not None]
        assert len(found) == 1  # the grouped products, every other op None
        return found[0]

    assert experts_run() == pytest.approx(1.75)
    assert experts_run(tp=2, ep=2) == pytest.approx(1.5)


DEEPSEEK = str(Path(__file__).parents[1] / "data" / "tiny-deepseek-v3.json")  # 4 layers, the first dense


def _reduced_in(report) -> list[str]:
    # a collective after a module's forward is recorded in the module around it
    return [
        r.invoke.module.split("model.")[-1]
        for r in report.records
        if r.invoke.name == "_c10d_functional::all_reduce"
    ]


@pytest.mark.parametrize("layout", [{"tp": 2}, {"tp": 2, "ep": 2}], ids=["tp", "tp-ep"])
def test_a_shared_expert_and_the_routed_ones_are_summed_by_one_all_reduce(session, layout):
    """DeepSeek's MoE block adds its shared expert to its routed experts: both leave partial sums, and one
    all_reduce of the block's output sums them, as vLLM's SharedFusedMoE does."""
    report = session.estimate(balanced(DEEPSEEK, phase="decode", kv_len=16, batch=1, **layout))
    attention = [f"layers.{i}.self_attn" for i in range(4)]
    # the embedding, each attention's o_proj, the dense MLP's down_proj, each MoE block (in its layer)
    assert _reduced_in(report) == [
        "DeepseekV3ForCausalLM.model",
        attention[0],
        "layers.0.mlp",
        *(m for i in (1, 2, 3) for m in (attention[i], f"layers.{i}")),
    ]
    # Attention data parallelism brings the experts' outputs back whole: the shared expert reduces its own.
    dispatched = session.estimate(balanced(DEEPSEEK, phase="decode", kv_len=16, batch=2, tp=2, ep=4))
    assert [m for m in _reduced_in(dispatched) if "mlp" in m] == [
        "layers.0.mlp",
        *(f"layers.{i}.mlp.shared_experts" for i in (1, 2, 3)),
    ]


def _marked(report, module_end: str) -> dict[str, bool]:
    """Each op name under ``module_end`` (the experts block) -> whether its calls carry the fused-MoE mark."""
    found: dict[str, bool] = {}
    for r in report.records:
        if r.invoke.module.endswith(module_end) and not r.invoke.name.startswith("_c10d_functional::wait"):
            found[r.invoke.name] = found.get(r.invoke.name, True) and bool(r.invoke.attrs.get("fused_moe"))
    return found


@pytest.mark.parametrize("options", [{}, {"tp": 2, "ep": 2}], ids=["one device", "ep inside tp"])
def test_a_local_experts_block_is_marked_as_one_fused_moe_kernels_parts(session, options):
    # the sort, the products, the activation and the combine stay on the device: an engine's fused MoE runs them
    # as one kernel (castcore.recording.routing's mark); the all_reduce after them is no part of it
    report = session.estimate(balanced(MIXTRAL, phase="decode", kv_len=16, batch=2, **options))
    marked = _marked(report, "layers.0.mlp.experts")
    for op in (
        "castcore::moe_permute",
        "aten::_grouped_mm",
        "castcore::silu_and_mul",
        "castcore::moe_unpermute",
    ):
        assert marked[op] is True, op
    if options:
        assert marked["_c10d_functional::all_reduce"] is False
    router = [r for r in report.records if r.invoke.name == "castcore::topk_softmax"]
    assert router and not any(r.invoke.attrs.get("fused_moe") for r in router)


def test_a_dispatch_marks_only_the_local_experts_not_the_sort_and_combine_that_cross_the_network(session):
    report = session.estimate(balanced(MIXTRAL, phase="decode", kv_len=16, batch=2, ep=2, attention_dp=2))
    marked = _marked(report, "layers.0.mlp.experts")
    assert marked["aten::_grouped_mm"] and marked["castcore::silu_and_mul"]
    assert not marked["castcore::moe_permute"] and not marked["castcore::moe_unpermute"]
    assert not marked["_c10d_functional::all_to_all_single"]
