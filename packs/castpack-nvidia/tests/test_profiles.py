"""Every shipped profile loads through castcore, is sourced field by field, and holds NVIDIA's dense figures."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

import castcore
import castcore.pack

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

PROFILES = resources.files("castpack_nvidia") / "profiles"
README = Path(__file__).resolve().parents[1] / "README.md"
# name: (file, SMs, dense bf16 flop per clock per SM, GiB of memory)
EXPECTED = {
    "a100-sxm4-80gb": ("a100-sxm4-80gb.toml", 108, 2048, 80),
    "h100-sxm5-80gb": ("h100-sxm5-80gb.toml", 132, 4096, 80),
    "h100-pcie-80gb": ("h100-pcie-80gb.toml", 114, 4096, 80),
    "h200-sxm": ("h200-sxm.toml", 132, 4096, 141),
    "b200": ("b200.toml", 148, 8192, 180),
    "l40s": ("l40s.toml", 142, 1024, 48),
    "h20": ("h20.toml", 78, None, 96),  # tensor rate capped below SMs x 4096 x clock; no clock found
    "h800-sxm": ("h800-sxm.toml", 132, 4096, 80),
    "b300": ("b300.toml", 148, 8192, 270),
    "gb200-nvl72": ("gb200-nvl72.toml", 148, 8192, 186),
    "gb300-nvl72": ("gb300-nvl72.toml", 148, 8192, 279),
    "rtx-pro-6000-server": ("rtx-pro-6000-server.toml", 188, 1024, 96),
}
# The tensor figures NVIDIA prints 'with sparsity' (datasheets, HGX B200 table): a profile holds half of each.
SPARSE_DATASHEET = {
    "a100-sxm4-80gb": {"bfloat16": 624e12, "float16": 624e12, "tf32": 312e12, "int8": 1248e12},
    "h100-sxm5-80gb": {"bfloat16": 1979e12, "tf32": 989e12, "float8_e4m3fn": 3958e12, "int8": 3958e12},
    "h100-pcie-80gb": {"bfloat16": 1513e12, "tf32": 756e12, "float8_e4m3fn": 3026e12, "int8": 3026e12},
    "h200-sxm": {"bfloat16": 1979e12, "tf32": 989e12, "float8_e5m2": 3958e12, "int8": 3958e12},
    "b200": {"bfloat16": 4.5e15, "tf32": 2.2e15, "float8_e4m3fn": 9e15, "int8": 9e15, "float4_e2m1fn_x2": 18e15},
    "l40s": {"bfloat16": 733e12, "tf32": 366e12, "float8_e4m3fn": 1466e12},
    "h20": {},  # no NVIDIA datasheet: aiconfigurator's and third-party figures are dense already
    "h800-sxm": {},
    "b300": {"bfloat16": 4.5e15, "tf32": 2.2e15, "float8_e4m3fn": 9e15, "int8": 307e12},
    "gb200-nvl72": {"bfloat16": 5e15, "tf32": 2.5e15, "float8_e4m3fn": 10e15, "int8": 10e15},
    "gb300-nvl72": {"bfloat16": 5e15, "tf32": 2.5e15, "float8_e4m3fn": 10e15, "int8": 330e12},
    # the product page does not say sparse; taken as sparse (its TF32 234 is printed dense and kept)
    "rtx-pro-6000-server": {"bfloat16": 1e15, "float8_e4m3fn": 2e15, "float4_e2m1fn_x2": 4e15},
}
# FP4 where the vendor prints sparse | dense and sparse is not twice dense (Blackwell Ultra), or a rack total / 72.
DENSE_FP4 = {"b200": 9e15, "b300": 108e15 / 8, "gb200-nvl72": 720e15 / 72, "gb300-nvl72": 1080e15 / 72,
             "rtx-pro-6000-server": 2e15}
# Shape-aware pricing needs tiles; no SM120 (RTX Blackwell) kernel shapes were sourced, so that card has none.
UNTILED = {"rtx-pro-6000-server"}
NEW_FIELDS = ("compute_units", "l2_bytes", "clock_hz", "attention_efficiency", "memory_half_bytes")
NO_CLOCK = {"h20"}  # no H20 clock was found; its source says why


@pytest.fixture(scope="module")
def devices():
    return castcore.Session(load_packs=["nvidia"]).devices


def nvidia(devices):
    return {n: d for n, d in devices.items() if d.origin.startswith("castpack-nvidia:")}


def test_the_twelve_profiles_load_under_their_documented_names_and_none_is_the_default(devices):
    ours = nvidia(devices)
    assert set(ours) == set(EXPECTED)
    assert not [n for n, d in ours.items() if d.default]
    for name, (file, *_rest) in EXPECTED.items():
        assert ours[name].origin == f"castpack-nvidia:profiles/{file}"
        assert ours[name].vendor == "NVIDIA"


def test_the_readme_tables_name_every_profile_and_no_other():
    rows = re.findall(r"^\| `([a-z0-9-]+)`", README.read_text(encoding="utf-8"), flags=re.M)
    assert sorted(rows) == sorted(2 * list(EXPECTED))  # the profiles table and the efficiencies table


@pytest.mark.parametrize("name", EXPECTED)
def test_every_number_has_a_source(devices, name):
    device = devices[name]
    shape = [f for f in NEW_FIELDS if not (f == "clock_hz" and name in NO_CLOCK)]
    fields = ["memory_bytes", "memory_bandwidth", "compute_efficiency", "memory_efficiency", "mma_op_cost_s",
              "gp_op_cost_s", "comm_op_cost_s", *shape, *(f"mma_flops.{d}" for d in device.mma_flops),
              *(f"gp_flops.{d}" for d in device.gp_flops), *(f"mma_unit.{d}" for d in device.mma_unit),
              *(f"mma_tile.{d}" for d in device.mma_tile), *(f"interconnect.{i.name}" for i in device.interconnect)]
    for field in fields:
        parts = field.split(".")
        found = [device.sources[".".join(parts[:n])] for n in range(1, len(parts) + 1) if ".".join(parts[:n]) in device.sources]
        assert found, field
        # each source says when it was read (the collective constants were revisited on 2026-11-27 and -28; the
        # H20, H800, B300, GB200/GB300 NVL72 and RTX PRO 6000 profiles were added on -29)
        assert re.search(r"read 2026-11-2[3789]", found[-1]), field
    # a field a reader would expect and the profile leaves out says why in [sources]
    if name in NO_CLOCK:
        assert device.clock_hz == 0 and "absent on purpose" in device.sources["clock_hz"]
    if name in UNTILED:
        assert not device.mma_unit and "absent on purpose" in device.sources["mma_unit"]


@pytest.mark.parametrize("name", EXPECTED)
def test_the_shape_fields_are_set(devices, name):
    device = devices[name]
    _file, units, _per_sm, _gib = EXPECTED[name]
    assert device.compute_units == units
    assert all(getattr(device, f) > 0 for f in NEW_FIELDS if not (f == "clock_hz" and name in NO_CLOCK))
    # Every matrix rate but fp64 has the tiles a tuned GEMM uses; the loader checked they fit the units.
    if name not in UNTILED:
        assert set(device.mma_flops) - {"float64"} <= set(device.mma_tile)


def test_h100_sxm_bf16_is_the_dense_whitepaper_figure(devices):
    assert devices["h100-sxm5-80gb"].mma_flops["bfloat16"] == pytest.approx(989.4e12, rel=0.01)


@pytest.mark.parametrize("name", EXPECTED)
def test_tensor_rates_are_half_the_sparse_datasheet_figures(devices, name):
    device = devices[name]
    for dtype, sparse in SPARSE_DATASHEET[name].items():
        # 1.5%: the L40S datasheet prints 362.05 dense beside 733 sparse.
        assert device.mma_flops[dtype] == pytest.approx(sparse / 2, rel=0.015), dtype
    if name in DENSE_FP4:
        assert device.mma_flops["float4_e2m1fn_x2"] == pytest.approx(DENSE_FP4[name]), name


@pytest.mark.parametrize("name", EXPECTED)
def test_bf16_rate_is_sms_times_per_sm_rate_times_clock(devices, name):
    device = devices[name]
    _file, units, per_sm, gib = EXPECTED[name]
    assert device.memory_bytes == gib * 2**30
    if per_sm is None:  # H20: capped far below Hopper's 4096 flop/clk per SM at any GH100 clock (1.98 GHz at most)
        assert device.mma_flops["bfloat16"] < units * 4096 * 1.0e9
        return
    # 1.5%: the L40S datasheet prints 362.05 where 142 x 1024 x 2.52 GHz gives 366.4.
    assert device.mma_flops["bfloat16"] == pytest.approx(units * per_sm * device.clock_hz, rel=0.015)


@pytest.mark.parametrize("name", EXPECTED)
def test_low_precision_doubles_the_rate(devices, name):
    rates = devices[name].mma_flops
    if name == "rtx-pro-6000-server":  # the page's TF32 234 is dense at 2.43 GHz, the rest at 2.6: 0.47 of bf16
        assert rates["tf32"] == pytest.approx(0.468 * rates["bfloat16"], rel=0.01)
    else:
        assert rates["tf32"] == pytest.approx(rates["bfloat16"] / 2, rel=0.03)
    if name in ("b300", "gb300-nvl72"):  # Blackwell Ultra cut INT8 to a few percent of FP8, as NVIDIA prints
        assert rates["int8"] < rates["float8_e4m3fn"] / 10
    elif name == "rtx-pro-6000-server":
        assert "int8" not in rates  # no source found; the profile says so
    else:
        assert rates["int8"] == pytest.approx(2 * rates["bfloat16"], rel=0.02)
    if name == "a100-sxm4-80gb":
        assert "float8_e4m3fn" not in rates  # Ampere has no FP8 tensor cores
    else:
        assert rates["float8_e4m3fn"] == rates["float8_e5m2"] == pytest.approx(2 * rates["bfloat16"], rel=0.02)
    # FP4 on Blackwell only; Hopper, Ampere and Ada have none
    assert ("float4_e2m1fn_x2" in rates) == (name in DENSE_FP4)


@pytest.mark.parametrize("name", EXPECTED)
def test_efficiencies_are_measured_fractions_and_attention_trails_the_gemm(devices, name):
    device = devices[name]
    assert 0.6 < device.compute_efficiency < 0.9
    assert 0.75 < device.memory_efficiency < 0.95
    assert device.attention_efficiency < device.compute_efficiency


def test_interconnect_levels_match_each_platform(devices):
    levels = {name: [(i.name, i.devices) for i in devices[name].interconnect] for name in EXPECTED}
    for hgx in ("a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm", "b200", "h20", "h800-sxm", "b300"):
        assert levels[hgx] == [("nvlink", 8), ("infiniband", 1024)]
    for rack in ("gb200-nvl72", "gb300-nvl72"):  # the whole rack is one NVLink domain, the network beyond it
        assert levels[rack] == [("nvlink", 72), ("infiniband", 1152)]
        assert devices[rack].interconnect[0].topology == "switch"
        assert devices[rack].interconnect[0].engine_allreduce_max_ranks == 4  # one compute tray
    assert levels["rtx-pro-6000-server"] == [("pcie", 8), ("ethernet", 1024)]
    assert levels["h100-pcie-80gb"] == [("nvlink", 2), ("pcie", 8), ("infiniband", 1024)]  # bridged pairs
    assert levels["l40s"] == [("pcie", 8), ("ethernet", 1024)]  # no NVLink on the L40S; 8 cards on one PCIe host
    bandwidth = {name: devices[name].interconnect[0].bandwidth for name in EXPECTED}
    assert bandwidth["b200"] == 2 * bandwidth["h100-sxm5-80gb"] == 2 * bandwidth["h200-sxm"]
    assert bandwidth["b300"] == bandwidth["gb200-nvl72"] == bandwidth["gb300-nvl72"] == bandwidth["b200"]
    assert bandwidth["h20"] == bandwidth["h100-sxm5-80gb"] and bandwidth["h800-sxm"] == 2e11  # H800: NVLink cut
    # a GPU's NIC beyond the node or rack: 400 Gb/s ConnectX-7 on GB200, 800 Gb/s ConnectX-8 on GB300 and HGX B300
    nic = {name: devices[name].interconnect[-1].bandwidth for name in EXPECTED}
    assert (nic["gb200-nvl72"], nic["gb300-nvl72"], nic["b300"]) == (5e10, 1e11, 1e11)


@pytest.mark.parametrize("field", ["mma_flops.float8_e4m3fn", "mma_tile", "attention_efficiency", "interconnect.nvlink"])
def test_a_missing_source_fails_loading_and_names_the_field(field):
    data = tomllib.loads((PROFILES / "h100-sxm5-80gb.toml").read_text(encoding="utf-8"))
    del data["sources"][field]
    with pytest.raises(castcore.DeviceError, match=r"no source for .*" + re.escape(field)):
        castcore.device_from_dict(data, origin="h100-sxm5-80gb.toml")


def test_castcore_devices_lists_the_pack_profiles():
    done = subprocess.run([sys.executable, "-m", "castcore", "devices", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    for name, (file, *_rest) in EXPECTED.items():
        assert rows[name]["origin"] == f"castpack-nvidia:profiles/{file}"
        assert rows[name]["default"] is False
    assert rows["h100-pcie-80gb"]["interconnect"] == ["nvlink", "pcie", "infiniband"]


def test_every_gpu_carries_its_sourced_board_power():
    powered = {p.name: (p.tdp_w, p.idle_w) for p in castcore.pack.package_profiles("castpack_nvidia") if p.tdp_w}
    assert {name: tdp for name, (tdp, _) in powered.items()} == {
        "a100-sxm4-80gb": 400, "h100-sxm5-80gb": 700, "h100-pcie-80gb": 350, "h200-sxm": 700, "b200": 1000,
        "l40s": 350, "h20": 400, "h800-sxm": 700, "b300": 1100, "gb200-nvl72": 1200, "gb300-nvl72": 1400,
        "rtx-pro-6000-server": 600}
    assert powered["h100-sxm5-80gb"][1] == 140 and powered["b200"][1] == 137  # the two idle readings found
