"""castpack-amd installed beside castcore: its profiles load, every number sourced, and castcore finds
the pack, which claims the parts of a routed-experts block AITER's fused MoE runs (castpack_amd.aiter_moe) and
nothing else. Run with `pytest` after installing the pack (editable or not), or `python3 -m nox`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from importlib import resources

import pytest
import torch

import castcore
from castcore.pack import op_name

PACK = "castpack-amd"
MODULE = "castpack_amd"
ENTRY_POINT = "amd"
DEVICE = "mi300x"
GPUS = ("mi300x", "mi325x", "mi355x")


@pytest.fixture
def session(monkeypatch) -> castcore.Session:
    """A session that sees every installed pack, whatever CASTCORE_* variables the shell has set."""
    for var in (
        "CASTCORE_LOAD_PACKS",
        "CASTCORE_DISABLE_PACKS",
        "CASTCORE_CUSTOM_OP_PATH",
        "CASTCORE_STRICT",
    ):
        monkeypatch.delenv(var, raising=False)
    return castcore.Session()


def test_profile_loads_and_every_number_is_sourced():
    folder = resources.files(MODULE) / "profiles"
    profiles = [
        castcore.load_device_file(f) for f in folder.iterdir() if f.name.endswith(".toml")
    ]  # raises, naming the field, if one is unsourced
    assert DEVICE in [p.name for p in profiles]
    for profile in profiles:
        assert profile.memory_bandwidth > 0 and profile.mma_flops, profile.name
        placeholders = sorted(k for k, v in profile.sources.items() if "PLACEHOLDER" in v)
        if placeholders:
            warnings.warn(
                f"{profile.origin}: sources still placeholders: {', '.join(placeholders)}", stacklevel=1
            )


# What AITER's fused MoE runs as one kernel's parts, which this pack prices on AMD GPUs: the rest is the core's.
CLAIMED = {
    "castcore::moe_permute",
    "castcore::silu_and_mul",
    "castcore::gelu_and_mul",
    "castcore::clamped_swiglu",
    "castcore::moe_unpermute",
}


def test_pack_is_loaded_through_its_entry_point_and_claims_the_fused_moe_parts(session):
    (pack,) = [info for info in session.plugins.infos if info.name == ENTRY_POINT]
    assert (pack.kind, pack.status, pack.distribution) == ("pack", "loaded", PACK), pack.error
    assert {op_name(c.op) for c in pack.claims} == CLAIMED
    assert sorted(pack.hooks) == ["estimate_op", "op_properties"]  # the claims' own table: no fuse_model
    assert {c.device for c in pack.claims} == {"mi3*"}  # AMD GPUs only: other devices keep the core's pricing
    assert session.devices[DEVICE].origin.startswith(f"{PACK}:profiles/")
    # Problems naming this pack or its device (another pack with the same device name, say).
    assert not [w for w in session.warnings if PACK in w or repr(DEVICE) in w], session.warnings


def test_castcore_audit_shows_who_answers_mm_on_the_device():
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    done = subprocess.run(
        [sys.executable, "-m", "castcore", "audit", "--json", "--device", DEVICE, "--op", "aten::mm"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert not row["winner"]["plugin"].startswith(PACK)


def test_a_matmul_is_priced_on_the_device(session):
    a = torch.empty(1024, 1024, dtype=torch.bfloat16, device="meta")
    (record,) = session.estimate(torch.mm, a, a, device=DEVICE).records
    assert record.estimate.time_s > 0


# The figures AMD prints 'with sparsity' (CDNA 3 white paper, MI355X brochure): a profile holds half of each.
SPARSE = {
    "mi300x": {"bfloat16": 2614.9e12, "float8_e4m3fnuz": 5229.8e12, "int8": 5229.8e12},
    "mi325x": {"bfloat16": 2614.9e12, "float8_e4m3fnuz": 5229.8e12, "int8": 5229.8e12},
    "mi355x": {"bfloat16": 5.0332e15, "float16": 5.0332e15, "float8_e4m3fn": 10.0664e15, "int8": 10.0664e15},
}
# name: (CUs, dense bf16 flop per clock per CU, GiB, Infinity Fabric GB/s a link each way)
SHAPE = {"mi300x": (304, 2048, 192, 64), "mi325x": (304, 2048, 256, 64), "mi355x": (256, 4096, 288, 76.8)}


@pytest.mark.parametrize("name", GPUS)
def test_every_profile_loads_under_its_name_sourced_field_by_field(session, name):
    device = session.devices[name]
    assert device.origin == f"{PACK}:profiles/{name}.toml" and device.vendor == "AMD" and not device.default
    fields = [
        "memory_bytes",
        "memory_bandwidth",
        "compute_efficiency",
        "memory_efficiency",
        "mma_op_cost_s",
        "gp_op_cost_s",
        "comm_op_cost_s",
        "compute_units",
        "clock_hz",
        "tdp_w",
        "idle_w",
        *(f"mma_flops.{d}" for d in device.mma_flops),
        *(f"gp_flops.{d}" for d in device.gp_flops),
        *(f"interconnect.{i.name}" for i in device.interconnect),
    ]
    for field in fields:
        parts = field.split(".")
        found = [
            device.sources[".".join(parts[:n])]
            for n in range(1, len(parts) + 1)
            if ".".join(parts[:n]) in device.sources
        ]
        assert found and "read 2026-11-29" in found[-1], field
        assert "PLACEHOLDER" not in found[-1], field


@pytest.mark.parametrize("name", GPUS)
def test_matrix_rates_are_half_the_sparse_figures_and_cus_times_clock(session, name):
    device = session.devices[name]
    for dtype, sparse in SPARSE[name].items():
        assert device.mma_flops[dtype] == pytest.approx(sparse / 2, rel=1e-4), dtype
    units, per_cu, gib, _link = SHAPE[name]
    assert device.compute_units == units and device.memory_bytes == gib * 2**30
    assert device.mma_flops["bfloat16"] == pytest.approx(units * per_cu * device.clock_hz, rel=1e-3)
    assert device.mma_flops["int8"] == pytest.approx(2 * device.mma_flops["bfloat16"], rel=1e-4)


def test_fp8_formats_mxfp4_and_tf32_where_each_gpu_has_them(session):
    mi300x, mi355x = session.devices["mi300x"].mma_flops, session.devices["mi355x"].mma_flops
    # CDNA 3 runs FNUZ fp8; OCP checkpoints are converted and run at the same rate
    assert (
        mi300x["float8_e4m3fnuz"]
        == mi300x["float8_e5m2fnuz"]
        == mi300x["float8_e4m3fn"]
        == mi300x["float8_e5m2"]
    )
    assert "float8_e4m3fnuz" not in mi355x and mi355x["float8_e4m3fn"] == mi355x["float8_e5m2"]
    assert mi355x["float4_e2m1fn_x2"] == pytest.approx(2 * mi355x["float8_e4m3fn"], rel=1e-4)  # MXFP4
    assert (
        "float4_e2m1fn_x2" not in mi300x
        and "tf32" not in mi355x
        and mi300x["tf32"] == pytest.approx(653.7e12)
    )


@pytest.mark.parametrize("name", GPUS)
def test_the_infinity_fabric_mesh_and_the_nic_levels(session, name):
    device = session.devices[name]
    mesh, network = device.interconnect
    assert (mesh.name, mesh.devices, mesh.topology) == ("infinity-fabric", 8, "full-mesh")
    # a full mesh's bandwidth is the sum of a GPU's 7 links; castpack-collectives gives one peer a seventh
    assert mesh.bandwidth == pytest.approx(7 * SHAPE[name][3] * 1e9)
    assert (network.name, network.topology, network.nic_bandwidth, network.nics_per_device) == (
        "infiniband",
        "clos",
        5e10,
        1,
    )


def test_castcore_audit_shows_who_wins_each_op_on_mi300x():
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    done = subprocess.run(
        [sys.executable, "-m", "castcore", "audit", "--json", "--device", "mi300x"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    rows = {row["op"]: row for row in json.loads(done.stdout)}
    assert rows and all(row["device"] == "mi300x" for row in rows.values())
    assert {row["status"] for row in rows.values()} <= {
        "ok",
        "override",
        "decomposed",
    }  # no CONFLICT on an AMD GPU
    # This pack wins the fused MoE's parts and nothing else; the matrix products go to the core's roofline over
    # this profile's rates.
    won = {op: row["winner"] for op, row in rows.items() if row["winner"]}
    assert {op for op, w in won.items() if w["plugin"].startswith(PACK)} == CLAIMED
    assert {won[op]["kind"] for op in CLAIMED} == {"estimator"}
    for op in ("aten::mm", "aten::bmm", "aten::_scaled_mm"):
        assert (won[op]["plugin"], won[op]["kind"]) == ("core", "properties"), op


# Constants measured or fitted on published AMD-platform runs (each profile's [sources] names the document):
# name -> (memory_efficiency, {dtype: mma_efficiency}, attention_efficiency,
#          Infinity Fabric efficiency, its latency_s, comm_op_cost_s)
MEASURED = {
    "mi300x": (
        0.78,
        dict.fromkeys(("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3fn", "float8_e5m2"), 0.44),
        0.0,
        0.71,
        3.75e-6,
        5.6e-6,
    ),
    "mi325x": (0.78, {}, 0.0, 0.71, 3.75e-6, 5.6e-6),  # MI300X's measurements, labelled assumptions
    "mi355x": (0.80, {"float8_e4m3fn": 0.65, "float8_e5m2": 0.65}, 0.50, 0.71, 3.75e-6, 5.6e-6),
}


@pytest.mark.parametrize("name", GPUS)
def test_measured_kernel_and_fabric_constants(session, name):
    device = session.devices[name]
    memory, mma, attention, fabric, latency, call = MEASURED[name]
    assert device.memory_efficiency == memory and dict(device.mma_efficiency) == mma
    assert device.attention_efficiency == attention and device.comm_op_cost_s == call
    mesh = device.interconnect[0]
    assert (mesh.efficiency, mesh.latency_s) == (fabric, latency)
    if mma:
        assert "mma_efficiency" in device.sources
    if attention:
        assert "attention_efficiency" in device.sources


# rccl-tests all_reduce_perf on 8x MI300X, out of place, from a stream (ROCm blogs 'Understanding RCCL
# Bandwidth and xGMI Performance on AMD Instinct MI300X', 2025-03-02): bytes -> microseconds.
RCCL_ALL_REDUCE_8X_MI300X = {
    1024: 13.11,
    8192: 13.30,
    65536: 13.77,
    1073741824: 5970.6,
    17179869184: 94254.0,
}


# The same, under HIP graphs (-G 1): no host cost a call, so the fabric alone.
RCCL_ALL_REDUCE_8X_MI300X_GRAPH = {
    1024: 7.47, 2048: 7.46, 4096: 7.61, 8192: 7.64, 16384: 8.71, 32768: 9.05, 65536: 9.14, 131072: 9.51,
    262144: 10.26, 524288: 14.26, 1048576: 19.40, 2097152: 35.03, 4194304: 51.83, 8388608: 83.74,
    16777216: 149.1, 33554432: 243.4, 67108864: 427.9, 134217728: 795.3, 268435456: 1534.4,
    536870912: 3024.0, 1073741824: 5961.9, 2147483648: 11880, 4294967296: 23658, 8589934592: 47244,
    17179869184: 94182,
}


def test_mi300x_all_reduce_follows_rccls_two_protocols_at_every_size(session):
    """RCCL's half-bandwidth protocol up to about 8 MiB, the whole bandwidth after a dearer start beyond
    (the mesh level's library and protocol step latencies); one protocol priced 256 KiB-32 MiB up to 46% fast."""
    from castpack_collectives import alphabeta

    mesh = session.devices["mi300x"].interconnect
    assert mesh[0].library == "rccl"
    errors = []
    for nbytes, measured_us in RCCL_ALL_REDUCE_8X_MI300X_GRAPH.items():
        cost = alphabeta.collective_cost("all_reduce", nbytes, 8, mesh, op_cost_s=0.0)
        errors.append(abs(cost.time_s * 1e6 / measured_us - 1))
        assert cost.protocols == (("LL",) if nbytes < 16 * 2**20 else ("Simple",)), nbytes
    errors.sort()
    assert errors[len(errors) // 2] < 0.03 and errors[-1] < 0.16, errors


def test_mi300x_all_reduce_matches_rccl_at_small_and_large_sizes(session):
    from castpack_collectives import alphabeta  # the amd session installs it beside this pack
    device = session.devices["mi300x"]
    for nbytes, measured_us in RCCL_ALL_REDUCE_8X_MI300X.items():
        cost = alphabeta.collective_cost(
            "all_reduce", nbytes, 8, device.interconnect, op_cost_s=device.comm_op_cost_s
        )
        assert cost.time_s * 1e6 == pytest.approx(measured_us, rel=0.03), nbytes


# vLLM's custom all-reduce on MI300X, fp16, microseconds: at TP 4 (vllm-project/vllm #19744, table TP=4, column
# 'baseline'), which the mi300x profile's engine constants are fitted on, and at TP 2 (ROCm/aiter #801, table tp2(us),
# column 'vllm cr'), held out.
VLLM_CR_MI300X_TP4 = {2048: 7.18, 16384: 7.26, 32768: 7.58, 262144: 14.39, 524288: 14.65, 1048576: 22.91,
                      2097152: 36.64, 4194304: 63.86, 8388608: 118.31, 16777216: 230.48}
VLLM_CR_MI300X_TP2 = {4096: 7.07, 8192: 7.58, 16384: 7.53, 32768: 7.30, 65536: 7.66, 131072: 8.70, 262144: 11.45,
                      524288: 17.13, 1048576: 28.15, 2097152: 49.67, 4194304: 93.79, 8388608: 181.43,
                      16777216: 355.91}


@pytest.mark.parametrize("ranks, measured, median_within", [(4, VLLM_CR_MI300X_TP4, 0.02), (2, VLLM_CR_MI300X_TP2, 0.05)])
def test_mi300x_engine_all_reduce_prices_vllms_custom_all_reduce(session, ranks, measured, median_within):
    from castpack_collectives import alphabeta

    mesh = session.devices["mi300x"].interconnect
    errors = []
    for nbytes, measured_us in measured.items():
        cost = alphabeta.collective_cost("all_reduce", nbytes, ranks, mesh, 5.6e-6, alphabeta.ENGINE)
        assert cost.algorithm in alphabeta.ENGINE_KERNELS, nbytes  # under 16 MiB, vLLM's own kernel
        errors.append(abs(cost.time_s * 1e6 / measured_us - 1))
    errors.sort()
    assert errors[len(errors) // 2] < median_within and errors[-1] < 0.15, errors


# A Qwen3-MoE of 8 experts, top-2, 2 layers: small enough to capture in a second, built from this config by
# transformers.
TINY_MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "norm_topk_prob": True,
    "vocab_size": 256,
    "max_position_embeddings": 256,
}


def _moe_decode(tmp_path, monkeypatch, device=DEVICE, **options):
    config = tmp_path / "tiny-moe.json"
    config.write_text(json.dumps(TINY_MOE))
    for var in ("CASTCORE_LOAD_PACKS", "CASTCORE_CUSTOM_OP_PATH", "CASTCORE_STRICT"):
        monkeypatch.delenv(var, raising=False)
    workload = castcore.build_workload(str(config), phase="decode", kv_len=16, batch=4, **options)
    return castcore.Session().estimate(workload, device=device)


def _by_op(report, module_end="layers.0.mlp.experts"):
    return {r.invoke.name: r for r in report.records if r.invoke.module.endswith(module_end)}


def test_a_routed_experts_block_on_mi300x_runs_as_aiters_fused_moe(tmp_path, monkeypatch):
    ours = _by_op(_moe_decode(tmp_path, monkeypatch))
    monkeypatch.setenv("CASTCORE_DISABLE_PACKS", ENTRY_POINT)  # the estimators go; the profile is read as a file
    profile = castcore.load_device_file(resources.files(MODULE) / "profiles" / f"{DEVICE}.toml")
    core = _by_op(_moe_decode(tmp_path, monkeypatch, device=profile))
    for op in ("castcore::silu_and_mul", "castcore::moe_unpermute"):  # stage 1's and stage 2's epilogues
        assert ours[op].estimate.source.plugin.startswith(PACK)
        assert ours[op].estimate.time_s == 0 and ours[op].estimate.detail["fused_into"].startswith("AITER")
        assert core[op].estimate.time_s > 0 and core[op].estimate.source.plugin == "core"
    sort, copy = ours["castcore::moe_permute"].estimate, core["castcore::moe_permute"].estimate
    assert sort.detail["kernel"] == "AITER moe_sorting" and 0 < sort.time_s <= copy.time_s
    # the products themselves stay the core's
    assert ours["aten::_grouped_mm"].estimate.time_s == core["aten::_grouped_mm"].estimate.time_s


def test_a_dispatched_sort_and_combine_keep_the_cores_pricing(tmp_path, monkeypatch):
    # under attention data parallelism the rows cross the network: the sort copies them into the send buffer and
    # the combine sums what comes back, as the core prices them; only the local experts' activation is fused
    ops = _by_op(_moe_decode(tmp_path, monkeypatch, ep=2, attention_dp=2, expert_skew=0))
    for op in ("castcore::moe_permute", "castcore::moe_unpermute"):
        assert ops[op].estimate.source.plugin == "core" and ops[op].estimate.time_s > 0, op
    assert ops["castcore::silu_and_mul"].estimate.time_s == 0
