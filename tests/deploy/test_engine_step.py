"""A step priced as an engine runs it: glue over ids and positions costs nothing (castcore.deploy.engine_step)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from castcore.cli.main import main

DATA = Path(__file__).parents[1] / "data"
IDS = (torch.int64, torch.int32, torch.bool)


def _on_ids(record) -> bool:
    tensors = [*record.invoke.inputs(), *record.invoke.outputs()]
    return bool(tensors) and all(t.dtype in IDS for t in tensors)


def _decode(session, model, device, **options):
    return session.estimate(model, device=device, phase="decode", batch=2, seq=32, kv_len=64, **options)


def test_glue_on_ids_costs_nothing_in_a_deployed_step_and_keeps_its_cost_eagerly(session, tiny_llama):
    deployed = _decode(session, str(tiny_llama), "h100-sxm")
    glue = [r for r in deployed.records if r.invoke.name.startswith("aten::") and _on_ids(r)]
    assert {r.invoke.name for r in glue} >= {"aten::arange"}  # the positions the HF forward computes
    assert all(r.estimate.time_s == 0 and r.estimate.source.step == "hoisted" for r in glue)
    assert all(r.bytes == 0 and r.flops == 0 for r in glue)
    eager = _decode(session, str(tiny_llama), "h100-sxm", fuse=False)
    kept = [r for r in eager.records if r.invoke.name == "aten::arange"]
    assert kept and all(r.estimate.time_s >= 4e-6 for r in kept)  # the profile's 4 us a vector op


def test_a_write_of_no_element_costs_nothing_in_a_deployed_step(session):
    """Latent attention's cache entry is its keys; the value slot beside it is empty, and so is its write."""
    model = str(DATA / "tiny-deepseek-v3.json")
    deployed = _decode(session, model, "h100-sxm")
    writes = [r for r in deployed.records if r.invoke.name == "aten::index_copy_"]
    empty = [r for r in writes if r.invoke.args[0].numel() == 0]
    assert empty and len(empty) < len(writes)  # one empty value slot beside each latent entry
    assert all(r.estimate.time_s == 0 and r.estimate.source.step == "hoisted" for r in empty)
    assert all(r.estimate.time_s > 0 for r in writes if r not in empty)


def test_a_plugins_op_on_ids_keeps_its_estimate(session):
    lib = torch.library.Library("cctest_glue", "DEF")  # kept alive for the test
    lib.define("bucket(Tensor ids) -> Tensor")

    @torch.library.impl(lib, "bucket", "Meta")
    def _bucket(ids):
        return torch.empty_like(ids)

    class Routing(nn.Module):
        def forward(self, ids):
            return torch.ops.cctest_glue.bucket(ids) + torch.arange(ids.shape[0], device=ids.device)

    report = session.estimate(Routing(), torch.zeros(4096, dtype=torch.int64), device="h100-sxm")
    times = {r.invoke.name: r.estimate.time_s for r in report.records}
    assert times["cctest_glue::bucket"] > 0  # not aten's: the plugin that answers prices it
    assert times["aten::arange"] == 0 and times["aten::add.Tensor"] == 0


def test_a_train_step_keeps_the_glue_and_the_cli_shows_it_hoisted(session, tiny_llama, capsys):
    train = session.estimate(str(tiny_llama), device="h100-sxm", batch=2, seq=32, train=True)
    assert not any(r.estimate.source.step == "hoisted" for r in train.records)  # a training step runs eagerly
    argv = ["estimate", "--model", str(tiny_llama), "--phase", "decode", "--kv-len", "64", "--seq", "32"]
    assert (
        main([*argv, "--batch", "2", "--no-packs", "--device-file", str(DATA / "h100-sxm.toml"), "--json"])
        == 0
    )
    ops = {op["op"]: op for op in json.loads(capsys.readouterr().out)["ops"]}
    assert ops["aten::arange"]["time_s"] == 0 and "hoisted" in str(ops["aten::arange"])
