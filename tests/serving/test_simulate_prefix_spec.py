"""Prefix caching and speculative decoding under traffic (castcore simulate): a cached shared prefix is not
prefilled again, a draft model's tokens are verified in one pass, and the refusals of bad options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from castcore.cli.main import main
from castcore.errors import ModelError
from castcore.simulation.requests import read_dataset
from castcore.serving import speculation
from castcore.workload import draft_heads
from castcore.workload.spec import load_model_config

DATA = Path(__file__).parents[1] / "data"
LLAMA, H100 = str(DATA / "tiny-llama.json"), str(DATA / "h100-sxm.toml")
BASE = [
    "simulate",
    "--model",
    LLAMA,
    "--device-file",
    H100,
    "--no-packs",
    "--input",
    "200",
    "--output",
    "32",
    "--requests",
    "40",
    "--rate",
    "20",
    "--json",
]


def run(capsys, *more: str) -> dict:
    assert main([*BASE, *more]) == 0
    return json.loads(capsys.readouterr().out)


def test_acceptance_is_a_rate_per_position_or_their_list():
    assert speculation.acceptance_rates("0.5", 3) == [0.5, 0.25, 0.125]
    assert speculation.acceptance_rates("0.9,0.7,0.5", 3) == [0.9, 0.7, 0.5]
    assert speculation.tokens_per_step([0.9, 0.7, 0.5]) == pytest.approx(3.1)
    for text, said in (
        ("1.5", "from 0 to 1"),
        ("0.9,0.7", "2 positions for"),
        ("0.5,0.7,0.2", "cannot rise"),
        ("high", "give a rate"),
    ):
        with pytest.raises(ModelError, match=said):
            speculation.acceptance_rates(text, 3)


def test_a_step_adds_the_drafts_prefill_and_its_k_decode_steps():
    calls = []

    def model(batch):
        calls.append(("model", batch))
        return 1.0

    def draft(batch):
        calls.append(("draft", batch))
        return 0.1

    step = speculation.speculative_step(model, draft, 3)
    prompt, verify = (200, 0, True), (4, 100, True)  # a prompt's last chunk; a decode carrying 3 drafts
    assert step([prompt, verify]) == pytest.approx(1.0 + 0.1 + 2 * 0.1)
    # The draft prefills the chunk and drafts the first token together, then drafts the other two (priced once, x 2).
    assert calls == [
        ("model", [prompt, verify]),
        ("draft", [prompt, (1, 100, True)]),
        ("draft", [(1, 100, True)]),
    ]


def test_a_shared_prefix_is_prefilled_once_and_lowers_time_to_first_token(capsys):
    plain, cached = run(capsys), run(capsys, "--prefix-len", "160")
    assert "prefix_cache_hits" not in plain
    # 40 requests share it: the first computes it, the other 39 skip its 10 whole blocks of 16 tokens.
    assert (cached["prefix_cache_hits"], cached["cached_prompt_tokens"]) == (39, 39 * 160)
    assert cached["mean_ttft_ms"] < plain["mean_ttft_ms"]
    half = run(capsys, "--prefix-len", "160", "--prefix-hit-rate", "0.5")
    assert 0 < half["prefix_cache_hits"] < 39


def test_accepted_drafts_cut_the_steps_and_time_per_token(tmp_path, capsys):
    config = json.loads((DATA / "tiny-llama.json").read_text())
    config["num_hidden_layers"] = 1  # a draft of the same family, half the depth
    small = tmp_path / "draft.json"
    small.write_text(json.dumps(config))
    plain = run(capsys)
    good, poor = (
        run(capsys, "--spec-tokens", "3", "--acceptance", rate, "--draft-model", str(small))
        for rate in ("0.9", "0.1")
    )
    assert good["spec_tokens_per_step"] == pytest.approx(1 + 0.9 + 0.81 + 0.729)
    assert good["completed"] == poor["completed"] == plain["completed"] == 40
    # The same passes keep more tokens: fewer iterations, less time per token. (On this tiny model every step is
    # launch-bound, so the draft's three steps cost as much as the model's: even good acceptance loses to none.)
    assert good["iterations"] < poor["iterations"] < plain["iterations"] * 1.01
    assert good["mean_tpot_ms"] < poor["mean_tpot_ms"]


def test_a_dataset_names_its_prefixes(tmp_path):
    lines = [
        '{"input_tokens": 600, "output_tokens": 8, "prefix_id": "system", "prefix_tokens": 512}',
        '{"input_tokens": 700, "output_tokens": 8, "prefix_id": "system", "prefix_tokens": 512}',
        '{"input_tokens": 650, "output_tokens": 8}',
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines))
    found = read_dataset(path)
    assert [(r.prefix_id, r.prefix_tokens) for r in found] == [(0, 512), (0, 512), (None, 0)]
    path.write_text('{"input_tokens": 600, "output_tokens": 8, "prefix_id": "s", "prefix_tokens": 600}')
    with pytest.raises(ModelError, match="line 1: prefix_id 's', prefix_tokens 600"):
        read_dataset(path)


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["--prefix-len", "300"],
            "--prefix-len 300: request 0 has a 200-token prompt, not longer than the prefix",
        ),
        (
            ["--prefix-len", "100", "--prefix-hit-rate", "1.5"],
            "--prefix-hit-rate 1.5: a share of the requests, at most 1",
        ),
        (["--prefix-hit-rate", "0.5"], "--prefix-hit-rate 0.5 needs --prefix-len"),
        (
            ["--spec-tokens", "2", "--acceptance", "1.2", "--draft-model", LLAMA],
            "--acceptance 1.2: an acceptance rate",
        ),
        (["--spec-tokens", "2"], "--spec-tokens 2 needs --draft-model"),
        (["--acceptance", "0.5"], "--acceptance needs --spec-tokens"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(capsys, argv, said):
    assert main([*BASE, *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and said in captured.err and captured.err.count("\n") == 1


def test_a_draft_with_another_vocabulary_is_refused(tmp_path, capsys):
    config = json.loads((DATA / "tiny-llama.json").read_text())
    config["vocab_size"] += 64
    other = tmp_path / "other.json"
    other.write_text(json.dumps(config))
    assert main([*BASE, "--spec-tokens", "2", "--acceptance", "0.8", "--draft-model", str(other)]) == 2
    err = capsys.readouterr().err
    assert "a draft must propose the model's own tokens" in err and err.count("\n") == 1


def test_a_draft_head_is_the_model_cut_to_its_layers():
    deepseek = load_model_config("deepseek-v3")
    mtp = draft_heads.head_config(deepseek, "mtp", "deepseek-v3")
    # One multi-token-prediction layer, a mixture-of-experts one like the model's own after its 3 dense layers.
    assert (mtp["num_hidden_layers"], mtp["first_k_dense_replace"]) == (1, 0)
    # the model is untouched
    assert "num_nextn_predict_layers" not in mtp and deepseek["num_hidden_layers"] == 61
    gpt_oss = load_model_config("gpt-oss-20b")
    eagle = draft_heads.head_config(gpt_oss, "eagle", "gpt-oss-20b")
    assert eagle["num_hidden_layers"] == 1 and eagle["layer_types"] == gpt_oss["layer_types"][:1]
    with pytest.raises(ModelError, match="llama-3-8b ships no multi-token-prediction layers"):
        draft_heads.head_config(load_model_config("llama-3-8b"), "mtp", "llama-3-8b")
    # The embedding and the LM head a device holds: two 500 x 64 bf16 matrices, halved over tp 2.
    assert draft_heads.shared_weight_bytes(json.loads(Path(LLAMA).read_text()), 2, 2) == 500 * 64 * 2


def test_an_eagle_head_drafts_with_the_models_own_embedding_and_head(tmp_path, capsys):
    config = json.loads((DATA / "tiny-llama.json").read_text())
    config["num_hidden_layers"] = (
        1  # the same layer as a draft model of its own, which holds its embedding and head
    )
    own = tmp_path / "draft.json"
    own.write_text(json.dumps(config))
    head = run(capsys, "--spec-tokens", "2", "--acceptance", "0.8", "--draft-model", "eagle")
    separate = run(capsys, "--spec-tokens", "2", "--acceptance", "0.8", "--draft-model", str(own))
    assert head["spec_tokens_per_step"] == pytest.approx(1 + 0.8 + 0.64) and head["completed"] == 40
    # The same steps; the head shares the model's embedding and LM head, so more memory is left for the KV cache.
    assert head["iterations"] == separate["iterations"]
    assert head["kv_blocks"] > separate["kv_blocks"]


def test_mtp_needs_a_model_that_ships_it(capsys):
    assert main([*BASE, "--spec-tokens", "1", "--acceptance", "0.8", "--draft-model", "mtp"]) == 2
    err = capsys.readouterr().err
    assert (
        "ships no multi-token-prediction layers" in err
        and "--draft-model eagle" in err
        and err.count("\n") == 1
    )


def test_an_mtp_head_drafts_with_the_layers_the_config_declares(tmp_path, capsys):
    config = json.loads((DATA / "tiny-llama.json").read_text())
    config["num_nextn_predict_layers"] = 1
    model = tmp_path / "with-mtp.json"
    model.write_text(json.dumps(config))
    assert (
        main(
            [
                *BASE[:2],
                str(model),
                *BASE[3:],
                "--spec-tokens",
                "2",
                "--acceptance",
                "0.9,0.6",
                "--draft-model",
                "mtp",
            ]
        )
        == 0
    )
    found = json.loads(capsys.readouterr().out)
    assert found["spec_tokens_per_step"] == pytest.approx(2.5) and found["completed"] == 40
