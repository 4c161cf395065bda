"""Twin B: shares the entry-point name 'twin' with castpack-twin-a; castcore must refuse both."""

import torch

import castcore


@castcore.register_op_estimator(torch.ops.aten.mm.default)
def _mm(invoke, device):
    return 8.0


@castcore.hookimpl
def device_profiles():
    numbers = {
        "mma_flops": {"bfloat16": 1e14},
        "gp_flops": {"float32": 1e13},
        "memory_bytes": 1e10,
        "memory_bandwidth": 1e12,
    }
    return [
        castcore.device_from_dict(
            {"name": "twin-b-npu", "vendor": "test", **numbers, "sources": {k: "test value" for k in numbers}}
        )
    ]
