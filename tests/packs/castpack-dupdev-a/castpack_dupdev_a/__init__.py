"""Provides the device 'dup-npu', as castpack-dupdev-b does (with another bandwidth)."""

import castcore

MEMORY_BANDWIDTH = 1e12


@castcore.hookimpl
def device_profiles():
    numbers = {
        "mma_flops": {"bfloat16": 1e14},
        "gp_flops": {"float32": 1e13},
        "memory_bytes": 1e10,
        "memory_bandwidth": MEMORY_BANDWIDTH,
    }
    return [
        castcore.device_from_dict(
            {
                "name": "dup-npu",
                "vendor": "dupdev-a",
                **numbers,
                "sources": {k: "test value" for k in numbers},
            }
        )
    ]
