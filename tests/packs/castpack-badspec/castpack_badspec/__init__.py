"""A pack whose estimate_op takes an argument castcore's spec does not have: the whole pack must be refused."""

import castcore


@castcore.hookimpl
def estimate_op(invoke, device, extra):
    return 5.0


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
                "name": "badspec-npu",
                "vendor": "test",
                **numbers,
                "sources": {k: "test value" for k in numbers},
            }
        )
    ]
