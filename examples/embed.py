"""Embedding castcore in a program: one workload on two devices, and an estimator of the program's own.

Run: python examples/embed.py tests/data/h100-sxm.toml  (any device profile TOML works)
"""

from __future__ import annotations

import sys

import torch

import castcore
from castcore import pack


# A claim declared by the embedding program itself wins over every pack (castcore audit shows it).
@pack.register_op_estimator(torch.ops.aten.embedding.default)
def embedding_lookup(invoke: pack.OpInvoke, device: pack.DeviceProfile) -> pack.Estimate:
    """A gather reads one row per token; model it as latency-bound below 1 MiB."""
    out = invoke.out[0] if isinstance(invoke.out, (list, tuple)) else invoke.out
    nbytes = out.nbytes if isinstance(out, pack.TensorMeta) else 0
    seconds = max(nbytes / device.memory_bandwidth, 2e-6)
    return pack.Estimate(time_s=seconds, memory_s=seconds, bound="memory")


def main(device_file: str) -> int:
    session = castcore.Session(load_packs=[], device_files=[device_file])
    device = session.device()
    for phase in ("prefill", "decode"):
        workload = castcore.build_workload("tests/data/tiny-llama.json", batch=4, seq=128, phase=phase)
        report: castcore.Report = session.estimate(workload, device=device)
        totals = report.totals()
        print(f"{report.description} on {device.name}: {totals['time_s'] * 1e6:.1f} us, "
              f"{totals['flops'] / 1e9:.3f} GFLOP, {len(report.records)} calls")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/h100-sxm.toml"))
