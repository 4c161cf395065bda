"""A deployment's devices: --dp replicas for throughput, and the interconnect that must join a replica."""

from __future__ import annotations

import pytest

import castcore
from castcore.cli.main import main

INPUT, OUTPUT, BATCH = 16, 6, 2


def test_dp_multiplies_the_systems_throughput_only(session, tiny_llama):
    one, two = (
        session.serve(str(tiny_llama), input_tokens=INPUT, output_tokens=OUTPUT, batch=BATCH, tp=2, dp=dp)
        for dp in (1, 2)
    )
    a, b = one.to_dict(), two.to_dict()
    assert b["output_tokens_per_s"] == pytest.approx(2 * a["output_tokens_per_s"], rel=1e-12)
    assert b["output_tokens_per_s_per_device"] == pytest.approx(
        a["output_tokens_per_s_per_device"], rel=1e-12
    )
    assert (a["devices"], b["devices"]) == (2, 4)
    for key in ("ttft_s", "tpot_s", "latency_s", "weight_bytes", "kv_cache_bytes", "peak_bytes"):
        assert a[key] == b[key]
    assert two.format_text().splitlines()[0].endswith("tp 2 = 2 devices x 2 replicas (figures per device)")
    report = session.estimate(castcore.build_workload(str(tiny_llama), seq=INPUT, dp=3))
    assert any(n.startswith("--dp 3: 3 replicas") for n in report.notes)


def _profile(tmp_path, h100_file, interconnect: str):
    text = h100_file.read_text().split("[[interconnect]]")[0]
    sources = h100_file.read_text().split("[sources]")[1]
    path = tmp_path / "small.toml"
    sources += '"interconnect.pcie" = "test value"\n'
    path.write_text(
        text.replace('name = "h100-sxm"', 'name = "small-box"') + interconnect + "\n[sources]" + sources
    )
    return path


FOUR = """[[interconnect]]
name = "pcie"
devices = 4
bandwidth = 3.2e10
latency_s = 5e-6
"""


@pytest.mark.parametrize("command", ["estimate", "serve"])
def test_a_replica_larger_than_the_interconnect_is_refused(tmp_path, h100_file, tiny_llama, capsys, command):
    device = _profile(tmp_path, h100_file, FOUR)
    argv = [command, "--no-packs", "--device-file", str(device), "--model", str(tiny_llama)]
    argv += ["--seq", "16"] if command == "estimate" else ["--input", "16", "--output", "4"]
    # 4 devices a replica: fits; replicas need none
    assert main([*argv, "--tp", "2", "--pp", "2", "--dp", "8"]) == 0
    capsys.readouterr()
    assert main([*argv, "--tp", "4", "--pp", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if "error" in line]) == 1
    assert err[-1] == (
        "castcore: error: --tp 4 --pp 2 needs 8 devices in one replica, more than the largest "
        "interconnect level of device 'small-box' joins (pcie: 4 devices); use at most 4 (tp or ep, "
        "times pp), and --dp for more replicas"
    )


def test_a_profile_without_interconnect_runs_one_device(session, tiny_llama, simple_profile):
    with pytest.raises(
        castcore.ModelError, match=r"^tp=2 needs 2 devices .* 'round-numbers' has no \[\[interconnect\]\]"
    ):
        session.estimate(castcore.build_workload(str(tiny_llama), seq=16, tp=2), device=simple_profile)
    assert (
        session.estimate(castcore.build_workload(str(tiny_llama), seq=16, dp=2), device=simple_profile).time_s
        > 0
    )
