"""A step priced as an engine runs it: glue over ids and positions costs nothing (castcore.deploy.engine_step)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from castcore.cli.main import main
from castcore.deploy import engine_step

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


def test_a_write_of_no_element_costs_nothing_and_a_latent_entry_is_written_by_one_kernel(session):
    """Latent attention's cache entry is its keys; the value slot beside it is empty. Eagerly its write is an
    index_copy_ of no element, glue a deployed step would hoist; deployed, one castcore::kv_cache_write a layer
    writes the entry, and the empty slot adds no byte."""
    empty_slot, entry = torch.empty(2, 1, 8, 0), torch.empty(2, 1, 8, 4)
    position = torch.zeros(1, dtype=torch.int64)
    empty, written = (
        session.estimate(lambda t, i, s: t.index_copy_(2, i, s), t, position, t[:, :, :1]).records[0].invoke
        for t in (empty_slot, entry)
    )
    assert engine_step.hoisted(empty) and not engine_step.hoisted(written)
    model = str(DATA / "tiny-deepseek-v3.json")
    deployed = _decode(session, model, "h100-sxm")
    assert not [r for r in deployed.records if r.invoke.name == "aten::index_copy_"]
    one = [r for r in deployed.records if r.invoke.name == "castcore::kv_cache_write"]
    assert len(one) == 4  # one a layer
    keys, values, position, key, value = one[0].invoke.args[:5]
    assert values.numel() == value.numel() == 0
    assert one[0].bytes == position.nbytes + 2 * key.nbytes  # the new entry read and written, nothing else


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
