"""A test pack: answers aten.mm with a fixed second and gives cumsum properties and a device."""

import torch

import castcore

PACK_MM_SECONDS = 1.0


@castcore.register_op_estimator(torch.ops.aten.mm.default)
def _mm(invoke, device):
    return PACK_MM_SECONDS


@castcore.register_op_properties(torch.ops.aten.cumsum.default)
def _cumsum(invoke, device):
    x = invoke.args[0]
    return invoke.memory_access_properties().add(x.dtype, gp=x.numel())


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
            {
                "name": "throwaway-npu",
                "vendor": "test",
                **numbers,
                "sources": {k: "test value" for k in numbers},
            }
        )
    ]
